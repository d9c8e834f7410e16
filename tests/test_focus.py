"""FocusLLM unit tests on a tiny random model (no fixtures needed)."""
from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file

from longjax.ckpts.hf import save_hf
from longjax.focus import (FocusConfig, FocusError, FocusLLM, focus_from_llama, load_focus,
                           save_focus, split_prompt, split_training)
from longjax.focus import condense as C
from longjax.focus.losses import FocusLoss, trainable_mask
from longjax.focus.planner import pack_chunks
from longjax.focus.spans import sample_indices
from longjax.inference.generate import generate
from longjax.models.decoder import Decoder

from focus_helpers import prompt, tiny_focus, tiny_model


@pytest.fixture(scope="module")
def tiny():
  return tiny_model()


# ------------------------------------------------------------------------------------------------
# Config and planner.
@pytest.mark.parametrize("kw, match", [
    (dict(local_window=0), "local_window"),
    (dict(chunk_stride=0), "chunk_stride"),
    (dict(local_window=16, prompt_cap=17), "prompt_cap"),
    (dict(candidate_projections=("q", "x")), "candidate_projections"),
    (dict(min_len_threshold=-1), "min_len_threshold"),
    (dict(max_chunks=0), "max_chunks"),
])
def test_config_rejects_bad_sizes(kw, match):
  with pytest.raises(FocusError, match=match):
    FocusConfig(**kw)


def test_config_defaults_and_hf_fields():
  f = FocusConfig()
  assert (f.local_window, f.chunk_stride, f.prompt_cap, f.min_len_threshold) == (
      1024, 1024, 512, 4096)
  assert FocusConfig(local_window=128, chunk_stride=64).prompt_len == 64
  g = FocusConfig.from_hf({"local_window": 3500, "memory_stride": [1024],
                           "beacon_param": ["q", "k"]})
  assert (g.local_window, g.chunk_stride, g.candidate_projections, g.prompt_len) == (
      3500, 1024, ("q", "k"), 512)
  with pytest.raises(FocusError, match="memory_stride"):
    FocusConfig.from_hf({"memory_stride": [64, 128]})
  assert FocusConfig.from_hf({"memory_stride": [64, 128]}, chunk_stride=128).chunk_stride == 128
  assert FocusConfig.from_hf(g.to_hf()) == g


def test_split_prompt_layout():
  f = FocusConfig(local_window=128, chunk_stride=64, min_len_threshold=0)
  x = prompt(400, 0)
  r = split_prompt(x, f)
  assert r.chunk_lens == [64, 64, 64, 64, 16]
  assert all(np.array_equal(c, x[i * 64:i * 64 + len(c)]) for i, c in enumerate(r.chunks))
  assert np.array_equal(r.prompt, np.r_[1, x[400 - 64:]])
  assert np.array_equal(r.local, np.r_[1, x[272:]])
  # BOS only when the span does not already start with it.
  y = x.copy()
  y[272] = 1
  assert np.array_equal(split_prompt(y, f).local, y[272:])
  # Short input: below the threshold the plain LM over bos(x).
  short = split_prompt(x, f.replace(min_len_threshold=4096))
  assert short.n_chunks == 0 and np.array_equal(short.local, x)
  with pytest.raises(FocusError, match="empty prompt"):
    split_prompt([], f)
  with pytest.raises(FocusError, match="max_chunks"):
    split_prompt(x, f.replace(max_chunks=4))


def test_split_training_layout():
  x = prompt(400, 1)
  r = split_training(x, memory_len=264, local_start=264, local_size=62, stride=64)
  assert r.chunk_lens == [64, 64, 64, 64, 8] and r.target == x[326]
  assert np.array_equal(r.prompt, np.r_[1, x[326 - 62:326]])  # P = min(512, S, ls) = 62
  assert np.array_equal(r.local, np.r_[1, x[264:326]])
  with pytest.raises(FocusError):
    split_training(x, memory_len=10, local_start=390, local_size=20, stride=64)


def test_spans_sampler_bounds():
  rng = np.random.default_rng(0)
  for _ in range(200):
    ix = sample_indices(rng, 7000, window=3072)
    a, ls = ix["local_start"], ix["local_size"]
    assert 30 <= ls <= 3070 and ix["target_index"] == a + ls < 7000
    assert ix["stride"] in (64, 128, 256, 512, 1024, 2048)
    if ix["objective"] == "continuation":
      assert ix["memory_len"] == a and 3072 < a  # N = 2
    else:
      assert ix["memory_len"] == 7000


