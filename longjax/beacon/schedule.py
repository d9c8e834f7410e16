"""Activation Beacon's host side between the per-row planner and the device (numpy only): a batch's
official call planned as steps side by side, the query slots and memory-size bucket of each step,
the segments consecutive steps run in, and the stacked plan of a whole call for the window scan.

Device compute has static shapes:

* query slots ``Q = W + W / r_min`` (interleave) or ``W + S / r_min`` (append) per step, or, for
  a call of one step, the smallest of two small buckets that holds every row's step:
  ``TOKEN_SLOTS`` (generation: one raw token and the beacon that may follow it) or
  ``decode_slots`` (a few fed tokens);
* memory buffers of ``capacity = sink + beacon capacity + R`` entries with ``R = Q`` (the raw
  region slab), with explicit lengths from the planner;
* the part of the buffer that attention sees: a *memory-size bucket* ``M`` (``0``, then powers of
  two from ``memory_bucket_min``, split into ``memory_bucket_steps`` buckets per octave where the
  memory is large, capped at ``capacity``) chosen on the host from the planner's exact memory
  lengths, so a step costs what its filled memory costs (not the whole buffer sized for
  ``max_length``). Each bucket is one compiled program: ``O(steps * log capacity)`` of them.

Consecutive steps run in *segments* that share one bucket (``segments``: the one way steps are
cut): prefill's scan chunks, the loss plan's ``lax.scan`` runs and the decode loop's device calls.
"""
from __future__ import annotations

import dataclasses
import numbers
from typing import List, Optional, Sequence, Tuple

import numpy as np

from longjax.beacon.config import BeaconConfig
from longjax.beacon.memory import BeaconState
from longjax.beacon.planner import (BeaconInputError, Planner, RowState, StepDesc, WindowPlan,
                                    assemble, stack)
from longjax.errors import LongjaxError
from longjax.models.inputs import check_room
from longjax.runtime.rounding import next_pow2, round_up


# Query slots of a one-token step: the token and the beacon that may follow it (interleave). Every
# decode step fits unless it completes an append-layout window. Measured (2026-12-03, bench model,
# 16K, device loop, alternating processes): 2 slots decode in ~10.0 ms/token where 8 took ~11.7;
# the step's attention and projections scale with its query slots, its weight reads do not.
TOKEN_SLOTS = 2


class BeaconSetupError(LongjaxError, ValueError):
  """The model / checkpoint cannot run Activation Beacon as configured."""


class CapacityError(LongjaxError, ValueError):
  """An input does not fit the memory capacity this BeaconLM was built for."""


@dataclasses.dataclass(frozen=True)
class Call:
  """One official call of a batch, planned on the host."""
  descs: List[List[StepDesc]]  # per row: its steps, as the official model makes them
  rows: Tuple[RowState, ...]  # per row: the planner's state after the call
  steps: List[List[Optional[StepDesc]]]  # per step: each row's step (None: the row is done)
  q_slots: int  # query slots every step of the call runs with
  needs: List[int]  # per step: the buffer entries its attention must see (``memory_need``)
  ids: List[np.ndarray]  # per row: the call's ids


