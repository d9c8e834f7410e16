"""The pure device side of Activation Beacon: one window step, the scan over a stacked plan, the
training loss over it (hard labels or soft targets), and their jitted programs. Everything here is
a function of arrays and static settings. The host side is the planning (``planner.py``, whose
``WindowPlan`` this module runs, and ``schedule.py``) and ``BeaconLM`` (``model.py``); ``model.py``,
the decode loop's plans (``decode.py``) and the training task import this module, never the
reverse.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp

from longjax.runtime import program_cache
from longjax.beacon.planner import IGNORE, WindowPlan
from longjax.kernels import TokenMeta
from longjax.models.config import ModelConfig
from longjax.models.decoder import Decoder, KVPrefix
from longjax.models.head import head_nll, lm_head


class Carry(NamedTuple):
  """What the window scan carries from one official call to the next."""
  k: jax.Array  # [L, B, C, Hkv, D] memory buffers: pre-RoPE keys
  v: jax.Array  # [L, B, C, Hkv, D] values
  last: jax.Array  # [B, V] fp32 logits after each row's last raw token so far
  loss_sum: jax.Array  # [B] fp32 summed token CE
  loss_count: jax.Array  # [B] int32 labelled tokens


program_cache.register_pytree(Carry, "longjax.beacon.Carry")


def _token_nll(cfg: ModelConfig, params, h, labels, frozen_head: bool):
  """Next-token NLL ``[B, L]`` of hidden states ``h [B, L, H]`` (IGNORE labels: 0)."""
  return _frozen_head_nll(cfg, params, h, labels) if frozen_head else _nll(cfg, params, h, labels)


def _nll(cfg, params, h, labels, with_grad=False):
  ok = labels != IGNORE
  safe = jnp.where(ok, labels, 0)[..., None]
  if not with_grad:
    return jnp.where(ok, head_nll(cfg, params, h, safe[..., 0]), 0.0)
  logits = lm_head(cfg, params, h)
  # One pass over the [B, L, V] logits for both the NLL and its gradient (softmax - onehot).
  m = jax.lax.stop_gradient(jnp.max(logits, axis=-1, keepdims=True))
  e = jnp.exp(logits - m)
  s = jnp.sum(e, axis=-1, keepdims=True)
  nll = (jnp.log(s) + m - jnp.take_along_axis(logits, safe, axis=-1))[..., 0]
  g = e * (ok[..., None] / s)
  g = jnp.put_along_axis(g, safe, jnp.take_along_axis(g, safe, axis=-1) - ok[..., None], axis=-1,
                         inplace=False)
  _, pull = jax.vjp(lambda x: lm_head(cfg, params, x), h)
  (dh,) = pull(g)
  return jnp.where(ok, nll, 0.0), dh.astype(h.dtype)


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def _frozen_head_nll(cfg, params, h, labels):
  """``_nll`` whose derivative reaches ``h`` only: the LM head (and the tied embedding) is
  frozen. d nll / d h = (softmax - onehot) @ head is computed with the logits in the forward pass
  (only when differentiating), so the backward pass keeps ``dh [B, L, H]`` instead of the
  ``[B, L, V]`` logits and needs no head matmul."""
  return _nll(cfg, params, h, labels)


@_frozen_head_nll.defjvp
def _frozen_head_nll_jvp(cfg, primals, tangents):
  params, h, labels = primals
  nll, dh = _nll(cfg, params, h, labels, with_grad=True)
  # The tangent has the NLL's dtype (fp32) whatever h's (bf16 on accelerators).
  return nll, jnp.sum(tangents[1] * dh, axis=-1, dtype=jnp.float32).astype(nll.dtype)


def _soft_ce(cfg, params, h, idx, p, rest=None, with_grad=False):
  """Cross-entropy ``[B, L]`` of the logits of ``h [B, L, H]`` against soft targets: ids ``idx``
  and mass ``p`` ``[B, L, K]`` (unnormalised: a row's mass is its weight, 0 for no loss):
  ``sum_k p_k * (logsumexp(z) - z[idx_k])``; with ``rest [B, L]`` (the target's mass outside the
  ids with ``p > 0``) also ``- rest * log(mass of the student outside them)``: the K ids plus one
  bucket for the rest of the vocabulary. ``with_grad`` also returns d/dh, computed from the same
  logits (``w * softmax(z) - scatter(p)`` plus the bucket's term, then the head's transpose), as
  ``_nll`` does."""
  logits = lm_head(cfg, params, h)
  m = jax.lax.stop_gradient(jnp.max(logits, axis=-1, keepdims=True))
  e = jnp.exp(logits - m)
  s = jnp.sum(e, axis=-1, keepdims=True)
  w = jnp.sum(p, axis=-1)
  ce = w * (jnp.log(s[..., 0]) + m[..., 0]) - jnp.sum(p * jnp.take_along_axis(logits, idx, -1), -1)
  v = logits.shape[-1]
  scatter = lambda vals, fn: jax.vmap(fn)(  # noqa: E731  one row of [V] per label
      jnp.zeros((idx.shape[0] * idx.shape[1], v), logits.dtype), idx.reshape(-1, idx.shape[-1]),
      vals.reshape(-1, vals.shape[-1])).reshape(logits.shape)
  if rest is not None:
    # the student's mass outside the ids, summed directly (1 - sum over the ids would cancel)
    member = scatter((p > 0).astype(logits.dtype), lambda r, i, x: r.at[i].max(x))
    out = jnp.sum(e * (1 - member), axis=-1) / s[..., 0]
    tail = jnp.maximum(out, 1e-30)
    ce = ce - jnp.where(rest > 0, rest * jnp.log(tail), 0.0)
  if not with_grad:
    return ce
  g = e * (w[..., None] / s) - scatter(p, lambda r, i, x: r.at[i].add(x))
  if rest is not None:  # d(-rest log tail)/dz_j = rest / tail * q_j * (member_j - (1 - tail))
    q = e / s
    g = g + jnp.where(rest > 0, rest / tail, 0.0)[..., None] * q * (member - (1 - out)[..., None])
  _, pull = jax.vjp(lambda x: lm_head(cfg, params, x), h)
  (dh,) = pull(g)
  return ce, dh.astype(h.dtype)


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def _frozen_head_soft_ce(cfg, params, h, idx, p, rest):
  """``_soft_ce`` whose derivative reaches ``h`` only (see ``_frozen_head_nll``)."""
  return _soft_ce(cfg, params, h, idx, p, rest)


@_frozen_head_soft_ce.defjvp
def _frozen_head_soft_ce_jvp(cfg, primals, tangents):
  params, h, idx, p, rest = primals
  ce, dh = _soft_ce(cfg, params, h, idx, p, rest, with_grad=True)
  return ce, jnp.sum(tangents[1] * dh, axis=-1, dtype=jnp.float32).astype(ce.dtype)


def _token_loss(cfg, params, h, plan, frozen_head: bool):
  """Per-label loss ``[B, L]``: next-token NLL, or the soft cross-entropy of ``plan.soft_*``."""
  if plan.soft_idx is None:
    return _token_nll(cfg, params, h, plan.labels, frozen_head)
  rest = plan.soft_rest
  if frozen_head:
    if rest is None:  # custom_jvp primals must be arrays
      rest = jnp.zeros(plan.soft_p.shape[:-1], plan.soft_p.dtype)
    return _frozen_head_soft_ce(cfg, params, h, plan.soft_idx, plan.soft_p, rest)
  return _soft_ce(cfg, params, h, plan.soft_idx, plan.soft_p, rest)


def window_step(model: Decoder, sink_cap: int, params, carry: Carry, plan: WindowPlan, *,
                mem_size: Optional[int], want_loss: bool, want_hidden: bool,
                frozen_head: bool = False):
  """One official call for every row (a no-op for rows without one), folded into ``carry``.

  ``mem_size`` (static): the attention sees only the buffer's first ``mem_size`` entries (a
  memory-size bucket; every row's valid memory must lie inside them, see
  ``Schedule.memory_need``); ``None``: the whole buffer. The write-back always goes to the full
  buffer. ``frozen_head``: the loss's gradient stops at the hidden states (``_token_nll``).

  Returns ``(carry, hidden [B, Q, H] or None)``: the memory written back, the logits after each
  row's last raw token (kept from ``carry`` for rows without one) and the summed loss.
  """
  cfg = model.cfg
  b = plan.tokens.shape[0]
  cap = carry.k.shape[2]
  m = cap if mem_size is None else min(int(mem_size), cap)
  kinds = model.rule.kind_sees is not None
  # m == 0: nothing valid in memory (the first window): attend to the window only
  memory = _memory_prefix(carry.k, carry.v, plan, m, sink_cap, kinds) if m > 0 else None
  q_meta = TokenMeta.causal(plan.order, valid=plan.valid, kind=plan.kind if kinds else None)
  last = jnp.maximum(plan.last_slot, 0)
  # Reading (no loss, no hidden states): only the last raw token's output is used, so the last
  # layer computes only it besides every token's keys and values.
  rows = None if (want_loss or want_hidden) else last[:, None]
  hidden, (nk, nv) = model.apply({"params": params}, plan.tokens, plan.pos, q_meta=q_meta,
                                 alt=plan.alt_slot, memory=memory, head=False, head_rows=rows)
  write = _append if plan.append_only else _write_back
  k = write(carry.k, nk, plan, sink_cap)
  v = write(carry.v, nv, plan, sink_cap)

  h_last = (hidden if rows is not None
            else jnp.take_along_axis(hidden, last[:, None, None], axis=1))[:, 0]
  last = jnp.where((plan.last_slot >= 0)[:, None], lm_head(cfg, params, h_last), carry.last)
  if want_loss:
    h = jnp.take_along_axis(hidden, plan.label_slot[..., None], axis=1)  # [B, L, H]
    ok = plan.labels != IGNORE
    loss_sum = jnp.sum(_token_loss(cfg, params, h, plan, frozen_head), axis=-1)
    loss_count = jnp.sum(ok, axis=-1, dtype=jnp.int32)
  else:
    loss_sum = jnp.zeros((b,), jnp.float32)
    loss_count = jnp.zeros((b,), jnp.int32)
  carry = Carry(k, v, last, carry.loss_sum + loss_sum, carry.loss_count + loss_count)
  return carry, (hidden if want_hidden else None)


def _memory_prefix(k, v, plan: WindowPlan, m: int, sink_cap: int, kinds: bool) -> KVPrefix:
  """The first ``m`` buffer entries as the attention's KV prefix: positions and mask metadata
  from the step's region lengths (sink, beacons, raw region)."""
  b = plan.tokens.shape[0]
  j = jnp.arange(m, dtype=jnp.int32)[None]
  jr = j - sink_cap
  nb = plan.beacon_len[:, None]
  in_sink = j < sink_cap
  mem_valid = jnp.where(in_sink, j < plan.sink_len[:, None],
                        (jr >= 0) & (jr < nb + plan.raw_len[:, None]))
  mem_pos = jnp.where(in_sink, j, plan.sink_len[:, None] + jr)
  mem_order = jnp.where(jr >= nb, 2 * (jr - nb), -1)
  mem_meta = TokenMeta.causal(mem_order, valid=mem_valid,
                              kind=jnp.zeros((b, m), jnp.int32) if kinds else None)
  mk, mv = (k, v) if m == k.shape[2] else (k[:, :, :m], v[:, :, :m])
  # mem_pos <= j < m for every entry (sink_len <= sink_cap): the RoPE tables come from one table
  # of m positions (computed once per decode loop, not per step)
  return KVPrefix(mk, mv, mem_pos, mem_meta, position_bound=m)


