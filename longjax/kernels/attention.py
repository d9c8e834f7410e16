"""The single attention entry point used by the decoder (and so by Beacon and FocusLLM).

Implementations, selected by ``impl``:

* ``"xla"``        the dense jnp reference (``reference.dense_attention``): materialises
  ``[B, H, Tq, Tk]`` scores; XLA fuses it well for short sequences.
* ``"chunked"``    query-chunked dense jnp (``chunked.py``): one ``lax.map`` step per block of
  queries against every key (key tiles merged by an online softmax once a block's scores outgrow
  the cache), softmax in two passes over the scores; about twice the dense path's speed on CPU
  once the scores outgrow the cache, bounded memory in the forward.
* ``"blockwise"``  online-softmax jnp (``blockwise.py``): never materialises ``Tq x Tk``, skips
  fully masked KV blocks with ``lax.cond``; blockwise backward (custom VJP).
* ``"pallas"``     Pallas flash kernels (``pallas_tpu.py`` on TPU, ``pallas_gpu.py`` on GPU), or the
  decode kernel (``decode.py``: head packing + split-K) when ``G * Tq <= 64`` rows; backward via
  the blockwise VJP. On a mesh of several devices the kernel forward runs per shard under one
  ``jax.shard_map`` (batch over ``data``/``fsdp``, heads over ``tensor``: ``sharded.py``), since
  XLA cannot partition a Pallas call. On CPU it needs interpret mode: ``interpret=True`` or
  ``LONGJAX_PALLAS_INTERPRET=1`` (``=tpu``: TPU interpret params); the kernel flavour on CPU is
  ``pallas_backend=`` / ``LONGJAX_PALLAS_BACKEND`` (default ``gpu``). An explicit ``"pallas"``
  request that cannot run raises ``ValueError`` with the reason; it never falls back.
* keys with a score bias (``TokenMeta.bias``, FocusLLM's optional candidate gate) run on every
  path: the dense and chunked paths add it to their scores, the blockwise path and the Pallas
  kernels read it as ``KernelMeta.k_bias`` (and the blockwise VJP returns its gradient).
* ``"auto"``       on GPU/TPU: Pallas when the backend is present and the shapes are supported,
  otherwise XLA (dense, or blockwise when ``Tq * Tk > DENSE_MAX_SCORES``) with a logged warning
  saying why (once per reason). On CPU: dense for at most ``CHUNK_Q`` queries (decode steps: one
  block), chunked while one block's scores (``B * Hq * CHUNK_Q * Tk``) stay within
  ``CHUNK_MAX_SCORES``, else blockwise (its tiles are small whatever ``Tk`` is).
  ``explain(...)`` returns the decision and reason without running anything.

The sliding ``window`` may be a traced scalar (it comes from ``nn.scan`` over layers): every
implementation folds it into the per-query ``lo`` bound (``mask.kernel_meta``), so no fallback is
needed for it. Metadata may be traced too (see ``flash.py`` for how block lists are built then).
"""
from __future__ import annotations

import logging
from typing import Optional

import jax.numpy as jnp

from longjax.kernels import decode as decode_lib
from longjax.kernels import flash, pallas_gpu, pallas_tpu
from longjax.kernels.blockwise import blockwise_attention
from longjax.kernels.chunked import chunked_attention
from longjax.kernels.errors import KernelError
from longjax.kernels.mask import MaskRule, TokenMeta, NO_WINDOW, kernel_meta
from longjax.kernels.reference import dense_attention
from longjax.runtime.rounding import round_up

IMPLS = ("auto", "xla", "chunked", "blockwise", "pallas")
# Above this many scores per (batch, head) the XLA paths use the blockwise implementation.
DENSE_MAX_SCORES = 2048 * 2048
# CPU: at most this many queries run dense (one chunked block: 64, measured fastest of 32..256 on
# a Beacon window over 2K-4K memory entries), and the largest score tile (fp32, all heads) of one
# such block before the blockwise path takes over: 256 MiB.
CHUNK_Q = 64
CHUNK_MAX_SCORES = 64 * 2**20
_SUPPORTED_DTYPES = (jnp.float32, jnp.bfloat16, jnp.float16)

