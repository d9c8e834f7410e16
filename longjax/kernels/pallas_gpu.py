"""Pallas GPU flash-attention forward kernel (Triton lowering), with per-query-block KV lists.

Which GPU lowering, and why
---------------------------
Pallas has two GPU backends. Since jax 0.10 the default for ``pl.pallas_call`` on CUDA is Mosaic
GPU, and in jax 0.11 the Triton backend is *deprecated* (still shipped). We nevertheless lower this
kernel with **Triton**, selected explicitly by passing ``compiler_params=plt.CompilerParams(...)``
(``jax.experimental.pallas.triton``), which picks the Triton lowering regardless of the
``jax_pallas_use_mosaic_gpu`` default. Reasons:

* The same kernel source runs on CPU with ``interpret=True``: the issue requires every kernel to be
  tested in interpret mode on this CPU-only project. A Mosaic GPU kernel is written at warpgroup
  level (``plgpu.kernel``, explicit SMEM transforms/swizzles, barriers, WGMMA layouts); its
  ``pallas_call`` form is deprecated and its API changed in every recent release (0.10 broke
  ``pl.kernel``; 0.11 changes ``copy_gmem_to_smem`` barriers), so a kernel we cannot run here would
  very likely not even compile on the H200's jax 0.11.
* Triton compiles ``tl.dot`` to WGMMA on sm_90 (H100/H200) and software-pipelines the KV loop
  (``num_stages``), which is the main thing flash attention needs; the masking, dynamic loop
  bounds (per-block KV lists) and scalar loads we need are all supported by the Triton lowering.
* If a future jax removes the Triton backend, :func:`available` turns false: ``impl="auto"`` then
  falls back to XLA and says why, and ``impl="pallas"`` raises (no silent fallback).
  ``hardware/gpu_check.py`` prints which backend ran. A Mosaic GPU (FA3-style, warp-specialised)
  kernel is the follow-up once it can be developed on a GPU.
* The decision for jax >= 0.11 (Triton kept, Mosaic GPU the follow-up, tokamax not adopted: its
  masks are causal, key ranges or dense) and how the kernel is lowered for ``cuda`` on a CPU host
  are in ``docs/kernels.md``.

Layout (prepared by ``flash.py``): ``q [B, Hq, Tq, D]``, ``k``/``v`` ``[B, Hkv, Tk, D]`` (GQA:
program ``h`` reads KV head ``h // G``; KV is never repeated in memory), lengths padded to the
block sizes; metadata as separate ``[B, T]`` int32 arrays, and an optional key score bias
(``KernelMeta.k_bias``) as a ``[B, Tk]`` float32 array (no operand without one). Grid
``(nQ, B * Hq)`` (query blocks first so that neighbouring programs share KV in L2). Each program
loops over ``blocks[b, i, 1:1 + blocks[b, i, 0]]`` (count stored in slot 0) with a dynamic-trip
``fori_loop``, so fully masked KV blocks cost nothing. fp32 inputs use IEEE dots
(``Precision.HIGHEST``; the default would be TF32), bf16/fp16 inputs use tensor cores with fp32
accumulation.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

try:
  from jax.experimental.pallas import triton as plt
except Exception:  # pragma: no cover - backend removed in a future jax
  plt = None

from longjax.kernels.errors import KernelError, KernelUnavailable
from longjax.kernels.mask import kernel_allowed
from longjax.kernels.pallas_common import flash_cost
from longjax.runtime.rounding import is_pow2, next_pow2


def available() -> bool:
  return plt is not None and hasattr(plt, "CompilerParams")


def supported(d: int, block_q: int, block_k: int):
  """``None`` if the shapes are supported, else a reason string."""
  if not is_pow2(d) or d < 16 or d > 256:
    return f"head_dim {d} must be a power of two in [16, 256] for the Triton kernel"
  if not (is_pow2(block_q) and is_pow2(block_k)) or min(block_q, block_k) < 16:
    return f"block sizes ({block_q}, {block_k}) must be powers of two >= 16"
  return None


def _kernel(blocks_ref, q_ref, k_ref, v_ref, qlo_ref, qhi_ref, qseg_ref, qkind_ref,
            ko_ref, kseg_ref, kkind_ref, *refs, scale, kind_sees, block_k, precision, biased):
  kb_ref, (o_ref, lse_ref) = (refs[0], refs[1:]) if biased else (None, refs)
  q = q_ref[...]
  block_q, d = q.shape
  q_lo = qlo_ref[...][:, None]
  q_hi = qhi_ref[...][:, None]
  q_seg = qseg_ref[...][:, None]
  q_kind = qkind_ref[...][:, None]
  count = blocks_ref[0]

  def body(t, carry):
    m_prev, l_prev, acc = carry
    j = blocks_ref[t + 1]
    start = pl.multiple_of(j * block_k, block_k)
    k = k_ref[pl.ds(start, block_k), :]
    v = v_ref[pl.ds(start, block_k), :]
    s = jax.lax.dot_general(q, k, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32,
                            precision=precision) * scale
    if biased:
      s = s + kb_ref[pl.ds(start, block_k)][None, :]  # each key's score bias
    ok = kernel_allowed(q_lo, q_hi, q_seg, q_kind, ko_ref[pl.ds(start, block_k)][None, :],
                        kseg_ref[pl.ds(start, block_k)][None, :],
                        kkind_ref[pl.ds(start, block_k)][None, :], kind_sees)
    s = jnp.where(ok, s, -jnp.inf)
    m_new = jnp.maximum(m_prev, jnp.max(s, axis=1))
    m_safe = jnp.where(m_new == -jnp.inf, 0.0, m_new)
    alpha = jnp.exp(m_prev - m_safe)
    p = jnp.exp(s - m_safe[:, None])
    l_new = l_prev * alpha + jnp.sum(p, axis=1)
    pv = jax.lax.dot_general(p.astype(v.dtype), v, (((1,), (0,)), ((), ())),
                             preferred_element_type=jnp.float32, precision=precision)
    return m_new, l_new, acc * alpha[:, None] + pv

  init = (jnp.full((block_q,), -jnp.inf, jnp.float32), jnp.zeros((block_q,), jnp.float32),
          jnp.zeros((block_q, d), jnp.float32))
  m, l, acc = jax.lax.fori_loop(0, count, body, init)
  pos = l > 0
  l_safe = jnp.where(pos, l, 1.0)
  o_ref[...] = (acc / l_safe[:, None]).astype(o_ref.dtype)
  m_safe = jnp.where(m == -jnp.inf, 0.0, m)
  lse_ref[...] = jnp.where(pos, m_safe + jnp.log(l_safe), -jnp.inf)


def flash_fwd(q, k, v, q_fields, k_fields, blocks, counts, *, scale: float, kind_sees,
              block_q: int, block_k: int, interpret=False, num_warps: int = 4, num_stages: int = 2,
              k_bias=None):
  """Run the kernel.

  Args:
    q: ``[B, Hq, Tq, D]``; k, v: ``[B, Hkv, Tk, D]`` (Tq, Tk multiples of the block sizes).
    q_fields: tuple of 4 ``[B, Tq]`` int32 (lo, hi, seg, kind); k_fields: 3 ``[B, Tk]`` (order,
      seg, kind).
    blocks: ``[B, nQ, W]`` int32 KV block lists; counts ``[B, nQ]``.
    k_bias: ``[B, Tk]`` float32 key score bias, or ``None``.
  Returns ``(out [B, Hq, Tq, D], lse [B, Hq, Tq])``.
  """
  if not available():
    raise KernelUnavailable("the Pallas Triton backend (jax.experimental.pallas.triton) is not "
                            "available")
  bsz, hq, tq, d = q.shape
  hkv, tk = k.shape[1], k.shape[2]
  reason = supported(d, block_q, block_k)
  if reason:
    raise KernelError(reason)
  g = hq // hkv
  n_q = tq // block_q
  lists = jnp.concatenate([counts[..., None], blocks], axis=-1).astype(jnp.int32)  # [B, nQ, 1+W]
  width = next_pow2(lists.shape[-1])  # keep every block shape a power of two (Triton)
  lists = jnp.pad(lists, ((0, 0), (0, 0), (0, width - lists.shape[-1])))
  precision = jax.lax.Precision.HIGHEST if q.dtype == jnp.float32 else None
  kernel = functools.partial(_kernel, scale=scale, kind_sees=kind_sees, block_k=block_k,
                             precision=precision, biased=k_bias is not None)

  def bh(p):  # program axis 1 -> (b, h)
    return p // hq, p % hq

  in_specs = [
      pl.BlockSpec((None, None, width), lambda i, p: (bh(p)[0], i, 0)),
      pl.BlockSpec((None, None, block_q, d), lambda i, p: (bh(p)[0], bh(p)[1], i, 0)),
      pl.BlockSpec((None, None, tk, d), lambda i, p: (bh(p)[0], bh(p)[1] // g, 0, 0)),
      pl.BlockSpec((None, None, tk, d), lambda i, p: (bh(p)[0], bh(p)[1] // g, 0, 0)),
  ] + [pl.BlockSpec((None, block_q), lambda i, p: (bh(p)[0], i))] * 4 \
    + [pl.BlockSpec((None, tk), lambda i, p: (bh(p)[0], 0))] * (3 if k_bias is None else 4)
  out_specs = [pl.BlockSpec((None, None, block_q, d), lambda i, p: (bh(p)[0], bh(p)[1], i, 0)),
               pl.BlockSpec((None, None, block_q), lambda i, p: (bh(p)[0], bh(p)[1], i))]
  out, lse = pl.pallas_call(
      kernel,
      grid=(n_q, bsz * hq),
      in_specs=in_specs,
      out_specs=out_specs,
      out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype),
                 jax.ShapeDtypeStruct((bsz, hq, tq), jnp.float32)],
      compiler_params=plt.CompilerParams(num_warps=num_warps, num_stages=num_stages),
      interpret=interpret,
      cost_estimate=flash_cost(q, k),
      name="longjax_flash_gpu",
  )(lists, q, k, v, *q_fields, *k_fields,
    *([k_bias.astype(jnp.float32)] if k_bias is not None else []))
  return out, lse
