"""Activation Beacon against the official reference outputs (``<fixtures>/beacon/<case>/``).

The fixtures root is ``LONGJAX_FIXTURES`` or ``<repo>/../shared/fixtures``. Every folder under
``<root>/beacon/`` with a ``case.json`` is one test case (the test id is the folder name); its
settings come from its own files. Decoding is teacher-forced (fixtures README).
"""
from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import fixtures_root
from longjax.beacon import BeaconLM, load_beacon
from longjax.ckpts.hf import hf_tensors


def beacon_cases(beacon: Path) -> list:
  """The case folders (those with a ``case.json``) under a fixtures root's ``beacon/``."""
  return sorted(p.name for p in beacon.glob("*/") if (p / "case.json").exists()) \
      if beacon.is_dir() else []


BEACON = fixtures_root() / "beacon"
CASES = beacon_cases(BEACON)
NO_CASES = f"no beacon fixture cases under {BEACON} (set LONGJAX_FIXTURES to a fixtures root)"


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
  if not CASES:
    pytest.skip(NO_CASES)
  return checkpoint_dir(BEACON, tmp_path_factory.mktemp("beacon_ckpt"))


def checkpoint_dir(beacon: Path, d: Path) -> Path:
  """``d`` as a HF checkpoint directory over the shared model files of ``beacon``."""
  (d / "config.json").symlink_to(beacon / "config.json")
  (d / "model.safetensors").symlink_to(beacon / "weights.safetensors")
  return d


def case_setup(hf_dir, ref: Path):
  """``ref``: a case folder, ``<root>/beacon/<case>``."""
  info = json.loads((ref / "case.json").read_text())
  cfg, bcfg, params = load_beacon(hf_dir, **info["beacon_config"])
  return info, cfg, bcfg, jax.tree.map(jnp.asarray, params), case_input(ref)


def case_input(ref: Path) -> np.ndarray:
  own = ref / "input_ids.npy"  # a case may bring its own input; else the shared one
  return np.load(own if own.exists() else ref.parent / "input_ids.npy")


def max_length(ref: Path, ids) -> int:
  """The case's own capacity: its input plus the tokens it generates (so a longer case runs
  without changing this file)."""
  return len(ids) + len(np.load(ref / "gen_ids.npy"))


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
  check_case(hf_dir, BEACON / case, impl="auto")


def _pallas_cases():
  """``main`` with the Pallas kernels (interpret mode) in the default run, the others marked
  slow."""
  if not CASES:
    return [pytest.param("none", marks=pytest.mark.skip(NO_CASES))]
  first = "main" if "main" in CASES else CASES[0]
  return [c if c == first else pytest.param(c, marks=pytest.mark.slow) for c in CASES]


@pytest.mark.parametrize("case", _pallas_cases())
def test_fixture_case_pallas_interpret(hf_dir, case, monkeypatch):
  monkeypatch.setenv("LONGJAX_PALLAS_INTERPRET", "1")
  check_case(hf_dir, BEACON / case, impl="pallas")


def check_case(hf_dir, ref: Path, impl):
  """Every record of the case folder ``ref`` against a ``BeaconLM`` sized from the case."""
  info, cfg, bcfg, params, ids = case_setup(hf_dir, ref)
  lm = BeaconLM(cfg, bcfg, max_length=max_length(ref, ids), impl=impl)

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
  ref = BEACON / case
  info, cfg, bcfg, params, ids = case_setup(hf_dir, ref)
  lm = BeaconLM(cfg, bcfg, max_length=max_length(ref, ids), training=True)
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
  info, cfg, bcfg, params, ids = case_setup(hf_dir, BEACON / case)
  lm = BeaconLM(cfg.replace(dtype="bfloat16"), bcfg, max_length=max_length(BEACON / case, ids))
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
                  max_length=max_length(BEACON / case, ids))
  p16 = jax.tree.map(lambda x: x.astype(jnp.bfloat16), params)
  loss = lm16.loss(p16, ids, training=False)
  assert abs(float(loss) - float(np.load(BEACON / case / "loss_eval.npy"))) < 1e-2