# ------------------------------------------------------------------------------------------------
# Condensing.
def test_batched_condense_equals_one_chunk_at_a_time(tiny):
  cfg, params = tiny
  f = tiny_focus()
  rows = [split_prompt(prompt(100, 0), f), split_prompt(prompt(61, 1), f)]
  cb = pack_chunks(rows, row_multiple=3, length_multiple=32)
  model = Decoder(cfg)
  ck, cv, k, v = jax.jit(lambda *a: C.condense(model, params, *a))(
      cb.tokens, cb.positions, cb.valid, cb.lengths)
  one = jax.jit(lambda *a: C.condense(model, params, *a))
  n = 0
  for r in rows:
    for seq in r.chunk_rows():
      t = np.asarray(seq, np.int32)[None]
      ck1, cv1, k1, v1 = one(t, np.arange(t.shape[1])[None],
                                    np.ones(t.shape, bool), np.asarray([t.shape[1]], np.int32))
      np.testing.assert_allclose(ck[:, n], ck1[:, 0], atol=1e-5)
      np.testing.assert_allclose(cv[:, n], cv1[:, 0], atol=1e-5)
      np.testing.assert_allclose(k[:, n, :t.shape[1]], k1[:, 0], atol=1e-5)
      n += 1
  assert n == 8 and cb.n_rows == 9  # 5 + 3 chunks, padded to a multiple of 3


def test_training_candidates_equal_whole_row_condense(tiny):
  """The training path (prefix forward without gradient, then the candidate as a one-token step)
  gives the whole-row forward's candidates, and the same gradient, padding rows included."""
  cfg, params = tiny
  f = tiny_focus()
  rows = [split_prompt(prompt(100, 0), f), split_prompt(prompt(61, 1), f)]
  cb = pack_chunks(rows, row_multiple=3, length_multiple=32)
  assert (np.asarray(cb.lengths) == 0).any() and len(set(np.asarray(cb.lengths))) > 2
  model = Decoder(cfg)
  args = (cb.tokens, cb.positions, cb.valid, cb.lengths)
  ck, cv, _, _ = C.condense(model, params, *args)
  ck2, cv2 = jax.jit(lambda p, *a: C.condense_candidates(model, p, *a))(params, *args)
  real = np.asarray(cb.lengths) > 0
  np.testing.assert_allclose(ck2[:, real], ck[:, real], atol=1e-5)
  np.testing.assert_allclose(cv2[:, real], cv[:, real], atol=1e-5)
  w = np.random.default_rng(0).normal(size=ck.shape[1:]) * real[:, None, None]
  score = lambda c: lambda p: sum(jnp.sum(x * w) for x in c(p))
  g1 = jax.grad(score(lambda p: C.condense(model, p, *args)[:2]))(params)
  g2 = jax.grad(score(lambda p: C.condense_candidates(model, p, *args)))(params)
  for a, b, t in zip(jax.tree.leaves(g1), jax.tree.leaves(g2), jax.tree.leaves(trainable_mask(g1))):
    if t:  # the candidate projections: what FocusLLM trains (the base is frozen)
      np.testing.assert_allclose(b, a, atol=1e-5 + 1e-4 * np.abs(a).max())
  assert np.abs(g2["layers"]["attn"]["alt_q_proj"]["kernel"]).max() > 0


def test_chunk_rows_padded_to_powers_of_two(tiny):
  """Chunk rows (computed, padding included) are padded to devices * 2^k: < 2x waste."""
  f = tiny_focus()
  rows = [split_prompt(prompt(100, 0), f), split_prompt(prompt(61, 1), f)]  # 5 + 3 chunks
  assert pack_chunks(rows[:1], pow2=True).n_rows == 8
  assert pack_chunks(rows[1:], pow2=True).n_rows == 4
  assert pack_chunks(rows, pow2=True).n_rows == 8
  assert pack_chunks(rows, row_multiple=3, pow2=True).n_rows == 12  # 3 devices: 3 * 2^2
  assert pack_chunks(rows[1:], row_multiple=3, pow2=True).n_rows == 3
  assert pack_chunks(rows[:1], pow2=True).gather.shape == (1, 8)
  assert pack_chunks(rows[1:], pow2=True).gather.shape == (1, 4)
  cfg, params = tiny
  m = FocusLLM(cfg, f, bucket=16)
  two = prompt(52, 3)  # 2 chunks: 2 rows (was padded to 8)
  assert m.plan(two).n_chunks == 2
  _, state = m.prefill(params, np.asarray(two)[None], np.array([len(two)]), 1)
  assert state.cache_k.shape[1] == 2 and state.gather.shape == (1, 2)
  with pytest.raises(FocusError, match="chunk_bucket"):
    FocusLLM(cfg, f, chunk_bucket=0)