def _write_back(buf, new, plan: WindowPlan, sink_cap: int):
  """Every row's raw-region slab of ``buf [L, B, C, H, D]`` replaced by the entries ``plan.src``
  keeps of it and of the step's new KV ``new [L, B, Q, H, D]``; the sink (re)captured."""
  r_slots = plan.src.shape[1]

  def update(buf, new, base, src, capture):  # one row: buf [L, C, H, D], new [L, Q, H, D]
    new = new.astype(buf.dtype)
    slab = jax.lax.dynamic_slice_in_dim(buf, base, r_slots, axis=1)
    kept = jnp.take(jnp.concatenate([slab, new], axis=1), src, axis=1)
    buf = jax.lax.dynamic_update_slice_in_dim(buf, kept, base, axis=1)
    if sink_cap:
      head = new[:, :sink_cap]
      if head.shape[1] < sink_cap:
        head = jnp.pad(head, ((0, 0), (0, sink_cap - head.shape[1]), (0, 0), (0, 0)))
      buf = buf.at[:, :sink_cap].set(jnp.where(capture, head, buf[:, :sink_cap]))
    return buf

  upd = jax.vmap(update, in_axes=(1, 1, 0, 0, 0), out_axes=1)
  return upd(buf, new, sink_cap + plan.beacon_len, plan.src, plan.capture)


