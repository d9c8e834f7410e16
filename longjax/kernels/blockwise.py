"""Blockwise (online-softmax) attention in plain jnp: the fallback that never materialises T x T.

Forward: for each query block (``lax.map``, sequential) a ``lax.scan`` over the KV blocks keeps the
running max / denominator / accumulator (flash attention's recurrence). A KV block that no query of
the block may see (``mask.block_visits``: per-block ranges of the kernel metadata) is skipped with
``lax.cond``, so on CPU a causal or windowed mask costs about half / ``window/T`` of the dense
FLOPs. Peak memory is one ``[B, Hq, block_q, block_k]`` score tile.

Backward (:func:`blockwise_bwd`): the flash-attention backward recurrence, recomputing the
probabilities from the saved log-sum-exp: one pass over query blocks for ``dq`` and one pass over
KV blocks for ``dk``/``dv`` (GQA: summed over the query heads of a group). It is also the VJP of the
Pallas kernels (``flash.py``): they save ``(out, lse)`` and reuse this backward.

The cotangent of ``lse`` is supported (``d lse / d s = p``), so ``return_lse=True`` callers that
merge partial results can differentiate through the merge.

Key score biases (``KernelMeta.k_bias``, ``None`` for none) are added to the scores of their keys in
both passes; their gradient is the score gradient summed over the queries and heads that read the
key (``d s / d bias = 1``), accumulated with ``dk`` / ``dv``.
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from longjax.kernels.mask import (KernelMeta, block_visits, kernel_allowed, pad_kernel_meta)
from longjax.runtime.rounding import round_up


def _pad_seq(x, t, axis=1):
  n = t - x.shape[axis]
  if n == 0:
    return x
  widths = [(0, 0)] * x.ndim
  widths[axis] = (0, n)
  return jnp.pad(x, widths)


def _tiling(q, k, km: KernelMeta, block_q, block_k):
  """One call's tiling: ``(b, tq, tk, hq, hkv, g, d)`` sizes, ``(bq, bk, tqp, tkp, nq, nk)``
  block sizes, padded lengths and block counts, ``km`` padded to those lengths and its
  ``[B, nQ, nK]`` block-visit table (forward and backward must tile alike)."""
  b, tq, hq, d = q.shape
  tk, hkv = k.shape[1], k.shape[2]
  bq = min(block_q, round_up(tq, 8))
  bk = min(block_k, round_up(tk, 8))
  tqp, tkp = round_up(tq, bq), round_up(tk, bk)
  km = pad_kernel_meta(km, tqp, tkp)
  return ((b, tq, tk, hq, hkv, hq // hkv, d), (bq, bk, tqp, tkp, tqp // bq, tkp // bk), km,
          block_visits(km, bq, bk))


def _mask(km: KernelMeta, i, j, bq, bk, kind_sees):
  """``[B, 1, 1, bq, bk]`` mask of query block ``i`` against key block ``j``."""
  sl_q = lambda x: jax.lax.dynamic_slice_in_dim(x, i * bq, bq, axis=1)[:, None, None, :, None]
  sl_k = lambda x: jax.lax.dynamic_slice_in_dim(x, j * bk, bk, axis=1)[:, None, None, None, :]
  return kernel_allowed(sl_q(km.q_lo), sl_q(km.q_hi), sl_q(km.q_seg), sl_q(km.q_kind),
                        sl_k(km.k_order), sl_k(km.k_seg), sl_k(km.k_kind), kind_sees)


def _biased(s, km: KernelMeta, j, bk):
  """Scores ``s [B, Hkv, G, bq, bk]`` of key block ``j`` plus the keys' score bias, if any."""
  if km.k_bias is None:
    return s
  return s + jax.lax.dynamic_slice_in_dim(km.k_bias, j * bk, bk, axis=1)[:, None, None, None, :]


