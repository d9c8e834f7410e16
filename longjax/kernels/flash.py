"""Shared host side of the Pallas kernels: padding, layouts, block lists, backend choice, VJP.

``flash_attention`` pads the sequences to the block sizes (padded queries see nothing, padded keys
are never seen), transposes to head-major layouts, builds the per-(batch, query-block) KV block
lists from the kernel metadata and calls the TPU (``pallas_tpu``) or GPU (``pallas_gpu``) forward
kernel. Both return ``(out, lse)``.

Block lists (which KV blocks a query block may touch): ``mask.block_visits`` compares per-block
ranges of the folded metadata (query lo/hi/segment, key order/segment). When the metadata is
concrete (eager calls, host-planned layouts) the lists are compacted in numpy and the kernel grid
/ loop is as long as the longest list. When it is traced (inside ``jit``/``nn.scan``, which is how
the decoder calls us) the same computation runs on device in jnp (a sort per row of the tiny
``[B, nQ, nK]`` visit matrix) and the grid keeps the full ``nK`` extent; the kernels still skip
the compute (TPU: ``pl.when``; GPU: dynamic trip count) and, on TPU, the DMA of unlisted blocks.
So block skipping does not depend on concreteness, only the grid size does.

Backward: ``blockwise.attention_with_vjp`` pairs the kernel forward with the blockwise jnp flash
backward (recomputes probabilities from the kernel's ``lse``; never materialises T x T). A Pallas
backward kernel is a later optimisation; the VJP is exact and memory-bounded today.

Interpret mode (CPU): ``interpret=True`` or the environment variable
``LONGJAX_PALLAS_INTERPRET=1`` (``=tpu`` uses ``pltpu.InterpretParams()`` for the TPU kernel,
which also simulates DMAs/semaphores). ``LONGJAX_PALLAS_BACKEND=tpu|gpu`` chooses which kernel
flavour runs on CPU (default: ``gpu``, the faster one to interpret).
"""
from __future__ import annotations

import contextlib
import contextvars
import enum
import functools
import os
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from longjax.kernels import pallas_gpu, pallas_tpu, sharded
from longjax.kernels.blockwise import attention_with_vjp, blockwise_bwd
from longjax.kernels.errors import KernelError
from longjax.kernels.mask import (KernelMeta, block_lists, block_visits, is_concrete,
                                  pad_kernel_meta)
from longjax.runtime.rounding import next_pow2, round_up

class Backend(enum.StrEnum):
  """The Pallas kernel flavour: Mosaic TPU or Triton GPU. A string enum, so that the public
  arguments (``pallas_backend="gpu"``) and ``$LONGJAX_PALLAS_BACKEND`` stay plain strings;
  :func:`resolve_backend` turns them into members once, and the code compares members."""
  TPU = "tpu"
  GPU = "gpu"


BACKENDS = tuple(b.value for b in Backend)
# Default block sizes per backend (query rows, key columns).
DEFAULT_BLOCKS = {Backend.TPU: (128, 128), Backend.GPU: (128, 64)}


_TARGET = contextvars.ContextVar("longjax_target_platform", default=None)
PLATFORMS = ("cpu", "gpu", "tpu")


def platform() -> str:
  """The platform the attention is built for: ``jax.default_backend()``, unless a
  :func:`target_platform` block says otherwise."""
  target = _TARGET.get()
  return target if target is not None else jax.default_backend()


@contextlib.contextmanager
def target_platform(name: str):
  """Build attention for ``name`` (``"tpu"``, ``"gpu"``, ``"cpu"``) instead of this host's backend:
  ``impl="auto"`` / ``"pallas"`` then choose the accelerator's kernels, not interpreted. Used to
  lower or compile for TPU / GPU from a CPU host (``longjax.kernels.lowering``). It affects tracing
  only: trace the function inside the block (jit caches a trace by function and shapes, so a
  function already traced for the host is not re-traced)."""
  if name not in PLATFORMS:
    raise KernelError(f"unknown target platform {name!r}; choose one of {PLATFORMS}")
  token = _TARGET.set(name)
  try:
    yield
  finally:
    _TARGET.reset(token)


def env_interpret():
  """Interpret setting from ``LONGJAX_PALLAS_INTERPRET`` (``None`` when unset)."""
  val = os.environ.get("LONGJAX_PALLAS_INTERPRET", "").strip().lower()
  if val in ("", "0", "false", "no"):
    return None
  return "tpu" if val == "tpu" else True


def resolve_backend(backend: Optional[str] = None) -> Backend:
  """The Pallas backend: ``backend``, else ``$LONGJAX_PALLAS_BACKEND``, else the platform's."""
  if backend is None:
    backend = os.environ.get("LONGJAX_PALLAS_BACKEND", "").strip().lower() or None
  if backend is None:
    backend = Backend.TPU if platform() == "tpu" else Backend.GPU
  if backend not in BACKENDS:
    raise KernelError(f"unknown Pallas backend {backend!r}; choose one of {BACKENDS}")
  return Backend(backend)


def resolve_interpret(interpret, backend: str):
  """Turn ``interpret`` (bool / 'tpu' / None=env) into what ``pallas_call`` accepts."""
  if interpret is None:
    interpret = env_interpret()
  if interpret in (None, False):
    return False
  if interpret == "tpu" and backend == Backend.TPU:
    params = getattr(pallas_tpu.pltpu, "InterpretParams", None) if pallas_tpu.pltpu else None
    return params() if params is not None else True
  return True


