"""Activation Beacon behaviour on a tiny random Qwen2 (no fixtures needed).

Fixture parity lives in test_beacon_fixtures.py; here: config validation, planning rules from the
spec, scan == step-by-step, compile-once prefill, batched == unbatched generation, multi-turn
memory reuse, sampling, bad inputs, conversion and gradients through the memory.
"""
from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import longjax
from longjax.beacon import (BeaconConfig, BeaconConfigError, BeaconLM,
                            BeaconSetupError, CapacityError, Planner, RowState, adapt_ratio,
                            load_beacon, save_beacon)
from longjax.ckpts.hf import CheckpointError, save_hf, shard_map
from longjax.models.config import ModelConfig
from longjax.models.decoder import init_params

VOCAB = 300


def tiny_cfg(family="qwen2", alt=("q", "k", "v"), **kw):
  base = dict(family=family, vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
              num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
              attention_bias=family == "qwen2", max_position_embeddings=512,
              alt_projections=alt, num_alt_embeddings=1 if alt else 0)
  base.update(kw)
  return ModelConfig(**base)


def tiny_params(cfg, seed=0):
  p = init_params(cfg, seed)
  # HF-style init is tiny (std 0.02); scale linear weights so logits have clear margins.
  return jax.tree_util.tree_map_with_path(
      lambda path, x: x if "norm" in jax.tree_util.keystr(path) or "embedding" in
      jax.tree_util.keystr(path) else x * 6.0, p)


BCFG = BeaconConfig(window=16, stride=16, ratios=(4,), sink_size=0)


@pytest.fixture(scope="module")
def model():
  cfg = tiny_cfg()
  return cfg, tiny_params(cfg)


@pytest.fixture(scope="module")
def lm(model):
  return BeaconLM(model[0], BCFG, max_length=256)


def _ids(n, seed=0):
  return np.random.default_rng(seed).integers(3, VOCAB, n)


# ------------------------------------------------------------------------------------------------
def test_config_validation():
  ok = BeaconConfig(window=2048, stride=2048, ratios=[2, 4, 8])
  assert ok.ratios == (2, 4, 8) and ok.query_slots == 2048 + 1024
  with pytest.raises(BeaconConfigError, match="divisible"):
    BeaconConfig(window=60, stride=60, ratios=(8,))
  with pytest.raises(BeaconConfigError, match="stride == window"):
    BeaconConfig(window=64, stride=32, ratios=(4,))
  # append with stride < window: the official code's intent (test_beacon_stride.py)
  assert BeaconConfig(window=64, stride=32, ratios=(4,), pos="append").query_slots == 64 + 8
  with pytest.raises(BeaconConfigError, match="step-expansion"):
    BeaconConfig(attn="step-expansion", pos="interleave")
  with pytest.raises(BeaconConfigError, match="segmentation"):
    BeaconConfig(attn="segmentation", pos="append")
  with pytest.raises(BeaconConfigError, match="ratio_mix"):
    BeaconConfig(ratio_mix="adapt")
  with pytest.raises(BeaconConfigError, match="param"):
    BeaconConfig(param=("q", "mlp"))
  with pytest.raises(BeaconConfigError, match="embed_init"):
    BeaconConfig(embed_init="pad")
  with pytest.raises(BeaconConfigError, match="not in the configured ratios"):
    ok.check_ratio(16)
  # Official config.json fields round-trip.
  hf = ok.replace(sink_size=1, ratio_mix="adapt-1024").to_hf()
  assert hf["beacon_ratio"] == [2, 4, 8] and hf["beacon_ratio_mix"] == "adapt-1024"
  assert BeaconConfig.from_hf(hf) == ok.replace(sink_size=1, ratio_mix="adapt-1024")
  assert BeaconConfig.from_hf(hf, beacon_ratio=[4]).ratios == (4,)


def test_adapt_ratio_spec_numbers():
  # docs/beacon.md §1: Qwen2-7B, P = 32768, W = 2048: r=2 covers 63,488, r=4 124,928, r=8 247,808.
  pick = lambda n: adapt_ratio([2, 4, 8], n + 1024, 2048, 32768)  # noqa: E731
  assert pick(62464) == 2 and pick(62465) == 4
  assert pick(124928 - 1024) == 4 and pick(124928 - 1023) == 8
  assert pick(10**7) == 8  # nothing qualifies: the largest ratio
  assert adapt_ratio([0, 2, 4], 1000, 2048, 32768) == 0
  # Through the planner: tiny P = 512, W = 64, adapt-16 -> max_len(2) = 960.
  bcfg = BeaconConfig(window=64, stride=64, ratios=(2, 4, 8), ratio_mix="adapt-16")
  planner = Planner(bcfg, VOCAB, 512, 10**6)
  for n, want in ((944, 2), (945, 4)):
    steps, st = planner.plan_row(RowState(), np.full(n, 5))
    assert {s.ratio for s in steps} == {want}


