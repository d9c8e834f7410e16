"""Beacon training objectives: distillation from the full-attention base (KL(teacher || student)
on every raw token after the first window, the teacher computed inside the step), the inference
layout, per-source objectives. Tiny random model; references are plain jnp."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from test_beacon import VOCAB, tiny_cfg, tiny_params

from longjax.beacon import BeaconLM
from longjax.beacon.config import BeaconConfig
from longjax.beacon.model import frozen_base
from longjax.data.pipeline import Dataset, split_objectives
from longjax.data.sources import DataError
from longjax.models.decoder import Decoder
from longjax.beacon.task import BeaconTask, DistillSettings, token_weights

W = 16


@pytest.fixture(scope="module")
def model():
  cfg = tiny_cfg(num_layers=2)
  return cfg, jax.tree.map(jnp.asarray, tiny_params(cfg))


def _task(cfg, bcfg, *, layout="inference", objective="distill", alpha=0.0, top_k=VOCAB,
          base=1.0):
  return BeaconTask(cfg, bcfg, max_length=8 * W, seed=0, layout=layout, remat=False,
                    distill=DistillSettings(top_k=top_k, alpha=alpha, base_weight=base),
                    default_objective=objective)


def _loss(task, params, docs, objectives=None):
  ds = Dataset([np.asarray(d, np.int32) for d in docs], [None] * len(docs), {}, objectives)
  batch = task.prepare(ds, np.arange(len(docs)), step=0)
  ls, lc = task.loss(frozen_base(params), jax.tree.map(jnp.asarray, batch["plans"]))
  return ls, lc


def test_distill_is_zero_when_the_student_sees_what_the_teacher_sees(model):
  """Ratio 0 keeps every raw activation as memory: the beacon model is full attention, so
  KL(teacher || student) over the whole vocabulary is 0 on every scored token."""
  cfg, params = model
  ids = np.random.default_rng(1).integers(3, VOCAB, 3 * W + 5)
  for top_k in (VOCAB, 5):  # 5: the top 5 and one class for the rest, still 0
    ls, lc = _loss(_task(cfg, BeaconConfig(window=W, stride=W, ratios=(0,)), top_k=top_k),
                   params, [ids])
    assert int(lc[0]) == len(ids) - W  # every token after the first window is scored
    assert abs(float(ls[0])) < 1e-4 * float(lc[0]), (top_k, float(ls[0]))
  # ... and it is not 0 once the memory compresses (the test can fail)
  ls4, lc4 = _loss(_task(cfg, BeaconConfig(window=W, stride=W, ratios=(4,))), params, [ids])
  assert float(ls4[0]) / float(lc4[0]) > 1e-2


def _reference_kl(cfg, bcfg, params, ids, alpha=0.0, top_k=VOCAB, base=1.0):
  """Dense jnp reference: student logits of every raw token from the prefill path (inference
  layout), teacher logits from the plain decoder on the whole document, KL over the vocabulary;
  with ``top_k`` < V, KL over the teacher's top k ids plus one class for all the others."""
  lm = BeaconLM(cfg, bcfg, max_length=8 * W)
  out = lm.forward(params, ids, collect_logits=True, training=False)
  q = jax.nn.log_softmax(out.raw_logits[0], axis=-1)  # row i predicts token i + 1
  pos = jnp.arange(len(ids))[None]
  t_logits, _ = Decoder(cfg).apply({"params": jax.lax.stop_gradient(params)}, ids[None], pos)
  p = jax.nn.log_softmax(t_logits[0], axis=-1)
  if top_k < VOCAB:  # coarsen both distributions to the top k + "the rest"
    top = np.argsort(-np.asarray(p), axis=-1)[:, :top_k]
    member = np.zeros(p.shape, bool)
    np.put_along_axis(member, top, True, axis=-1)
    rest = lambda x: jnp.log(jnp.sum(jnp.where(member, 0.0, jnp.exp(x)), -1))  # noqa: E731
    kl = (jnp.sum(jnp.where(member, jnp.exp(p) * (p - q), 0.0), axis=-1)
          + jnp.exp(rest(p)) * (rest(p) - rest(q)))[W - 1:len(ids) - 1]
  else:
    kl = jnp.sum(jnp.exp(p) * (p - q), axis=-1)[W - 1:len(ids) - 1]  # targets W .. T-1
  if alpha:
    trunc = Decoder(cfg.replace(sliding_windows=(W,) * cfg.num_layers))
    lt, _ = trunc.apply({"params": params}, ids[None], pos)
    lt = jax.nn.log_softmax(lt[0], axis=-1)
    nxt = jnp.asarray(ids[1:])[:, None]
    w = token_weights(jnp.take_along_axis(p[:-1], nxt, -1)[:, 0],
                      jnp.take_along_axis(lt[:-1], nxt, -1)[:, 0], alpha, base)
    kl = kl * w[W - 1:]
  return jnp.sum(kl) / kl.shape[0]


