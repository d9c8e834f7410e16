"""Decode attention: 1-2 query tokens (times the GQA group) against a long KV cache.

Built on the same Pallas forward kernels (``flash.flash_fwd``, TPU or GPU) with two rearrangements
that make a handful of query rows efficient:

* **Head packing.** The ``G = Hq / Hkv`` query heads that read one KV head become ``G * Tq`` rows
  of a single query block of that KV head (``[B, G*Tq, Hkv, D]``, metadata tiled ``G`` times), so
  each KV block is loaded once per KV head instead of once per query head, and the MXU / tensor
  core sees a ``G*Tq``-row tile instead of a 1-row vector.
* **Split-K (flash decoding).** The cache is cut into ``S`` contiguous chunks processed as extra
  batch entries (in parallel), each returning ``(out, lse)``; the partial results are merged with
  log-sum-exp weights in jnp. With B=1 and 4 KV heads this is what keeps 100+ SMs / both TPU
  cores busy.

Empty rows (a query that sees nothing in any chunk) give 0 / -inf. Gradients: the blockwise jnp
backward (``blockwise.attention_with_vjp``), as for the flash kernels.
"""
from __future__ import annotations

import functools
import math

import jax.numpy as jnp

from longjax.kernels import flash, sharded
from longjax.kernels.blockwise import attention_with_vjp, blockwise_bwd
from longjax.kernels.mask import INT_MAX, KernelMeta
from longjax.runtime.rounding import round_up

# Decode path is used when the packed rows (G * Tq) fit one query block of this many rows.
MAX_DECODE_ROWS = 64


def auto_splits(b: int, hkv: int, tk: int, block_k: int) -> int:
  """Enough chunks for ~256 parallel programs, each at least 4 KV blocks long."""
  return max(1, min(math.ceil(256 / max(1, b * hkv)), tk // (4 * block_k)))


def decode_fwd(q, k, v, km: KernelMeta, *, scale: float, kind_sees=None, backend: str = "gpu",
               interpret=False, num_splits=None, block_k=None, gpu_opts=None):
  """``(out [B, Tq, Hq, D], lse [B, Hq, Tq])``; see module docstring."""
  b, tq, hq, d = q.shape
  tk, hkv = k.shape[1], k.shape[2]
  g = hq // hkv
  rows = g * tq
  _, bk = flash.block_sizes(backend, rows, tk, None, block_k)
  splits = num_splits or auto_splits(b, hkv, tk, bk)
  chunk = round_up(-(-tk // splits), bk)
  splits = -(-tk // chunk)
  tkp = splits * chunk

  # Head packing: row r = g_idx * Tq + t.
  qp = q.reshape(b, tq, hkv, g, d).transpose(0, 3, 1, 2, 4).reshape(b, rows, hkv, d)
  tile = lambda x: jnp.tile(x, (1, g))
  # Split-K: [B, Tk] -> [B*S, chunk]; queries repeated per chunk.
  pad_k = lambda x, val: jnp.pad(x, ((0, 0), (0, tkp - tk)) + ((0, 0),) * (x.ndim - 2),
                                 constant_values=val) if tkp != tk else x
  split = lambda x: x.reshape((b * splits, chunk) + x.shape[2:])
  rep = lambda x: jnp.repeat(x, splits, axis=0)
  ks, vs = split(pad_k(k, 0)), split(pad_k(v, 0))
  kms = KernelMeta(q_lo=rep(tile(km.q_lo)), q_hi=rep(tile(km.q_hi)), q_seg=rep(tile(km.q_seg)),
                   q_kind=rep(tile(km.q_kind)), k_order=split(pad_k(km.k_order, INT_MAX)),
                   k_seg=split(pad_k(km.k_seg, 0)), k_kind=split(pad_k(km.k_kind, 0)),
                   k_bias=None if km.k_bias is None else split(pad_k(km.k_bias, 0.0)))
  out_s, lse_s = flash.flash_fwd(rep(qp), ks, vs, kms, scale=scale, kind_sees=kind_sees,
                                 backend=backend, interpret=interpret, block_q=256, block_k=bk,
                                 gpu_opts=gpu_opts)
  # Merge the chunks: out_s [B, S, rows, Hkv, D], lse_s [B, S, Hkv, rows].
  out_s = out_s.reshape(b, splits, rows, hkv, d).astype(jnp.float32)
  lse_s = lse_s.reshape(b, splits, hkv, rows)
  m = jnp.max(lse_s, axis=1, keepdims=True)
  m_safe = jnp.where(jnp.isfinite(m), m, 0.0)
  w = jnp.exp(lse_s - m_safe)  # -inf chunks weigh 0
  tot = jnp.sum(w, axis=1, keepdims=True)
  pos = tot > 0
  lse = jnp.where(pos, m_safe + jnp.log(jnp.where(pos, tot, 1.0)), -jnp.inf)[:, 0]  # [B, Hkv, rows]
  w = w / jnp.where(pos, tot, 1.0)
  out = jnp.einsum("bshr,bsrhd->brhd", w, out_s)
  out = out.reshape(b, g, tq, hkv, d).transpose(0, 2, 3, 1, 4).reshape(b, tq, hq, d).astype(q.dtype)
  lse = lse.reshape(b, hkv, g, tq).reshape(b, hq, tq)
  return out, lse


@functools.lru_cache(maxsize=None)
def _decode_pair(scale, kind_sees, backend, interpret, num_splits, block_k, gpu_opts, bwd_blocks):
  fwd = functools.partial(decode_fwd, scale=scale, kind_sees=kind_sees, backend=backend,
                          interpret=interpret, num_splits=num_splits, block_k=block_k,
                          gpu_opts=gpu_opts)
  bwd = functools.partial(blockwise_bwd, scale=scale, kind_sees=kind_sees, block_q=bwd_blocks[0],
                          block_k=bwd_blocks[1])
  return sharded.wrap(fwd), bwd


def decode_attention(q, k, v, km: KernelMeta, *, scale: float, kind_sees=None, backend: str = "gpu",
                     interpret=False, num_splits=None, block_k=None, gpu_opts=None,
                     bwd_blocks=(512, 512)):
  """Differentiable decode attention on kernel metadata; returns ``(out, lse)``."""
  gpu_opts = tuple(sorted(dict(gpu_opts or {}).items()))
  fwd, bwd = _decode_pair(float(scale), kind_sees, backend, flash._hashable_interpret(interpret),
                          num_splits, block_k, gpu_opts, tuple(bwd_blocks))
  return attention_with_vjp(q, k, v, km, fwd, bwd)