def test_candidate_uses_candidate_weights_only(tiny):
  """Regular tokens never see the candidate and use base weights: their K/V equal the plain LM's
  (the cache's keys rotated at their positions, as chunk_step reads them)."""
  from longjax.models.decoder import caches_rotated, rotate_kv
  cfg, params = tiny
  model = Decoder(cfg)
  t = prompt(20, 3).astype(np.int32)[None]
  pos = np.arange(20)[None]
  _, _, k, _ = C.condense(model, params, t, pos, np.ones(t.shape, bool), np.asarray([20], np.int32))
  _, (k0, _) = model.apply({"params": params}, t, pos, alt=np.zeros(t.shape, bool))
  assert caches_rotated(cfg)
  k0 = rotate_kv(cfg, k0, pos)
  np.testing.assert_allclose(k[:, :, :19], k0[:, :, :19], atol=1e-6)
  assert np.abs(np.asarray(k[:, :, 19]) - np.asarray(k0[:, :, 19])).max() > 1e-3


# ------------------------------------------------------------------------------------------------
# Decoding: cached == closed form; batch rows == single runs; generate.
@pytest.mark.parametrize("overlap", [0, 5])
def test_cached_decode_equals_recompute(tiny, overlap):
  cfg, params = tiny
  f = tiny_focus(chunk_overlap=overlap)  # 5: the chunk rows (and their caches) 5 tokens longer
  prompts = [prompt(100, 0), prompt(61, 1), prompt(20, 2)]  # 5, 3 and 0 chunks
  m = FocusLLM(cfg, f, bucket=16)
  b = len(prompts)
  lengths = np.array([len(p) for p in prompts], np.int32)
  tokens = np.zeros((b, lengths.max()), np.int32)
  for i, p in enumerate(prompts):
    tokens[i, :len(p)] = p
  logits, state = m.prefill(params, tokens, lengths, 6)
  np.testing.assert_allclose(logits, m.recompute(params, prompts, [[]] * b), atol=2e-5)
  rng = np.random.default_rng(0)
  fed = [[] for _ in range(b)]
  for _ in range(5):
    g = rng.integers(3, 97, size=b)
    for i in range(b):
      fed[i].append(int(g[i]))
    logits, state = m.step(params, state, g)
    np.testing.assert_allclose(logits, m.recompute(params, prompts, fed), atol=2e-5)
  with pytest.raises(FocusError, match="full"):  # capacity: 6 new tokens (+ bucket slack)
    for _ in range(64):
      _, state = m.step(params, state, g)


def test_generate_batch_rows_equal_single_runs(tiny):
  cfg, params = tiny
  f = tiny_focus()
  m = FocusLLM(cfg, f, bucket=16)
  prompts = [list(prompt(100, 0)), list(prompt(40, 1)), list(prompt(7, 2))]
  batch = generate(m, params, prompts, max_new_tokens=5, return_logits=True)
  for i, p in enumerate(prompts):
    one = generate(m, params, p, max_new_tokens=5, return_logits=True)
    assert one.tokens[0] == batch.tokens[i]
    np.testing.assert_allclose(one.logits[0], batch.logits[i], atol=2e-5)
  # Sampling is reproducible per seed, stop ids end a row, the callback streams every step.
  seen = []
  s1 = generate(m, params, prompts, max_new_tokens=5, temperature=0.8, top_k=20, top_p=0.9, seed=3,
                callback=lambda t, toks: seen.append((t, np.asarray(toks).copy())))
  s2 = generate(m, params, prompts, max_new_tokens=5, temperature=0.8, top_k=20, top_p=0.9, seed=3)
  assert s1.tokens == s2.tokens and [t for t, _ in seen] == list(range(5))
  assert all(len(toks) == 3 for _, toks in seen)
  stop = batch.tokens[0][1]
  stopped = generate(m, params, prompts[0], max_new_tokens=5, stop_ids=[stop])
  assert stopped.tokens[0] == batch.tokens[0][:batch.tokens[0].index(stop) + 1]


def test_short_input_is_the_plain_lm(tiny):
  cfg, params = tiny
  m = FocusLLM(cfg, tiny_focus(min_len_threshold=4096))
  x = prompt(60, 5)
  out = m.forward(params, x)
  logits, _ = jax.jit(Decoder(cfg).apply)({"params": params}, x[None].astype(np.int32),
                                          np.arange(60)[None])
  np.testing.assert_allclose(out.logits, logits[0], atol=2e-5)
  assert out.cand_k.shape[1] == 0


def test_bad_inputs(tiny):
  cfg, params = tiny
  m = FocusLLM(cfg, tiny_focus(max_chunks=3))
  with pytest.raises(FocusError, match="empty prompt"):
    m.prefill(params, np.zeros((1, 4), np.int32), np.array([0]), 2)
  with pytest.raises(ValueError, match="empty prompt"):
    generate(m, params, [[]], max_new_tokens=2)
  with pytest.raises(FocusError, match="max_chunks=3"):
    generate(m, params, prompt(100, 0), max_new_tokens=2)
  with pytest.raises(FocusError, match="candidate_projections"):
    FocusLLM(cfg.replace(alt_projections=("q",)), tiny_focus())