# ------------------------------------------------------------------------------------------------
# A fixture root with a longer case. The official code cannot run here, so the case's records come
# from paths the check above does not take: the per-call layout from the fixtures README's rules
# (``interleave_layout``, itself checked against the official ``steps.json``), the logits from the
# blockwise attention kernel fed in calls that cut windows anywhere, step by step (no scan); the
# check runs the default kernel over whole windows with the scan, as for an official case.
LONG_CASE = dict(name="long500", length=500, n_gen=40, window=64, ratios=[4])
# The same size with the official default mix: a ratio drawn per window from [2, 4, 8].
MIXED_CASE = dict(name="mixed500", length=500, n_gen=40, window=64, ratios=[2, 4, 8])


def step_random_ratios(ratios, window: int, n_windows: int) -> list:
  """The ratio of each window under ``beacon_ratio_mix = "step-random"``, from the spec's rules
  (§1), not from the planner: one ratio for a single-entry list; else ratios that do not divide the
  stride are dropped and each window draws one with ``np.random.default_rng(42).choice``."""
  if len(ratios) == 1:
    return [ratios[0]] * n_windows
  cands = [r for r in ratios if r <= window and (r == 0 or window % r == 0)]
  g = np.random.default_rng(42)
  return [int(g.choice(cands)) for _ in range(n_windows)]


def recorded_window_ratios(records, window: int) -> list:
  """The ratio in force in each window, read from an official ``steps.json``: the ratio of the
  first call that feeds the window (the official code draws only when a window starts)."""
  ratios, fed = [], 0
  for rec in records:
    if fed // window == len(ratios):
      ratios.append(rec["ratio"])
    fed += sum(1 for t in rec["ids"] if t != -1)
  return ratios


