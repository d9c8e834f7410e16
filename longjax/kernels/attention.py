"""The single attention entry point used by the decoder (and so by Beacon and FocusLLM).

Implementations are selected by ``impl``:

* ``"xla"``  the dense jnp reference (``reference.dense_attention``).
* ``"auto"`` today the same as ``"xla"``; the Pallas issue extends it to pick a kernel on GPU/TPU
  where the shapes allow and to say why it fell back otherwise.

Anything else is refused with a clear error rather than silently falling back.
"""
from __future__ import annotations

from longjax.kernels.mask import MaskRule, TokenMeta, NO_WINDOW
from longjax.kernels.reference import dense_attention

IMPLS = ("auto", "xla")


def attention(q, k, v, q_meta: TokenMeta, k_meta: TokenMeta, rule: MaskRule = MaskRule(), *,
              window=NO_WINDOW, scale=None, impl: str = "auto", return_lse: bool = False):
  """Masked grouped-query attention.

  Args:
    q: ``[B, Tq, Hq, D]`` queries (RoPE already applied).
    k, v: ``[B, Tk, Hkv, D]`` keys (RoPE applied) and values; ``Hq`` must be a multiple of ``Hkv``.
    q_meta, k_meta: per-token metadata (see ``longjax.kernels.mask``).
    rule: static mask rule (causal or not).
    window: sliding window in ``order`` units (traced scalar allowed); ``NO_WINDOW`` for none.
    scale: softmax scale, default ``D ** -0.5``.
    impl: ``"auto" | "xla"``.
    return_lse: also return the fp32 log-sum-exp ``[B, Hq, Tq]`` (for blockwise merging / kernels).
  """
  if q.ndim != 4 or k.ndim != 4 or v.shape != k.shape:
    raise ValueError(f"attention expects q [B,Tq,Hq,D] and k/v [B,Tk,Hkv,D]; got q {q.shape}, "
                     f"k {k.shape}, v {v.shape}")
  if q.shape[2] % k.shape[2]:
    raise ValueError(f"query heads ({q.shape[2]}) must be a multiple of KV heads ({k.shape[2]})")
  if impl not in IMPLS:
    raise ValueError(f"unknown attention impl {impl!r}; choose one of {IMPLS}")
  out, lse = dense_attention(q, k, v, q_meta, k_meta, rule, window=window, scale=scale)
  return (out, lse) if return_lse else out