def test_planner_spec_example():
  """docs/beacon.md §2.1: interleave, W = 8, r = 4, 10 prompt tokens, then one token per call."""
  planner = Planner(BeaconConfig(window=8, stride=8, ratios=(4,)), VOCAB, 512, 1000)
  steps, st = planner.plan_row(RowState(), np.arange(10) + 3)
  assert [s.alt.astype(int).tolist() for s in steps] == [[0, 0, 0, 0, 1, 0, 0, 0, 0, 1], [0, 0]]
  assert st.sizes == (0, 2, 2) and st.rem == 2
  layouts = []
  for t in range(6):
    (s,), st = planner.plan_row(st, [7])
    layouts.append(s.alt.astype(int).tolist())
  assert layouts[:2] == [[0], [0, 1]]  # token 1: rem 3; token 2: [r, B]
  assert layouts[5] == [0, 1] and st.sizes == (0, 4, 0)  # raw token 16 completes the window


def test_ratio_mix_step_random_rng():
  bcfg = BeaconConfig(window=8, stride=8, ratios=(2, 4, 8), ratio_mix="step-random")
  steps, _ = Planner(bcfg, VOCAB, 512, 1000).plan_row(RowState(), np.full(40, 5))
  rng = np.random.default_rng(42)
  assert [s.ratio for s in steps] == [int(rng.choice([2, 4, 8])) for _ in steps]
  seq = BeaconConfig(window=8, stride=8, ratios=(2, 4), ratio_mix="sequence")
  steps, _ = Planner(seq, VOCAB, 512, 1000).plan_row(RowState(), np.full(40, 5))
  assert [s.ratio for s in steps] == [2, 4, 2, 4, 2]


def test_step_expansion_layout_and_run(model):
  """docs/beacon.md §3.4: append + step-expansion, m = 0, r = 4: beacons at positions 4 and 9; raw
  tokens never see the window's beacons, so window 0's raw logits equal append + full-coverage's."""
  bcfg = BeaconConfig(window=8, stride=8, ratios=(4,), pos="append", attn="step-expansion")
  steps, _ = Planner(bcfg, VOCAB, 512, 1000).plan_row(RowState(), np.arange(8) + 3)
  assert steps[0].pos[8:].tolist() == [4, 9]
  cfg, params = model
  ids = _ids(40, 1)
  se = BeaconLM(cfg, bcfg.replace(window=16, stride=16), max_length=64)
  fc = BeaconLM(cfg, bcfg.replace(window=16, stride=16, attn="full-coverage"), max_length=64)
  a = se.forward(params, ids, collect_logits=True)
  b = fc.forward(params, ids, collect_logits=True)
  np.testing.assert_allclose(a.raw_logits[0][:16], b.raw_logits[0][:16], atol=1e-5)
  assert np.max(np.abs(np.asarray(a.raw_logits[0][16:] - b.raw_logits[0][16:]))) > 1e-4
  assert a.state.sizes()[0].tolist() == [0, 8, 8]


def test_scan_equals_steps(lm, model):
  _, params = model
  ids = _ids(75, 2)
  a = lm.forward(params, ids, labels=ids, collect_logits=True)
  b = lm.forward(params, ids, labels=ids, collect_logits=True, use_scan=False)
  np.testing.assert_allclose(a.raw_logits[0], b.raw_logits[0], atol=1e-5)
  np.testing.assert_allclose(a.next_logits, b.next_logits, atol=1e-5)
  np.testing.assert_allclose(a.loss, b.loss, atol=1e-6)
  m = a.state.memory_kv(0)
  np.testing.assert_allclose(m[0], b.state.memory_kv(0)[0], atol=1e-5)
  assert a.state.rows == b.state.rows


@pytest.fixture
def scan_traces(monkeypatch):
  """Traces of the compiled scan chunk: the jitted function calls ``scan_windows`` only while
  tracing, so each call of it here is one compile (cached programs are not traced again)."""
  from longjax.beacon import step as beacon_step
  traces = []
  real = beacon_step.scan_windows

  def counted(*args, **kwargs):
    traces.append(1)
    return real(*args, **kwargs)

  monkeypatch.setattr(beacon_step, "scan_windows", counted)
  return traces