def interleave_layout(ids, gen_ids, window: int, ratios):
  """The official calls for interleaved beacons, full coverage and no sink, from the README's rules
  (§1.3-1.4) and the spec's slot rule (§2.1), not from the planner: the forward pass is one call
  per window, then one call per generated token; window ``k`` compresses at ``ratios[k]`` (an int:
  every window); a call of ``n`` raw tokens after ``rem`` raw tokens without a beacon holds
  ``(n + rem) // r`` beacons (``-1``), at the slots ``p % (r + 1) == r - rem``; the call that fills
  a window compresses it (its raw cache goes, its beacons stay; at ratio 0 its raw entries stay);
  positions are ``arange(memory + input)``. Returns ``(steps.json records, beacons per forward
  call, memory sizes after the forward pass, after generation)``."""
  if isinstance(ratios, int):
    ratios = [ratios] * ((len(ids) + len(gen_ids)) // window + 1)
  mem = dict(sink=0, beacon=0, raw=0)
  fill, rem, windows, steps = 0, 0, 0, []

  def call(phase, step, tokens):
    nonlocal fill, rem, windows
    r = ratios[windows]
    n = len(tokens)
    if r:
      p = np.arange(n + (n + rem) // r)
      slot = p % (r + 1) == r - rem
      rec = np.full(p.size, -1, np.int64)
      rec[~slot] = np.asarray(tokens, np.int64)
      rec, rem = [int(t) for t in rec], (n + rem) % r
    else:
      rec = [int(t) for t in tokens]
    size = sum(mem.values())
    steps.append(dict(phase=phase, step=step, ids=rec, position_ids=list(range(size + len(rec))),
                      mem_size=size, beacon_size=rec.count(-1), ratio=r))
    mem["raw"] += len(rec)
    fill += n
    if fill == window:
      mem["beacon"] += window // r if r else mem["raw"]
      mem["raw"] = fill = 0
      windows += 1
    return rec.count(-1)

  per_call = [call("forward", k, ids[s:s + window])
              for k, s in enumerate(range(0, len(ids), window))]
  after_prefill = dict(mem)
  for t, tok in enumerate(gen_ids):
    call("generate", t, [tok])
  return steps, per_call, after_prefill, dict(mem)


def test_interleave_layout_follows_the_slot_rule_at_every_ratio():
  """The layout rules on small hand-checked windows: the spec's example (W = 8, r = 4, 10 prompt
  tokens then generation), mixed ratios window by window, and ratio 0 (raw entries become
  memory)."""
  # Spec §2.1: step 1 ``r r r r B r r r r B``; step 2 ``r r``; the 2nd generated token carries a
  # beacon; the 6th completes the window (16 raw tokens): memory = 2 + 2 beacons.
  steps, per_call, after_prefill, after_gen = interleave_layout(list(range(10, 20)),
                                                                list(range(20, 26)), 8, [4, 4])
  assert steps[0]["ids"] == [10, 11, 12, 13, -1, 14, 15, 16, 17, -1]
  assert steps[1]["ids"] == [18, 19] and per_call == [2, 0]
  assert [s["ids"] for s in steps[2:]] == [[20], [21, -1], [22], [23], [24], [25, -1]]
  assert after_prefill == dict(sink=0, beacon=2, raw=2) and after_gen == dict(sink=0, beacon=4,
                                                                               raw=0)
  # Mixed ratios: window 0 at r = 2, window 1 at r = 8, window 2 (partial) at r = 4.
  steps, per_call, after_prefill, _ = interleave_layout(list(range(20)), [], 8, [2, 8, 4])
  assert per_call == [4, 1, 1] and [s["ratio"] for s in steps] == [2, 8, 4]
  assert steps[0]["ids"] == [0, 1, -1, 2, 3, -1, 4, 5, -1, 6, 7, -1]
  assert steps[1]["ids"] == [8, 9, 10, 11, 12, 13, 14, 15, -1]
  assert steps[2]["ids"] == [16, 17, 18, 19, -1] and steps[2]["mem_size"] == 5
  assert after_prefill == dict(sink=0, beacon=5, raw=5)
  # Ratio 0: no beacons; the whole window stays as memory.
  steps, per_call, after_prefill, _ = interleave_layout(list(range(12)), [], 8, [0, 2])
  assert per_call == [0, 2] and steps[1]["mem_size"] == 8
  assert after_prefill == dict(sink=0, beacon=8, raw=6)
  # The windows' ratios read back from the records they wrote.
  steps, *_ = interleave_layout(list(range(20)), list(range(30)), 8, [2, 8, 4, 2, 8, 4, 2])
  assert recorded_window_ratios(steps, 8) == [2, 8, 4, 2, 8, 4, 2]


def _plain_interleave_cases():
  """Official cases the README's plain interleave rules cover (no sink, full coverage)."""
  def plain(c):
    b = json.loads((BEACON / c / "case.json").read_text())["beacon_config"]
    return (b["beacon_pos"], b["beacon_attn"], b["beacon_sink_size"]) == (
        "interleave", "full-coverage", 0)
  return [c for c in CASES if plain(c)] or [pytest.param("none", marks=pytest.mark.skip(NO_CASES))]


@pytest.mark.parametrize("case", _plain_interleave_cases())
def test_interleave_layout_reproduces_official_steps(case):
  """The rules that write the long case's layout give the official records of the real cases, for
  any ratios the case lists (one, or several drawn window by window: ``steps.json`` records the
  ratio of every call, and the rules take each window's from its first call)."""
  ref = BEACON / case
  info = json.loads((ref / "case.json").read_text())
  b = info["beacon_config"]
  records = json.loads((ref / "steps.json").read_text())
  ratios = recorded_window_ratios(records, b["beacon_window"])
  assert set(ratios) <= set(b["beacon_ratio"])
  steps, per_call, after_prefill, after_gen = interleave_layout(
      case_input(ref), np.load(ref / "gen_ids.npy"), b["beacon_window"], ratios)
  keys = ("phase", "step", "ids", "position_ids", "mem_size", "beacon_size", "ratio")
  assert [{k: s[k] for k in keys} for s in records] == steps
  assert per_call == info["beacon_sizes_forward"]
  assert after_prefill == info["memory_after_prefill"]
  assert after_gen == info["memory_after_generation"]


def write_long_case(beacon: Path, hf_dir: Path, *, name, length, n_gen, window, ratios) -> Path:
  """A case folder ``beacon/name`` in the official format: ``length`` random input tokens and
  ``n_gen`` greedy tokens over the shared model, with the settings of ``main`` but this size."""
  ref = beacon / name
  ref.mkdir()
  ids = np.random.default_rng(length).integers(3, 1000, length).astype(np.int64)
  bconf = dict(beacon_window=window, beacon_stride=window, beacon_ratio=list(ratios),
               beacon_ratio_mix="step-random", beacon_attn="full-coverage",
               beacon_pos="interleave", beacon_param=["q", "k", "v"], beacon_sink_size=0,
               beacon_attend_prev=True, beacon_embed_init="eos")
  cfg, bcfg, params = load_beacon(hf_dir, **bconf)
  lm = BeaconLM(cfg, bcfg, max_length=length + n_gen, impl="blockwise")
  state, raw = None, []
  for s in range(0, length, 37):  # 37 < window: calls end mid-window, a window spans 2-3 calls
    out = lm.forward(params, ids[s:s + 37], state=state, collect_logits=True, use_scan=False)
    raw.append(np.asarray(out.raw_logits[0]))
    state = out.state
  raw = np.concatenate(raw)
  logits, gen_ids, gen_logits = np.asarray(out.next_logits[0]), [], []
  for t in range(n_gen):
    gen_logits.append(logits)
    gen_ids.append(int(np.argmax(logits)))
    if t + 1 < n_gen:
      out = lm.forward(params, [[gen_ids[-1]]], state=state, use_scan=False)
      logits, state = np.asarray(out.next_logits[0]), out.state
  # Eval loss from the logits in float64 (the README: it equals the mean next-token CE).
  z = raw[:-1].astype(np.float64)
  z -= z.max(-1, keepdims=True)
  loss = np.mean(np.log(np.sum(np.exp(z), -1)) - z[np.arange(length - 1), ids[1:]])
  steps, per_call, after_prefill, after_gen = interleave_layout(
      ids, gen_ids, window, step_random_ratios(ratios, window, (length + n_gen) // window + 1))
  masks = {f"{s['phase']}_{s['step']}": np.tril(np.ones((len(s["ids"]), len(s["position_ids"])),
                                                        bool), k=s["mem_size"]) for s in steps}
  last = (length - 1) // window * window  # the last forward call's raw tokens
  np.save(ref / "input_ids.npy", ids)
  np.save(ref / "logits_raw_all.npy", raw)
  np.save(ref / "logits_final.npy", raw[last:])
  np.save(ref / "gen_ids.npy", np.asarray(gen_ids, np.int64))
  np.save(ref / "gen_logits.npy", np.stack(gen_logits))
  np.save(ref / "loss_eval.npy", np.float64(loss))
  np.savez(ref / "masks.npz", **masks)
  (ref / "steps.json").write_text(json.dumps(steps))
  (ref / "case.json").write_text(json.dumps(dict(
      case=name, beacon_config=bconf, input_length=length, n_generated=n_gen,
      loss_eval=float(loss), beacon_sizes_forward=per_call, memory_after_prefill=after_prefill,
      memory_after_generation=after_gen, gen_ids=gen_ids)))
  return ref


@pytest.mark.parametrize("case", [LONG_CASE, pytest.param(MIXED_CASE, marks=pytest.mark.slow)],
                         ids=lambda c: c["name"])
def test_fixture_root_with_a_500_token_case(tmp_path, monkeypatch, case):
  """A fixture root laid out like the official one, whose case has a 500-token input and 40
  generated tokens (540 in all, past the 512 the tests once hard-coded), is found and checked by
  the same code as the official cases, unchanged: capacities come from the case's own files. The
  mixed case draws a ratio from [2, 4, 8] per window, as the official default does."""
  if not (BEACON / "weights.safetensors").exists():
    pytest.skip(f"no beacon model files under {BEACON} (set LONGJAX_FIXTURES to a fixtures root)")
  monkeypatch.setenv("LONGJAX_FIXTURES", str(tmp_path / "fixtures"))
  beacon = fixtures_root() / "beacon"
  beacon.mkdir(parents=True)
  for f in ("config.json", "weights.safetensors", "input_ids.npy", "manifest.json"):
    (beacon / f).symlink_to(BEACON / f)
  (tmp_path / "ckpt").mkdir()
  hf = checkpoint_dir(beacon, tmp_path / "ckpt")
  ref = write_long_case(beacon, hf, **case)
  assert beacon_cases(beacon) == [case["name"]]
  if len(case["ratios"]) > 1:  # the case really mixes ratios
    records = json.loads((ref / "steps.json").read_text())
    assert len(set(recorded_window_ratios(records, case["window"]))) > 1
  check_case(hf, ref, impl="auto")
