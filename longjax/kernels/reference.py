"""Dense jnp attention: the reference every other implementation is tested against.

Materialises the full ``[B, H, Tq, Tk]`` score matrix, so use it for short sequences and tests.
"""
from __future__ import annotations

import jax.numpy as jnp

from longjax.kernels.mask import MaskRule, TokenMeta, allowed, NO_WINDOW


def dense_attention(q, k, v, q_meta: TokenMeta, k_meta: TokenMeta, rule: MaskRule = MaskRule(),
                    window=NO_WINDOW, scale=None):
  """Grouped-query attention with softmax in fp32.

  Args:
    q: ``[B, Tq, Hq, D]``; k, v: ``[B, Tk, Hkv, D]`` with ``Hq % Hkv == 0``.
  Returns:
    ``(out [B, Tq, Hq, D] in q.dtype, lse [B, Hq, Tq] fp32)``. A query that may see no key gets a
    zero output and ``lse = -inf`` (never NaN).
  """
  b, tq, hq, d = q.shape
  hkv = k.shape[2]
  group = hq // hkv
  scale = d ** -0.5 if scale is None else scale
  # [B, Hkv, G, Tq, D]: query heads grouped by the KV head they read, so KV is never repeated.
  qg = q.reshape(b, tq, hkv, group, d).transpose(0, 2, 3, 1, 4)
  # Scores as [B, Hkv, Tk, G, Tq], the keys the left operand: XLA CPU then reads each key's D
  # values as one row, where keys on the right made it write every key first into a transposed
  # [Hkv, D, Tk] copy (the largest cost of a decode step over a long memory).
  s = jnp.einsum("bkhd,bhgqd->bhkgq", k, qg, preferred_element_type=jnp.float32) * scale
  ok = jnp.swapaxes(allowed(q_meta, k_meta, rule, window), 1, 2)[:, None, :, None, :]
  if k_meta.bias is not None:
    s = s + k_meta.bias.astype(jnp.float32)[:, None, :, None, None]
  s = jnp.where(ok, s, -jnp.inf)
  m = jnp.max(s, axis=2, keepdims=True)
  m_safe = jnp.where(jnp.isfinite(m), m, 0.0)
  p = jnp.exp(s - m_safe)
  l = jnp.sum(p, axis=2, keepdims=True)
  p = p / jnp.where(l > 0, l, 1.0)
  out = jnp.einsum("bhkgq,bkhd->bhgqd", p.astype(v.dtype), v, preferred_element_type=jnp.float32)
  out = out.transpose(0, 3, 1, 2, 4).reshape(b, tq, hq, d).astype(q.dtype)
  l, m_safe = l[:, :, 0], m_safe[:, :, 0]  # [B, Hkv, G, Tq]
  lse = jnp.where(l > 0, jnp.log(jnp.where(l > 0, l, 1.0)) + m_safe, -jnp.inf)
  return out, lse.reshape(b, hq, tq)