# ------------------------------------------------------------------------------------------------
# Training loss.
def test_loss_gradients_reach_only_candidate_projections(tiny):
  cfg, params = tiny
  fl = FocusLoss(cfg, tiny_focus(), bucket=16)
  xs = [prompt(120, 0), prompt(90, 1)]
  ix = [dict(memory_len=50, local_start=50, local_size=30, stride=16),
        dict(memory_len=90, local_start=10, local_size=40, stride=32)]
  batch = fl.plan(xs, ix)
  value, grads = fl.value_and_grad(params, batch)
  assert np.isfinite(float(value)) and float(value) > 0
  mask = trainable_mask(params)
  for (path, g), t in zip(jax.tree_util.tree_leaves_with_path(grads), jax.tree.leaves(mask)):
    if t:
      assert np.abs(g).max() > 0, jax.tree_util.keystr(path)
    else:
      assert np.abs(g).max() == 0, jax.tree_util.keystr(path)


# ------------------------------------------------------------------------------------------------
# Conversion.
def test_checkpoint_roundtrip(tiny, tmp_path):
  cfg, params = tiny
  f = tiny_focus()
  save_focus(tmp_path / "ckpt", cfg, f, params)
  names = set(load_file(tmp_path / "ckpt" / "model.safetensors"))
  assert "model.beacon_embed_tokens.weight" in names
  assert {f"model.layers.{i}.self_attn.beacon_{p}_proj.weight"
          for i in (0, 1) for p in "qkvo"} <= names
  hf = json.loads((tmp_path / "ckpt" / "config.json").read_text())
  assert (hf["local_window"] == 24 and hf["memory_stride"] == [16]
          and hf["beacon_param"] == list("qkvo"))
  cfg2, f2, params2 = load_focus(tmp_path / "ckpt", prompt_cap=8, min_len_threshold=0)
  assert f2 == f and "alt_embedding" not in params2 and cfg2.num_alt_embeddings == 0
  jax.tree.map(np.testing.assert_array_equal, params, params2)
  _, _, kept = load_focus(tmp_path / "ckpt", keep_unused_embedding=True)
  np.testing.assert_array_equal(kept["alt_embedding"][0], params["embedding"][2])


def test_init_from_plain_llama(tmp_path):
  cfg, params = tiny_model(projections=())
  save_hf(tmp_path / "llama", cfg, params)
  with pytest.raises(FocusError, match="init_candidates='copy'"):
    load_focus(tmp_path / "llama")
  cfg2, f2, p2 = focus_from_llama(tmp_path / "llama", tiny_focus())
  assert cfg2.alt_projections == ("q", "k", "v", "o")
  for p in "qkvo":
    np.testing.assert_array_equal(p2["layers"]["attn"][f"alt_{p}_proj"]["kernel"],
                                  params["layers"]["attn"][f"{p}_proj"]["kernel"])
  # Copied candidate weights: the candidate is an ordinary token, so condensing = the plain LM.
  model = Decoder(cfg2)
  t = prompt(20, 3).astype(np.int32)[None]
  ck, _, _, _ = C.condense(model, p2, t, np.arange(20)[None], np.ones(t.shape, bool),
                           np.asarray([20], np.int32))
  _, (k0, _) = Decoder(cfg).apply({"params": params}, t, np.arange(20)[None])
  np.testing.assert_allclose(ck[:, 0], k0[:, 0, 19], atol=1e-5)


def test_training_rows_bucketed_to_the_batch_needs(tiny):
  """FocusTask computes batch x 2^k or batch x 3 x 2^k chunk rows (not batch x the longest
  document's chunks); the loss equals the one over all rows."""
  from longjax.focus.planner import pack_local
  from longjax.focus.task import FocusTask
  from longjax.focus.losses import TrainBatch
  cfg, params = tiny
  f = tiny_focus()
  rows = [split_training(prompt(n, s), memory_len=m, local_start=m, local_size=10, stride=16,
                         prompt_cap=8, bos_id=1) for n, s, m in ((60, 0, 20), (40, 1, 17))]
  shp = dict(cmax=6)
  assert [r.n_chunks for r in rows] == [2, 2]
  assert FocusTask.row_bucket(rows, shp) == 4  # 4 real rows: 2 x 2^1
  assert FocusTask.row_bucket(rows * 4, shp) == 8 * 1 * 2
  long = [split_training(prompt(120, 2), memory_len=100, local_start=100, local_size=10,
                         stride=16, prompt_cap=8, bos_id=1)]  # 7 chunks
  assert FocusTask.row_bucket(long + rows[:1], shp) == 2 * 6  # never above batch x cmax
  three = [split_training(prompt(60, s), memory_len=40, local_start=40, local_size=10, stride=16,
                          prompt_cap=8, bos_id=1) for s in (3, 4)]
  assert [r.n_chunks for r in three] == [3, 3]
  assert FocusTask.row_bucket(three, shp) == 2 * 3  # a half octave: not 2 x 4
  ref = dict(shp, reference=True)  # the gate's reference rows: one more per sample
  assert FocusTask.row_bucket(rows, ref) == 2 * 3
  assert FocusTask.row_bucket(long * 2, ref) == 2 * 7  # never above batch x (cmax + 1)
  fl = FocusLoss(cfg, f)
  lb = pack_local(rows, length_multiple=16)
  targets = np.asarray([r.target for r in rows], np.int32)
  losses = []
  for n in (FocusTask.row_bucket(rows, shp), 2 * 6):
    cb = pack_chunks(rows, row_multiple=n, length_multiple=32, cmax_multiple=6)
    assert cb.n_rows == n
    losses.append(np.asarray(fl.per_sample(params, TrainBatch(cb, lb, targets))))
  np.testing.assert_allclose(losses[0], losses[1], atol=1e-5)


