"""Activation Beacon against the official reference outputs (``<fixtures>/beacon/<case>/``).

The fixtures root is ``LONGJAX_FIXTURES`` or ``<repo>/../shared/fixtures``. Every folder under
``<root>/beacon/`` with a ``case.json`` is one test case (the test id is the folder name); its
settings come from its own files. Decoding is teacher-forced (fixtures README).
"""
from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import fixtures_root
from longjax.beacon import BeaconLM, load_beacon
from longjax.convert.hf import hf_tensors


BEACON = fixtures_root() / "beacon"
CASES = sorted(p.name for p in BEACON.glob("*/") if (p / "case.json").exists()) \
    if BEACON.is_dir() else []
NO_CASES = f"no beacon fixture cases under {BEACON} (set LONGJAX_FIXTURES to a fixtures root)"


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
  if not CASES:
    pytest.skip(NO_CASES)
  d = tmp_path_factory.mktemp("beacon_ckpt")
  (d / "config.json").symlink_to(BEACON / "config.json")
  (d / "model.safetensors").symlink_to(BEACON / "weights.safetensors")
  return d


def case_setup(hf_dir, case):
  info = json.loads((BEACON / case / "case.json").read_text())
  cfg, bcfg, params = load_beacon(hf_dir, **info["beacon_config"])
  own = BEACON / case / "input_ids.npy"  # a case may bring its own input; else the shared one
  ids = np.load(own if own.exists() else BEACON / "input_ids.npy")
  return info, cfg, bcfg, jax.tree.map(jnp.asarray, params), ids


def max_length(case, ids) -> int:
  """The case's own capacity: its input plus the tokens it generates (so a longer case runs
  without changing this file)."""
  return len(ids) + len(np.load(BEACON / case / "gen_ids.npy"))


def _max_abs(a, b):
  return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))


def _official_mask(step, bcfg):
  """The mask the planned step implies: rows = inputs, cols = [memory ; inputs] (official order)."""
  mem_order = np.concatenate([np.full(step.sink_len + step.beacon_len, -1),
                              2 * np.arange(step.raw_len)])
  k_order = np.concatenate([mem_order, step.order])
  ok = k_order[None, :] <= step.order[:, None]
  if bcfg.attn == "step-expansion":  # raw tokens never see this window's beacons
    k_beacon = np.concatenate([np.zeros(step.mem_size, bool), step.alt])
    ok &= ~((~step.alt)[:, None] & k_beacon[None, :])
  return ok


@pytest.mark.parametrize("case", CASES or [pytest.param("none", marks=pytest.mark.skip(NO_CASES))])
def test_fixture_case(hf_dir, case):
  check_case(hf_dir, case, impl="auto")


def _pallas_cases():
  """``main`` with the Pallas kernels (interpret mode) in the default run, the others marked slow."""
  if not CASES:
    return [pytest.param("none", marks=pytest.mark.skip(NO_CASES))]
  first = "main" if "main" in CASES else CASES[0]
  return [c if c == first else pytest.param(c, marks=pytest.mark.slow) for c in CASES]


@pytest.mark.parametrize("case", _pallas_cases())
def test_fixture_case_pallas_interpret(hf_dir, case, monkeypatch):
  monkeypatch.setenv("LONGJAX_PALLAS_INTERPRET", "1")
  check_case(hf_dir, case, impl="pallas")


