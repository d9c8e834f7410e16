"""Activation Beacon on the shared decoder, host side: planning, the ``lax.scan`` prefill in chunks,
the loss, and the generation method (``prefill`` / ``step``) that ``longjax.generate`` drives (the
device step itself, pure and jitted, is ``step.py``).

Device compute has static shapes:

* query slots ``Q = W + W / r_min`` (interleave) or ``W + S / r_min`` (append) per step, or a small
  decode bucket when every row's step fits (generation: 1 raw token, maybe a beacon);
* memory buffers of ``capacity = sink + beacon capacity + R`` entries with ``R = Q`` (the raw
  region slab), with explicit lengths from the planner;
* the part of the buffer that attention sees: a *memory-size bucket* ``M`` (``0``, then powers of
  two from ``memory_bucket_min``, split into ``memory_bucket_steps`` buckets per octave where the
  memory is large, capped at ``capacity``) chosen on the host from the planner's exact memory
  lengths, so a step costs what its filled memory costs (not the whole buffer sized for
  ``max_length``). Each bucket is one compiled program: ``O(steps * log capacity)`` of them.

Prefill runs the planned steps through ``lax.scan`` in chunks of at most ``scan_chunk`` steps that
share one bucket (a chunk starts a new bucket when the memory outgrows the current one); a
chunk's unused tail steps are skipped with ``lax.cond``, so one compiled chunk per bucket serves
any number of windows (full windows and the final partial window alike). Decode steps use one
jitted step per (query slots, bucket).

``loss`` and the training task run the same scan (``scan_windows`` over a ``WindowPlan``) as one
jitted program over all windows: ``plan`` stacks every step in bucket segments, ``loss_terms``
runs them from an empty buffer sized to the input.
"""
from __future__ import annotations

import dataclasses
import logging
import sys
from typing import Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from longjax import program_cache
from longjax.beacon.config import BeaconConfig
from longjax.beacon.memory import BeaconState, empty_state
from longjax.beacon.planner import (BeaconInputError, Planner, RowState, StepDesc, WindowPlan,
                                    assemble, stack)
from longjax.beacon.step import Carry, _chunks, _loss_jit, _scan_jit, _step_jit, loss_terms
from longjax.errors import LongjaxError
from longjax.kernels import MaskRule
from longjax.models.config import ModelConfig
from longjax.models.decoder import Decoder
from longjax.models.head import lm_head
from longjax.sizes import next_pow2, round_up

_log = logging.getLogger("longjax.beacon")


class BeaconSetupError(LongjaxError, ValueError):
  """The model / checkpoint cannot run Activation Beacon as configured."""


class CapacityError(LongjaxError, ValueError):
  """An input does not fit the memory capacity this BeaconLM was built for."""


@dataclasses.dataclass
class ForwardOutput:
  next_logits: jax.Array  # [B, V] fp32: after each row's last new token
  state: BeaconState
  loss_sum: jax.Array  # [B] fp32 summed token CE (0 without labels)
  loss_count: jax.Array  # [B] int32 labelled tokens
  raw_logits: Optional[list] = None  # per row [n_new, V] (collect_logits=True)
  steps: Optional[list] = None  # per row: list of StepDesc (the planned official calls)
  mem_buckets: Optional[list] = None  # per device call (scan chunk or step): its memory bucket

  @property
  def loss(self) -> jax.Array:
    """Official ``loss``: summed CE over all rows / labelled tokens."""
    return jnp.sum(self.loss_sum) / jnp.maximum(jnp.sum(self.loss_count), 1)




def frozen_base(params):
  """``params`` with gradients stopped everywhere but the beacon tensors (official training:
  only ``beacon_*``, here ``alt_*``, is trained), so the base gets no gradient computed."""
  def f(path, x):
    beacon = any(str(getattr(p, "key", "")).startswith("alt_") for p in path)
    return x if beacon else jax.lax.stop_gradient(x)
  return jax.tree_util.tree_map_with_path(f, params)


