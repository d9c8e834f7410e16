"""Query-chunked dense attention: the fast XLA path on CPU.

The dense reference materialises ``[B, Hq, Tq, Tk]`` fp32 scores and walks them five times (scale,
mask, max, exp, normalise): past a few MB that is memory traffic, not arithmetic, and a Beacon
window over a 4K-entry memory ran at ~20 % of the matmul peak. The blockwise path keeps the tiles
small but pays a ``lax.scan`` + ``lax.cond`` per KV block. This path sits between them:

* queries are cut into blocks of ``block_q`` (``lax.map``, sequential); each block sees every key
  at once, so there is no online-softmax rescaling and one score tile ``[B, Hkv, G * block_q, Tk]``
  stays near the cache;
* each KV head's query group is one ``[G * block_q, D] x [D, Tk]`` matmul (keys transposed once,
  outside the loop), then ``[G * block_q, Tk] x [Tk, D]``;
* the scale is folded into the queries, the mask is an additive bias computed once per block and
  shared by the group, and the softmax denominator divides the ``[.., D]`` output instead of the
  ``[.., Tk]`` probabilities: two passes over the scores (max, exp-and-sum) instead of five.

Same contract as :func:`longjax.kernels.reference.dense_attention` (``(out, lse)``; a query that
sees no key gives zeros and ``lse = -inf``). Differentiable by plain autodiff; above
``remat_scores`` scores per head each block is rematerialised, so a backward pass keeps one
block's scores at a time instead of all of them.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from longjax.kernels.mask import MaskRule, TokenMeta, allowed, NO_WINDOW
from longjax.sizes import round_up

# -1e30, not -inf: masked scores then need no isfinite guard in the max / exp passes (a row that
# sees nothing is zeroed explicitly below).
_MASKED = -1e30


def _block(qb, kt, v, ok):
  """One query block. ``qb [B, bq, Hq, D]`` (pre-scaled), ``kt [B, Hkv, D, Tk]``,
  ``v [B, Hkv, Tk, D]``, ``ok [B, bq, Tk]`` -> ``(out [B, bq, Hq, D], lse [B, Hq, bq])``."""
  b, bq, hq, d = qb.shape
  hkv = kt.shape[1]
  g = hq // hkv
  qg = qb.reshape(b, bq, hkv, g, d).transpose(0, 2, 3, 1, 4).reshape(b, hkv, g * bq, d)
  s = jnp.einsum("bhqd,bhdk->bhqk", qg, kt, preferred_element_type=jnp.float32)
  s = s.reshape(b, hkv, g, bq, -1) + jnp.where(ok, 0.0, _MASKED)[:, None, None]
  m = jnp.max(s, axis=-1, keepdims=True)
  p = jnp.exp(s - m)
  l = jnp.sum(p, axis=-1)  # [B, Hkv, G, bq]
  o = jnp.einsum("bhqk,bhkd->bhqd", p.reshape(b, hkv, g * bq, -1).astype(v.dtype), v,
                 preferred_element_type=jnp.float32)
  seen = jnp.any(ok, axis=-1)[:, None, None]  # [B, 1, 1, bq]
  o = o.reshape(b, hkv, g, bq, d) / jnp.where(seen, l, 1.0)[..., None]
  o = jnp.where(seen[..., None], o, 0.0)
  lse = jnp.where(seen, m[..., 0] + jnp.log(jnp.where(seen, l, 1.0)), -jnp.inf)
  return o.transpose(0, 3, 1, 2, 4).reshape(b, bq, hq, d), lse.reshape(b, hq, bq)


# Causal trimming (``causal_offset``): query blocks run in this many groups, each against the keys
# its last query can see. 8 groups do 9/16 of the untrimmed score work; more groups mean more
# compiled bodies for ever smaller savings.
TRIM_GROUPS = 8


def chunked_attention(q, k, v, q_meta: TokenMeta, k_meta: TokenMeta, rule: MaskRule = MaskRule(),
                      window=NO_WINDOW, scale=None, block_q: int = 64,
                      remat_scores: int = 2048 * 2048, causal_offset=None):
  """Grouped-query attention, query-chunked (see the module docstring).

  Args:
    q: ``[B, Tq, Hq, D]``; k, v: ``[B, Tk, Hkv, D]`` with ``Hq % Hkv == 0``.
    causal_offset: ``None``, or a static promise from the caller that query ``i`` sees no key
      after index ``causal_offset + i`` (a causal prefill after ``causal_offset`` cached
      entries): the query blocks then run in up to ``TRIM_GROUPS`` groups, each against only
      the keys its queries may see, which nearly halves the work of a fresh prefill. The mask is
      still applied in full, so a wrong promise drops keys but never adds any.
  Returns ``(out [B, Tq, Hq, D] in q.dtype, lse [B, Hq, Tq] fp32)``.
  """
  b, tq, hq, d = q.shape
  tk = k.shape[1]
  scale = d ** -0.5 if scale is None else scale
  bq = min(block_q, round_up(tq, 8))
  nq = -(-tq // bq)
  pad = nq * bq - tq

  def blocks(x):  # [B, Tq, ...] -> [nQ, B, bq, ...]; padded queries are invalid (see nothing)
    x = jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))
    return jnp.moveaxis(x.reshape((b, nq, bq) + x.shape[2:]), 1, 0)

  qs = blocks((q.astype(jnp.float32) * scale).astype(q.dtype))
  kt = k.transpose(0, 2, 3, 1)  # [B, Hkv, D, Tk]: the score matmul's natural layout
  vt = v.transpose(0, 2, 1, 3)  # [B, Hkv, Tk, D]
  meta_b = jax.tree.map(blocks, q_meta)

  remat = tq * tk > remat_scores  # decided by the whole call's scores, trimmed or not
  outs, lses = [], []
  for n0, n1, kend in _groups(nq, bq, tk, causal_offset):
    km = jax.tree.map(lambda x, kend=kend: x[:, :kend], k_meta)
    ktg, vtg = kt[..., :kend], vt[:, :, :kend]

    def one(args, ktg=ktg, vtg=vtg, km=km):
      qb, mb = args
      return _block(qb, ktg, vtg, allowed(mb, km, rule, window))

    if remat:
      one = jax.checkpoint(one)
    out, lse = jax.lax.map(one, (qs[n0:n1], jax.tree.map(lambda x: x[n0:n1], meta_b)))
    outs.append(out)
    lses.append(lse)
  out, lse = jnp.concatenate(outs, axis=0), jnp.concatenate(lses, axis=0)
  out = jnp.moveaxis(out, 0, 1).reshape(b, nq * bq, hq, d)[:, :tq]
  lse = jnp.moveaxis(lse, 0, 2).reshape(b, hq, nq * bq)[..., :tq]
  return out.astype(q.dtype), lse


def _groups(nq: int, bq: int, tk: int, causal_offset):
  """``(first block, end block, keys)`` of each group of query blocks: all blocks against all
  ``tk`` keys, or (``causal_offset``) up to ``TRIM_GROUPS`` groups, each against the keys up to
  its last query's ``causal_offset + i`` (a multiple of 8, at least 8, at most ``tk``)."""
  if causal_offset is None or nq < 2:
    return [(0, nq, tk)]
  n = min(TRIM_GROUPS, nq)
  cuts = [round(i * nq / n) for i in range(n + 1)]
  out = []
  for n0, n1 in zip(cuts[:-1], cuts[1:]):
    kend = min(tk, max(8, round_up(int(causal_offset) + n1 * bq, 8)))
    if out and out[-1][2] == kend:  # nothing to trim between them: one group
      out[-1] = (out[-1][0], n1, kend)
    else:
      out.append((n0, n1, kend))
  return out