def check_case(hf_dir, case, impl):
  info, cfg, bcfg, params, ids = case_setup(hf_dir, case)
  ref = BEACON / case
  lm = BeaconLM(cfg, bcfg, max_length=max_length(case, ids), impl=impl)

  # 1. Forward (empty memory): every raw token's logits, the returned (last call) logits, memory.
  out = lm.forward(params, ids, collect_logits=True)
  raw_all = np.load(ref / "logits_raw_all.npy")
  final = np.load(ref / "logits_final.npy")
  assert _max_abs(out.raw_logits[0], raw_all) < 1e-4
  assert _max_abs(out.raw_logits[0][-final.shape[0]:], final) < 1e-4
  assert _max_abs(out.next_logits[0], final[-1]) < 1e-4
  if "memory_after_prefill" in info:
    mem = info["memory_after_prefill"]
    assert out.state.sizes()[0].tolist() == [mem["sink"], mem["beacon"], mem["raw"]]
  if "beacon_sizes_forward" in info:
    assert [s.n - int(np.sum(~s.alt)) for s in out.steps[0]] == info["beacon_sizes_forward"]

  # Per-call layout against steps.json / masks.npz (ids with beacons, memory size, positions, mask).
  steps = json.loads((ref / "steps.json").read_text())
  masks = np.load(ref / "masks.npz")
  fwd = [s for s in steps if s["phase"] == "forward"]
  assert len(fwd) == len(out.steps[0])
  for rec, st in zip(fwd, out.steps[0]):
    assert np.where(st.alt, -1, st.ids).tolist() == rec["ids"]
    assert st.mem_size == rec["mem_size"]
    assert (np.arange(st.mem_size).tolist() + st.pos.tolist()) == rec["position_ids"]
    np.testing.assert_array_equal(_official_mask(st, bcfg), masks[f"forward_{rec['step']}"])
    if rec.get("ratio") is not None:
      assert st.ratio == rec["ratio"]

  # 2. Teacher-forced decoding: each call's logits, the greedy token, the per-call layout.
  gen_ids = np.load(ref / "gen_ids.npy")
  gen_logits = np.load(ref / "gen_logits.npy")
  gen_rec = [s for s in steps if s["phase"] == "generate"]
  logits, state = out.next_logits, out.state
  worst = 0.0
  for t in range(len(gen_ids)):
    worst = max(worst, _max_abs(logits[0], gen_logits[t]))
    assert int(jnp.argmax(logits[0])) == int(gen_ids[t]), f"greedy token {t}"
    o = lm.forward(params, [[int(gen_ids[t])]], state=state)
    (st,) = o.steps[0]
    assert np.where(st.alt, -1, st.ids).tolist() == gen_rec[t]["ids"]
    assert st.mem_size == gen_rec[t]["mem_size"]
    np.testing.assert_array_equal(_official_mask(st, bcfg), masks[f"generate_{gen_rec[t]['step']}"])
    logits, state = o.next_logits, o.state
  assert worst < 1e-4
  if "memory_after_generation" in info:
    mem = info["memory_after_generation"]
    assert state.sizes()[0].tolist() == [mem["sink"], mem["beacon"], mem["raw"]]

  # 3. Eval loss (fresh memory, labels = input_ids, shifted once over the whole stream).
  loss = lm.loss(params, ids, training=False)
  assert abs(float(loss) - float(np.load(ref / "loss_eval.npy"))) < 1e-5


@pytest.mark.parametrize("case", [c for c in CASES if (BEACON / c / "loss_train.npy").exists()]
                         or [pytest.param("none", marks=pytest.mark.skip(NO_CASES))])
def test_fixture_training(hf_dir, case):
  """Training-mode loss (no beacons in the last window) and beacon gradients (full BPTT)."""
  from safetensors.numpy import load_file
  info, cfg, bcfg, params, ids = case_setup(hf_dir, case)
  ref = BEACON / case
  lm = BeaconLM(cfg, bcfg, max_length=max_length(case, ids), training=True)
  loss, grads = jax.value_and_grad(lambda p: lm.loss(p, ids))(params)
  assert abs(float(loss) - float(np.load(ref / "loss_train.npy"))) < 1e-5
  if (ref / "grads.safetensors").exists():
    want = load_file(str(ref / "grads.safetensors"))
    got = dict(hf_tensors(cfg, grads))
    for name, g in want.items():
      tol = 1e-4 * max(1.0, float(np.max(np.abs(g))))
      assert _max_abs(got[name], g) < tol, name


@pytest.mark.parametrize("case", (["main"] if "main" in CASES else CASES[:1])
                         or [pytest.param("none", marks=pytest.mark.skip(NO_CASES))])
def test_fixture_bf16(hf_dir, case):
  """bf16 compute runs and stays within bf16 tolerance of the fp32 reference."""
  info, cfg, bcfg, params, ids = case_setup(hf_dir, case)
  lm = BeaconLM(cfg.replace(dtype="bfloat16"), bcfg, max_length=max_length(case, ids))
  out = lm.forward(params, ids, collect_logits=True)
  raw_all = np.load(BEACON / case / "logits_raw_all.npy")
  err = _max_abs(out.raw_logits[0], raw_all)
  scale = float(np.max(np.abs(raw_all)))
  assert out.state.k.dtype == jnp.bfloat16
  assert err < 0.05 * scale, (err, scale)
  # Next-token choice agrees on nearly all positions.
  agree = np.mean(np.argmax(np.asarray(out.raw_logits[0]), -1) == np.argmax(raw_all, -1))
  assert agree > 0.9, agree
  # bf16 parameters and compute: eval loss within 1e-2 of the fp32 reference.
  lm16 = BeaconLM(cfg.replace(dtype="bfloat16", param_dtype="bfloat16"), bcfg,
                  max_length=max_length(case, ids))
  p16 = jax.tree.map(lambda x: x.astype(jnp.bfloat16), params)
  loss = lm16.loss(p16, ids, training=False)
  assert abs(float(loss) - float(np.load(BEACON / case / "loss_eval.npy"))) < 1e-2
