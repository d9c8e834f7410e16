"""Activation Beacon's decode steps for the device loop (``longjax.inference.decode_loop``).

Generated tokens are fed one per row per step, and what the planner does with a token (its RoPE
position, the beacons inserted after it, whether it completes a window and which raw-region
entries the memory keeps) depends only on how many tokens each row has been fed, never on the
token's value: ``Planner.plan_row`` reads the ids only to copy them into the step's input slots
(``_fill(isb, ids[raw], ...)``; labels are absent in generation, and the ratio draws follow the
row's own RNG state and positions). So the decode steps are planned here with a placeholder id,
``PLAN_BLOCK`` steps at a time before the loop reaches them; the device step writes the sampled
token into the step's one raw slot (``last_slot``). Windows completing inside the loop are planned
steps like any other.

The steps are grouped into runs of one memory-size bucket (as prefill's scan chunks are): each run
is one device call of the loop compiled for that bucket; a bucket never shrinks inside a run
(a completing window shrinks the memory need, and the run keeps its larger bucket). A step with
more slots than the one-token bucket (append layout: a completing window's beacons) runs alone with
the query slots the host step gives it.
"""
from __future__ import annotations

import dataclasses
import functools

import jax.numpy as jnp
import numpy as np

from longjax.beacon.memory import BeaconState
from longjax.beacon.planner import append_only, stack
from longjax.beacon.schedule import segments
from longjax.beacon.step import Carry, window_step
from longjax.models.protocol import DevicePlan, Segment
from longjax.models.decoder import Decoder, decode_decoder


@dataclasses.dataclass(frozen=True)
class BeaconDecodeStep:
  """One planned decode step with the sampled tokens filled in: pure, hashable by value."""
  model: Decoder
  sink_cap: int
  mem_size: int  # the memory-size bucket this run of steps attends over

  def __call__(self, params, carry: Carry, plan, tokens):
    b = tokens.shape[0]
    # Every row feeds exactly one raw token per decode step: it sits at the step's last raw slot.
    ids = plan.tokens.at[jnp.arange(b), plan.last_slot].set(tokens.astype(plan.tokens.dtype),
                                                            mode="drop")
    plan = dataclasses.replace(plan, tokens=ids)
    carry, _ = window_step(self.model, self.sink_cap, params, carry, plan, mem_size=self.mem_size,
                           want_loss=False, want_hidden=False)
    return carry.last, carry

  def prepare_params(self, params):
    return self.model.prepare_params(params)


# Decode steps planned (and stacked) at a time: the stacked plan's shape, hence the compiled loop,
# does not depend on max_new_tokens, and a generation that stops early plans no further than the
# block it stopped in (planning costs host time per step: a max_new_tokens of thousands with an
# early stop id would otherwise be planned in full first).
PLAN_BLOCK = 128


def device_plan(lm, state: BeaconState, n_feeds: int) -> DevicePlan:
  """(``lm``: the ``BeaconLM``; not imported here, which imports this module.) The decode steps
  after ``state`` for the device loop (host side), planned lazily."""
  b = state.batch
  carry = Carry(state.k, state.v, np.zeros((b, lm.cfg.vocab_size), np.float32),
                np.zeros((b,), np.float32), np.zeros((b,), np.int32))
  rows_after = [state.rows]  # rows_after[f]: the planner's rows after f feeds (grows lazily)

  def finish(carry: Carry, feeds: int) -> BeaconState:
    return BeaconState(carry.k, carry.v, rows_after[feeds])

  return DevicePlan(carry, _segments(lm, state.capacity, rows_after, n_feeds), finish)


def _segments(lm, capacity: int, rows_after: list, n_feeds: int):
  """Yield the loop's segments, planning ``PLAN_BLOCK`` feeds at a time."""
  b = len(rows_after[0])
  placeholder = np.zeros((b, 1), np.int64)  # any valid id: the plan does not depend on it
  for f0 in range(0, n_feeds, PLAN_BLOCK):
    step_descs, needs = [], []
    for _ in range(f0, min(f0 + PLAN_BLOCK, n_feeds)):
      call = lm.schedule.call(placeholder, None, None, rows_after[-1], False, None, 0)
      if len(call.steps) != 1 or any(len(d) != 1 for d in call.descs):
        raise AssertionError("a one-token decode step planned as more than one official call")
      rows_after.append(call.rows)
      step_descs.append(call.steps[0])
      needs.append(call.needs[0])
    yield from _block_segments(lm, capacity, f0, step_descs, needs)


def _block_segments(lm, capacity: int, f0: int, step_descs, needs):
  """Segments of the feeds ``f0 + [0, len(step_descs))``: runs of one memory bucket.

  Each step runs with the query slots the host step gives it: the one-token bucket, or, alone in
  its segment, a larger one for a step that inserts several beacons (append layout: a completing
  window)."""
  sch = lm.schedule
  b, n = len(step_descs[0]), len(step_descs)
  q_small = sch.token_slots
  # Steps that fit the one-token bucket and only append share one stacked plan whose write-back
  # scatters the new entries; a completing window rewrites the raw region and runs alone.
  small = [all(d.n <= q_small and append_only(d) for d in sd) for sd in step_descs]
  shared = None
  if any(small):
    noop = sch.assemble([None] * b, q_small)
    plans = [sch.assemble(sd, q_small) if ok else noop for sd, ok in zip(step_descs, small)]
    shared = _stacked(plans + [noop] * (PLAN_BLOCK - n), capacity, append_only=True)
  buckets = [sch.memory_bucket(x, capacity) for x in needs]
  step = functools.partial(BeaconDecodeStep, decode_decoder(lm.model), lm.sink_cap)
  i = 0
  while i < n:
    if not small[i]:
      q = sch.step_slots(max(d.n for d in step_descs[i]))
      one = _stacked([sch.assemble(step_descs[i], q)], capacity)
      yield Segment(f0 + i + 1, step(buckets[i]), one, first=f0 + i)
      i += 1
      continue
    j = i
    while j < n and small[j]:
      j += 1
    for _, c1, bucket in segments(buckets[i:j]):
      yield Segment(f0 + i + c1, step(bucket), shared, first=f0)
    i = j


def _stacked(plans, capacity: int, append_only: bool = False):
  # segments=(): the loop indexes one step at a time, and the plan's static fields must not
  # depend on the number of steps (they key the compiled loop).
  return dataclasses.replace(stack(plans, [(len(plans), 0)], capacity), segments=(),
                             append_only=append_only)
