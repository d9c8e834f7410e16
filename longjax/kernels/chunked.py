"""Query-chunked, key-tiled attention in plain jnp: the fast XLA path on CPU.

The dense reference materialises ``[B, Hq, Tq, Tk]`` fp32 scores and walks them five times (scale,
mask, max, exp, normalise): past a few MB that is memory traffic, not arithmetic, and a Beacon
window over a 4K-entry memory ran at ~20 % of the matmul peak. The blockwise path (the kernels'
backward and XLA fallback) pays per KV block for a layout made for the kernels. This path:

* cuts queries into blocks (``lax.map``, sequential) and keys into tiles of ``TILE_K``, merged by
  an online softmax (``lax.scan``); one block's score tile stays in the core's cache (a block's
  scores over all 16K keys were a 32 MiB tile, and cost ~40 % more per score than at 8K). Calls
  with nothing to skip and a small enough key range run each block as one tile
  (``WHOLE_TILE_BYTES``);
* runs ``PARALLEL_BLOCKS`` query blocks side by side in each loop step, as independent chains: a
  tile's matmuls are too small for XLA's CPU runtime to split over threads, so a single chain
  leaves the other core idle;
* makes each KV head's query group one ``[G * block_q, D] x [D, TILE_K]`` matmul (keys
  transposed once, outside the loop), then ``[G * block_q, TILE_K] x [TILE_K, D]``;
* folds the scale into the queries, adds the mask as a bias computed once per tile and shared by
  the group (only where the tile masks something: a tile every query of the block sees whole
  skips it, ``lax.cond``), and divides the ``[.., D]`` output by the softmax denominator instead
  of the probabilities: two passes over each tile's scores (max, exp-and-sum);
* with ``causal_offset`` (a causal prefill), skips the tiles after a step's last query
  (``lax.cond``): about half the work of a fresh prefill, from one compiled loop body; a call
  small enough for whole tiles is cut into query bands instead, each reading only the keys up to
  its last query.

Same contract as :func:`longjax.kernels.reference.dense_attention` (``(out, lse)``; a query that
sees no key gives zeros and ``lse = -inf``). Differentiable by plain autodiff; above
``remat_scores`` scores per head each block is rematerialised, so a backward pass keeps one
block's scores at a time instead of all of them.

Measured against torch SDPA and the blockwise path with ``python -m bench.bench_chunked`` (one
layer's causal attention); the latest numbers are in ``docs/performance.md``.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from longjax.kernels.mask import MaskRule, TokenMeta, allowed, NO_WINDOW
from longjax.runtime.rounding import round_up

# -1e30, not -inf: masked scores then need no isfinite guard in the max / exp passes (a row that
# sees nothing is zeroed explicitly below).
_MASKED = -1e30


def _group_queries(qb, hkv):
  """``[B, bq, Hq, D]`` -> ``[B, Hkv, G * bq, D]``: each KV head's query group as one matrix."""
  b, bq, hq, d = qb.shape
  g = hq // hkv
  return qb.reshape(b, bq, hkv, g, d).transpose(0, 2, 3, 1, 4).reshape(b, hkv, g * bq, d)


def _tile(qg, kt, v, ok, g, state=None, bias=None):
  """One key tile: ``qg [B, Hkv, G*bq, D]``, ``kt [B, Hkv, D, bk]``, ``v [B, Hkv, bk, D]``, ``ok
  [B, bq, bk]`` -> ``(m [B, Hkv, G, bq], l [same], o [B, Hkv, G, bq, D])``: the row max, the sum
  of ``exp(s - m)`` and the unnormalised output, of this tile alone or, given the ``state`` of
  the tiles before it, of all of them (the online softmax: the tile's probabilities are taken at
  the running max, so only the earlier state is rescaled). ``bias [B, bk]``: added to each key's
  scores (``TokenMeta.bias``)."""
  b, hkv, gbq, d = qg.shape
  bq = gbq // g
  s = jnp.einsum("bhqd,bhdk->bhqk", qg, kt, preferred_element_type=jnp.float32)
  s = s.reshape(b, hkv, g, bq, -1)
  if bias is not None:
    s = s + bias.astype(jnp.float32)[:, None, None, None, :]
  if ok is not None:  # None: every key of the tile is visible to every query of the block
    s = s + jnp.where(ok, 0.0, _MASKED)[:, None, None]
  m = jnp.max(s, axis=-1)
  if state is not None:
    m0, l0, o0 = state
    m = jnp.maximum(m0, m)
  p = jnp.exp(s - m[..., None])
  o = jnp.einsum("bhqk,bhkd->bhqd", p.reshape(b, hkv, gbq, -1).astype(v.dtype), v,
                 preferred_element_type=jnp.float32).reshape(b, hkv, g, bq, d)
  l = jnp.sum(p, axis=-1)
  if state is None:
    return m, l, o
  a0 = jnp.exp(m0 - m)
  return m, l0 * a0 + l, o0 * a0[..., None] + o