@pytest.mark.parametrize("steps, expected", [
    (1, {0, 4, 8, 16, 32, 64}),  # powers of two
    # 4 per octave, but never a step below 8 (half the 20 query slots, as a power of two)
    (4, {0, 4, 8, 16, 24, 32, 40, 48})])
def test_prefill_compiles_once_per_memory_bucket(model, scan_traces, steps, expected):
  """The scan chunk compiles once per memory-size bucket (capped at the capacity):
  O(steps * log capacity) programs for any number of windows, none for a new length whose
  buckets were already used."""
  cfg, params = model
  lm = BeaconLM(cfg, BCFG, max_length=512, scan_chunk=4, memory_bucket_min=4,
                memory_bucket_steps=steps)
  assert lm.schedule.q_slots == 20
  from longjax.beacon import model as beacon_model
  beacon_model.scan_jit.clear_cache()  # count this case's compiles only
  before = len(scan_traces)
  used = set()
  for n_windows in (2, 5, 11):  # 3, 6 and 12 calls (the last window partial)
    out = lm.forward(params, _ids(16 * n_windows + 5, n_windows))
    assert out.state.sizes()[0].tolist() == [0, 4 * n_windows, 6]
    used |= set(out.mem_buckets)
  # memory before call s is 4 s beacons (0 .. 44)
  assert used == expected
  assert len(scan_traces) - before == len(used)
  assert used <= set(lm.schedule.bucket_sizes())
  assert len(lm.schedule.bucket_sizes()) <= steps * int(np.ceil(np.log2(lm.capacity))) + 2
  before = len(scan_traces)
  out = lm.forward(params, _ids(16 * 9 + 3, 9))  # same buckets: no new compile
  assert set(out.mem_buckets) <= used
  assert len(scan_traces) == before


def test_one_step_calls_take_the_smallest_slot_bucket(model):
  """A fed token runs in the one-token bucket (it and a beacon), a few tokens in the decode
  bucket, more in all query slots; the buckets compute the same thing."""
  cfg, params = model
  lm = BeaconLM(cfg, BCFG, max_length=256)  # window 16, ratio 4 (interleave)
  sch = lm.schedule
  assert (sch.token_slots, sch.decode_slots, sch.q_slots) == (2, 8, 20)
  assert [sch.step_slots(n) for n in (1, 2, 3, 8, 9)] == [2, 2, 8, 8, 20]
  state = lm.forward(params, _ids(21, 3)).state  # 5 raw tokens into the second window
  feed = _ids(5, 4)
  rows = state.rows
  assert sch.call([feed[:1]], None, None, rows, False, None, 0).q_slots == 2
  assert sch.call([feed], None, None, rows, False, None, 0).q_slots == 8  # 5 raw + 1 beacon
  assert sch.call([_ids(12, 5)], None, None, rows, False, None, 0).q_slots == 20
  at_once = lm.forward(params, feed, state=state)
  one_by_one = state
  for t in feed:
    out = lm.forward(params, [t], state=one_by_one)
    one_by_one = out.state
  np.testing.assert_allclose(out.next_logits, at_once.next_logits, atol=1e-5)
  np.testing.assert_allclose(one_by_one.k, at_once.state.k, atol=1e-5)


def test_memory_bucket_steps_below_one_is_refused(model):
  cfg, _ = model
  with pytest.raises(ValueError, match=r"memory_bucket_steps must be >= 1 .*got 0: pass 1"):
    BeaconLM(cfg, BCFG, max_length=512, memory_bucket_steps=0)