# ------------------------------------------------------------------------------------------------
# Several teacher-forced decode steps per training sample (docs/focusllm.md §5.1).
@pytest.mark.parametrize("gate,gain", [(0.0, 0.0), (3.0, 0.0), (3.0, 1.5)])
def test_decode_steps_loss_equals_teacher_forced_generation(tiny, gate, gain):
  """Each of a sample's J scored steps is the inference model's next-token NLL after the prompt
  ``x[:t0]`` and the forced tokens ``x[t0:t0+j]`` (closed form, ``FocusLLM.recompute``); J = 1 is
  the official single-target loss. With the candidate gate (docs/focusllm.md §4.5) on, training
  reads the candidates under the same bias as inference, its reference rows (``gate_gain``)
  included."""
  cfg, params = tiny
  f = tiny_focus(candidate_gate=gate, gate_gain=gain, gate_threshold=0.01 if gain else 1.0)
  w = f.local_window
  fl = FocusLoss(cfg, f, bucket=16)
  m = FocusLLM(cfg, f, bucket=16)
  xs = [prompt(110, 5), prompt(75, 6)]
  t0s = [90, 47]  # 4 and 2 memory chunks of 16 before the local window
  ix = [dict(memory_len=t0 - w, local_start=t0 - w, local_size=w, stride=f.chunk_stride)
        for t0 in t0s]
  steps = 5
  got = np.asarray(fl.per_sample(params, fl.plan(xs, ix, steps=steps)))
  want = []
  for x, t0 in zip(xs, t0s):
    nll = []
    for j in range(steps):
      logits = m.recompute(params, [x[:t0]], [x[t0:t0 + j]])[0]
      nll.append(float(jax.nn.logsumexp(logits) - logits[x[t0 + j]]))
    want.append(np.mean(nll))
    assert len(set(np.round(nll, 4))) == steps  # the steps differ: a real per-step check
  np.testing.assert_allclose(got, want, atol=1e-4)
  one = np.asarray(fl.per_sample(params, fl.plan(xs, ix)))
  np.testing.assert_allclose(one, np.asarray(fl.per_sample(params, fl.plan(xs, ix, steps=1))))
  first = [float(jax.nn.logsumexp(lg) - lg[x[t0]]) for x, t0 in zip(xs, t0s)
           for lg in m.recompute(params, [x[:t0]], [[]])]
  np.testing.assert_allclose(one, first, atol=1e-4)
  _, grads = fl.value_and_grad(params, fl.plan(xs, ix, steps=steps))
  assert np.abs(grads["layers"]["attn"]["alt_q_proj"]["kernel"]).max() > 0


def test_decode_steps_bad_input():
  x = prompt(60, 0)
  with pytest.raises(FocusError, match="steps=3"):  # targets x[50:53] would pass the end
    split_training(x, memory_len=20, local_start=20, local_size=38, stride=16, steps=3)
  from longjax.focus.task import FocusTask
  cfg, _ = tiny_model()
  with pytest.raises(FocusError, match="focus.steps=0"):
    FocusTask(cfg, tiny_focus(), dict(window=24, strides=(16,), steps=0), seed=0)
  from longjax.run_config.sections import DistillSettings
  for settings, match in ((DistillSettings(alpha=1.0), "alpha"),
                          (DistillSettings(answer_weight=5.0), "answer_weight"),
                          (DistillSettings(base_weight=0.0), "base_weight")):
    with pytest.raises(FocusError, match=match):  # beacon-only weights, refused by name
      FocusTask(cfg, tiny_focus(), dict(window=24, strides=(16,), steps=1), seed=0,
                distill=settings)