def _blocks(qbs, kt_tiles, v_tiles, km_tiles, mbs, rule, window, limit=None):
  """Query blocks against ``n`` key tiles (online softmax across tiles).

  ``qbs``: a list of ``[B, bq, Hq, D]`` blocks (pre-scaled), ``mbs`` their query metadata
  (``[B, bq]``); ``kt_tiles [n, B, Hkv, D, bk]``, ``v_tiles [n, B, Hkv, bk, D]``, ``km_tiles`` key
  metadata ``[n, B, bk]``. Returns a list of ``(out [B, bq, Hq, D], lse [B, Hq, bq])``.

  The blocks are independent chains of small matmuls inside one loop step: XLA's CPU runtime
  runs one tile's matmul on one thread, so a single chain leaves the other cores idle."""
  hkv = kt_tiles.shape[2]
  g = qbs[0].shape[2] // hkv
  qgs = [_group_queries(qb, hkv) for qb in qbs]

  def tiles(j_tiles, states=None):
    kt, v, km = j_tiles
    out = []
    for i, (qg, mb) in enumerate(zip(qgs, mbs)):
      ok = allowed(mb, km, rule, window)
      st = None if states is None else states[i]
      # A tile that masks nothing (most of a long causal prefill's, all but the diagonal ones)
      # skips the mask: one pass less over its scores.
      out.append(jax.lax.cond(jnp.all(ok),
                              lambda qg, kt, v, ok, st: _tile(qg, kt, v, None, g, st, km.bias),
                              lambda qg, kt, v, ok, st: _tile(qg, kt, v, ok, g, st, km.bias),
                              qg, kt, v, ok, st))
    return out

  state = tiles(jax.tree.map(lambda x: x[0], (kt_tiles, v_tiles, km_tiles)))
  if kt_tiles.shape[0] > 1:
    def update(carry, j_tiles):
      return tiles(j_tiles, carry)

    def step(carry, xs):
      j, j_tiles = xs
      if limit is None:
        return update(carry, j_tiles), None
      # Tiles from ``limit`` on hold only keys after every query of the step: skipped.
      return jax.lax.cond(j < limit, lambda c: update(c, j_tiles), lambda c: c, carry), None

    rest = jax.tree.map(lambda x: x[1:], (kt_tiles, v_tiles, km_tiles))
    state, _ = jax.lax.scan(step, state, (jnp.arange(1, kt_tiles.shape[0]), rest))
  return [_finish(*st) for st in state]


def _finish(m, l, o):
  """Normalise one block: ``m, l [B, Hkv, G, bq]``, ``o [B, Hkv, G, bq, D]`` -> ``(out [B, bq,
  Hq, D], lse [B, Hq, bq])``. A row that saw no key kept the masked value as its max (every p
  was exp(0) of masked scores): it gets zeros and lse = -inf."""
  b, hkv, g, bq, d = o.shape
  seen = jax.lax.stop_gradient(m) > _MASKED / 2
  l_safe = jnp.where(seen, l, 1.0)
  o = jnp.where(seen[..., None], o / l_safe[..., None], 0.0)
  lse = jnp.where(seen, m + jnp.log(l_safe), -jnp.inf)
  return o.transpose(0, 3, 1, 2, 4).reshape(b, bq, hkv * g, d), lse.reshape(b, hkv * g, bq)