def test_program_cache_skips_tracing_and_survives_a_bad_file(model, scan_traces, tmp_path,
                                                              monkeypatch):
  """With the program cache on, the first run exports each window program; a new process (here:
  the in-memory table cleared) deserializes them without tracing ``scan_windows`` and gets the
  same outputs. A corrupt file is re-exported; calls under jit (tracers) bypass the cache."""
  from longjax.runtime import program_cache
  cfg, params = model
  monkeypatch.setattr(program_cache, "_LOADED", {})
  monkeypatch.setattr(program_cache, "_DIR", None)
  lm = BeaconLM(cfg, BCFG, max_length=512, scan_chunk=4, memory_bucket_min=4)
  ids = _ids(16 * 5 + 5, 5)
  ref = lm.forward(params, ids)
  ref_steps = lm.forward(params, ids, use_scan=False)
  program_cache.enable(tmp_path)
  lm.forward(params, ids)
  lm.forward(params, ids, use_scan=False)
  files = sorted(tmp_path.glob("*" + program_cache.SUFFIX))
  assert len([f for f in files if f.name.startswith("beacon_scan-")]) == len(set(ref.mem_buckets))
  assert any(f.name.startswith("beacon_step-") for f in files)
  program_cache._LOADED.clear()
  before = len(scan_traces)
  out = lm.forward(params, ids)
  out_steps = lm.forward(params, ids, use_scan=False)
  assert len(scan_traces) == before, "a cached program was traced again"
  np.testing.assert_allclose(out.next_logits, ref.next_logits, rtol=0, atol=1e-6)
  np.testing.assert_allclose(out.state.k, ref.state.k, rtol=0, atol=1e-6)
  np.testing.assert_allclose(out_steps.next_logits, ref_steps.next_logits, rtol=0, atol=1e-6)
  files[0].write_bytes(b"not a program")
  program_cache._LOADED.clear()
  out = lm.forward(params, ids)
  np.testing.assert_allclose(out.next_logits, ref.next_logits, rtol=0, atol=1e-6)
  assert files[0].read_bytes() != b"not a program"  # re-exported
  traced = jax.jit(lambda p: lm.forward(p, ids).next_logits)(params)
  np.testing.assert_allclose(traced, ref.next_logits, rtol=0, atol=1e-6)


def test_prefill_compiles_once_without_buckets(model, scan_traces):
  cfg, params = model
  lm = BeaconLM(cfg, BCFG, max_length=512, scan_chunk=4, memory_buckets=False)
  before = len(scan_traces)
  for n_windows in (2, 5, 11):  # 3, 6 and 12 calls (the last window partial): 1, 2, 3 chunks
    out = lm.forward(params, _ids(16 * n_windows + 5, n_windows))
    assert out.state.sizes()[0].tolist() == [0, 4 * n_windows, 6]
    assert set(out.mem_buckets) == {lm.capacity}
  assert len(scan_traces) - before == 1


def test_memory_buckets_equal_full_buffer(model):
  """Attending over the bucket instead of the whole buffer changes nothing (prefill with a
  partial window, sink, labels, then decode steps whose memory crosses buckets)."""
  cfg, params = model
  bcfg = BCFG.replace(sink_size=2)
  a_lm = BeaconLM(cfg, bcfg, max_length=256, scan_chunk=3, memory_bucket_min=8)
  b_lm = BeaconLM(cfg, bcfg, max_length=256, scan_chunk=3, memory_buckets=False)
  ids = _ids(101, 11)
  a = a_lm.forward(params, ids, labels=ids, collect_logits=True)
  b = b_lm.forward(params, ids, labels=ids, collect_logits=True)
  assert max(a.mem_buckets) < a_lm.capacity and len(set(a.mem_buckets)) > 2
  np.testing.assert_allclose(a.raw_logits[0], b.raw_logits[0], atol=1e-5)
  np.testing.assert_allclose(a.loss, b.loss, atol=1e-6)
  np.testing.assert_allclose(a.state.k, b.state.k, atol=1e-5)
  sa, sb = a.state, b.state
  for t in _ids(12, 12):
    la, sa = a_lm.step(params, sa, [t])
    lb, sb = b_lm.step(params, sb, [t])
    np.testing.assert_allclose(la, lb, atol=1e-5)
  assert sa.rows == sb.rows


def test_batched_equals_unbatched(model):
  cfg, params = model
  lm = BeaconLM(cfg, BCFG.replace(sink_size=1), max_length=256)
  prompts = [_ids(53, 3).tolist(), _ids(9, 4).tolist(), _ids(32, 5).tolist()]
  batched = longjax.generate(lm, params, prompts, max_new_tokens=14, return_logits=True)
  for i, p in enumerate(prompts):
    single = longjax.generate(lm, params, p, max_new_tokens=14, return_logits=True)
    assert batched.tokens[i] == single.tokens[0]
    np.testing.assert_allclose(batched.logits[i], single.logits[0], atol=1e-4)
    assert batched.state.rows[i] == single.state.rows[0]


def test_generated_tokens_are_compressed(lm, model):
  """Feeding generated tokens one by one equals feeding them as part of the prompt."""
  _, params = model
  prompt = _ids(20, 6).tolist()
  out = longjax.generate(lm, params, prompt, max_new_tokens=20)
  toks = out.tokens[0]
  assert out.state.rows[0].fed == 20 + 19  # the last generated token is never fed back
  whole = lm.forward(params, prompt + toks[:-1])
  np.testing.assert_allclose(whole.state.sizes(), out.state.sizes())
  np.testing.assert_allclose(whole.state.memory_kv(0)[0], out.state.memory_kv(0)[0], atol=1e-4)


