"""Host-side (numpy) window planning for Activation Beacon.

The planner replays the official ``Memory.prepare`` / ``_step`` / ``update_memory`` bookkeeping
(docs/beacon.md §2.1, §3, §4) on plain integers, one batch row at a time, and emits for every call
("step") of the official model the layout the device step needs: input ids with beacon ids
inserted, alternative-projection flags, RoPE positions, mask orders/kinds, labels, and the
gather indices that say which KV entries the memory keeps. No KV values are involved, so a whole
prompt is planned before anything runs on the device.

Memory layout per row (one buffer of ``capacity`` entries per layer, see ``memory.py``)::

    [ sink (sink_size slots) | beacon memory ... | raw region (raw cache) | free ]
      0                      sink_size           sink_size + beacon_len

The raw region holds the current window's entries (raw tokens, and with interleave the beacons
already inserted). At every step the device reads the raw region as a fixed-size slab of ``R``
entries, concatenates the step's new KV (``Q`` slots) and writes back ``R`` entries gathered by
``src`` at the same place: appending (partial window), or keeping only the beacons (full window:
the raw region becomes part of the beacon memory and is emptied).
"""
from __future__ import annotations

import dataclasses
from typing import List, Optional, Sequence, Tuple

import jax
import numpy as np

from longjax.runtime import program_cache
from longjax.beacon.config import BeaconConfig, adapt_ratio
from longjax.errors import LongjaxError
from longjax.models.inputs import check_token_ids
from longjax.runtime.rounding import next_pow2

IGNORE = -100


class MemoryFullError(LongjaxError, ValueError):
  """The beacon memory buffers cannot hold what a step would add."""


class BeaconInputError(LongjaxError, ValueError):
  """Input the planner cannot place: token ids outside the vocabulary, labels of another shape."""


@dataclasses.dataclass(frozen=True)
class RowState:
  """Per-row planner state (the official ``Memory`` cursors, as immutable data).

  * ``fed``: raw tokens fed so far (official ``_end_idx``); ``start``: start of the current window.
  * ``rem``: interleave remainder (raw tokens since the last beacon); ``ratio``: ratio in force.
  * ``need_ratio``: the previous call completed a window (or nothing ran yet): choose a new ratio.
  * ``sink_len`` / ``beacon_len`` / ``raw_len``: filled entries of the three memory regions.
  * ``raw_keep``: per raw-region entry, 1 if it moves to the beacon memory when the window
    completes (beacons; every entry when r = 0).
  * ``seq_ratio``: ratio fixed once per sequence (instance-random, adapt-N); ``-1`` before.
  * ``rng``: PCG64 state of the ratio RNG (``None``: fresh ``default_rng(seed)``).
  """
  fed: int = 0
  start: int = 0
  rem: int = 0
  ratio: int = -1
  need_ratio: bool = True
  sink_len: int = 0
  beacon_len: int = 0
  raw_len: int = 0
  raw_keep: Tuple[int, ...] = ()
  windows_done: int = 0
  used_zero: bool = False
  seq_ratio: int = -1
  rng: Optional[tuple] = None

  @classmethod
  def seeded(cls, rng: np.random.Generator) -> "RowState":
    """A fresh row whose ratio draws continue ``rng`` (PCG64) instead of ``default_rng(seed)``."""
    return cls(rng=_rng_state(rng))

  @property
  def sizes(self) -> Tuple[int, int, int]:
    """(sink, beacon, raw) entries, as the official memory counts them."""
    return self.sink_len, self.beacon_len, self.raw_len