class BeaconLM:
  """Activation Beacon over a frozen decoder; a ``longjax.generate`` method.

  Args:
    cfg: the decoder config; must have the beacon projections (``alt_projections`` ⊇ ``param``)
      and the beacon embedding row (``num_alt_embeddings >= 1``). ``longjax.beacon.load_beacon``
      produces such a config from an official or plain HF checkpoint.
    bcfg: the beacon settings.
    max_length: most tokens (prompt + generated, over all turns) one state can hold. Sizes the
      memory: ``capacity = sink + (max_length // W) * W / r_min + Q`` entries per layer and row.
    scan_chunk: windows per compiled ``lax.scan`` chunk in prefill.
    decode_slots: query slots of the decode bucket (steps with few slots, i.e. generation).
    ratio: force this ratio (must be in ``bcfg.ratios``), like the official ``Memory.set``.
    training: official training mode (no beacons in the last window, first-window label rule).
    progress: show a progress bar over windows (``None``: only for >= 32 windows on a terminal).
    memory_buckets: attend over a memory-size bucket of the buffer (``0``, then sizes from
      ``memory_bucket_min`` up, at most ``capacity``) instead of the whole buffer: each step
      costs what its filled memory costs; one compile per bucket used.
      ``False``: every step attends over the whole buffer (one compile, cost independent of fill).
    memory_bucket_min: the smallest non-zero bucket.
    memory_bucket_steps: buckets per octave ``(2^(k-1), 2^k]`` of memory size (``1``: powers
      of two). Finer buckets waste fewer masked entries (at most ``1 / steps`` of the octave's
      base), but never step by less than half a window's query slots (rounded down to a power
      of two): a finer step would save less attention than the window's own causal attention
      costs, not worth one more compile. At most ``steps * log2(capacity)`` buckets.
    remat: when differentiating, rematerialise every decoder layer of every window (the
      decoder's ``remat``: ``jax.checkpoint`` per layer): each window keeps its layer inputs,
      memory slices and KV carry instead of its activations, for one more forward pass. (A
      checkpoint around a whole window was measured 1.2x slower and 3.4x larger on SmolLM2: its
      recomputation holds all layers' activations at once.)
  """

  def __init__(self, cfg: ModelConfig, bcfg: BeaconConfig, *, max_length: int = 65536,
               scan_chunk: int = 8, decode_slots: int = 8, impl: str = "auto",
               ratio: Optional[int] = None, training: bool = False,
               progress: Optional[bool] = None, memory_buckets: bool = True,
               memory_bucket_min: int = 64, memory_bucket_steps: int = 4, remat=True):
    missing = [p for p in bcfg.param if p not in cfg.alt_projections]
    if missing or cfg.num_alt_embeddings < 1:
      raise BeaconSetupError(
          "the model has no beacon tensors for "
          f"{['embedding'] if cfg.num_alt_embeddings < 1 else []}{missing or ''}: load the "
          "checkpoint with longjax.beacon.load_beacon(dir, init='official') to initialise them "
          "as the official from_pretrained does (copies of q/k/v(/o), embedding row from eos/bos), "
          "or use a checkpoint that has beacon_* tensors")
    if ratio is not None:
      bcfg.check_ratio(ratio)
    if max_length < 1:
      raise CapacityError(f"max_length must be >= 1, got {max_length}")
    if cfg.has_sliding_window:
      # The official Activation Beacon code never applies a sliding window (Mistral's is not passed
      # to its attention; it only warns): follow it, so logits match its outputs. PlainLM keeps it.
      _log.warning("Activation Beacon ignores the model's sliding window %s, as the official "
                   "beacon code does (memory + window attend in full)", cfg.sliding_windows[0])
      cfg = cfg.replace(sliding_windows=None)
    self.cfg = cfg
    self.bcfg = bcfg
    self.max_length = int(max_length)
    self.scan_chunk = int(scan_chunk)
    self.ratio = ratio
    self.training = training
    self.progress = progress
    rule = MaskRule(causal=True, kind_sees=(0b01, 0b11) if bcfg.attn == "step-expansion" else None)
    # remat True / "dots": the decoder's per-layer policy (ModelConfig.remat).
    self.model = Decoder(cfg.replace(remat=remat) if remat else cfg, rule=rule, impl=impl)
    self.q_slots = bcfg.query_slots
    self.r_slots = self.q_slots
    self.decode_slots = min(int(decode_slots), self.q_slots)
    self.sink_cap = bcfg.sink_size
    self.beacon_capacity = (self.max_length // bcfg.window) * bcfg.max_memory_per_window
    self.capacity = self.sink_cap + self.beacon_capacity + self.r_slots
    self.memory_buckets = bool(memory_buckets)
    self.memory_bucket_min = max(1, int(memory_bucket_min))
    if int(memory_bucket_steps) < 1:
      raise BeaconSetupError(f"memory_bucket_steps must be >= 1 (buckets per octave of memory "
                             f"size), got {memory_bucket_steps}: pass 1 for powers of two, 4 "
                             f"(the default) for finer buckets")
    self.memory_bucket_steps = int(memory_bucket_steps)
    # The finest bucket step: the largest power of two <= half the window's query slots.
    self._bucket_step_min = next_pow2(self.q_slots // 2 + 1) // 2
    self.planner = Planner(bcfg, cfg.vocab_size, cfg.max_positions, self.beacon_capacity)
    self.remat = remat
    self._static = dict(model=self.model, sink_cap=self.sink_cap)

  # ------------------------------------------------------------------------------------------
  def memory_need(self, d: Optional[StepDesc]) -> int:
    """Buffer entries a step's attention must see: its valid memory is ``[0, need)``."""
    if d is None:
      return 0
    rest = d.beacon_len + d.raw_len
    return max(d.sink_len, self.sink_cap + rest if rest else 0)

  def alt_slots(self, q_slots: int) -> int:
    """Beacon slots of a ``q_slots``-slot step: the only tokens projected with the beacon
    q/k/v(/o) (static; the planner checks every step fits)."""
    return min(q_slots, self.bcfg.max_beacons_per_call)

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
  # ------------------------------------------------------------------------------------------
  def init_state(self, batch: int) -> BeaconState:
    c = self.cfg
    return empty_state(c.num_layers, batch, self.capacity, c.num_kv_heads, c.head_dim,
                       c.compute_dtype)

  def _check_room(self, rows: Sequence[RowState], new: Sequence[int], extra: int = 0):
    for i, (r, n) in enumerate(zip(rows, new)):
      need = r.fed + n + extra
      if need > self.max_length:
        raise CapacityError(
            f"row {i}: {r.fed} tokens already in memory + {n} new"
            + (f" + {extra} to generate" if extra else "")
            + f" = {need} tokens exceed this BeaconLM's max_length={self.max_length} (memory "
            f"capacity {self.capacity} KV entries per layer: sink {self.sink_cap} + beacons "
            f"{self.beacon_capacity} + window {self.r_slots}); build it with "
            f"BeaconLM(..., max_length={round_up(need, self.bcfg.window)}) or more")

  def _plan(self, ids, labels, lengths, rows, training, ratio, reserve):
    """Host planning of one official call: ``(descs per row, new row states, step_descs per
    step, query slots, memory need per step)``."""
    rows_ids = _rows(ids, lengths)
    rows_labels = None if labels is None else _rows(labels, lengths)
    training = self.training if training is None else training
    ratio = self.ratio if ratio is None else ratio
    if ratio is not None:
      self.bcfg.check_ratio(ratio)
    if len(rows_ids) != len(rows):
      raise BeaconInputError(f"{len(rows_ids)} rows of ids for a state of batch {len(rows)}")
    if any(len(r) == 0 for r in rows_ids):
      raise BeaconInputError("empty input: every row needs at least one token")
    self._check_room(rows, [len(r) for r in rows_ids], reserve)
    descs, new_rows = [], []
    for i, ids_i in enumerate(rows_ids):
      labels_i = None if rows_labels is None else rows_labels[i]
      d, st = self.planner.plan_row(rows[i], ids_i, labels_i, training, ratio)
      descs.append(d)
      new_rows.append(st)
    n_steps = max(len(d) for d in descs)
    small = all(x.n <= self.decode_slots for d in descs for x in d)
    q = self.decode_slots if n_steps == 1 and small else self.q_slots
    step_descs = [[d[s] if s < len(d) else None for d in descs] for s in range(n_steps)]
    needs = [max(self.memory_need(x) for x in sd) for sd in step_descs]
    return descs, tuple(new_rows), step_descs, q, needs, rows_ids

  def plan(self, ids, labels=None, *, lengths=None, state: Optional[BeaconState] = None,
           rows: Optional[Sequence[RowState]] = None, training: Optional[bool] = None,
           ratio: Optional[int] = None, steps_multiple: int = 1) -> WindowPlan:
    """Plan one official call (as ``forward`` would) as one stacked ``WindowPlan`` for
    ``loss_terms``: every step, in memory-bucket segments, padded with no-op steps to a
    multiple of ``steps_multiple``.

    After ``state``; or from empty memory, with ``rows`` (e.g. ``RowState.seeded(rng)``: the
    ratio draws) as the planner's start. From empty memory the plan's buffer holds what this
    input needs (``sink + (T // W) * W / r_min + Q`` entries), not ``max_length``.
    """
    if state is not None:
      rows, capacity = state.rows, state.capacity
    else:
      b = len(_rows(ids, lengths))
      rows = tuple(rows) if rows is not None else tuple(RowState() for _ in range(b))
      if any(r.fed or r.sizes != (0, 0, 0) for r in rows):
        raise BeaconInputError("plan(rows=...) starts from empty memory: pass state= to continue")
      capacity = None
    _, _, step_descs, q, needs, rows_ids = self._plan(ids, labels, lengths, rows, training,
                                                      ratio, 0)
    if capacity is None:
      longest = max(len(r) for r in rows_ids)
      capacity = min(self.capacity, self.sink_cap + self.r_slots
                     + (longest // self.bcfg.window) * self.bcfg.max_memory_per_window)
    buckets = [self.memory_bucket(n, capacity) for n in needs]
    segments = [[c1 - c0, buckets[c0]] for c0, c1 in _chunks(buckets, len(buckets))]
    pad = round_up(len(step_descs), max(1, int(steps_multiple))) - len(step_descs)
    segments[-1][0] += pad
    segments = _no_single_steps(segments)
    b = len(rows)
    plans = [assemble(sd, q, self.r_slots, self.alt_slots(q)) for sd in step_descs]
    plans += [assemble([None] * b, q, self.r_slots, self.alt_slots(q))] * pad
    return stack(plans, segments, capacity, compact_labels=True, guard=False)

  def loss_terms(self, params, plan: WindowPlan, state: Optional[BeaconState] = None):
    """``(loss_sum [B], loss_count [B])`` of a ``plan`` (pure and jittable: the training step
    calls it inside its own jit); from ``state``'s memory or empty buffers. In training mode the
    LM head is frozen (no gradient reaches it, as in ``loss``)."""
    k, v = (None, None) if state is None else (state.k, state.v)
    return loss_terms(params, plan, k, v, frozen_head=self.training, **self._static)

  def forward(self, params, ids, *, lengths=None, labels=None, state: Optional[BeaconState] = None,
              training: Optional[bool] = None, ratio: Optional[int] = None,
              collect_logits: bool = False, use_scan: bool = True, reserve: int = 0
              ) -> ForwardOutput:
    """Feed ``ids`` (``[T]``, ``[B, T]`` right-padded with ``lengths``, or a list of id lists)
    after ``state`` (default: empty memory), as one official ``model(input_ids, labels=...)``.

    Differentiable in ``params`` (planning only looks at ids). ``collect_logits`` also returns
    the logits of every new raw token (tests / analysis: ``[n, V]`` per row).
    """
    if state is None:
      state = self.init_state(len(_rows(ids, lengths)))
    descs, new_rows, step_descs, q, needs, rows_ids = self._plan(
        ids, labels, lengths, state.rows, training, ratio, reserve)
    n_steps = len(step_descs)
    want_loss = labels is not None
    b = state.batch
    # Host zeros: jnp.zeros would compile three tiny programs in every new process.
    carry = Carry(state.k, state.v, np.zeros((b, self.cfg.vocab_size), np.float32),
                  np.zeros((b,), np.float32), np.zeros((b,), np.int32))
    hidden_chunks = []
    buckets = [self.memory_bucket(n) for n in needs]
    used = []
    flags = dict(want_loss=want_loss, want_hidden=collect_logits, **self._static)
    if not use_scan or (n_steps == 1 and q == self.decode_slots):
      for s in range(n_steps):
        plan = assemble(step_descs[s], q, self.r_slots, self.alt_slots(q))
        carry, hid = program_cache.call("beacon_step", _step_jit,
                                        dict(flags, mem_size=buckets[s]), params, carry, plan)
        used.append(buckets[s])
        if collect_logits:
          hidden_chunks.append(hid[None])
    else:
      chunk = self.scan_chunk
      bar = self._progress_bar(n_steps)
      for c0, c1 in _chunks(buckets, chunk):
        # Every chunk is padded to scan_chunk skipped steps: one compiled chunk per bucket.
        plans = [assemble(step_descs[s], q, self.r_slots, self.alt_slots(q)) for s in range(c0, c1)]
        plans += [assemble([None] * b, q, self.r_slots, self.alt_slots(q))] * (chunk - len(plans))
        plan = stack(plans, [(chunk, buckets[c0])], state.capacity)
        carry, hid = program_cache.call("beacon_scan", _scan_jit, flags, params, carry, plan)
        used.append(buckets[c0])
        if collect_logits:
          hidden_chunks.append(hid[:c1 - c0])
        if bar is not None:
          bar.update(c1 - c0)
      if bar is not None:
        bar.close()
    state = BeaconState(carry.k, carry.v, new_rows)
    out = ForwardOutput(next_logits=carry.last, state=state, loss_sum=carry.loss_sum,
                        loss_count=carry.loss_count, steps=descs, mem_buckets=used)
    if collect_logits:
      hidden = jnp.concatenate(hidden_chunks, axis=0)  # [steps, B, Q, H]
      out.raw_logits = self._gather_raw_logits(params, hidden, descs, rows_ids)
    return out

  def _gather_raw_logits(self, params, hidden, descs, rows_ids):
    res = []
    for i, d in enumerate(descs):
      idx_s, idx_q, where = [], [], []
      for s, x in enumerate(d):
        slots = np.flatnonzero(x.raw_index >= 0)
        idx_s.extend([s] * slots.size)
        idx_q.extend(slots.tolist())
        where.extend(x.raw_index[slots].tolist())
      h = hidden[np.asarray(idx_s), i, np.asarray(idx_q)]
      logits = lm_head(self.cfg, params, h)
      order = np.argsort(np.asarray(where))
      res.append(logits[order])
    return res

  def _progress_bar(self, n_steps: int):
    show = self.progress
    if show is None:
      show = n_steps >= 32 and sys.stderr.isatty()
    if not show:
      return None
    try:
      from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover
      return None
    return tqdm(total=n_steps, desc="beacon windows", unit="call")

  # ------------------------------------------------------------------------------------------
  def loss(self, params, ids, labels=None, *, lengths=None, training: Optional[bool] = None,
           state: Optional[BeaconState] = None, ratio: Optional[int] = None):
    """Official loss (labels default to ids; mean CE over labelled raw tokens); differentiable.

    One jitted program over all windows (``loss_terms``; see ``remat``). In
    training mode the base is frozen as in the official training: only the beacon tensors
    (``alt_*``) get a gradient; the base's gradient is zero and never computed.
    """
    if labels is None:
      labels = ids
    training = self.training if training is None else training
    plan = self.plan(ids, labels, lengths=lengths, state=state, training=training, ratio=ratio)
    if training:
      params = frozen_base(params)
    k, v = (None, None) if state is None else (state.k, state.v)
    ls, lc = _loss_jit(params, plan, k, v, frozen_head=training, **self._static)
    return jnp.sum(ls) / jnp.maximum(jnp.sum(lc), 1)

  # ------------------------------------------------------------------------------------------
  # The generate() method interface.
  def prefill(self, params, tokens, lengths, max_new_tokens):
    out = self.forward(params, tokens, lengths=lengths, training=False, reserve=max_new_tokens)
    return out.next_logits, out.state

  def step(self, params, state: BeaconState, tokens):
    tokens = np.asarray(tokens).reshape(-1, 1)
    out = self.forward(params, tokens, state=state, training=False)
    return out.next_logits, out.state

  def device_plan(self, state: BeaconState, n_feeds: int):
    """The decode steps planned for ``longjax.generate``'s device loop (``beacon/decode.py``)."""
    from longjax.beacon.decode import device_plan
    return device_plan(self, state, n_feeds)

  def resume(self, state: BeaconState, carry_tokens=None) -> "Resumed":
    """A method for ``longjax.generate`` that continues from ``state`` (multi-turn): the new
    prompt is fed after the memory without re-encoding earlier turns. ``carry_tokens`` (per row)
    are fed first, e.g. the last generated token, which ``generate`` never feeds back."""
    return Resumed(self, state, carry_tokens)


class Resumed:
  """``BeaconLM`` continuing from a state: ``prefill`` extends the memory instead of resetting."""

  def __init__(self, lm: BeaconLM, state: BeaconState, carry_tokens=None):
    self.lm, self.state, self.cfg = lm, state, lm.cfg
    self.carry = carry_tokens

  def prefill(self, params, tokens, lengths, max_new_tokens):
    rows = _rows(tokens, lengths)
    n_state = len(self.state.sizes())
    # zip would silently drop rows: a prompt fed to another row's memory answers the wrong question
    if len(rows) != n_state:
      raise CapacityError(f"resume: {len(rows)} prompts for a state of {n_state} rows; give one "
                          "prompt per row of the state")
    if self.carry is not None:
      if len(self.carry) != n_state:
        raise CapacityError(f"resume: carry_tokens has {len(self.carry)} rows, the state "
                            f"{n_state}; give one entry per row (an empty list for none)")
      from longjax.generate import check_integer_ids
      check_integer_ids(list(self.carry), what="carry_tokens row")
      rows = [list(map(int, c)) + list(r) for c, r in zip(self.carry, rows)]
    out = self.lm.forward(params, rows, state=self.state, training=False, reserve=max_new_tokens)
    return out.next_logits, out.state

  def step(self, params, state, tokens):
    return self.lm.step(params, state, tokens)

  def device_plan(self, state, n_feeds):
    return self.lm.device_plan(state, n_feeds)


def _no_single_steps(segments):
  """Merge every 1-step segment into a neighbour (which then runs at the larger bucket): XLA
  turns a 1-step scan into straight-line code and schedules its backward pass worse (SmolLM2,
  4 windows: 565 MB of temporaries instead of 407 MB)."""
  out = []
  for n, m in segments:
    if out and out[-1][0] == 1:
      out[-1] = [n + 1, max(m, out[-1][1])]
    else:
      out.append([n, m])
  if len(out) > 1 and out[-1][0] == 1:
    out[-2:] = [[out[-2][0] + 1, max(out[-2][1], out[-1][1])]]
  return out


def _rows(ids, lengths=None) -> list:
  """``[T]`` / ``[B, T]`` (+ lengths) / list of lists -> list of 1-D int arrays; float ids are
  refused (casting would truncate them)."""
  from longjax.generate import check_integer_ids
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