@pytest.mark.parametrize("alpha,top_k,base", [(0.0, VOCAB, 1.0), (0.7, VOCAB, 1.0), (0.0, 5, 1.0),
                                              (0.7, 5, 1.0), (0.7, 5, 0.0)])
def test_distill_loss_and_gradient_match_a_dense_reference(model, alpha, top_k, base):
  """Top k < V: the teacher's mass outside its top k is one more class (distill.rest="bucket"),
  compared with the student's mass there. Base weight 0: only the tokens the far context helps."""
  cfg, params = model
  bcfg = BeaconConfig(window=W, stride=W, ratios=(4,))
  ids = np.random.default_rng(2).integers(3, VOCAB, 3 * W + 9)
  task = _task(cfg, bcfg, alpha=alpha, top_k=top_k, base=base)

  def ours(p):
    ls, lc = _loss(task, p, [ids])
    return ls[0] / lc[0]

  def ref(p):
    return _reference_kl(cfg, bcfg, frozen_base(p), ids, alpha, top_k, base)

  a, ga = jax.value_and_grad(ours)(params)
  b, gb = jax.value_and_grad(ref)(params)
  np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
  for x, y in zip(jax.tree.leaves(ga), jax.tree.leaves(gb)):
    np.testing.assert_allclose(x, y, rtol=1e-3, atol=1e-6)
  assert max(float(jnp.abs(x).max()) for x in jax.tree.leaves(ga)) > 0


def test_answer_weight_counts_the_answer_span_that_many_times(model):
  """``distill.answer_weight`` multiplies the KL of the answer-span targets (the record's output)
  and nothing else: the dense reference with those terms weighted, value and gradient; the
  first window's answer tokens stay unscored, and at weight 1 the loss is the plain one."""
  cfg, params = model
  bcfg = BeaconConfig(window=W, stride=W, ratios=(4,))
  ids = np.random.default_rng(5).integers(3, VOCAB, 3 * W + 9)
  ans = np.zeros(len(ids), bool)
  ans[-6:] = True  # the answer: the last 6 tokens
  ans[3] = True  # inside the first window: the teacher sees what the student sees, unscored
  weight = 7.0

  def ours(p, w):
    task = BeaconTask(cfg, bcfg, max_length=8 * W, seed=0, layout="inference", remat=False,
                      distill=DistillSettings(top_k=VOCAB, answer_weight=w),
                      default_objective="distill")
    ds = Dataset([ids.astype(np.int32)], [ans], {}, None)
    batch = task.prepare(ds, np.arange(1), step=0)
    ls, lc = task.loss(frozen_base(p), jax.tree.map(jnp.asarray, batch["plans"]))
    return ls[0] / lc[0]

  def ref(p):
    lm = BeaconLM(cfg, bcfg, max_length=8 * W)
    out = lm.forward(frozen_base(p), ids, collect_logits=True, training=False)
    q = jax.nn.log_softmax(out.raw_logits[0], axis=-1)
    t_logits, _ = Decoder(cfg).apply({"params": jax.lax.stop_gradient(frozen_base(p))},
                                     ids[None], jnp.arange(len(ids))[None])
    pt = jax.nn.log_softmax(t_logits[0], axis=-1)
    kl = jnp.sum(jnp.exp(pt) * (pt - q), axis=-1)[W - 1:len(ids) - 1]  # targets W .. T-1
    w = jnp.where(jnp.asarray(ans[W:]), weight, 1.0)
    return jnp.sum(kl * w) / kl.shape[0]

  a, ga = jax.value_and_grad(ours)(params, weight)
  b, gb = jax.value_and_grad(ref)(params)
  np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
  for x, y in zip(jax.tree.leaves(ga), jax.tree.leaves(gb)):
    np.testing.assert_allclose(x, y, rtol=1e-3, atol=1e-6)
  plain = ours(params, 1.0)
  assert float(a) > 1.5 * float(plain)  # the weight changes the loss (the test can fail)
  np.testing.assert_allclose(plain, _reference_kl(cfg, bcfg, frozen_base(params), ids),
                             rtol=1e-4)


