"""Pallas TPU (Mosaic) flash-attention forward kernel with host/device block lists.

Layout (prepared by ``flash.py``): ``q [B, Hq, Tq, D]``, ``k``/``v`` ``[B, Hkv, Tk, D]`` with the
sequence lengths padded to the block sizes; GQA reads KV head ``h // G`` through the BlockSpec
index map, so KV is never repeated in memory. Mask metadata travels in TPU-friendly layouts:
query fields ``[B, Tq, 4]`` (lo, hi, segment, kind: a ``[bq, 4]`` block gives ``[bq, 1]`` columns)
and key fields ``[B, 4, Tk]`` (order, segment, kind, 0: a ``[4, bk]`` block gives ``[1, bk]`` rows).
An optional key score bias (``KernelMeta.k_bias``) travels as ``[B, 1, Tk]`` float32 (a ``[1, bk]``
block: one row added to the scores); without one the kernel has no such operand.

Grid ``(B, Hq, nQ, W)``. ``W`` walks a per-(batch, query block) list of the KV blocks that may be
visible, delivered by scalar prefetch (``PrefetchScalarGridSpec``): the KV index map reads
``blocks[b, i, j]``, so only listed blocks are DMA'd; entries past ``counts[b, i]`` repeat the last
listed block (the pipeline sees an unchanged block index and skips the copy) and their compute is
disabled with ``pl.when``. With concrete metadata the lists are built on the host and ``W`` is the
longest list (true block skipping in the grid); with traced metadata (inside ``jit``/``scan``) the
lists are built on device and ``W = nK`` (compute still skipped, DMA of repeated blocks elided).

Outputs: ``out [B, Hq, Tq, D]`` in q.dtype and ``lse [B, Hq, Tq, 1]`` fp32 (-inf for queries that
see nothing; their output is 0). The running max / sum live in ``[bq, 1]`` VMEM scratch.

On CPU the kernel runs with ``interpret=True`` or ``interpret=pltpu.InterpretParams()``.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

try:  # Pallas TPU may be missing from some jaxlib builds.
  from jax.experimental.pallas import tpu as pltpu
except Exception:  # pragma: no cover
  pltpu = None

from longjax.kernels.errors import KernelError, KernelUnavailable
from longjax.kernels.mask import kernel_allowed
from longjax.kernels.pallas_common import flash_cost

NUM_META = 4


# TPU tiling: the last two dimensions of every block must be multiples of (8, 128) or span the
# whole array axis. The kernel's blocks are q [block_q, D], k/v [block_k, D], query metadata
# [block_q, 4] and key metadata [4, block_k]: so block_q % 8 and block_k % 128 (the key block is a
# lane dimension of the key metadata), unless one block covers the whole (padded) axis.
SUBLANE, LANE = 8, 128


def available() -> bool:
  return pltpu is not None and hasattr(pltpu, "PrefetchScalarGridSpec")


def supported(d: int, tq: int, tk: int, block_q: int, block_k: int):
  """``None`` if a compiled (not interpreted) TPU kernel accepts these blocks, else why not.

  ``tq`` / ``tk`` are the lengths padded to the blocks (``flash.block_sizes`` + ``round_up``).
  Interpret mode has no tiling rules (the CPU tests use 16 x 16 blocks to exercise several blocks
  on short sequences); a TPU refuses such blocks at lowering time with a less direct message.
  """
  if d % 8:
    return f"head_dim {d} must be a multiple of 8 for the TPU kernel"
  bad = []
  if block_q % SUBLANE and block_q != tq:
    bad.append(f"block_q={block_q} must be a multiple of {SUBLANE}")
  if block_k % LANE and block_k != tk:
    bad.append(f"block_k={block_k} must be a multiple of {LANE}")
  if bad:
    return (f"TPU block rule: {' and '.join(bad)} unless one block spans the whole padded axis "
            f"(Tq={tq}, Tk={tk}); use the defaults (128, 128) or a multiple of (8, 128)")
  return None


def _kernel(blocks_ref, counts_ref, q_ref, k_ref, v_ref, qm_ref, km_ref, *refs, scale, kind_sees,
            n_q, width, n_steps, precision, biased):
  kb_ref, (o_ref, lse_ref, m_sc, l_sc, acc_sc) = (refs[0], refs[1:]) if biased else (None, refs)
  b, i, j = pl.program_id(0), pl.program_id(2), pl.program_id(3)

  @pl.when(j == 0)
  def _init():
    m_sc[...] = jnp.full(m_sc.shape, -jnp.inf, jnp.float32)
    l_sc[...] = jnp.zeros(l_sc.shape, jnp.float32)
    acc_sc[...] = jnp.zeros(acc_sc.shape, jnp.float32)

  @pl.when(j < counts_ref[b * n_q + i])
  def _compute():
    q = q_ref[...]
    k = k_ref[...]
    s = jax.lax.dot_general(q, k, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32,
                            precision=precision) * scale
    if biased:
      s = s + kb_ref[...]  # [1, bk]: each key's score bias
    qm = qm_ref[...]
    km = km_ref[...]
    ok = kernel_allowed(qm[:, 0:1], qm[:, 1:2], qm[:, 2:3], qm[:, 3:4],
                        km[0:1, :], km[1:2, :], km[2:3, :], kind_sees)
    s = jnp.where(ok, s, -jnp.inf)
    m_prev = m_sc[...]
    m_new = jnp.maximum(m_prev, jnp.max(s, axis=1, keepdims=True))
    m_safe = jnp.where(m_new == -jnp.inf, 0.0, m_new)
    alpha = jnp.exp(m_prev - m_safe)
    p = jnp.exp(s - m_safe)
    l_sc[...] = l_sc[...] * alpha + jnp.sum(p, axis=1, keepdims=True)
    v = v_ref[...]
    pv = jax.lax.dot_general(p.astype(v.dtype), v, (((1,), (0,)), ((), ())),
                             preferred_element_type=jnp.float32, precision=precision)
    acc_sc[...] = acc_sc[...] * alpha + pv
    m_sc[...] = m_new

  @pl.when(j == n_steps - 1)
  def _finish():
    l = l_sc[...]
    pos = l > 0
    l_safe = jnp.where(pos, l, 1.0)
    o_ref[...] = (acc_sc[...] / l_safe).astype(o_ref.dtype)
    m = m_sc[...]
    m_safe = jnp.where(m == -jnp.inf, 0.0, m)
    lse_ref[...] = jnp.where(pos, m_safe + jnp.log(l_safe), -jnp.inf)


def flash_fwd(q, k, v, q_fields, k_fields, blocks, counts, *, n_steps: int, scale: float,
              kind_sees, block_q: int, block_k: int, interpret=False, k_bias=None):
  """Run the kernel.

  Args:
    q: ``[B, Hq, Tq, D]``; k, v: ``[B, Hkv, Tk, D]`` (Tq, Tk multiples of the block sizes).
    q_fields: ``[B, Tq, 4]`` int32 (lo, hi, seg, kind); k_fields: ``[B, 4, Tk]``
      (order, seg, kind, 0).
    blocks: ``[B, nQ, W]`` int32 KV block lists; counts: ``[B, nQ]`` int32.
    n_steps: grid extent along the list (``<= W``).
    k_bias: ``[B, 1, Tk]`` float32 key score bias, or ``None``.
  Returns ``(out [B, Hq, Tq, D], lse [B, Hq, Tq, 1])``.
  """
  if not available():
    raise KernelUnavailable("Pallas TPU (jax.experimental.pallas.tpu) is not available in this jax")
  bsz, hq, tq, d = q.shape
  hkv = k.shape[1]
  if not interpret:
    reason = supported(d, tq, k.shape[2], block_q, block_k)
    if reason:
      raise KernelError(reason)
  g = hq // hkv
  n_q = tq // block_q
  width = blocks.shape[-1]
  blocks_flat = blocks.reshape(-1).astype(jnp.int32)
  counts_flat = counts.reshape(-1).astype(jnp.int32)
  precision = jax.lax.Precision.HIGHEST if q.dtype == jnp.float32 else None

  def kv_map(b, h, i, j, blk, cnt):
    return (b, h // g, blk[(b * n_q + i) * width + j], 0)

  def km_map(b, h, i, j, blk, cnt):
    return (b, 0, blk[(b * n_q + i) * width + j])

  grid_spec = pltpu.PrefetchScalarGridSpec(
      num_scalar_prefetch=2,
      grid=(bsz, hq, n_q, n_steps),
      in_specs=[
          pl.BlockSpec((None, None, block_q, d), lambda b, h, i, j, blk, cnt: (b, h, i, 0)),
          pl.BlockSpec((None, None, block_k, d), kv_map),
          pl.BlockSpec((None, None, block_k, d), kv_map),
          pl.BlockSpec((None, block_q, NUM_META), lambda b, h, i, j, blk, cnt: (b, i, 0)),
          pl.BlockSpec((None, NUM_META, block_k), km_map),
      ] + ([pl.BlockSpec((None, 1, block_k), km_map)] if k_bias is not None else []),
      out_specs=[
          pl.BlockSpec((None, None, block_q, d), lambda b, h, i, j, blk, cnt: (b, h, i, 0)),
          pl.BlockSpec((None, None, block_q, 1), lambda b, h, i, j, blk, cnt: (b, h, i, 0)),
      ],
      scratch_shapes=[pltpu.VMEM((block_q, 1), jnp.float32), pltpu.VMEM((block_q, 1), jnp.float32),
                      pltpu.VMEM((block_q, d), jnp.float32)],
  )
  kernel = functools.partial(_kernel, scale=scale, kind_sees=kind_sees, n_q=n_q, width=width,
                             n_steps=n_steps, precision=precision, biased=k_bias is not None)
  compiler_params = None
  cp_cls = getattr(pltpu, "CompilerParams", None)
  if cp_cls is not None:
    compiler_params = cp_cls(dimension_semantics=("parallel", "parallel", "parallel", "arbitrary"))
  out, lse = pl.pallas_call(
      kernel,
      grid_spec=grid_spec,
      out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype),
                 jax.ShapeDtypeStruct((bsz, hq, tq, 1), jnp.float32)],
      compiler_params=compiler_params,
      interpret=interpret,
      cost_estimate=flash_cost(q, k),
      name="longjax_flash_tpu",
  )(blocks_flat, counts_flat, q, k, v, q_fields, k_fields,
    *([k_bias.astype(jnp.float32)] if k_bias is not None else []))
  return out, lse