@dataclasses.dataclass
class StepDesc:
  """One official call for one row, before padding to the step's static shapes."""
  ids: np.ndarray  # [n] int32, beacon slots hold vocab_size
  alt: np.ndarray  # [n] bool: beacon slot
  pos: np.ndarray  # [n] RoPE positions
  order: np.ndarray  # [n] mask order (memory raw region entry i has order 2 i)
  labels: np.ndarray  # [n] next-token labels, IGNORE for beacons / unlabelled
  raw_index: np.ndarray  # [n] index of the raw token within this forward call's ids, -1 beacon
  src: np.ndarray  # [<= R] gather indices: i >= 0 raw-region entry i, -(p+1) new slot p
  sink_len: int
  beacon_len: int
  raw_len: int
  capture: bool  # the sink is (re)captured from this step's first entries
  ratio: Optional[int]
  full: bool

  @property
  def n(self) -> int:
    return int(self.ids.shape[0])

  @property
  def mem_size(self) -> int:
    return self.sink_len + self.beacon_len + self.raw_len


def _rng(state: Optional[tuple], seed: int) -> np.random.Generator:
  if state is None:
    return np.random.default_rng(seed)
  bg = np.random.PCG64()
  bg.state = {"bit_generator": "PCG64", "state": {"state": state[0], "inc": state[1]},
              "has_uint32": state[2], "uinteger": state[3]}
  return np.random.Generator(bg)


def _rng_state(g: np.random.Generator) -> tuple:
  s = g.bit_generator.state
  return (s["state"]["state"], s["state"]["inc"], s["has_uint32"], s["uinteger"])