def test_token_weights_by_hand():
  w = token_weights(jnp.array([-1.0, -3.0, -0.5, -2.0]), jnp.array([-2.0, -1.0, -4.0, -2.0]), 0.5)
  # log p_full - log p_trunc = 1, -2, 3.5, 0 -> clipped 1, 0, 2, 0
  np.testing.assert_allclose(w, [1.5, 1.0, 2.0, 1.0])
  w0 = token_weights(jnp.array([-1.0, -3.0, -0.5, -2.0]), jnp.array([-2.0, -1.0, -4.0, -2.0]), 0.5,
                     0.0)  # base weight 0: a token the far context does not help weighs nothing
  np.testing.assert_allclose(w0, [0.5, 0.0, 1.0, 0.0])


def test_mixed_objectives_in_one_batch(model):
  """One batch of an ``lm`` row and a ``distill`` row: each row's loss is what its objective
  gives alone (the lm row: the plain next-token loss of the beacon model, every token)."""
  cfg, params = model
  bcfg = BeaconConfig(window=W, stride=W, ratios=(4,))
  rng = np.random.default_rng(3)
  a, b = rng.integers(3, VOCAB, 2 * W + 3), rng.integers(3, VOCAB, 2 * W + 3)
  task = _task(cfg, bcfg)
  ls, lc = _loss(task, params, [a, b], ["lm", "distill"])
  alone, n = _loss(task, params, [b])
  np.testing.assert_allclose(ls[1], alone[0], rtol=1e-5)
  assert int(lc[1]) == int(n[0])
  lm = BeaconLM(cfg, bcfg, max_length=8 * W)
  nll = lm.loss(params, a, training=False)
  np.testing.assert_allclose(ls[0] / lc[0], nll, rtol=1e-5)


def test_an_answer_source_scores_only_its_answer_in_a_distill_run(model):
  """``SOURCE@answer`` in a run whose data.loss_on is ``distill``: that row's loss is on its answer
  span alone, the same as in an answer run (it was once every token: the run's default decided)."""
  cfg, params = model
  bcfg = BeaconConfig(window=W, stride=W, ratios=(4,))
  rng = np.random.default_rng(4)
  a, b = rng.integers(3, VOCAB, 2 * W + 3), rng.integers(3, VOCAB, 2 * W + 5)
  ans = np.zeros(len(a), bool)
  ans[-5:] = True  # the answer and its EOS
  ds = Dataset([a.astype(np.int32), b.astype(np.int32)], [ans, None], {}, ["answer", "distill"])

  def loss(task, idx):
    batch = task.prepare(ds, np.asarray(idx), step=0)
    return task.loss(frozen_base(params), jax.tree.map(jnp.asarray, batch["plans"]))

  ls, lc = loss(_task(cfg, bcfg, objective="distill"), [0, 1])
  alone, n = loss(_task(cfg, bcfg, objective="answer"), [0])
  assert int(lc[0]) == int(n[0]) == 5
  np.testing.assert_allclose(ls[0], alone[0], rtol=1e-5)