# Keys per tile (a ``[G * block_q, TILE_K]`` fp32 score tile per KV head: 1.5 MiB at G = 3, 256
# queries), queries per block (``TILE_Q``, or half of it when that pads less), blocks per loop
# step. Measured on one layer's fresh causal prefill (2 CPU cores): at SmolLM2's 9 / 3 heads 256
# queries per block took 0.60 / 2.28 / 9.2 s at 8K / 16K / 32K against 0.75 / 2.85 / 11.1 s with
# 128 (torch SDPA 2.15 s at 16K), and 384 or 512 no better; at 8 / 2 heads 256 and 128 are level
# (1.87 / 1.96 s at 16K). The score matmul's contraction is only the head dimension (64): taller
# tiles amortise it better. Keys: best of 256-2048.
TILE_K = 512
TILE_Q = 256
PARALLEL_BLOCKS = 2
# Without ``causal_offset`` (nothing to skip: Beacon windows over their memory, FocusLLM) a
# block of ``WHOLE_Q`` queries whose scores over all keys take at most ``WHOLE_TILE_BYTES`` runs
# as one tile: as fast there (1152 queries x 3.7K keys), and no tile loop to compile for each of
# the many memory sizes a Beacon prefill goes through.
WHOLE_Q = 64
# A causal call that fits whole tiles is cut into this many query bands (``_causal_bands``).
# Measured on one FocusLLM chunk row (1,152 tokens, 8 / 2 and 9 / 3 heads): 4 bands 1.4-1.6x,
# 8 bands 1.45-1.65x faster than the whole square; at 2K tokens the same as the tiled skip.
CAUSAL_BANDS = 8
WHOLE_TILE_BYTES = 16 * 2**20