class Schedule:
  """The sizes of a ``BeaconLM``'s device programs and the host planning of its calls.

  Args (as ``BeaconLM``'s): ``max_length`` sizes the memory, ``decode_slots`` the decode
  bucket; ``memory_buckets``, ``memory_bucket_min`` and ``memory_bucket_steps`` the memory-size
  buckets; ``training`` and ``ratio`` are the defaults of every call.
  """

  def __init__(self, bcfg: BeaconConfig, vocab_size: int, max_positions: int, *,
               max_length: int, decode_slots: int, memory_buckets: bool, memory_bucket_min: int,
               memory_bucket_steps: int, training: bool, ratio: Optional[int]):
    if (isinstance(max_length, (bool, np.bool_)) or not isinstance(max_length, numbers.Integral)
        or max_length < 1):  # int() below would truncate 100.5 silently
      raise CapacityError(f"max_length must be an integer >= 1, got {max_length!r}")
    if int(memory_bucket_steps) < 1:
      raise BeaconSetupError("memory_bucket_steps must be >= 1 (buckets per octave of memory "
                             f"size), got {memory_bucket_steps}: pass 1 for powers of two, 4 "
                             "(the default) for finer buckets")
    self.bcfg = bcfg
    self.max_length = int(max_length)
    self.training = training
    self.ratio = ratio
    self.q_slots = bcfg.query_slots
    self.r_slots = self.q_slots
    self.decode_slots = min(int(decode_slots), self.q_slots)
    self.token_slots = min(TOKEN_SLOTS, self.decode_slots)
    self.sink_cap = bcfg.sink_size
    self.beacon_capacity = (self.max_length // bcfg.stride) * bcfg.max_memory_per_window
    self.capacity = self.sink_cap + self.beacon_capacity + self.r_slots
    self.memory_buckets = bool(memory_buckets)
    self.memory_bucket_min = max(1, int(memory_bucket_min))
    self.memory_bucket_steps = int(memory_bucket_steps)
    # The finest bucket step: the largest power of two <= half the window's query slots.
    self._bucket_step_min = next_pow2(self.q_slots // 2 + 1) // 2
    self.planner = Planner(bcfg, vocab_size, max_positions, self.beacon_capacity)

  # ------------------------------------------------------------------------------------------
  def memory_need(self, d: Optional[StepDesc]) -> int:
    """Buffer entries a step's attention must see: its valid memory is ``[0, need)``."""
    if d is None:
      return 0
    rest = d.beacon_len + d.raw_len
    return max(d.sink_len, self.sink_cap + rest if rest else 0)

  def step_slots(self, n: int) -> int:
    """Query slots of a one-step call whose rows use at most ``n`` slots: the smallest bucket
    that holds them (``token_slots``, ``decode_slots``, then all ``q_slots``)."""
    for q in (self.token_slots, self.decode_slots):
      if n <= q:
        return q
    return self.q_slots

  def alt_slots(self, q_slots: int) -> int:
    """Beacon slots of a ``q_slots``-slot step: the only tokens projected with the beacon
    q/k/v(/o) (static; the planner checks every step fits)."""
    return min(q_slots, self.bcfg.max_beacons_per_call)

  def assemble(self, step: Sequence[Optional[StepDesc]], q_slots: int) -> WindowPlan:
    """One step of every row (``None``: a no-op) padded to ``q_slots`` query slots."""
    return assemble(step, q_slots, self.r_slots, self.alt_slots(q_slots))

  def memory_bucket(self, need: int, capacity: Optional[int] = None) -> int:
    """The memory-size bucket (static attention length over a buffer of ``capacity`` entries,
    default ``self.capacity``) for ``need`` entries."""
    capacity = self.capacity if capacity is None else capacity
    if not self.memory_buckets:
      return capacity
    if need <= 0:
      return 0
    b = max(self.memory_bucket_min, next_pow2(need))
    step = max(b // (2 * self.memory_bucket_steps), self._bucket_step_min, 1)
    if step < b:  # ``need`` lies in (b / 2, b]: the next multiple of ``step``
      b = max(self.memory_bucket_min, min(b, round_up(need, step)))
    return min(b, capacity)

  def bucket_sizes(self) -> list:
    """Every bucket ``memory_bucket`` can return (an upper bound on compiles per program)."""
    needs = {0, 1, self.capacity}
    for i in range(self.capacity.bit_length() + 1):
      top = 1 << i  # each bucket of the octave (top / 2, top] is hit by one of these needs
      needs.update(range(top // 2 + 1, top + 1, max(1, top // (2 * self.memory_bucket_steps))))
    return sorted({self.memory_bucket(n) for n in needs if n <= self.capacity})

  # ------------------------------------------------------------------------------------------
  def check_room(self, rows: Sequence[RowState], new: Sequence[int], extra: int = 0):
    for i, (r, n) in enumerate(zip(rows, new)):
      check_room(r.fed, n + extra, self.max_length, lambda need, i=i, r=r, n=n: CapacityError(
          f"row {i}: {r.fed} tokens already in memory + {n} new"
          + (f" + {extra} to generate" if extra else "")
          + f" = {need} tokens exceed this BeaconLM's max_length={self.max_length} (memory "
          f"capacity {self.capacity} KV entries per layer: sink {self.sink_cap} + beacons "
          f"{self.beacon_capacity} + window {self.r_slots}); build it with "
          f"BeaconLM(..., max_length={round_up(need, self.bcfg.window)}) or more"))

  def call(self, ids, labels, lengths, rows: Sequence[RowState], training: Optional[bool] = None,
           ratio=None, reserve: int = 0) -> Call:
    """Plan one official call of the batch ``ids`` (with ``labels``, cut to ``lengths``) after
    the planner's ``rows``, leaving room for ``reserve`` more tokens per row. ``ratio``: one
    compression ratio for every row, or a sequence of one per row (None, for a row or for all:
    drawn by ratio_mix)."""
    rows_ids = rows_of(ids, lengths)
    rows_labels = None if labels is None else rows_of(labels, lengths)
    training = self.training if training is None else training
    ratio = self.ratio if ratio is None else ratio
    if len(rows_ids) != len(rows):
      raise BeaconInputError(f"{len(rows_ids)} rows of ids for a state of batch {len(rows)}")
    # one ratio for every row, or one per row (None: that row's ratio_mix draws)
    per_row = list(ratio) if isinstance(ratio, (list, tuple)) else [ratio] * len(rows_ids)
    if len(per_row) != len(rows_ids):
      raise BeaconInputError(f"{len(per_row)} ratios for a batch of {len(rows_ids)} rows; give "
                             "one per row (None: drawn) or a single ratio")
    for r in per_row:
      if r is not None:
        self.bcfg.check_ratio(r)
    if any(len(r) == 0 for r in rows_ids):
      raise BeaconInputError("empty input: every row needs at least one token")
    self.check_room(rows, [len(r) for r in rows_ids], reserve)
    descs, new_rows = [], []
    for i, ids_i in enumerate(rows_ids):
      labels_i = None if rows_labels is None else rows_labels[i]
      d, st = self.planner.plan_row(rows[i], ids_i, labels_i, training, per_row[i])
      descs.append(d)
      new_rows.append(st)
    n_steps = max(len(d) for d in descs)
    most = max(x.n for d in descs for x in d)
    q = self.step_slots(most) if n_steps == 1 else self.q_slots
    steps = [[d[s] if s < len(d) else None for d in descs] for s in range(n_steps)]
    needs = [max(self.memory_need(x) for x in sd) for sd in steps]
    return Call(descs, tuple(new_rows), steps, q, needs, rows_ids)

  def plan(self, ids, labels=None, *, lengths=None, state: Optional[BeaconState] = None,
           rows: Optional[Sequence[RowState]] = None, training: Optional[bool] = None,
           ratio=None, steps_multiple: int = 1) -> WindowPlan:
    """Plan one official call (as ``BeaconLM.forward`` would) as one stacked ``WindowPlan`` for
    the loss scan: every step, in memory-bucket segments, padded with no-op steps to a
    multiple of ``steps_multiple``.

    After ``state``; or from empty memory, with ``rows`` (e.g. ``RowState.seeded(rng)``: the
    ratio draws) as the planner's start. From empty memory the plan's buffer holds what this
    input needs (``sink + (T // W) * W / r_min + Q`` entries), not ``max_length``.
    """
    if state is not None:
      rows, capacity = state.rows, state.capacity
    else:
      b = len(rows_of(ids, lengths))
      rows = tuple(rows) if rows is not None else tuple(RowState() for _ in range(b))
      if any(r.fed or r.sizes != (0, 0, 0) for r in rows):
        raise BeaconInputError("plan(rows=...) starts from empty memory: pass state= to continue")
      capacity = None
    call = self.call(ids, labels, lengths, rows, training, ratio)
    if capacity is None:
      longest = max(len(r) for r in call.ids)
      capacity = min(self.capacity, self.sink_cap + self.r_slots
                     + (longest // self.bcfg.stride) * self.bcfg.max_memory_per_window)
    buckets = [self.memory_bucket(n, capacity) for n in call.needs]
    pad = round_up(len(call.steps), max(1, int(steps_multiple))) - len(call.steps)
    runs = segments(buckets, pad=pad, lone_steps=False)
    c0, c1, bucket = runs[0]
    if c1 - c0 > 1 and self._width(call, c0, c1) > self._width(call, c0 + 1, c1):
      # The first window (full width) merged into the next segment would run its narrow steps
      # at full width: it runs alone (a 1-step scan: its backward keeps a little more memory).
      runs[:1] = [(c0, c0 + 1, buckets[c0]), (c0 + 1, c1, bucket)]
    plans = [self.assemble(sd, call.q_slots) for sd in call.steps]
    plans += [self.assemble([None] * len(rows), call.q_slots)] * pad
    return stack(plans, [(c1 - c0, bucket, self._width(call, c0, c1)) for c0, c1, bucket in runs],
                 capacity, compact_labels=True, guard=False)

  def _width(self, call: Call, c0: int, c1: int) -> int:
    """Query slots steps ``[c0, c1)`` of ``call`` run with: the narrower stride width when
    every step fits it (append with S < W after the first window), else the call's."""
    used = max((x.n for sd in call.steps[c0:c1] for x in sd if x is not None), default=0)
    narrow = min(call.q_slots, self.bcfg.stride_query_slots)
    return narrow if used <= narrow else call.q_slots


def segments(buckets: Sequence[int], most: Optional[int] = None, pad: int = 0,
             lone_steps: bool = True) -> List[Tuple[int, int, int]]:
  """Cut steps ``[0, n)`` with memory buckets ``buckets`` into segments ``(c0, c1, bucket)``
  that run at one bucket: a segment runs at its first step's bucket, and a step that needs a
  larger one starts the next; at most ``most`` steps each (``None``: no limit). ``pad`` no-op
  steps are added to the last segment.

  ``lone_steps=False`` merges every 1-step segment into a neighbour (which then runs at the
  larger bucket): XLA turns a 1-step scan into straight-line code and schedules its backward pass
  worse (SmolLM2, 4 windows: 565 MB of temporaries instead of 407 MB)."""
  n = len(buckets)
  most = n if most is None else most
  cut, c0 = [], 0
  while c0 < n:
    c1 = c0 + 1
    while c1 < n and c1 - c0 < most and buckets[c1] <= buckets[c0]:
      c1 += 1
    cut.append((c0, c1, buckets[c0]))
    c0 = c1
  if pad:
    c0, c1, bucket = cut[-1]
    cut[-1] = (c0, c1 + pad, bucket)
  if lone_steps:
    return cut
  out = []
  for c0, c1, bucket in cut:
    if out and out[-1][1] - out[-1][0] == 1:
      out[-1] = (out[-1][0], c1, max(bucket, out[-1][2]))
    else:
      out.append((c0, c1, bucket))
  if len(out) > 1 and out[-1][1] - out[-1][0] == 1:
    out[-2:] = [(out[-2][0], out[-1][1], max(out[-2][2], out[-1][2]))]
  return out


def rows_of(ids, lengths=None) -> list:
  """``[T]`` / ``[B, T]`` (+ lengths) / list of lists -> list of 1-D int arrays; float ids are
  refused (casting would truncate them)."""
  from longjax.models.inputs import check_integer_ids
  if isinstance(ids, (list, tuple)) and ids and isinstance(ids[0], (list, tuple, np.ndarray)):
    check_integer_ids(ids, what="ids")
    rows = [np.asarray(r, np.int64).reshape(-1) for r in ids]
  else:
    check_integer_ids([ids], what="ids")
    arr = np.asarray(ids, np.int64)
    if arr.ndim == 1:
      arr = arr[None]
    if arr.ndim != 2:
      raise BeaconInputError(f"ids must be [T] or [B, T], got shape {arr.shape}")
    rows = list(arr)
  if lengths is not None:
    lengths = np.asarray(lengths).reshape(-1)
    if len(lengths) != len(rows):
      raise BeaconInputError(f"{len(lengths)} lengths for {len(rows)} rows")
    rows = [r[:int(n)] for r, n in zip(rows, lengths)]
  return rows