def backend_available(backend: str) -> bool:
  return pallas_tpu.available() if backend == Backend.TPU else pallas_gpu.available()


def block_sizes(backend: str, tq: int, tk: int, block_q=None, block_k=None):
  """Effective (bq, bk): the defaults, shrunk for short sequences (powers of two on GPU)."""
  dq, dk = DEFAULT_BLOCKS[Backend(backend)]
  block_q = block_q or dq
  block_k = block_k or dk
  if backend == Backend.GPU:
    return min(block_q, next_pow2(max(tq, 16))), min(block_k, next_pow2(max(tk, 16)))
  return min(block_q, round_up(tq, 8)), min(block_k, round_up(tk, 8))


def _lists(kmp: KernelMeta, bq: int, bk: int):
  """Block lists and the loop/grid extent (see module docstring)."""
  visits = block_visits(kmp, bq, bk)
  if is_concrete(visits):
    vis = np.asarray(visits)
    nk = vis.shape[-1]
    idx = np.arange(nk)
    key = np.where(vis, idx, nk + idx)
    blocks = np.sort(key, axis=-1)
    counts = vis.sum(-1).astype(np.int32)
    last = np.take_along_axis(blocks, np.maximum(counts - 1, 0)[..., None], axis=-1)
    blocks = np.where(idx < counts[..., None], blocks, last)
    blocks = np.where(blocks >= nk, 0, blocks).astype(np.int32)
    n_steps = max(1, int(counts.max()) if counts.size else 1)
    return jnp.asarray(blocks[..., :n_steps]), jnp.asarray(counts), n_steps
  blocks, counts = block_lists(visits)
  return blocks, counts, visits.shape[-1]


def flash_fwd(q, k, v, km: KernelMeta, *, scale: float, kind_sees=None, backend: str = Backend.GPU,
              interpret=False, block_q=None, block_k=None, gpu_opts=None):
  """Forward only: ``(out [B, Tq, Hq, D], lse [B, Hq, Tq])`` from the chosen Pallas kernel."""
  b, tq, hq, d = q.shape
  tk = k.shape[1]
  bq, bk = block_sizes(backend, tq, tk, block_q, block_k)
  tqp, tkp = round_up(tq, bq), round_up(tk, bk)
  kmp = pad_kernel_meta(km, tqp, tkp)
  blocks, counts, n_steps = _lists(kmp, bq, bk)

  def head_major(x, t):
    x = jnp.pad(x, ((0, 0), (0, t - x.shape[1]), (0, 0), (0, 0))) if t != x.shape[1] else x
    return x.transpose(0, 2, 1, 3)

  qt, kt, vt = head_major(q, tqp), head_major(k, tkp), head_major(v, tkp)
  if backend == Backend.TPU:
    q_fields = jnp.stack([kmp.q_lo, kmp.q_hi, kmp.q_seg, kmp.q_kind], axis=-1)
    k_fields = jnp.stack([kmp.k_order, kmp.k_seg, kmp.k_kind, jnp.zeros_like(kmp.k_kind)], axis=1)
    k_bias = None if kmp.k_bias is None else kmp.k_bias[:, None, :]  # [B, 1, Tk]: a lane row
    out, lse = pallas_tpu.flash_fwd(qt, kt, vt, q_fields, k_fields, blocks, counts,
                                    n_steps=n_steps, scale=scale, kind_sees=kind_sees,
                                    block_q=bq, block_k=bk, interpret=interpret, k_bias=k_bias)
    lse = lse[..., 0]
  else:
    out, lse = pallas_gpu.flash_fwd(qt, kt, vt, (kmp.q_lo, kmp.q_hi, kmp.q_seg, kmp.q_kind),
                                    (kmp.k_order, kmp.k_seg, kmp.k_kind), blocks, counts,
                                    scale=scale, kind_sees=kind_sees, block_q=bq, block_k=bk,
                                    interpret=interpret, k_bias=kmp.k_bias,
                                    **dict(gpu_opts or ()))
  return out.transpose(0, 2, 1, 3)[:, :tq], lse[:, :, :tq]


@functools.lru_cache(maxsize=None)
def _flash_pair(scale, kind_sees, backend, interpret, block_q, block_k, gpu_opts, bwd_blocks):
  fwd = functools.partial(flash_fwd, scale=scale, kind_sees=kind_sees, backend=backend,
                          interpret=interpret, block_q=block_q, block_k=block_k, gpu_opts=gpu_opts)
  bwd = functools.partial(blockwise_bwd, scale=scale, kind_sees=kind_sees, block_q=bwd_blocks[0],
                          block_k=bwd_blocks[1])
  return sharded.wrap(fwd), bwd


def _hashable_interpret(interpret):
  try:
    hash(interpret)
    return interpret
  except TypeError:
    return True


def flash_attention(q, k, v, km: KernelMeta, *, scale: float, kind_sees=None,
                    backend: str = Backend.GPU, interpret=False, block_q=None, block_k=None,
                    gpu_opts=None, bwd_blocks=(512, 512)):
  """Differentiable Pallas flash attention on kernel metadata; returns ``(out, lse)``."""
  gpu_opts = tuple(sorted(dict(gpu_opts or {}).items()))
  fwd, bwd = _flash_pair(float(scale), kind_sees, backend, _hashable_interpret(interpret), block_q,
                         block_k, gpu_opts, tuple(bwd_blocks))
  return attention_with_vjp(q, k, v, km, fwd, bwd)
