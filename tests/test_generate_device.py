"""``generate(loop="device")`` (the decode loop in one ``lax.while_loop``) against the host loop
(``loop="host"``, the reference) for every method: tokens equal, logits within 1e-5 (fp32), the
method's final state equal; beacon generations that cross window boundaries and stop mid-way.
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest

import longjax
from longjax.inference import decode_loop
from longjax.beacon import BeaconConfig, BeaconLM
from longjax.beacon import decode as beacon_decode
from longjax.focus import FocusLLM
from longjax.inference.generate import GenerateError
from longjax.plain import PlainLM
from longjax.inference.teacher_forcing import teacher_forced_nll

from focus_helpers import prompt, tiny_focus, tiny_model
from test_beacon import BCFG, VOCAB, tiny_cfg, tiny_params


def _ids(n, seed):
  return np.random.default_rng(seed).integers(3, VOCAB, n).tolist()


def _no_host_steps(method):
  """The device loop must never call the method's host ``step``."""
  def fail(*a, **k):
    raise AssertionError("the device loop called the host step")
  method.step = fail
  return method


def _both(method, params, prompts, **kw):
  host = longjax.generate(method, params, prompts, loop="host", return_logits=True, **kw)
  host_step = method.step
  try:
    dev = longjax.generate(_no_host_steps(method), params, prompts, loop="device",
                           return_logits=True, **kw)
  finally:
    method.step = host_step
  assert dev.tokens == host.tokens
  for a, b in zip(dev.logits, host.logits):
    assert a.shape == b.shape
    np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)
  assert dev.timings.decode_steps == host.timings.decode_steps
  return host, dev


def _stops_at(tokens, earliest):
  """Stop ids that end row i at a step >= earliest[i], every row at a different step and before
  the last step (the loop ends early): returns ``(stop ids, the step each row ends at)``;
  ``tokens`` are unstopped generations."""
  def firsts(row, lo):  # steps whose token appears there for the first time in the row
    return [w for w in range(lo, len(row) - 1) if row[w] not in row[:w]]
  for when in itertools.product(*(firsts(r, lo) for r, lo in zip(tokens, earliest))):
    stops = {r[w] for r, w in zip(tokens, when)}
    if len(set(when)) == len(when) and not any(stops & set(r[:w]) for r, w in zip(tokens, when)):
      return sorted(stops), list(when)
  raise AssertionError("no stop ids end the rows at different steps: pick other prompts")


# ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def plain():
  cfg = tiny_cfg(alt=())
  return PlainLM(cfg), tiny_params(cfg)


@pytest.fixture(scope="module")
def beacon_params():
  cfg = tiny_cfg()
  return cfg, tiny_params(cfg)


def test_plain_greedy_and_sampled(plain):
  lm, params = plain
  prompts = [_ids(17, 1), _ids(5, 2)]
  _both(lm, params, prompts, max_new_tokens=12)
  _both(lm, params, prompts, max_new_tokens=12, temperature=0.8, top_k=20, top_p=0.9, seed=5)
  _both(lm, params, prompts, max_new_tokens=1)


def _count_calls(monkeypatch, what):
  """Record ``what(args, kwargs)`` of every device-loop call (a list, filled as calls happen)."""
  calls = []
  advance = decode_loop._advance_jit

  def counted(*a, **k):
    calls.append(what(a, k))
    return advance(*a, **k)
  monkeypatch.setattr(decode_loop, "_advance_jit", counted)
  return calls


def test_plain_is_one_device_call_and_streams_in_chunks(plain, monkeypatch):
  lm, params = plain
  calls = _count_calls(monkeypatch, lambda a, k: 1)
  p = _ids(9, 3)
  longjax.generate(lm, params, p, max_new_tokens=10, loop="device")
  assert len(calls) == 1
  seen_host, seen_dev = [], []
  host = longjax.generate(lm, params, p, max_new_tokens=10, loop="host",
                          callback=lambda t, x: seen_host.append((t, x.tolist())))
  calls.clear()
  dev = longjax.generate(lm, params, p, max_new_tokens=10, loop="device", chunk=4,
                         callback=lambda t, x: seen_dev.append((t, x.tolist())))
  assert dev.tokens == host.tokens and seen_dev == seen_host and len(seen_dev) == 10
  assert len(calls) == 3  # 9 fed tokens in chunks of 4