def test_inference_layout_puts_beacons_in_the_last_window(model):
  cfg, _ = model
  bcfg = BeaconConfig(window=W, stride=W, ratios=(4,))
  ids = np.random.default_rng(4).integers(3, VOCAB, 2 * W - 3)
  ds = Dataset([ids.astype(np.int32)], [None], {})
  beacons = {}
  for layout in ("official", "inference"):
    plan = _task(cfg, bcfg, layout=layout, objective="lm").prepare(ds, np.arange(1), 0)["plans"]
    beacons[layout] = int(np.sum(np.asarray(plan.tokens) == cfg.vocab_size))
  assert beacons["official"] == W // 4  # the first window only
  assert beacons["inference"] == W // 4 + (W - 3) // 4


def test_source_objectives():
  assert split_objectives(["jsonl:a.jsonl@distill", "text:b", "jsonl:c@lm"]) == (
      ["jsonl:a.jsonl", "text:b", "jsonl:c"], ["distill", None, "lm"])
  assert split_objectives(["text:/x/me@host.org/a.txt"])[1] == [None]  # an '@' inside a path
  with pytest.raises(DataError, match="unknown suffix 'distil'"):
    split_objectives(["jsonl:a@distil"])


def test_source_suffixes_objective_and_ratio():
  from longjax.run_config.source_options import SourceOptions, SourceSpecError, parse
  assert parse("jsonl:a.jsonl@answer@ratio=8") == SourceOptions("jsonl:a.jsonl", "answer", 8)
  assert parse("jsonl:a.jsonl@ratio=32@distill") == SourceOptions("jsonl:a.jsonl", "distill", 32)
  assert parse("text:/x/me@host.org/a.txt@ratio=4") == SourceOptions("text:/x/me@host.org/a.txt",
                                                                     None, 4)
  for bad, msg in (("jsonl:a@ratio=8@ratio=4", "a second suffix 'ratio=8'"),
                   ("jsonl:a@lm@answer", "a second suffix 'lm'"),
                   ("jsonl:a@ratio=x", "an unknown suffix 'ratio=x'"),
                   ("jsonl:a@ratio=0", "ratio=0")):
    with pytest.raises(SourceSpecError, match=msg):
      parse(bad)