def test_decode_step_draws_leave_room_for_every_target():
  from longjax.focus.spans import focus_indices
  answer = np.zeros(80, bool)
  answer[77:] = True  # a 3-token answer at the very end
  for objective in ("answer", "random", "continuation", "repetition"):
    for seed in range(40):
      fc = dict(window=24, strides=(16,), min_local=4, objective=objective, steps=6)
      ix = focus_indices(np.random.default_rng(seed), 80, answer, fc)
      assert ix["target_index"] + 6 <= 80 and ix["local_start"] + ix["local_size"] == (
          ix["target_index"])
      if objective == "answer":  # the steps still reach the answer
        assert ix["target_index"] + 6 > 77


def test_distill_loss_is_kl_to_the_base_on_every_step(tiny):
  """docs/focusllm.md §5.2: a distilled sample's loss is the mean over its steps of KL(teacher ||
  student) over the teacher's top k + one class for the rest, the teacher the plain base reading
  the sample up to the step's target, the student the inference model's decode step; a sample
  that is not distilled keeps its targets' NLL."""
  from longjax.focus.losses import teacher_batch
  cfg, params = tiny
  f = tiny_focus()
  w, steps, k = f.local_window, 3, 5
  fl = FocusLoss(cfg, f, bucket=16)
  m = FocusLLM(cfg, f, bucket=16)
  xs = [prompt(110, 5), prompt(75, 6)]
  t0s = [90, 47]
  ix = [dict(memory_len=t0 - w, local_start=t0 - w, local_size=w, stride=f.chunk_stride)
        for t0 in t0s]
  batch = fl.plan(xs, ix, steps=steps)
  tb = teacher_batch(xs, ix, [True, False], steps, multiple=16)
  got = np.asarray(fl.per_sample_distill(params, batch, tb, top_k=k))
  logsm = lambda a: np.asarray(jax.nn.log_softmax(jnp.asarray(a, jnp.float32)))
  want = []
  for b, (x, t0) in enumerate(zip(xs, t0s)):
    base, _ = Decoder(cfg).apply({"params": params}, x[None, :t0 + steps - 1].astype(np.int32),
                                 np.arange(t0 + steps - 1)[None])
    per = []
    for j in range(steps):
      q = logsm(m.recompute(params, [x[:t0]], [x[t0:t0 + j]])[0])
      if b == 1:
        per.append(-q[x[t0 + j]])
        continue
      p = logsm(base[0, t0 - 1 + j])
      top = np.argsort(-p)[:k]
      pt, qt = np.exp(p[top]), np.exp(q[top])
      rest_p, rest_q = 1 - pt.sum(), 1 - qt.sum()
      per.append(np.sum(pt * (p[top] - q[top])) + rest_p * np.log(rest_p / rest_q))
    want.append(np.mean(per))
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
  assert want[0] > 1e-3  # the copied-candidate student is not the teacher: a real KL
  renorm = np.asarray(fl.per_sample_distill(params, batch, tb, top_k=k, rest="renormalise"))
  assert renorm[1] == pytest.approx(got[1]) and renorm[0] != pytest.approx(got[0])
  g = jax.grad(lambda p: fl.per_sample_distill(p, batch, tb, top_k=k).sum())(params)
  for (path, leaf), t in zip(jax.tree_util.tree_leaves_with_path(g),
                             jax.tree.leaves(trainable_mask(params))):
    assert (np.abs(leaf).max() > 0) == t, jax.tree_util.keystr(path)  # the base stays frozen


def test_teacher_reads_only_the_distilled_samples():
  """A sample scored on its targets (not distilled) adds no teacher row: the teacher's width
  comes from the distilled samples alone, so a long answer-loss document next to a short
  distilled one is never read whole by the base."""
  from longjax.focus.losses import dense_teacher_batch, teacher_batch
  from longjax.focus.planner import split_dense
  f = tiny_focus()
  xs = [prompt(300, 5), prompt(60, 6)]
  ix = [dict(memory_len=t0 - 16, local_start=t0 - 16, local_size=16, stride=f.chunk_stride)
        for t0 in (290, 50)]
  tb = teacher_batch(xs, ix, [False, True], 3, multiple=16)
  assert tb.ids.shape == (2, 64)  # 50 + 3 - 1 = 52 tokens -> 64 (not 290 + 2 -> 384)
  np.testing.assert_array_equal(tb.ids[1, :52], xs[1][:52])
  assert not tb.ids[0].any() and not tb.rows[0].any()
  np.testing.assert_array_equal(tb.rows[1], [49, 50, 51])
  assert teacher_batch(xs, ix, [True, True], 3, multiple=16).ids.shape == (2, 384)
  mem = (260, 30)
  rows = [split_dense(x, memory_len=a, local_size=20, stride=f.chunk_stride,
                      prompt_cap=f.prompt_cap, bos_id=f.bos_id) for x, a in zip(xs, mem)]
  dt = dense_teacher_batch(xs, rows, [False, True], 32, mem, multiple=16)
  assert dt.ids.shape == (2, 64) and not dt.ids[0].any() and not dt.rows[0].any()
  assert dense_teacher_batch(xs, rows, [True, True], 32, mem, multiple=16).ids.shape == (2, 384)