def blockwise_fwd(q, k, v, km: KernelMeta, *, scale: float, kind_sees=None, block_q: int = 512,
                  block_k: int = 512):
  """Returns ``(out [B, Tq, Hq, D] q.dtype, lse [B, Hq, Tq] fp32)``; empty rows give 0 / -inf."""
  (b, tq, tk, hq, hkv, g, d), (bq, bk, tqp, tkp, nq, nk), km, visits = _tiling(
      q, k, km, block_q, block_k)
  qp = _pad_seq(q, tqp).reshape(b, tqp, hkv, g, d)
  kp, vp = _pad_seq(k, tkp), _pad_seq(v, tkp)

  def q_block(i):
    qi = jax.lax.dynamic_slice_in_dim(qp, i * bq, bq, axis=1)  # [B, bq, Hkv, G, D]

    def compute(carry, j):
      m, l, acc = carry
      kj = jax.lax.dynamic_slice_in_dim(kp, j * bk, bk, axis=1)
      vj = jax.lax.dynamic_slice_in_dim(vp, j * bk, bk, axis=1)
      s = jnp.einsum("bqhgd,bkhd->bhgqk", qi, kj, preferred_element_type=jnp.float32) * scale
      s = jnp.where(_mask(km, i, j, bq, bk, kind_sees), _biased(s, km, j, bk), -jnp.inf)
      m_new = jnp.maximum(m, jnp.max(s, axis=-1))
      m_safe = jnp.where(jnp.isfinite(m_new), m_new, 0.0)
      alpha = jnp.exp(m - m_safe)
      p = jnp.exp(s - m_safe[..., None])
      l = l * alpha + jnp.sum(p, axis=-1)
      pv = jnp.einsum("bhgqk,bkhd->bhgqd", p.astype(v.dtype), vj,
                      preferred_element_type=jnp.float32)
      return m_new, l, acc * alpha[..., None] + pv

    def step(carry, j):
      carry = jax.lax.cond(jnp.any(visits[:, i, j]), compute, lambda c, _: c, carry, j)
      return carry, None

    init = (jnp.full((b, hkv, g, bq), -jnp.inf, jnp.float32),
            jnp.zeros((b, hkv, g, bq), jnp.float32),
            jnp.zeros((b, hkv, g, bq, d), jnp.float32))
    (m, l, acc), _ = jax.lax.scan(step, init, jnp.arange(nk))
    pos = l > 0
    out = acc / jnp.where(pos, l, 1.0)[..., None]
    m_safe = jnp.where(jnp.isfinite(m), m, 0.0)
    lse = jnp.where(pos, m_safe + jnp.log(jnp.where(pos, l, 1.0)), -jnp.inf)
    return out.astype(q.dtype), lse

  out, lse = jax.lax.map(q_block, jnp.arange(nq))  # [nQ, B, Hkv, G, bq, (D)]
  out = out.transpose(1, 0, 4, 2, 3, 5).reshape(b, tqp, hq, d)[:, :tq]
  lse = lse.transpose(1, 2, 3, 0, 4).reshape(b, hq, tqp)[:, :, :tq]
  return out, lse