def test_plain_stop_ids_rows_end_at_different_steps(plain):
  lm, params = plain
  prompts = [_ids(11, 4), _ids(6, 5), _ids(14, 6)]
  free = longjax.generate(lm, params, prompts, max_new_tokens=12, loop="host")
  stops, when = _stops_at(free.tokens, [1, 3, 5])
  host, dev = _both(lm, params, prompts, max_new_tokens=12, stop_ids=stops)
  assert [len(t) for t in host.tokens] == [w + 1 for w in when]
  np.testing.assert_array_equal(dev.state.length, host.state.length)


# ------------------------------------------------------------------------------------------------
def _assert_same_memory(dev, host, sink_cap):
  """Every row's memory as it is read (buffer entries past it are unspecified: the device loop's
  append-only steps leave them as they were, the host step's write-back fills them)."""
  for row in range(dev.batch):
    for a, b in zip(dev.memory_kv(row, sink_cap), host.memory_kv(row, sink_cap)):
      assert a.shape[1] > 0
      np.testing.assert_allclose(a, b, atol=1e-5)


def test_beacon_crosses_windows_and_stops_mid_way(beacon_params):
  cfg, params = beacon_params
  lm = BeaconLM(cfg, BCFG.replace(sink_size=1), max_length=256)  # window 16
  prompts = [_ids(13, 7), _ids(30, 8), _ids(3, 9)]
  host, dev = _both(lm, params, prompts, max_new_tokens=24)
  # The generation completes windows inside the loop (the premise of this test).
  before = lm.forward(params, prompts[0]).state.rows[0].windows_done
  assert host.state.rows[0].windows_done >= before + 2
  assert dev.state.rows == host.state.rows
  _assert_same_memory(dev.state, host.state, lm.sink_cap)
  # Stop ids: rows end at different steps, row 0 after its window boundary (13 + 4 > 16).
  stops, when = _stops_at(host.tokens, [4, 8, 12])
  host, dev = _both(lm, params, prompts, max_new_tokens=24, stop_ids=stops)
  assert [len(t) for t in host.tokens] == [w + 1 for w in when]
  assert dev.state.rows == host.state.rows  # every row fed until the last one stopped
  _assert_same_memory(dev.state, host.state, lm.sink_cap)
  host, dev = _both(lm, params, prompts, max_new_tokens=1)  # nothing fed back
  assert dev.state.rows == host.state.rows