def test_dense_teacher_rows_with_overlapping_chunks():
  """With chunk_overlap the chunks repeat tokens, so the memory's length is not their summed
  length: the local row of x[a+k] still reads the teacher's row a+k, the teacher x[0 : a+ls]."""
  from longjax.focus.losses import dense_teacher_batch
  from longjax.focus.planner import split_dense
  f = tiny_focus()
  x, a, ls = prompt(120, 7), 70, 20
  for overlap in (0, 5):
    r = split_dense(x, memory_len=a, local_size=ls, stride=f.chunk_stride,
                    prompt_cap=f.prompt_cap, bos_id=f.bos_id, overlap=overlap)
    assert (sum(r.chunk_lens) > a) == (overlap > 0)  # 5 chunks, 4 of them 5 tokens longer
    dt = dense_teacher_batch([x], [r], [True], 32, [a], multiple=16)
    first = int(np.argmax(r.row_targets >= 0))
    np.testing.assert_array_equal(dt.rows[0, first:first + ls], a + np.arange(ls))
    np.testing.assert_array_equal(dt.ids[0, :a + ls], x[:a + ls])
    assert not dt.ids[0, a + ls:].any()
    # the teacher's row a+k is followed by x[a+k+1]: the local row's own target
    np.testing.assert_array_equal(x[dt.rows[0, first:first + ls] + 1], r.row_targets[first:])


def _dense_reference(cfg, f, params, x, a, ls):
  """Per local row k, the inference functions' next-token log-probabilities behind the
  candidates of ``x[0:a]``'s chunks read with the prompt ``bos(x[a-P:a])``: the chunk rows come
  from the single-target training layout whose local context is those P tokens, condensed by the
  inference path (whole-row forward), and each row is its own local forward over
  ``bos(x[a : a+k+1])``."""
  from longjax.focus.planner import RowPlan, pack_local, split_training
  model = Decoder(cfg)
  p = min(f.prompt_cap, f.chunk_stride)
  plan = split_training(x, memory_len=a, local_start=a - p, local_size=p,
                        stride=f.chunk_stride, prompt_cap=f.prompt_cap, bos_id=f.bos_id)
  cb = pack_chunks([plan], length_multiple=16)
  ck, cv, _, _ = C.condense(C.row_decoder(model), params, cb.tokens, cb.positions, cb.valid,
                            cb.lengths)
  locals_ = [RowPlan(chunks=plan.chunks, prompt=plan.prompt,
                     local=np.concatenate([[f.bos_id], x[a:a + k + 1]])) for k in range(ls)]
  lb = pack_local(locals_, length_multiple=16)
  logits = C.local_next_logits(model, params, ck, cv, np.repeat(cb.gather, ls, axis=0),
                               np.repeat(cb.cand_valid, ls, axis=0), lb.tokens, lb.lengths,
                               lb.n_chunks)
  return np.asarray(jax.nn.log_softmax(logits)), plan.prompt