def blockwise_bwd(q, k, v, km: KernelMeta, out, lse, dout, dlse=None, *, scale: float,
                  kind_sees=None, block_q: int = 512, block_k: int = 512):
  """Gradients ``(dq, dk, dv, dbias)`` of ``(out, lse) = attention(q, k, v)`` given their
  cotangents; ``dbias [B, Tk]`` is ``None`` when the keys carry no score bias."""
  (b, tq, tk, hq, hkv, g, d), (bq, bk, tqp, tkp, nq, nk), km, visits = _tiling(
      q, k, km, block_q, block_k)
  # delta_i = sum_d dO_i O_i - dlse_i   (the softmax-Jacobian correction, per query row)
  delta = jnp.einsum("bqhd,bqhd->bhq", dout.astype(jnp.float32), out.astype(jnp.float32))
  if dlse is not None:
    delta = delta - dlse.astype(jnp.float32)
  lse_safe = jnp.where(jnp.isfinite(lse), lse, 0.0)
  # Padded layouts: queries [B, T, Hkv, G, D]; per-row stats [B, Hkv, G, T].
  qp = _pad_seq(q, tqp).reshape(b, tqp, hkv, g, d)
  dop = _pad_seq(dout, tqp).reshape(b, tqp, hkv, g, d)
  stat = lambda x: _pad_seq(x, tqp, axis=2).reshape(b, hkv, g, tqp)
  lse_p, delta_p = stat(lse_safe), stat(delta)
  kp, vp = _pad_seq(k, tkp), _pad_seq(v, tkp)
  cdt = q.dtype

  def tile(i, j):
    qi = jax.lax.dynamic_slice_in_dim(qp, i * bq, bq, axis=1)
    doi = jax.lax.dynamic_slice_in_dim(dop, i * bq, bq, axis=1)
    li = jax.lax.dynamic_slice_in_dim(lse_p, i * bq, bq, axis=3)
    di = jax.lax.dynamic_slice_in_dim(delta_p, i * bq, bq, axis=3)
    kj = jax.lax.dynamic_slice_in_dim(kp, j * bk, bk, axis=1)
    vj = jax.lax.dynamic_slice_in_dim(vp, j * bk, bk, axis=1)
    s = _biased(jnp.einsum("bqhgd,bkhd->bhgqk", qi, kj, preferred_element_type=jnp.float32)
                * scale, km, j, bk)
    mask = _mask(km, i, j, bq, bk, kind_sees)
    p = jnp.where(mask, jnp.exp(s - li[..., None]), 0.0)
    dp = jnp.einsum("bqhgd,bkhd->bhgqk", doi, vj, preferred_element_type=jnp.float32)
    ds = p * (dp - di[..., None])
    return qi, doi, kj, p, ds

  def dq_block(i):
    def step(acc, j):
      def compute(acc):
        _, _, kj, _, ds = tile(i, j)
        return acc + jnp.einsum("bhgqk,bkhd->bqhgd", ds.astype(cdt), kj,
                                preferred_element_type=jnp.float32)
      return jax.lax.cond(jnp.any(visits[:, i, j]), compute, lambda a: a, acc), None
    acc, _ = jax.lax.scan(step, jnp.zeros((b, bq, hkv, g, d), jnp.float32), jnp.arange(nk))
    return acc * scale

  def dkv_block(j):
    def step(acc, i):
      def compute(acc):
        dk, dv, db = acc
        qi, doi, _, p, ds = tile(i, j)
        dv = dv + jnp.einsum("bhgqk,bqhgd->bkhd", p.astype(cdt), doi,
                             preferred_element_type=jnp.float32)
        dk = dk + jnp.einsum("bhgqk,bqhgd->bkhd", ds.astype(cdt), qi,
                             preferred_element_type=jnp.float32)
        return dk, dv, db + jnp.sum(ds, axis=(1, 2, 3))
      return jax.lax.cond(jnp.any(visits[:, i, j]), compute, lambda a: a, acc), None
    zeros = jnp.zeros((b, bk, hkv, d), jnp.float32)
    (dk, dv, db), _ = jax.lax.scan(step, (zeros, zeros, jnp.zeros((b, bk), jnp.float32)),
                                   jnp.arange(nq))
    return dk * scale, dv, db

  dq = jax.lax.map(dq_block, jnp.arange(nq))  # [nQ, B, bq, Hkv, G, D]
  dq = dq.transpose(1, 0, 2, 3, 4, 5).reshape(b, tqp, hq, d)[:, :tq].astype(q.dtype)
  dk, dv, db = jax.lax.map(dkv_block, jnp.arange(nk))  # [nK, B, bk, Hkv, D], db [nK, B, bk]
  dk = dk.transpose(1, 0, 2, 3, 4).reshape(b, tkp, hkv, d)[:, :tk].astype(k.dtype)
  dv = dv.transpose(1, 0, 2, 3, 4).reshape(b, tkp, hkv, d)[:, :tk].astype(v.dtype)
  dbias = None if km.k_bias is None else db.transpose(1, 0, 2).reshape(b, tkp)[:, :tk]
  return dq, dk, dv, dbias


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def attention_with_vjp(q, k, v, km: KernelMeta, fwd, bwd):
  """``(out, lse) = fwd(q, k, v, km)`` with the VJP ``bwd(q, k, v, km, out, lse, dout, dlse)``.

  ``fwd``/``bwd`` are static (hashable) callables; this is how the blockwise path and every
  Pallas kernel get their gradient. Of ``km`` only the keys' score bias has one.
  """
  return fwd(q, k, v, km)


def _vjp_fwd(q, k, v, km, fwd, bwd):
  out, lse = fwd(q, k, v, km)
  return (out, lse), (q, k, v, km, out, lse)


def _vjp_bwd(fwd, bwd, res, cts):
  q, k, v, km, out, lse = res
  dout, dlse = cts
  dq, dk, dv, dbias = bwd(q, k, v, km, out, lse, dout, dlse)
  dkm = jax.tree.map(lambda _: None, km)
  if km.k_bias is not None:
    dkm = dataclasses.replace(dkm, k_bias=dbias.astype(km.k_bias.dtype))
  return dq, dk, dv, dkm


attention_with_vjp.defvjp(_vjp_fwd, _vjp_bwd)


@functools.lru_cache(maxsize=None)
def _blockwise_pair(scale, kind_sees, block_q, block_k):
  fwd = functools.partial(blockwise_fwd, scale=scale, kind_sees=kind_sees, block_q=block_q,
                          block_k=block_k)
  bwd = functools.partial(blockwise_bwd, scale=scale, kind_sees=kind_sees, block_q=block_q,
                          block_k=block_k)
  return fwd, bwd


def blockwise_attention(q, k, v, km: KernelMeta, *, scale: float, kind_sees=None,
                        block_q: int = 512, block_k: int = 512):
  """Differentiable blockwise attention on kernel metadata; returns ``(out, lse)``."""
  fwd, bwd = _blockwise_pair(float(scale), kind_sees, block_q, block_k)
  return attention_with_vjp(q, k, v, km, fwd, bwd)