def _append(buf, new, plan: WindowPlan, sink_cap: int):
  """``_write_back`` of a step that only appends (``plan.append_only``): each row's valid slots
  of ``new [L, B, Q, H, D]`` scattered after its raw region; every other entry stays in place.
  (The general write-back reads and rewrites the whole raw-region slab, 1,152 entries per layer
  at the official sizes, for the one or two entries a decode step adds.)"""
  b, c, q = buf.shape[1], buf.shape[2], new.shape[2]
  end = sink_cap + plan.beacon_len + plan.raw_len  # [B]
  dest = jnp.where(plan.valid, end[:, None] + jnp.arange(q, dtype=end.dtype)[None], c)
  rows = jnp.broadcast_to(jnp.arange(b)[:, None], (b, q))
  return buf.at[:, rows, dest].set(new.astype(buf.dtype), mode="drop")  # padding: dropped


def scan_windows(model: Decoder, sink_cap: int, params, carry: Carry, plan: WindowPlan, *,
                 want_loss: bool, want_hidden: bool, frozen_head: bool = False):
  """Run a stacked plan's steps (``[n, ...]`` leaves) over ``carry``: pure and jittable.

  The one window scan of prefill (``BeaconLM.forward``), ``BeaconLM.loss`` and the training
  task. Each of ``plan.segments`` is one ``lax.scan`` of ``window_step`` whose attention reads
  that segment's memory-size bucket of the buffer, so a window costs what its filled memory
  costs. With ``plan.guard``, inactive (padding) steps are skipped with ``lax.cond``. Memory under
  ``jax.grad``: with ``model.cfg.remat`` (``BeaconLM(remat=True)``) each window keeps its layer
  inputs and memory slices, and its layers are recomputed one at a time in the backward pass.

  Returns ``(carry, hidden [n, B, Q, H] or None)``.
  """
  outs, s0 = [], 0
  q = plan.tokens.shape[-1]
  for n, mem_size, width, n_labels in plan.segments:
    seg = _narrow(jax.tree.map(lambda x, s0=s0, n=n: x[s0:s0 + n], plan), width, n_labels)
    s0 += n
    step = functools.partial(window_step, model, sink_cap, params, mem_size=mem_size,
                             want_loss=want_loss, want_hidden=want_hidden, frozen_head=frozen_head)
    if plan.guard:
      step = _skip_inactive(step, want_hidden, params["embedding"].shape[-1])
    carry, hid = jax.lax.scan(step, carry, seg)
    if want_hidden and width < q:
      hid = jnp.pad(hid, ((0, 0), (0, 0), (0, q - width), (0, 0)))
    outs.append(hid)
  if s0 != plan.n_steps:
    raise AssertionError(f"segments {plan.segments} do not cover the plan's {plan.n_steps} steps")
  return carry, (jnp.concatenate(outs, axis=0) if want_hidden else None)