def chunked_attention(q, k, v, q_meta: TokenMeta, k_meta: TokenMeta, rule: MaskRule = MaskRule(),
                      window=NO_WINDOW, scale=None, block_q=None, block_k=None,
                      parallel_blocks=None, remat_scores: int = 2048 * 2048, causal_offset=None):
  """Grouped-query attention, query-chunked and key-tiled (see the module docstring).

  Args:
    q: ``[B, Tq, Hq, D]``; k, v: ``[B, Tk, Hkv, D]`` with ``Hq % Hkv == 0``.
    block_q, block_k, parallel_blocks: queries per block, keys per tile, query blocks per loop
      step; ``None`` chooses (see ``TILE_K`` and ``WHOLE_TILE_BYTES``).
    causal_offset: ``None``, or a static promise from the caller that query ``i`` sees no key
      after index ``causal_offset + i`` (a causal prefill after ``causal_offset`` cached
      entries): each loop step then skips the key tiles after its last query, which nearly
      halves the work of a fresh prefill. The mask is still applied in full, so a wrong promise
      drops keys but never adds any.
  Returns ``(out [B, Tq, Hq, D] in q.dtype, lse [B, Hq, Tq] fp32)``.
  """
  b, tq, hq, d = q.shape
  tk = k.shape[1]
  scale = d ** -0.5 if scale is None else scale
  fits_whole = b * hq * min(WHOLE_Q, round_up(tq, 8)) * round_up(tk, 8) * 4 <= WHOLE_TILE_BYTES
  if (causal_offset is not None and fits_whole
      and all(x is None for x in (block_q, block_k, parallel_blocks))):
    return _causal_bands(q, k, v, q_meta, k_meta, rule, window, scale, int(causal_offset),
                         remat_scores)
  whole = causal_offset is None and fits_whole
  if whole:
    block_q, block_k, parallel_blocks = block_q or WHOLE_Q, block_k or tk, parallel_blocks or 1
  parallel_blocks = parallel_blocks or PARALLEL_BLOCKS
  block_k = block_k or TILE_K
  if block_q is None:
    block_q = min((TILE_Q, TILE_Q // 2),
                  key=lambda n: (round_up(tq, n * min(parallel_blocks, -(-tq // n))), -n))
  bq = min(block_q, round_up(tq, 8))
  nq = -(-tq // bq)
  par = max(1, min(parallel_blocks, nq))
  steps = -(-nq // par)
  pad = steps * par * bq - tq  # padded queries are invalid: they see nothing
  bk = min(block_k, round_up(tk, 8))
  nk = -(-tk // bk)

  def blocks(x):  # [B, Tq, ...] -> [steps, P, B, bq, ...]
    x = jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))
    x = jnp.moveaxis(x.reshape((b, steps * par, bq) + x.shape[2:]), 1, 0)
    return x.reshape((steps, par) + x.shape[1:])

  def key_tiles(x, axis):  # key axis ``axis`` of a [B, ...] array -> [nK, B, ..., bk, ...]
    x = jnp.pad(x, [(0, nk * bk - x.shape[axis]) if a == axis else (0, 0) for a in range(x.ndim)])
    x = x.reshape(x.shape[:axis] + (nk, bk) + x.shape[axis + 1:])
    return jnp.moveaxis(x, axis, 0)

  qs = blocks((q.astype(jnp.float32) * scale).astype(q.dtype))
  kt = key_tiles(k.transpose(0, 2, 3, 1), 3)  # [nK, B, Hkv, D, bk]: the score matmul's layout
  vt = key_tiles(v.transpose(0, 2, 1, 3), 2)  # [nK, B, Hkv, bk, D]
  km = jax.tree.map(lambda x: key_tiles(x, 1), _pad_keys(k_meta, nk * bk - tk))
  meta_b = jax.tree.map(blocks, q_meta)
  if causal_offset is None:
    limits = jnp.full((steps,), nk, jnp.int32)
  else:  # key tiles a step needs: its last query sees keys up to causal_offset + its index
    ends = int(causal_offset) + (jnp.arange(steps, dtype=jnp.int32) + 1) * (par * bq)
    limits = jnp.minimum(-(-ends // bk), nk)

  def one(args):
    qb, mb, lim = args
    res = _blocks([qb[i] for i in range(par)], kt, vt, km,
                  [jax.tree.map(lambda x, i=i: x[i], mb) for i in range(par)], rule, window,
                  None if causal_offset is None else lim)
    return tuple(jnp.stack(x) for x in zip(*res))

  if tq * tk > remat_scores:
    one = jax.checkpoint(one)
  out, lse = jax.lax.map(one, (qs, meta_b, limits))  # [steps, P, B, bq, Hq, D], [.., B, Hq, bq]
  out = jnp.moveaxis(out.reshape((steps * par,) + out.shape[2:]), 0, 1)
  lse = jnp.moveaxis(lse.reshape((steps * par,) + lse.shape[2:]), 0, 2)
  out = out.reshape(b, steps * par * bq, hq, d)[:, :tq]
  lse = lse.reshape(b, hq, steps * par * bq)[..., :tq]
  return out.astype(q.dtype), lse


def causal_band_ends(tq: int):
  """Query ends of the bands a short causal call is cut into (``CAUSAL_BANDS`` of whole
  ``WHOLE_Q`` blocks, the last one ending at ``tq``)."""
  size = round_up(-(-tq // CAUSAL_BANDS), WHOLE_Q)
  return list(range(size, tq, size)) + [tq]


def _causal_bands(q, k, v, q_meta, k_meta, rule, window, scale, offset, remat_scores):
  """A causal call small enough for whole tiles (a FocusLLM chunk row, a short prefill): the
  queries cut into bands, each attending, in whole tiles, only to the keys up to its last query
  (``offset`` + its end). About 9/16 of the score work at 8 bands, in independent programs the
  CPU runtime can run side by side; the tiled path's per-tile skipping pays a tile loop instead."""
  outs, lses, s = [], [], 0
  for e in causal_band_ends(q.shape[1]):
    kend = min(k.shape[1], offset + e)
    out, lse = chunked_attention(
        q[:, s:e], k[:, :kend], v[:, :kend], jax.tree.map(lambda x: x[:, s:e], q_meta),
        jax.tree.map(lambda x: x[:, :kend], k_meta), rule, window=window, scale=scale,
        remat_scores=remat_scores)
    outs.append(out)
    lses.append(lse)
    s = e
  return jnp.concatenate(outs, axis=1), jnp.concatenate(lses, axis=2)


def _pad_keys(meta: TokenMeta, n: int) -> TokenMeta:
  """Key metadata followed by ``n`` invalid keys (never seen)."""
  if n == 0:
    return meta
  pad = lambda x, value=0: jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, n)], constant_values=value)
  return TokenMeta(order=pad(meta.order), segment=pad(meta.segment), valid=pad(meta.valid, False),
                   kind=None if meta.kind is None else pad(meta.kind),
                   bias=None if meta.bias is None else pad(meta.bias))