def test_beacon_plans_in_blocks_as_the_loop_reaches_them(beacon_params, monkeypatch):
  cfg, params = beacon_params
  monkeypatch.setattr(beacon_decode, "PLAN_BLOCK", 5)  # 23 feeds: 5 blocks, the last partial
  lm = BeaconLM(cfg, BCFG.replace(sink_size=1), max_length=256)
  prompts = [_ids(13, 7), _ids(30, 8)]
  host, _ = _both(lm, params, prompts, max_new_tokens=24)
  stops, when = _stops_at(host.tokens, [3, 6])
  _both(lm, params, prompts, max_new_tokens=24, stop_ids=stops)
  planned = []
  plan = lm.schedule.call
  lm.schedule.call = lambda *a: planned.append(1) or plan(*a)
  longjax.generate(lm, params, prompts, max_new_tokens=24, stop_ids=stops, loop="device")
  # prefill plans once; decoding plans whole blocks up to the one holding the last feed (the
  # max(when) - 1'th: the last row's stop id is sampled after it, and never fed).
  assert len(planned) - 1 == 5 * ((max(when) - 1) // 5 + 1) < 23


def test_beacon_sampled_and_runs_per_memory_bucket(beacon_params, monkeypatch):
  cfg, params = beacon_params
  lm = BeaconLM(cfg, BCFG, max_length=512, memory_bucket_min=8)
  p = _ids(40, 10)
  _both(lm, params, p, max_new_tokens=30, temperature=0.9, top_k=50, seed=2)
  calls = _count_calls(monkeypatch, lambda a, k: (k["step"].mem_size, a[2].append_only))
  before = lm.forward(params, p).state.rows[0].windows_done
  out = longjax.generate(lm, params, p, max_new_tokens=30, loop="device")
  # A step completing a window (it rewrites the raw region) is one call of its own; the other
  # steps, which only append, run in one call per run of one memory bucket, and those buckets
  # grow with the memory between two completions.
  alone = [i for i, (_, append) in enumerate(calls) if not append]
  assert len(alone) == out.state.rows[0].windows_done - before >= 1
  for lo, hi in zip([-1] + alone, alone + [len(calls)]):
    run = [m for m, _ in calls[lo + 1:hi]]
    assert run == sorted(run) and len(set(run)) == len(run), calls
  assert len(calls) - len(alone) >= 2


def test_beacon_append_layout_and_resume(beacon_params, monkeypatch):
  cfg, params = beacon_params
  # append (+ step-expansion, the campaign's layout): a completing window adds 1 raw token + 8
  # beacons, more than the 8 decode slots; every other step is one token (2 slots).
  lm = BeaconLM(cfg, BeaconConfig(window=16, stride=16, ratios=(2,), pos="append",
                                  attn="step-expansion", sink_size=1), max_length=256)
  slots = _count_calls(monkeypatch, lambda a, k: a[2].tokens.shape[-1])
  host, dev = _both(lm, params, [_ids(10, 11), _ids(21, 12)], max_new_tokens=20)
  assert dev.state.rows == host.state.rows
  # Only the window-completing steps (row 0 at 16, row 1 at 32) run with all query slots.
  assert slots.count(lm.schedule.q_slots) == 2 and set(slots) == {lm.schedule.token_slots,
                                                                 lm.schedule.q_slots}
  monkeypatch.undo()
  # Ratio 4: a completing window adds 1 + 4 slots, within the 8 decode slots: that step alone
  # runs with them, every other one with the one-token bucket.
  lm = BeaconLM(cfg, BeaconConfig(window=16, stride=16, ratios=(4,), pos="append", sink_size=1),
                max_length=256)
  slots = _count_calls(monkeypatch, lambda a, k: a[2].tokens.shape[-1])
  host, dev = _both(lm, params, [_ids(10, 11), _ids(21, 12)], max_new_tokens=20)
  assert dev.state.rows == host.state.rows
  assert lm.schedule.token_slots < lm.schedule.decode_slots < lm.schedule.q_slots
  assert slots.count(lm.schedule.decode_slots) == 2 and set(slots) == {
      lm.schedule.token_slots, lm.schedule.decode_slots}
  monkeypatch.undo()
  # Multi-turn: a resumed state decodes on device too.
  lm = BeaconLM(cfg, BCFG, max_length=256)
  first = longjax.generate(lm, params, _ids(20, 13), max_new_tokens=6, loop="host")
  resumed = lm.resume(first.state, carry_tokens=[first.tokens[0][-1:]])
  host, dev = _both(resumed, params, _ids(7, 14), max_new_tokens=9)
  assert dev.state.rows == host.state.rows


@pytest.mark.parametrize("pos, ratios", [("interleave", (2, 4, 8)), ("append", (2, 4))])
def test_beacon_random_ratio_draws(beacon_params, pos, ratios):
  """Each completed window draws its ratio from the row's RNG (step-random): planning ahead
  draws the same ratios in the same order as the host steps."""
  cfg, params = beacon_params
  bcfg = BeaconConfig(window=16, stride=16, ratios=ratios, ratio_mix="step-random", pos=pos,
                      sink_size=1)
  lm = BeaconLM(cfg, bcfg, max_length=256)
  host, dev = _both(lm, params, [_ids(9, 16), _ids(24, 17)], max_new_tokens=40)
  assert dev.state.rows == host.state.rows  # RowState holds the ratio RNG's state
  assert host.state.rows[0].windows_done >= 2


# ------------------------------------------------------------------------------------------------
def test_focus_greedy_sampled_and_stop_ids():
  cfg, params = tiny_model()
  m = FocusLLM(cfg, tiny_focus(), bucket=16)
  prompts = [list(prompt(100, 0)), list(prompt(40, 1)), list(prompt(7, 2))]
  host, _ = _both(m, params, prompts, max_new_tokens=8)
  _both(m, params, prompts, max_new_tokens=8, temperature=0.8, top_k=20, top_p=0.9, seed=3)
  stops, when = _stops_at(host.tokens, [1, 3, 5])
  host, dev = _both(m, params, prompts, max_new_tokens=8, stop_ids=stops)
  assert [len(t) for t in host.tokens] == [w + 1 for w in when]
  np.testing.assert_array_equal(dev.state.local_len, host.state.local_len)
  _both(m, params, prompts, max_new_tokens=1)


# ------------------------------------------------------------------------------------------------
class _HostOnly:
  """A method with only prefill / step (no device_plan)."""

  def __init__(self, inner):
    self.cfg, self.prefill, self.step = inner.cfg, inner.prefill, inner.step


def test_bad_loop_arguments(plain):
  lm, params = plain
  p = _ids(5, 15)
  with pytest.raises(GenerateError, match="loop must be one of"):
    longjax.generate(lm, params, p, max_new_tokens=2, loop="gpu")
  with pytest.raises(GenerateError, match="chunk must be an integer >= 1"):
    longjax.generate(lm, params, p, max_new_tokens=2, chunk=0)
  with pytest.raises(GenerateError, match="device loop only"):
    longjax.generate(lm, params, p, max_new_tokens=2, loop="host", chunk=2)
  with pytest.raises(GenerateError, match="needs a method with device_plan"):
    longjax.generate(_HostOnly(lm), params, p, max_new_tokens=2, loop="device")
  # "auto" runs such a method on the host loop.
  auto = longjax.generate(_HostOnly(lm), params, p, max_new_tokens=4)
  assert auto.tokens == longjax.generate(lm, params, p, max_new_tokens=4, loop="device").tokens


# ------------------------------------------------------------------------------------------------
# Teacher forcing (FocusLLM's perplexity protocol): the device loop fed given tokens.
def _prefill_rows(method, params, prompts, max_new_tokens):
  tokens = np.zeros((len(prompts), max(map(len, prompts))), np.int32)
  for i, p in enumerate(prompts):
    tokens[i, :len(p)] = p
  lengths = np.array([len(p) for p in prompts], np.int32)
  return method.prefill(params, tokens, lengths, max_new_tokens)


def _host_forced_nll(method, params, prompts, targets):
  """The reference: prefill, then one host ``step`` per target, each target scored by the logits
  before it."""
  b = len(prompts)
  logits, state = _prefill_rows(method, params, prompts, targets.shape[1])
  out = []
  for t in range(targets.shape[1]):
    z = np.asarray(logits, np.float64)
    z = z - z.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    out.append(-logp[np.arange(b), targets[:, t]])
    if t + 1 < targets.shape[1]:
      logits, state = method.step(params, state, targets[:, t])
  return np.stack(out, 1)


def _device_forced_nll(method, params, prompts, targets):
  logits, state = _prefill_rows(method, params, prompts, targets.shape[1])
  plan = _no_host_steps(method).device_plan(state, targets.shape[1] - 1)
  return teacher_forced_nll(plan, params, logits, targets)


@pytest.mark.parametrize("kind", ["plain", "beacon", "focus"])
def test_teacher_forcing_equals_host_steps(kind, plain, beacon_params):
  if kind == "plain":
    method, params = plain
    prompts = [_ids(17, 1), _ids(5, 2)]
  elif kind == "beacon":  # window 16: the 20 fed targets complete windows inside the loop
    cfg, params = beacon_params
    method = BeaconLM(cfg, BCFG.replace(sink_size=1), max_length=256)
    prompts = [_ids(13, 7), _ids(30, 8)]
  else:
    cfg, params = tiny_model()
    method = FocusLLM(cfg, tiny_focus(), bucket=16)
    prompts = [list(prompt(100, 0)), list(prompt(61, 1))]  # 5 and 3 chunks
  targets = np.random.default_rng(3).integers(3, 90, (2, 21)).astype(np.int32)
  want = _host_forced_nll(method, params, prompts, targets)
  host_step = method.step
  try:
    got = _device_forced_nll(method, params, prompts, targets)
  finally:
    method.step = host_step
  assert got.shape == (2, 21) and np.all(got > 0)
  np.testing.assert_allclose(got, want, atol=2e-5, rtol=0)


def test_teacher_forcing_rejects_bad_targets(plain):
  lm, params = plain
  logits, state = lm.prefill(params, np.array([_ids(5, 1)], np.int32), np.array([5]), 4)
  with pytest.raises(decode_loop.DevicePlanError, match="targets"):
    teacher_forced_nll(lm.device_plan(state, 3), params, logits, np.zeros((3, 4)))


def test_focus_gated_device_loop_equals_host_steps():
  """The candidate gate (docs/focusllm.md §4.5) in the device loop: each step re-reads the base's
  confidence with the per-layer decoder, as the host steps do with the scanned one."""
  cfg, params = tiny_model()
  m = FocusLLM(cfg, tiny_focus(candidate_gate=3.0), bucket=16)
  host, _ = _both(m, params, [list(prompt(100, 0)), list(prompt(40, 1))], max_new_tokens=6)
  plain = longjax.generate(FocusLLM(cfg, tiny_focus(), bucket=16), params,
                           [list(prompt(100, 0)), list(prompt(40, 1))], max_new_tokens=6,
                           loop="host", return_logits=True)
  assert np.max(np.abs(host.logits[0] - plain.logits[0])) > 1e-3  # the gate was read