@pytest.mark.parametrize("objective", ["lm", "distill"])
def test_a_source_ratio_fixes_its_samples_ratio(model, objective):
  """Rows of a ``@ratio=N`` source train at N whatever ratio_mix draws; the others still draw
  (both ratios appear over steps, so the test can fail)."""
  cfg, _ = model
  bcfg = BeaconConfig(window=W, stride=W, ratios=(2, 8), ratio_mix="instance-random")
  ids = np.random.default_rng(5).integers(3, VOCAB, 3 * W).astype(np.int32)
  ds = Dataset([ids, ids], [None, None], {}, None, [8, None])
  task = _task(cfg, bcfg, objective=objective)
  per_window = {2: 3 * (W // 2), 8: 3 * (W // 8)}  # beacons in 3 full windows (inference layout)
  seen = [set(), set()]
  for step in range(12):
    plans = task.prepare(ds, np.arange(2), step)["plans"]
    plan = plans if objective == "lm" else plans["plan"]
    tok = np.asarray(plan.tokens)
    for row in range(2):
      n = int(np.sum(tok[:, row] == cfg.vocab_size))
      seen[row].add({v: k for k, v in per_window.items()}[n])
  assert seen[0] == {8} and seen[1] == {2, 8}


def test_source_ratio_and_objective_suffixes_are_checked_before_anything_loads():
  from configs import tiny_beacon, tiny_focus
  from longjax.run_config import ConfigError, from_config
  c = tiny_beacon.get_config()
  ratios = tuple(c.beacon.ratios)
  bad = max(ratios) * 2
  c.data.sources = f"jsonl:a.jsonl@answer@ratio={bad}"
  with pytest.raises(ConfigError, match=rf"@ratio={bad}: not one of beacon.ratios"):
    from_config(c)
  c.data.sources = f"jsonl:a.jsonl@answer@ratio={ratios[0]}"
  from_config(c)  # a configured ratio is fine
  c.data.sources = "jsonl:a.jsonl@answr"
  with pytest.raises(ConfigError, match="unknown suffix 'answr'"):
    from_config(c)
  f = tiny_focus.get_config()
  f.data.sources = "jsonl:a.jsonl@ratio=8"
  with pytest.raises(ConfigError, match="is for methods that compress windows"):
    from_config(f)
  f.data.sources = "jsonl:a.jsonl@distill"
  from_config(f)  # FocusLLM distills too (docs/focusllm.md §5.2)


def test_campaign_record_carries_the_started_from_asset(tmp_path):
  """An asset exported from a run that started from another asset (train.init_from) records the
  sum of both runs' steps and tokens and both recipes; a cut metrics line is skipped."""
  import json
  from longjax.ckpts import campaign
  prev = tmp_path / "asset"
  prev.mkdir()
  (prev / "beacon.json").write_text(json.dumps(dict(campaign=dict(
      steps=100, tokens=5000, runs=[dict(steps=100, tokens=5000, recipe={})]))))
  run = tmp_path / "run"
  run.mkdir()
  (run / "config.json").write_text(json.dumps(dict(
      beacon=dict(window=256, stride=128, ratios=[8]),
      data=dict(sources="jsonl:/x/prose.jsonl@distill"),
      train=dict(init_from=str(prev), layout="inference", lr=1e-4))))
  (run / "metrics.jsonl").write_text(
      "".join(json.dumps(dict(step=s, tokens=10 * s)) + "\n" for s in (1, 2, 3))
      + '{"step": 4, "tok')
  rec = campaign.record(run, 2)
  assert rec["steps"] == 102 and rec["tokens"] == 5000 + 10 + 20
  assert len(rec["runs"]) == 2 and rec["runs"][-1]["recipe"]["data"] == ["prose.jsonl@distill"]
  assert rec["runs"][-1]["recipe"]["layout"] == "inference"
  assert rec["runs"][-1]["recipe"]["beacon"]["stride"] == 128  # S < W is part of the recipe


def test_bad_objective_settings_are_refused_before_anything_loads():
  import ml_collections
  from configs import tiny_beacon
  from longjax.run_config import ConfigError, from_config
  for key, value, msg in (("data.loss_on", "distil", "use 'all'"),
                          ("train.layout", "inferense", "train.layout='inferense'")):
    c = tiny_beacon.get_config()
    sec, k = key.split(".")
    c[sec][k] = value
    with pytest.raises(ConfigError, match=msg):
      from_config(c)
  c = tiny_beacon.get_config()
  c.train.distill = ml_collections.ConfigDict(dict(top_k=0, alpha=0.0))
  with pytest.raises(ConfigError, match="top_k >= 1"):
    from_config(c)
  c.train.distill = ml_collections.ConfigDict(dict(top_k=8, alpha=0.0, rest="renormalize"))
  with pytest.raises(ConfigError, match="train.distill.rest must be 'bucket'"):
    from_config(c)
  c.train.distill = ml_collections.ConfigDict(dict(top_k=8, alpha=0.0, rest="bucket",
                                                   answer_weight=0.0))
  with pytest.raises(ConfigError, match="answer_weight > 0"):
    from_config(c)
  for alpha, base in ((0.0, 0.0), (0.0, 0.5), (1.0, -0.5)):  # no alpha to floor; a negative floor
    c.train.distill = ml_collections.ConfigDict(dict(top_k=8, alpha=alpha, rest="bucket",
                                                     base_weight=base))
    with pytest.raises(ConfigError, match="train.distill.base_weight="):
      from_config(c)