def test_multi_turn_reuses_memory(lm, model):
  _, params = model
  turn1 = _ids(70, 7).tolist()
  out1 = longjax.generate(lm, params, turn1, max_new_tokens=6)
  question = _ids(11, 8).tolist()
  resumed = lm.resume(out1.state, carry_tokens=[out1.tokens[0][-1:]])
  out2 = longjax.generate(resumed, params, question, max_new_tokens=5, return_logits=True)
  # Only the new tokens were fed; the result equals encoding the whole conversation at once.
  assert out2.state.rows[0].fed == 70 + 6 + 11 + 4
  whole = lm.forward(params, turn1 + out1.tokens[0] + question)
  np.testing.assert_allclose(out2.logits[0][0], whole.next_logits[0], atol=1e-4)


def test_sampling_and_stop_ids(lm, model):
  _, params = model
  prompt = _ids(30, 9).tolist()
  kw = dict(max_new_tokens=8, temperature=0.8, top_k=20, top_p=0.9)
  a = longjax.generate(lm, params, prompt, seed=3, **kw)
  b = longjax.generate(lm, params, prompt, seed=3, **kw)
  assert a.tokens == b.tokens and len(a.tokens[0]) == 8
  greedy = longjax.generate(lm, params, prompt, max_new_tokens=8)
  stop = greedy.tokens[0][2]
  stopped = longjax.generate(lm, params, prompt, max_new_tokens=8, stop_ids=[stop])
  assert stopped.tokens[0] == greedy.tokens[0][:greedy.tokens[0].index(stop) + 1]


def test_bad_inputs(lm, model, tmp_path):
  cfg, params = model
  with pytest.raises(ValueError, match="empty prompt"):
    longjax.generate(lm, params, [], max_new_tokens=2)
  with pytest.raises(ValueError, match="empty input"):
    lm.forward(params, [[]])
  with pytest.raises(CapacityError, match=r"max_length=256.*BeaconLM\(\.\.\., max_length=304\)"):
    longjax.generate(lm, params, _ids(300).tolist(), max_new_tokens=4)
  with pytest.raises(BeaconConfigError, match="ratio 8 is not in the configured ratios"):
    lm.forward(params, _ids(10), ratio=8)
  with pytest.raises(BeaconConfigError, match="not in the configured ratios"):
    BeaconLM(cfg, BCFG, ratio=2)
  plain = tiny_cfg(alt=())
  with pytest.raises(BeaconSetupError, match="init='official'"):
    BeaconLM(plain, BCFG)
  save_hf(tmp_path / "plain", plain, tiny_params(plain))
  with pytest.raises(CheckpointError, match="no init rule"):
    load_beacon(tmp_path / "plain")


@pytest.mark.parametrize("family", ["qwen2", "llama", "mistral"])
def test_convert_init_and_roundtrip(family, tmp_path):
  """Missing beacon tensors are initialised as the official from_pretrained does; export keeps
  the official names and beacon_* fields; re-import is exact. Qwen2 has biases, LLaMA does not."""
  plain = tiny_cfg(family, alt=())
  p = tiny_params(plain, seed=1)
  save_hf(tmp_path / "plain", plain, p)
  bcfg_over = dict(window=16, stride=16, ratios=(4,), embed_init="bos", param=("q", "k", "v", "o"))
  cfg, bcfg, params = load_beacon(tmp_path / "plain", init="official", **bcfg_over)
  attn = params["layers"]["attn"]
  for proj in "qkvo":
    for leaf, value in attn[f"{proj}_proj"].items():
      np.testing.assert_array_equal(attn[f"alt_{proj}_proj"][leaf], value)
  assert ("bias" in attn["alt_q_proj"]) == (family == "qwen2")
  np.testing.assert_array_equal(params["alt_embedding"][0], params["embedding"][cfg.bos_token_id])
  save_beacon(tmp_path / "beacon", cfg, bcfg, params)
  names = set(shard_map(tmp_path / "beacon"))
  assert "model.beacon_embed_tokens.weight" in names
  assert "model.layers.1.self_attn.beacon_o_proj.weight" in names
  assert ("model.layers.0.self_attn.beacon_v_proj.bias" in names) == (family == "qwen2")
  hf = json.loads((tmp_path / "beacon" / "config.json").read_text())
  assert hf["beacon_param"] == ["q", "k", "v", "o"] and hf["beacon_window"] == 16
  cfg2, bcfg2, params2 = load_beacon(tmp_path / "beacon")  # no init needed now
  assert bcfg2 == bcfg
  jax.tree.map(np.testing.assert_array_equal, params, params2)