logger = logging.getLogger("longjax.kernels")
_warned = set()


def _warn_once(msg: str):
  if msg not in _warned:
    _warned.add(msg)
    logger.warning(msg)


def pallas_unsupported_reason(q_shape, k_shape, dtype, *, interpret=None,
                              backend: Optional[str] = None, block_q: Optional[int] = None,
                              block_k: Optional[int] = None) -> Optional[str]:
  """``None`` when the Pallas path can run these shapes here, else why not.

  ``block_q`` / ``block_k``: the flash kernel's blocks (``None``: the backend's defaults, shrunk
  for short sequences as ``flash.block_sizes`` does). A compiled TPU kernel also needs them to
  follow the TPU tiling rule (``pallas_tpu.supported``)."""
  try:
    backend = flash.resolve_backend(backend)
  except ValueError as e:
    return str(e)
  plat = flash.platform()
  interp = flash.resolve_interpret(interpret, backend)
  if not flash.backend_available(backend):
    return f"the Pallas {backend} backend is not available in this jax installation"
  if not interp:
    if plat == "cpu":
      return ("Pallas kernels run on CPU only in interpret mode (pass interpret=True or set "
              "LONGJAX_PALLAS_INTERPRET=1)")
    if (plat == "tpu") != (backend == flash.Backend.TPU):
      return f"the {backend} kernel cannot be compiled for platform {plat!r} (use interpret mode)"
  if jnp.dtype(dtype) not in [jnp.dtype(t) for t in _SUPPORTED_DTYPES]:
    return f"dtype {jnp.dtype(dtype)} is not supported by the kernels (fp32/bf16/fp16)"
  d = q_shape[-1]
  if backend == flash.Backend.GPU:
    reason = pallas_gpu.supported(d, 16, 16)
    if reason:
      return reason
  elif not interp:
    tq, tk = q_shape[1], k_shape[1]
    bq, bk = flash.block_sizes(flash.Backend.TPU, max(tq, 1), max(tk, 1), block_q, block_k)
    reason = pallas_tpu.supported(d, round_up(tq, bq), round_up(tk, bk), bq, bk)
    if reason:
      return reason
  if q_shape[1] == 0 or k_shape[1] == 0:
    return "empty query or key sequence"
  return None


def explain(q_shape, k_shape, dtype, *, impl: str = "auto", interpret=None,
            backend: Optional[str] = None):
  """``(choice, reason)`` with choice in
  ``dense | chunked | blockwise | pallas_flash | pallas_decode``."""
  choice, reason, _ = _decide(q_shape, k_shape, dtype, impl=impl, interpret=interpret,
                              backend=backend)
  return choice, reason


