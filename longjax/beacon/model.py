"""Activation Beacon on the shared decoder: ``BeaconLM``, the generation method (``prefill`` /
``step``) that ``longjax.generate`` drives, its prefill in ``lax.scan`` chunks and its loss.

The host planning of its calls (query slots, memory-size buckets, segments, stacked plans) is
``schedule.py`` over the per-row ``planner.py``; the device step itself, pure and jitted, is
``step.py``.

Prefill runs the planned steps through ``lax.scan`` in chunks of at most ``scan_chunk`` steps that
share one bucket (a chunk starts a new bucket when the memory outgrows the current one); a
chunk's unused tail steps are skipped with ``lax.cond``, so one compiled chunk per bucket serves
any number of windows (full windows and the final partial window alike). Decode steps use one
jitted step per (query slots, bucket).

``loss`` and the training task run the same scan (``scan_windows`` over a ``WindowPlan``) as one
jitted program over all windows: ``Schedule.plan`` stacks every step in bucket segments.
"""
from __future__ import annotations

import dataclasses
import logging
import sys
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from longjax.runtime import program_cache
from longjax.beacon.config import BeaconConfig
from longjax.beacon.memory import BeaconState, empty_state
from longjax.beacon.planner import stack
from longjax.beacon.schedule import (BeaconSetupError, CapacityError, Schedule, rows_of,
                                     segments)
from longjax.beacon.step import Carry, loss_jit, scan_jit, step_jit
from longjax.ckpts import layout
from longjax.kernels import MaskRule
from longjax.models.config import ModelConfig
from longjax.models.decoder import Decoder
from longjax.models.head import lm_head

_log = logging.getLogger("longjax.beacon")


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
  return layout.freeze(params, layout.is_alt)