def test_dense_rows_equal_fixed_candidate_prefixes(tiny):
  """docs/focusllm.md §5.3: every scored local row of a dense sample is the local forward of its
  own prefix behind candidates built from the memory before the span (so none has read a token
  it is scored on); the NLL / KL per sample are the means over those rows; the base stays
  frozen."""
  from longjax.focus.losses import DenseBatch, dense_teacher_batch, pack_dense_targets
  from longjax.focus.planner import pack_local, split_dense
  cfg, params = tiny
  f = tiny_focus()
  fl = FocusLoss(cfg, f, bucket=16)
  xs, spans, k = [prompt(110, 5), prompt(75, 6)], [(60, 24), (33, 20)], 5
  rows = [split_dense(x, memory_len=a, local_size=ls, stride=f.chunk_stride,
                      prompt_cap=f.prompt_cap, bos_id=f.bos_id) for x, (a, ls) in zip(xs, spans)]
  lb = pack_local(rows, length_multiple=16)
  width = lb.tokens.shape[1]
  batch = DenseBatch(pack_chunks(rows, length_multiple=16), lb, pack_dense_targets(rows, width))
  logq = np.asarray(fl.dense_logq(params, batch))
  tb = dense_teacher_batch(xs, rows, [True, False], width, [a for a, _ in spans], multiple=16)
  got = np.asarray(fl.per_sample_dense(params, batch, tb, top_k=k))
  nll_only = np.asarray(fl.per_sample_dense(params, batch))
  want_kl, want_nll = [], []
  for b, (x, (a, ls)) in enumerate(zip(xs, spans)):
    ref, ref_prompt = _dense_reference(cfg, f, params, x, a, ls)
    np.testing.assert_array_equal(rows[b].prompt, ref_prompt)  # the text just before the span
    assert rows[b].prompt[-1] == x[a - 1] and rows[b].row_targets[0] == -1
    np.testing.assert_allclose(logq[b, 1:ls + 1], ref, atol=1e-4)
    nll = [-ref[j, x[a + j + 1]] for j in range(ls)]
    assert len(set(np.round(nll, 3))) > ls // 2  # the rows differ: a real per-row check
    want_nll.append(np.mean(nll))
    base, _ = Decoder(cfg).apply({"params": params}, x[None, :a + ls].astype(np.int32),
                                 np.arange(a + ls)[None])
    per = []
    for j in range(ls):
      p = np.asarray(jax.nn.log_softmax(base[0, a + j]))
      top = np.argsort(-p)[:k]
      pt, qt = np.exp(p[top]), np.exp(ref[j, top])
      per.append(np.sum(pt * (p[top] - ref[j, top]))
                 + (1 - pt.sum()) * np.log((1 - pt.sum()) / (1 - qt.sum())))
    want_kl.append(np.mean(per))
  np.testing.assert_allclose(nll_only, want_nll, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(got, [want_kl[0], want_nll[1]], rtol=1e-4, atol=1e-5)
  assert want_kl[0] > 1e-3  # the copied-candidate student is not the teacher: a real KL
  g = jax.grad(lambda p: fl.per_sample_dense(p, batch, tb, top_k=k).sum())(params)
  for (path, leaf), t in zip(jax.tree_util.tree_leaves_with_path(g),
                             jax.tree.leaves(trainable_mask(params))):
    assert (np.abs(leaf).max() > 0) == t, jax.tree_util.keystr(path)


def test_dense_steps_in_the_task_and_bad_input(tiny):
  """``focus.dense_share`` draws dense steps per optimizer step (1: all, 0: none); a dense step's
  plan scores its whole local span and its loss runs; bad shares and indices are refused."""
  from types import SimpleNamespace
  from longjax.focus.planner import split_dense
  from longjax.focus.task import FocusTask
  cfg, params = tiny
  xs = [prompt(110, 5), prompt(75, 6), prompt(90, 7)]
  ds = SimpleNamespace(ids=xs, answer=[None] * 3, lengths=np.array([len(x) for x in xs]),
                       objective=["distill", None, None])
  fc = dict(window=24, strides=(16,), min_local=4, objective="random", steps=1)
  dense = FocusTask(cfg, tiny_focus(), dict(fc, dense_share=1.0), seed=3)
  plain = FocusTask(cfg, tiny_focus(), dict(fc, dense_share=0.0), seed=3)
  half = FocusTask(cfg, tiny_focus(), dict(fc, dense_share=0.5), seed=3)
  prep = dense.prepare(ds, [0, 1], step=4)
  plans = prep["plans"]
  assert "dense" in plans and "teacher" in plans and "dense" not in plain.prepare(
      ds, [0, 1], step=4)["plans"]
  assert all(ix["local_size"] == 24 for ix in prep["indices"])
  assert [int((t >= 0).sum()) for t in plans["dense"]] == [24, 24]
  nll, count = dense.loss(params, plans)
  assert nll.shape == (2,) and np.all(np.isfinite(nll)) and np.all(np.asarray(count) == 1)
  gained = FocusTask(cfg, tiny_focus(candidate_gate=3.0, gate_threshold=0.01, gate_gain=1.5),
                     dict(fc, dense_share=1.0), seed=3)
  g_plans = gained.prepare(ds, [0, 1], step=4)["plans"]
  refs = np.asarray(g_plans["chunks"]["ref_row"])
  owner = np.asarray(g_plans["chunks"]["owner"])
  assert owner[refs].tolist() == [0, 1]  # one reference row per sample, its own
  assert np.all(np.isfinite(np.asarray(gained.loss(params, g_plans)[0])))
  drawn = ["dense" in half.prepare(ds, [1, 2], step=s)["plans"] for s in range(40)]
  assert 8 < sum(drawn) < 32  # about half the steps, the same on a rerun
  assert drawn == ["dense" in half.prepare(ds, [1, 2], step=s)["plans"] for s in range(40)]
  with pytest.raises(FocusError, match="dense_share=1.5"):
    FocusTask(cfg, tiny_focus(), dict(fc, dense_share=1.5), seed=0)
  with pytest.raises(FocusError, match="bad dense training indices"):
    split_dense(xs[0], memory_len=0, local_size=24, stride=16)
  with pytest.raises(FocusError, match="bad dense training indices"):
    split_dense(xs[0], memory_len=90, local_size=20, stride=16)  # x[110] is past the end