def _decide(q_shape, k_shape, dtype, *, impl: str, interpret, backend: Optional[str]):
  """``(choice, reason, fell_back)``: ``fell_back`` when ``impl='auto'`` wanted Pallas and the
  shapes or platform made it take an XLA path (the caller warns once)."""
  if impl not in IMPLS:
    raise KernelError(f"unknown attention impl {impl!r}; choose one of {IMPLS}")
  b, tq, hq, _ = q_shape
  tk, hkv = k_shape[1], k_shape[2]
  long_seq = tq * tk > DENSE_MAX_SCORES
  xla_choice = "blockwise" if long_seq else "dense"
  if impl == "xla":
    return "dense", "impl='xla' requested", False
  if impl in ("blockwise", "chunked"):
    return impl, f"impl={impl!r} requested", False
  pallas_kind = ("pallas_decode" if (hq // hkv) * tq <= decode_lib.MAX_DECODE_ROWS
                 else "pallas_flash")
  if impl == "pallas":
    reason = pallas_unsupported_reason(q_shape, k_shape, dtype, interpret=interpret,
                                       backend=backend)
    if reason:
      raise KernelError(f"impl='pallas' cannot run: {reason}")
    return pallas_kind, "impl='pallas' requested", False
  # auto
  plat = flash.platform()
  if plat == "cpu" and not interpret:
    if tq <= CHUNK_Q:
      return "dense", (f"CPU: dense for at most {CHUNK_Q} queries; Pallas needs an "
                       "accelerator"), False
    if b * hq * CHUNK_Q * tk <= CHUNK_MAX_SCORES:
      return "chunked", ("CPU: query-chunked dense is the fastest XLA path; Pallas needs an "
                         "accelerator"), False
    return "blockwise", (f"CPU: blockwise, one chunked block would hold more than "
                         f"{CHUNK_MAX_SCORES} scores; Pallas needs an accelerator"), False
  reason = pallas_unsupported_reason(q_shape, k_shape, dtype, interpret=interpret, backend=backend)
  if reason:
    return xla_choice, f"fell back from Pallas to {xla_choice}: {reason}", True
  return pallas_kind, f"Pallas on {plat}", False


def attention(q, k, v, q_meta: TokenMeta, k_meta: TokenMeta, rule: MaskRule = MaskRule(), *,
              window=NO_WINDOW, scale=None, impl: str = "auto", return_lse: bool = False,
              interpret=None, pallas_backend: Optional[str] = None):
  """Masked grouped-query attention.

  Args:
    q: ``[B, Tq, Hq, D]`` queries (RoPE already applied).
    k, v: ``[B, Tk, Hkv, D]`` keys (RoPE applied) and values; ``Hq`` must be a multiple of ``Hkv``.
    q_meta, k_meta: per-token metadata (see ``longjax.kernels.mask``).
    rule: static mask rule (causal or not, optional kind table).
    window: sliding window in ``order`` units (traced scalar allowed); ``NO_WINDOW`` for none.
    scale: softmax scale, default ``D ** -0.5``.
    impl: ``"auto" | "xla" | "blockwise" | "pallas"`` (see module docstring).
    return_lse: also return the fp32 log-sum-exp ``[B, Hq, Tq]`` (for blockwise merging / kernels).
    interpret: Pallas interpret mode (``None``: ``LONGJAX_PALLAS_INTERPRET``).
    pallas_backend: ``"tpu" | "gpu"`` kernel flavour (``None``: from the platform / env).
  Returns ``out [B, Tq, Hq, D]`` (and ``lse`` when ``return_lse``). Queries that may see no key
  give zeros (and ``lse = -inf``), never NaN.
  """
  if q.ndim != 4 or k.ndim != 4 or v.shape != k.shape:
    raise KernelError(f"attention expects q [B,Tq,Hq,D] and k/v [B,Tk,Hkv,D]; got q {q.shape}, "
                      f"k {k.shape}, v {v.shape}")
  if q.shape[2] % k.shape[2]:
    raise KernelError(f"query heads ({q.shape[2]}) must be a multiple of KV heads ({k.shape[2]})")
  choice, reason, fell_back = _decide(q.shape, k.shape, q.dtype, impl=impl, interpret=interpret,
                                      backend=pallas_backend)
  if fell_back:
    _warn_once(f"attention impl='auto': {reason}")
  scale = q.shape[-1] ** -0.5 if scale is None else scale
  if choice == "dense":
    out, lse = dense_attention(q, k, v, q_meta, k_meta, rule, window=window, scale=scale)
  elif choice == "chunked":
    offset = k.shape[1] - q.shape[1] if rule.suffix_queries else None
    out, lse = chunked_attention(q, k, v, q_meta, k_meta, rule, window=window, scale=scale,
                                 causal_offset=offset)
  else:
    km = kernel_meta(q_meta, k_meta, rule, window)
    if choice == "blockwise":
      out, lse = blockwise_attention(q, k, v, km, scale=scale, kind_sees=rule.kind_sees)
    else:
      backend = flash.resolve_backend(pallas_backend)
      interp = flash.resolve_interpret(interpret, backend)
      if choice == "pallas_decode":
        out, lse = decode_lib.decode_attention(q, k, v, km, scale=scale, kind_sees=rule.kind_sees,
                                               backend=backend, interpret=interp)
      else:
        out, lse = flash.flash_attention(q, k, v, km, scale=scale, kind_sees=rule.kind_sees,
                                         backend=backend, interpret=interp)
  return (out, lse) if return_lse else out