def _narrow(seg: WindowPlan, width: int, n_labels: int) -> WindowPlan:
  """A segment's steps with only their first ``width`` query slots and ``n_labels`` label slots
  (static slices, see ``stack``): after the first window, an append step with stride S < W feeds
  S raw tokens, and padding it to W + S / r slots would nearly double its compute. Beacon slots
  padded with Q stay out of range (dropped); label slots of padding labels are clamped."""
  q, nl = seg.tokens.shape[-1], seg.labels.shape[-1]
  if width == q and n_labels == nl:
    return seg
  cut = lambda x, m: None if x is None else x[:, :, :m]  # noqa: E731  [n, B, Q or L, ...]
  return dataclasses.replace(
      seg, tokens=cut(seg.tokens, width), pos=cut(seg.pos, width), order=cut(seg.order, width),
      kind=cut(seg.kind, width), valid=cut(seg.valid, width),
      label_slot=jnp.minimum(cut(seg.label_slot, n_labels), width - 1),
      labels=cut(seg.labels, n_labels), soft_idx=cut(seg.soft_idx, n_labels),
      soft_p=cut(seg.soft_p, n_labels), soft_rest=cut(seg.soft_rest, n_labels))


def _skip_inactive(step, want_hidden: bool, hidden_size: int):
  """``step(carry, plan)`` run under ``lax.cond``: an inactive (padding) step leaves the carry as
  it is (and gives zero hidden states)."""
  def guarded(c, p):
    def skip(c):
      hid = None
      if want_hidden:
        b, q = p.tokens.shape
        hid = jnp.zeros((b, q, hidden_size), c.k.dtype)
      return c, hid
    return jax.lax.cond(p.active, lambda c: step(c, p), skip, c)
  return guarded