def test_gradient_reaches_first_window(model):
  """Window 3's loss reaches window 1's beacon projections through the (undetached) memory."""
  cfg, params = model
  lm = BeaconLM(cfg, BCFG, max_length=128)
  ids = _ids(64, 11)
  labels = np.full(64, -100)
  labels[49:64] = ids[49:64]  # targets of window 3's tokens only (labels are shifted by one)

  def split_loss(p1, p2):
    first = lm.forward(p1, ids[:16])  # window 1 with its own copy of the weights
    out = lm.forward(p2, ids[16:], labels=labels[16:], state=first.state)
    return out.loss

  g1, g2 = jax.grad(split_loss, argnums=(0, 1))(params, params)
  attn1 = g1["layers"]["attn"]
  for name in ("alt_q_proj", "alt_k_proj", "alt_v_proj"):
    assert float(jnp.max(jnp.abs(attn1[name]["kernel"]))) > 0, name
  assert float(jnp.max(jnp.abs(g1["alt_embedding"]))) > 0
  # Consistency: the two weight copies' gradients add up to the single-call gradient.
  g = jax.grad(lambda p: lm.forward(p, ids, labels=labels).loss)(params)
  jax.tree.map(lambda a, b, c: np.testing.assert_allclose(a + b, c, atol=1e-5, rtol=1e-4),
               g1, g2, g)


def test_sink_quirk_short_prompt():
  """docs/beacon.md §4.4: with sink 1 and a prompt < W the sink is re-captured from every call's
  first entry until the first window completes (the official quirk, kept for parity)."""
  planner = Planner(BeaconConfig(window=8, stride=8, ratios=(4,), sink_size=1), VOCAB, 512, 1000)
  steps, st = planner.plan_row(RowState(), [5, 6, 7, 8, 9])
  captures = [steps[0].capture]
  for t in range(5):
    (s,), st = planner.plan_row(st, [10 + t])
    captures.append(s.capture)
  assert captures == [True, True, True, True, False, False]  # raw token 8 completes window 0
  assert st.sizes == (1, 2, 2)


def test_resume_refuses_row_count_mismatch(lm, model):
  """Reliability: more prompts (or carry rows) than state rows used to be zipped away silently,
  answering one row's question from another row's memory."""
  _, params = model
  out1 = longjax.generate(lm, params, _ids(40, 3).tolist(), max_new_tokens=2)
  two = [_ids(5, 4).tolist(), _ids(6, 5).tolist()]
  for carry in (None, [out1.tokens[0][-1:]]):  # the probe: one carry row, two prompts
    with pytest.raises(CapacityError, match="2 prompts for a state of 1 rows"):
      longjax.generate(lm.resume(out1.state, carry_tokens=carry), params, two, max_new_tokens=2)
  with pytest.raises(CapacityError, match="carry_tokens has 2 rows, the state 1"):
    longjax.generate(lm.resume(out1.state, carry_tokens=[[1], [2]]), params, two[0],
                     max_new_tokens=2)


def test_mistral_beacon_ignores_sliding_window_like_the_official_code(caplog):
  """The official beacon Mistral code never applies sliding_window; PlainLM keeps it."""
  cfg = tiny_cfg("mistral", sliding_windows=(20, 20))
  params = tiny_params(cfg)
  ids = _ids(100, 11)
  with caplog.at_level("WARNING", logger="longjax.beacon"):
    windowed = BeaconLM(cfg, BCFG, max_length=256).forward(params, ids).next_logits
  assert "ignores the model's sliding window 20" in caplog.text
  full = BeaconLM(cfg.replace(sliding_windows=None), BCFG, max_length=256).forward(
      params, ids).next_logits
  np.testing.assert_array_equal(np.asarray(windowed), np.asarray(full))
  # ... while the plain model keeps its window (memory + window here exceed 20 tokens)
  plain = lambda c: longjax.generate(longjax.PlainLM(c), params, ids.tolist(), max_new_tokens=1,  # noqa: E731
                                     return_logits=True).logits[0][0]
  assert np.abs(plain(cfg) - plain(cfg.replace(sliding_windows=None))).max() > 1e-3
