"""Activation Beacon's decode steps for the device loop (``longjax.decode_loop``).

Generated tokens are fed one per row per step, and what the planner does with a token (its RoPE
position, the beacons inserted after it, whether it completes a window and which raw-region
entries the memory keeps) depends only on how many tokens each row has been fed, never on the
token's value: ``Planner.plan_row`` reads the ids only to copy them into the step's input slots
(``tok[~isb] = raw_ids``; labels are absent in generation, and the ratio draws follow the row's
own RNG state and positions). So every decode step is planned here, before the loop, with a
placeholder id; the device step writes the sampled token into the step's one raw slot
(``last_slot``). Windows completing inside the loop are planned steps like any other.

The steps are grouped into runs of one memory-size bucket (as prefill's scan chunks are): each run
is one device call of the loop compiled for that bucket; a bucket never shrinks inside a run
(a completing window shrinks the memory need, and the run keeps its larger bucket).
"""
from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

from longjax.beacon.memory import BeaconState
from longjax.beacon.model import BeaconLM, Carry, _chunks, run_step
from longjax.beacon.planner import assemble, stack
from longjax.decode_loop import DevicePlan
from longjax.models.decoder import Decoder


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
    carry, _ = run_step(self.model, self.sink_cap, params, carry, plan, mem_size=self.mem_size,
                        want_loss=False, want_hidden=False)
    return carry.last, carry


def device_plan(lm: BeaconLM, state: BeaconState, n_feeds: int) -> DevicePlan:
  """Plan ``n_feeds`` decode steps after ``state`` for the device loop (host side)."""
  b = state.batch
  carry = Carry(state.k, state.v, np.zeros((b, lm.cfg.vocab_size), np.float32),
                np.zeros((b,), np.float32), np.zeros((b,), np.int32))
  rows_after = [state.rows]  # rows_after[f]: the planner's rows after f feeds
  step_descs, needs, small = [], [], True
  placeholder = np.zeros((b, 1), np.int64)  # any valid id: the plan does not depend on it
  for _ in range(n_feeds):
    descs, rows, sd, _, need, _ = lm._plan(placeholder, None, None, rows_after[-1], False, None, 0)
    if len(sd) != 1 or any(len(d) != 1 for d in descs):
      raise AssertionError("a one-token decode step planned as more than one official call")
    rows_after.append(rows)
    step_descs.append(sd[0])
    needs.append(need[0])
    small = small and all(d.n <= lm.decode_slots for d in sd[0])

  def finish(carry: Carry, feeds: int) -> BeaconState:
    return BeaconState(carry.k, carry.v, rows_after[feeds])

  if not n_feeds:
    return DevicePlan(carry=carry, steps=[], finish=finish)
  # The host step runs a step that inserts many beacons (append layout, a completing window) with
  # all query slots; the stacked plan has one shape, so such a generation runs every step so.
  q = lm.decode_slots if small else lm.q_slots
  plans = [assemble(sd, q, lm.r_slots, lm.alt_slots(q)) for sd in step_descs]
  # segments=() : the loop indexes one step at a time, and the plan's static fields must not
  # depend on n_feeds (they key the compiled loop).
  xs = dataclasses.replace(stack(plans, [(n_feeds, 0)], state.capacity), segments=())
  buckets = [lm.memory_bucket(n, state.capacity) for n in needs]
  steps = [(c1, BeaconDecodeStep(lm.model, lm.sink_cap, buckets[c0]))
           for c0, c1 in _chunks(buckets, n_feeds)]
  return DevicePlan(carry=carry, steps=steps, xs=xs, finish=finish)