def start_carry(cfg: ModelConfig, plan: WindowPlan, k=None, v=None) -> Carry:
  """The carry a loss scan starts from: the memory ``k``/``v`` (default: empty buffers of
  ``plan.capacity`` entries), no logits, no loss."""
  b = plan.tokens.shape[1]
  if k is None:
    shape = (cfg.num_layers, b, plan.capacity, cfg.num_kv_heads, cfg.head_dim)
    k = v = jnp.zeros(shape, cfg.compute_dtype)
  return Carry(k, v, jnp.zeros((b, cfg.vocab_size), jnp.float32), jnp.zeros((b,), jnp.float32),
               jnp.zeros((b,), jnp.int32))


def loss_terms(params, plan: WindowPlan, k=None, v=None, *, model: Decoder, sink_cap: int,
               frozen_head: bool = False):
  """``(loss_sum [B], loss_count [B])`` of a stacked plan from the memory ``k``/``v`` (default:
  empty buffers of ``plan.capacity`` entries): pure and jittable. ``frozen_head``: no gradient
  reaches the LM head / tied embedding (training: the base is frozen), which saves a head matmul
  and the logits' memory in the backward pass."""
  carry, _ = scan_windows(model, sink_cap, params, start_carry(model.cfg, plan, k, v), plan,
                          want_loss=True, want_hidden=False, frozen_head=frozen_head)
  return carry.loss_sum, carry.loss_count


# Compiled programs, shared by every BeaconLM over an equal decoder (so that
# ``BeaconLM(...).loss`` built afresh in a loop does not recompile). ``scan_jit`` calls
# ``scan_windows`` only while tracing: tests count those calls (one compile per memory-size bucket,
# for any number of windows).
_STATIC = ("model", "sink_cap", "want_loss", "want_hidden")


@functools.partial(jax.jit, static_argnames=_STATIC)
def scan_jit(params, carry, plan, *, model, sink_cap, want_loss, want_hidden):
  return scan_windows(model, sink_cap, params, carry, plan, want_loss=want_loss,
                      want_hidden=want_hidden)


@functools.partial(jax.jit, static_argnames=_STATIC + ("mem_size",))
def step_jit(params, carry, plan, *, model, sink_cap, want_loss, want_hidden, mem_size):
  return window_step(model, sink_cap, params, carry, plan, mem_size=mem_size, want_loss=want_loss,
                     want_hidden=want_hidden)


loss_jit = jax.jit(loss_terms, static_argnames=("model", "sink_cap", "frozen_head"))