class Planner:
  """Plans official calls for one row at a time (pure: state in, state out)."""

  def __init__(self, bcfg: BeaconConfig, vocab_size: int, max_positions: int,
               beacon_capacity: int):
    self.bcfg = bcfg
    self.vocab_size = vocab_size
    self.max_positions = max_positions
    self.beacon_capacity = beacon_capacity

  # ------------------------------------------------------------------------------------------
  def _choose_ratio(self, st: RowState, total: int, training: bool, force: Optional[int]):
    """Returns ``(ratio, st)``; follows ``Memory.set_compression_ratio`` (docs/beacon.md §1)."""
    c = self.bcfg
    if force is not None:
      return force, st
    if len(c.ratios) == 1:
      return c.ratios[0], st
    cands = list(c.ratios)  # the config already refused ratios that do not divide the stride
    if training and 0 in cands:
      later_full = st.start + c.stride + c.window <= total
      if st.used_zero or not later_full:
        cands = [r for r in cands if r != 0] or cands
    mix = c.ratio_mix
    if c.adapt_n is not None:
      if st.seq_ratio < 0:
        st = dataclasses.replace(st, seq_ratio=adapt_ratio(cands, total + c.adapt_n, c.window,
                                                           self.max_positions))
      return st.seq_ratio, st
    if mix == "sequence":
      return cands[st.windows_done % len(cands)], st
    if mix == "instance-random" and st.seq_ratio >= 0:
      return st.seq_ratio, st
    g = _rng(st.rng, c.seed)
    r = int(g.choice(cands))
    st = dataclasses.replace(st, rng=_rng_state(g))
    if mix == "instance-random":
      st = dataclasses.replace(st, seq_ratio=r)
    return r, st

  # ------------------------------------------------------------------------------------------
  def plan_row(self, st: RowState, ids: Sequence[int], labels: Optional[Sequence[int]] = None,
               training: bool = False, force_ratio: Optional[int] = None
               ) -> Tuple[List[StepDesc], RowState]:
    """Plan one official forward call (``prepare`` + the ``while not finish`` loop) for one row.

    ``labels`` are unshifted (like ``labels=input_ids``); they are shifted once over this call's
    tokens (official ``prepare``), so the last token of a window predicts the next window's first.
    """
    c = self.bcfg
    ids = np.asarray(ids, np.int64).reshape(-1)
    if force_ratio is not None:
      c.check_ratio(force_ratio)
    if ids.size == 0:
      return [], st
    lab = self._shifted_labels(ids, labels)
    base = st.fed
    total = st.fed + ids.size
    steps = []
    while st.fed < total:
      end = st.start + c.window
      full = end <= total
      if not full:
        end = total
      n = end - st.fed
      raw = slice(st.fed - base, end - base)
      raw_lab = lab[raw].copy()
      if training and st.start == 0 and not (c.pos == "interleave" and c.attn == "full-coverage"):
        # docs/beacon.md §6.5: first window unlabelled outside interleave+full-coverage
        raw_lab[:] = IGNORE
      train_last = training and end == total
      isb, ratio, rem, st = self._beacons(st, n, full, train_last, total, training, force_ratio)
      keep = isb.copy()
      if ratio == 0 and not train_last:
        keep[:] = True  # r = 0: the window's raw activations become memory
      pos, order = self._positions(st, n, isb.size, ratio)
      src, nxt = self._kept(st, full, keep, ratio)
      capture = c.sink_size > 0 and st.beacon_len == 0
      # Raw tokens fill the slots that are not beacons; beacon slots hold the beacon id.
      steps.append(StepDesc(ids=_fill(isb, ids[raw], self.vocab_size), alt=isb, pos=pos,
                            order=order, labels=_fill(isb, raw_lab, IGNORE),
                            raw_index=_fill(isb, np.arange(raw.start, raw.stop), -1), src=src,
                            sink_len=st.sink_len, beacon_len=st.beacon_len, raw_len=st.raw_len,
                            capture=capture, ratio=ratio, full=full))
      if capture:
        nxt["sink_len"] = min(c.sink_size, isb.size)
      st = dataclasses.replace(st, fed=end, rem=rem, **nxt)
    return steps, st

  def _shifted_labels(self, ids: np.ndarray, labels) -> np.ndarray:
    """The next-token label of every id (``IGNORE`` for the last and without ``labels``), after
    checking the ids (the one vocabulary check every method shares: the beacon id, which is
    ``vocab_size``, is inserted by the planner and never given) and the labels' shape."""
    check_token_ids([ids], self.vocab_size, what="beacon input")
    lab = np.full(ids.shape, IGNORE, np.int64)
    if labels is not None:
      labels = np.asarray(labels, np.int64).reshape(-1)
      if labels.shape != ids.shape:
        raise BeaconInputError(f"labels {labels.shape} must match ids {ids.shape}")
      lab[:-1] = labels[1:]
    return lab

  def _beacons(self, st: RowState, n: int, full: bool, train_last: bool, total: int,
               training: bool, force_ratio: Optional[int]):
    """Where a step of ``n`` raw tokens has its beacons: ``(isb, ratio, rem, st)``, ``isb`` one
    flag per slot (interleave: a beacon after every ``ratio`` raw tokens, continuing the
    remainder ``rem`` of the window's earlier steps; append: ``stride / ratio`` beacons after a
    full window; none in training's last window), with ``st``'s ratio choice updated."""
    c = self.bcfg
    rem = st.rem
    if c.pos == "interleave":
      if st.need_ratio:
        r, st = self._choose_ratio(st, total, training, force_ratio)
        st = dataclasses.replace(st, ratio=r, need_ratio=False)
      ratio = st.ratio
      if train_last or ratio == 0:
        return np.zeros(n, bool), ratio, rem, st
      tot = n + rem
      p = np.arange(n + tot // ratio)
      return (p % (ratio + 1)) == (ratio - rem), ratio, tot % ratio, st
    isb = np.zeros(n, bool)
    if not full or train_last:
      return isb, None, rem, st
    ratio, st = self._choose_ratio(st, total, training, force_ratio)
    st = dataclasses.replace(st, ratio=ratio)
    if ratio > 0:
      isb = np.concatenate([isb, np.ones(c.stride // ratio, bool)])
    return isb, ratio, rem, st

  def _positions(self, st: RowState, n: int, length: int, ratio: Optional[int]):
    """RoPE positions and mask orders of a step's ``length`` slots (its ``n`` raw tokens first
    with step-expansion) after ``st``'s memory."""
    m = st.sink_len + st.beacon_len + st.raw_len
    p = np.arange(length)
    if self.bcfg.attn != "step-expansion":
      return m + p, 2 * (st.raw_len + p)
    # append only (config): docs/beacon.md §3.4, attend_prev=True
    pos = np.empty(length, np.int64)
    order = np.empty(length, np.int64)
    pos[:n] = m + p[:n]
    order[:n] = 2 * (st.raw_len + p[:n])
    b = np.arange(length - n)
    if b.size:
      pos[n:] = st.sink_len + st.beacon_len + (b + 1) * (ratio + 1) - 1
      order[n:] = 2 * ((b + 1) * ratio - 1) + 1
    return pos, order

  def _kept(self, st: RowState, full: bool, keep: np.ndarray, ratio: Optional[int]):
    """What the raw region keeps after a step whose slots ``keep`` go to memory: ``(src, the
    row state's next fields)``. A full window moves the kept entries to the beacon memory and
    empties the raw region; a partial one appends every new slot."""
    c = self.bcfg
    new_slots = -(np.arange(keep.size) + 1)
    if not full:
      src = np.concatenate([np.arange(st.raw_len), new_slots]).astype(np.int64)
      return src, dict(raw_len=st.raw_len + keep.size,
                       raw_keep=st.raw_keep + tuple(int(x) for x in keep))
    old_keep = np.flatnonzero(np.asarray(st.raw_keep, bool)) if st.raw_keep else np.zeros(0, int)
    src = np.concatenate([old_keep, new_slots[keep]]).astype(np.int64)
    beacon_len = st.beacon_len + src.size
    if beacon_len > self.beacon_capacity:
      raise MemoryFullError(
          f"beacon memory full: this window would bring it to {beacon_len} entries but the "
          f"capacity is {self.beacon_capacity}; create the BeaconLM with a larger max_length")
    # stride < window (append only): the window's last W - S raw tokens stay raw for the next
    # window (official ``raw_size_to_cache = W - S``); written right after the new beacons, they
    # are the next raw region. Its beacons covered the first S tokens, the ones that leave.
    tail = c.window - c.stride
    if tail:
      raw = np.concatenate([np.arange(st.raw_len), new_slots[~keep]])
      src = np.concatenate([src, raw[-tail:]]).astype(np.int64)
    return src, dict(beacon_len=beacon_len, raw_len=tail, raw_keep=(0,) * tail,
                     start=st.start + c.stride, windows_done=st.windows_done + 1,
                     need_ratio=True, used_zero=st.used_zero or ratio == 0)


def append_only(d: StepDesc) -> bool:
  """The step keeps the raw region as it is and appends all of its slots after it, in order (a
  partial window without a sink capture): its write-back touches only ``d.n`` entries."""
  appended = np.concatenate([np.arange(d.raw_len), -(np.arange(d.n) + 1)])
  return not d.capture and np.array_equal(d.src, appended)


def _fill(isb: np.ndarray, raw: np.ndarray, fill: int) -> np.ndarray:
  """One int64 entry per slot: ``raw`` in the raw-token slots, ``fill`` in the beacon slots."""
  out = np.full(isb.size, fill, np.int64)
  out[~isb] = raw
  return out


# ----------------------------------------------------------------------------------------------
@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class WindowPlan:
  """Planned official calls padded to static shapes: what the device scan runs.

  Leaves are ``[B, ...]`` for one step, or ``[n, B, ...]`` stacked over ``n`` steps (``active``:
  ``[]`` / ``[n]``). Q = query slots, R = raw-region slab entries.
  """
  tokens: np.ndarray  # [B, Q] int32 input ids; beacon slots hold vocab_size (the beacon embedding)
  # [B, A] int32 the beacon slots (they use the beacon q/k/v(/o) projections), padded with Q;
  # A = the most beacons one call can have (static), so only those slots are projected twice.
  alt_slot: np.ndarray
  pos: np.ndarray  # [B, Q] int32 RoPE positions (window-relative, recomputed every call)
  order: np.ndarray  # [B, Q] int32 causal mask order (raw-region entry i of memory has 2 i)
  kind: np.ndarray  # [B, Q] int32 mask kind (step-expansion: beacons 1, raw 0)
  valid: np.ndarray  # [B, Q] bool: a real slot (padding slots are masked out and write nothing)
  # The slots whose next-token loss counts: only their logits are computed (a vocabulary-wide
  # head per slot is the largest matmul of a window); L = Q, or fewer once compacted (``stack``).
  label_slot: np.ndarray  # [B, L] int32 slot of each label
  labels: np.ndarray  # [B, L] int32 next-token labels; IGNORE for padding
  src: np.ndarray  # [B, R] int32 what the raw region keeps: slab entry i < R, or new slot i - R
  sink_len: np.ndarray  # [B] int32 memory region lengths before the step: sink, beacons, raw
  beacon_len: np.ndarray  # [B] int32
  raw_len: np.ndarray  # [B] int32
  capture: np.ndarray  # [B] bool: the sink is (re)captured from this step's first entries
  last_slot: np.ndarray  # [B] int32 slot of the row's last raw token (next-token logits); -1 none
  active: np.ndarray  # [] bool: some row has a call (False: padding step of a scan, skipped)
  # Static (part of the compiled program): consecutive runs of steps and the memory-size bucket
  # their attention reads, ((steps, bucket), ...); and the KV buffer entries the plan needs.
  segments: Tuple[Tuple[int, int], ...] = dataclasses.field(default=(), metadata=dict(static=True))
  capacity: int = dataclasses.field(default=0, metadata=dict(static=True))
  # Static: skip inactive (padding) steps with a lax.cond (prefill chunks: saves their compute).
  # False: they run as no-ops (loss plans: under jax.grad a cond in the scan keeps ~10x more).
  guard: bool = dataclasses.field(default=True, metadata=dict(static=True))
  # Static: every step only appends its valid slots to the raw region (``src`` is the identity
  # followed by the new slots, no sink capture): the write-back then scatters those few entries
  # instead of rewriting the whole slab (decode steps; see ``append_only``).
  append_only: bool = dataclasses.field(default=False, metadata=dict(static=True))
  # Optional soft targets (distillation), aligned with ``labels``: ``[B, L, K]`` token ids and
  # their target mass (teacher probabilities times the token's weight; 0 where unlabelled). A hard
  # label is K = 1 mass on its id. None: the plain next-token loss on ``labels``.
  soft_idx: Optional[np.ndarray] = None
  soft_p: Optional[np.ndarray] = None
  # ``[B, L]`` the teacher's mass outside those K ids (times the weight; 0 for hard labels): the
  # loss compares it with the student's mass outside them, one bucket, so that a top-K teacher
  # does not teach the student to starve the rest of the vocabulary. None: no such bucket.
  soft_rest: Optional[np.ndarray] = None

  @property
  def n_steps(self) -> int:
    return int(self.active.shape[0]) if np.ndim(self.active) else 1


program_cache.register_pytree(WindowPlan, "longjax.beacon.WindowPlan")


def assemble(descs: Sequence[Optional[StepDesc]], q_slots: int, r_slots: int,
             alt_slots: int) -> WindowPlan:
  """Pad one step of every row to static shapes: ``[B, Q]`` slot arrays, ``[B, R]`` gathers,
  ``[B, A]`` beacon slots (``A = alt_slots``).

  ``None`` rows get a no-op step (no valid query; the memory is written back unchanged).
  """
  b = len(descs)
  out = dict(
      tokens=np.zeros((b, q_slots), np.int32),
      alt_slot=np.full((b, alt_slots), q_slots, np.int32),
      pos=np.zeros((b, q_slots), np.int32), order=np.zeros((b, q_slots), np.int32),
      kind=np.zeros((b, q_slots), np.int32), valid=np.zeros((b, q_slots), bool),
      label_slot=np.tile(np.arange(q_slots, dtype=np.int32), (b, 1)),
      labels=np.full((b, q_slots), IGNORE, np.int32),
      src=np.tile(np.arange(r_slots, dtype=np.int32), (b, 1)),
      sink_len=np.zeros(b, np.int32), beacon_len=np.zeros(b, np.int32),
      raw_len=np.zeros(b, np.int32), capture=np.zeros(b, bool),
      last_slot=np.full(b, -1, np.int32),
      active=np.asarray(any(d is not None for d in descs)))
  for i, d in enumerate(descs):
    if d is None:
      continue
    n = d.n
    if n > q_slots:
      raise AssertionError(f"step of {n} slots exceeds the {q_slots} query slots")
    out["tokens"][i, :n] = d.ids
    beacons = np.flatnonzero(d.alt)
    if beacons.size > alt_slots:
      raise AssertionError(f"step has {beacons.size} beacons, more than the {alt_slots} slots "
                           "for them (BeaconConfig.max_beacons_per_call)")
    out["alt_slot"][i, :beacons.size] = beacons
    out["pos"][i, :n] = d.pos
    out["order"][i, :n] = d.order
    out["kind"][i, :n] = d.alt
    out["valid"][i, :n] = True
    out["labels"][i, :n] = d.labels
    if d.src.size > r_slots:
      raise AssertionError(f"step keeps {d.src.size} entries, more than the {r_slots}-entry slab")
    src = np.where(d.src >= 0, d.src, r_slots - d.src - 1)
    out["src"][i, :] = 0
    out["src"][i, :src.size] = src
    out["sink_len"][i] = d.sink_len
    out["beacon_len"][i] = d.beacon_len
    out["raw_len"][i] = d.raw_len
    out["capture"][i] = d.capture
    raw_slots = np.flatnonzero(~d.alt)
    out["last_slot"][i] = raw_slots[-1] if raw_slots.size else -1
  return WindowPlan(**out)


def stack(plans: Sequence[WindowPlan], segments, capacity: int, compact_labels: bool = False,
          guard: bool = True) -> WindowPlan:
  """Stack single-step plans into an ``[n, ...]`` plan for the scan (``segments`` must cover
  exactly ``n`` steps). ``compact_labels``: keep only as many label slots as the most labelled
  step needs (a power of two >= 8, at most Q): beacons and unlabelled tokens get no logits.

  ``segments`` are ``(steps, bucket)`` or ``(steps, bucket, width)``; the plan keeps them as
  ``(steps, bucket, width, labels)``: the segment's steps run with only their first ``width``
  query slots (default Q; every step of the segment must fit) and ``labels`` label slots (with
  ``compact_labels``, as many as the segment's most labelled step needs, else all)."""
  if sum(s[0] for s in segments) != len(plans):
    raise AssertionError(f"segments {segments} do not cover {len(plans)} steps")
  leaves = {f.name: np.stack([getattr(p, f.name) for p in plans])
            for f in dataclasses.fields(WindowPlan)
            if not f.metadata.get("static") and getattr(plans[0], f.name) is not None}
  q = leaves["tokens"].shape[-1]
  n_labels = [q] * len(plans)
  if compact_labels:
    ok = leaves["labels"] != IGNORE  # [n, B, Q], label_slot is still arange(Q)
    counts = ok.sum(-1).max(-1)  # [n]
    size = min(q, next_pow2(max(8, int(counts.max()))))
    keep = np.argsort(~ok, axis=-1, kind="stable")[..., :size]  # labelled slots first
    leaves["labels"] = np.take_along_axis(leaves["labels"], keep, -1)
    leaves["label_slot"] = keep.astype(np.int32)
    n_labels = [min(size, next_pow2(max(8, int(c)))) for c in counts]
  out, s0 = [], 0
  for seg in segments:
    n, bucket = int(seg[0]), int(seg[1])
    width = int(seg[2]) if len(seg) > 2 else q
    last = np.flatnonzero(leaves["valid"][s0:s0 + n].any((0, 1)))
    if width > q or (last.size and last[-1] >= width):
      raise AssertionError(f"segment {seg}: its steps use query slots up to "
                           f"{last[-1] if last.size else -1} of {q}, past its width {width}")
    out.append((n, bucket, width, max(n_labels[s0:s0 + n], default=0) if n else 0))
    s0 += n
  return WindowPlan(**leaves, segments=tuple(out), capacity=int(capacity), guard=guard)