class BeaconLM:
  """Activation Beacon over a frozen decoder; a ``longjax.generate`` method. The host planning
  of its calls (query slots, memory-size buckets, stacked plans) is ``self.schedule``.

  Args:
    cfg: the decoder config; must have the beacon projections (``alt_projections`` ⊇ ``param``)
      and the beacon embedding row (``num_alt_embeddings >= 1``). ``longjax.beacon.load_beacon``
      produces such a config from an official or plain HF checkpoint.
    bcfg: the beacon settings.
    max_length: most tokens (prompt + generated, over all turns) one state can hold. Sizes the
      memory: ``capacity = sink + (max_length // W) * W / r_min + Q`` entries per layer and row.
    scan_chunk: windows per compiled ``lax.scan`` chunk in prefill.
    decode_slots: query slots of the small bucket for calls of a few tokens (one step); a
      generated token runs in a smaller one still (``schedule.TOKEN_SLOTS``: it and a beacon).
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
    self.schedule = Schedule(bcfg, cfg.vocab_size, cfg.max_positions, max_length=max_length,
                             decode_slots=decode_slots, memory_buckets=memory_buckets,
                             memory_bucket_min=memory_bucket_min,
                             memory_bucket_steps=memory_bucket_steps, training=training,
                             ratio=ratio)
    if cfg.has_sliding_window:
      # The official Activation Beacon code never applies a sliding window (Mistral's is not passed
      # to its attention; it only warns): follow it, so logits match its outputs. PlainLM keeps it.
      _log.warning("Activation Beacon ignores the model's sliding window %s, as the official "
                   "beacon code does (memory + window attend in full)", cfg.sliding_windows[0])
      cfg = cfg.replace(sliding_windows=None)
    self.cfg = cfg
    self.bcfg = bcfg
    self.max_length = self.schedule.max_length
    self.capacity = self.schedule.capacity  # KV entries per layer and row of a state's buffers
    self.scan_chunk = int(scan_chunk)
    self.progress = progress
    rule = MaskRule(causal=True, kind_sees=(0b01, 0b11) if bcfg.attn == "step-expansion" else None)
    # remat True / "dots": the decoder's per-layer policy (ModelConfig.remat).
    self.model = Decoder(cfg.replace(remat=remat) if remat else cfg, rule=rule, impl=impl)
    self.sink_cap = self.schedule.sink_cap
    self.remat = remat
    self._static = dict(model=self.model, sink_cap=self.sink_cap)
    self.check_state_fits(1)  # max_length=10**10 is refused here, not at the first allocation

  def state_bytes(self, batch: int) -> int:
    """Bytes of a ``batch``-row state's K and V buffers (``capacity`` entries per layer and row)."""
    c = self.cfg
    return (2 * c.num_layers * int(batch) * self.capacity * c.num_kv_heads * c.head_dim
            * np.dtype(c.compute_dtype).itemsize)

  def check_state_fits(self, batch: int):
    """Host side, before allocating: the memory buffers of ``batch`` rows must fit the device,
    and a buffer's positions must be int32-indexable."""
    from longjax.models.inputs import memory_limit_bytes
    need, have = self.state_bytes(batch), memory_limit_bytes()
    if need <= have and self.capacity < 2**31:
      return
    per_entry = self.state_bytes(1) / self.capacity
    fixed = self.capacity - self.schedule.beacon_capacity  # sink + window slots
    per_window = max(self.bcfg.max_memory_per_window, 1)
    fits = int((min(have / batch / per_entry, 2**31 - 1) - fixed) // per_window) * self.bcfg.stride
    raise CapacityError(
        f"BeaconLM(max_length={self.max_length}) needs a memory of {self.capacity} KV entries per "
        f"layer and row ({need / 2**30:.1f} GiB for {batch} row{'s' if batch > 1 else ''}), "
        f"more than this device holds ({have / 2**30:.1f} GiB)"
        + (" or int32 positions index" if self.capacity >= 2**31 else "")
        + f": lower max_length (at most about {max(fits, 0)} tokens here"
        + (f" for {batch} rows" if batch > 1 else "") + ")")

  def init_state(self, batch: int) -> BeaconState:
    c = self.cfg
    self.check_state_fits(batch)
    return empty_state(c.num_layers, batch, self.capacity, c.num_kv_heads, c.head_dim,
                       c.compute_dtype)

  # ------------------------------------------------------------------------------------------
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
      state = self.init_state(len(rows_of(ids, lengths)))
    call = self.schedule.call(ids, labels, lengths, state.rows, training, ratio, reserve)
    b = state.batch
    # Host zeros: jnp.zeros would compile three tiny programs in every new process.
    carry = Carry(state.k, state.v, np.zeros((b, self.cfg.vocab_size), np.float32),
                  np.zeros((b,), np.float32), np.zeros((b,), np.int32))
    flags = dict(want_loss=labels is not None, want_hidden=collect_logits, **self._static)
    if not use_scan or (len(call.steps) == 1 and call.q_slots <= self.schedule.decode_slots):
      carry, hidden, used = self._run_steps(params, carry, call, flags)
    else:
      carry, hidden, used = self._run_chunks(params, carry, call, flags, state.capacity)
    state = BeaconState(carry.k, carry.v, call.rows)
    out = ForwardOutput(next_logits=carry.last, state=state, loss_sum=carry.loss_sum,
                        loss_count=carry.loss_count, steps=call.descs, mem_buckets=used)
    if collect_logits:
      hidden = jnp.concatenate(hidden, axis=0)  # [steps, B, Q, H]
      out.raw_logits = self._gather_raw_logits(params, hidden, call.descs)
    return out

  def _run_steps(self, params, carry: Carry, call, flags: dict):
    """Each step of ``call`` as one jitted window step at its memory bucket (decode steps):
    ``(carry, per step hidden [1, B, Q, H], the buckets used)``."""
    hidden, used = [], []
    for step, need in zip(call.steps, call.needs):
      bucket = self.schedule.memory_bucket(need)
      plan = self.schedule.assemble(step, call.q_slots)
      carry, hid = program_cache.call("beacon_step", step_jit, dict(flags, mem_size=bucket),
                                      params, carry, plan)
      used.append(bucket)
      if flags["want_hidden"]:
        hidden.append(hid[None])
    return carry, hidden, used

  def _run_chunks(self, params, carry: Carry, call, flags: dict, capacity: int):
    """The steps of ``call`` in scan chunks of at most ``scan_chunk`` steps at one memory
    bucket: ``(carry, per chunk hidden [n, B, Q, H], the buckets used)``."""
    chunk, b = self.scan_chunk, len(call.rows)
    buckets = [self.schedule.memory_bucket(n) for n in call.needs]
    hidden, used = [], []
    bar = self._progress_bar(len(call.steps))
    for c0, c1, bucket in segments(buckets, most=chunk):
      # Every chunk is padded to scan_chunk skipped steps: one compiled chunk per bucket.
      plans = [self.schedule.assemble(step, call.q_slots) for step in call.steps[c0:c1]]
      plans += [self.schedule.assemble([None] * b, call.q_slots)] * (chunk - len(plans))
      plan = stack(plans, [(chunk, bucket)], capacity)
      carry, hid = program_cache.call("beacon_scan", scan_jit, flags, params, carry, plan)
      used.append(bucket)
      if flags["want_hidden"]:
        hidden.append(hid[:c1 - c0])
      if bar is not None:
        bar.update(c1 - c0)
    if bar is not None:
      bar.close()
    return carry, hidden, used

  def _gather_raw_logits(self, params, hidden, descs):
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

    One jitted program over all windows (``step.loss_terms``; see ``remat``). In
    training mode the base is frozen as in the official training: only the beacon tensors
    (``alt_*``) get a gradient; the base's gradient is zero and never computed.
    """
    if labels is None:
      labels = ids
    training = self.schedule.training if training is None else training
    plan = self.schedule.plan(ids, labels, lengths=lengths, state=state, training=training,
                              ratio=ratio)
    if training:
      params = frozen_base(params)
    k, v = (None, None) if state is None else (state.k, state.v)
    ls, lc = loss_jit(params, plan, k, v, frozen_head=training, **self._static)
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
    rows = rows_of(tokens, lengths)
    n_state = len(self.state.sizes())
    # zip would silently drop rows: a prompt fed to another row's memory answers the wrong question
    if len(rows) != n_state:
      raise CapacityError(f"resume: {len(rows)} prompts for a state of {n_state} rows; give one "
                          "prompt per row of the state")
    if self.carry is not None:
      if len(self.carry) != n_state:
        raise CapacityError(f"resume: carry_tokens has {len(self.carry)} rows, the state "
                            f"{n_state}; give one entry per row (an empty list for none)")
      from longjax.models.inputs import check_integer_ids
      check_integer_ids(list(self.carry), what="carry_tokens row")
      rows = [list(map(int, c)) + list(r) for c, r in zip(self.carry, rows)]
    out = self.lm.forward(params, rows, state=self.state, training=False, reserve=max_new_tokens)
    return out.next_logits, out.state

  def step(self, params, state, tokens):
    return self.lm.step(params, state, tokens)

  def device_plan(self, state, n_feeds):
    return self.lm.device_plan(state, n_feeds)
