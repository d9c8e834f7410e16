"""Attention kernels vs the dense reference (CPU; Pallas kernels in interpret mode).

Shapes are small and lengths are never multiples of the block sizes (the kernels use 16 x 16
blocks here so that several blocks, padding and block skipping are all exercised; interpret mode
has no TPU tiling rules, and ``test_flash_tpu_production_blocks`` runs the TPU kernel at its
production 128 x 128 blocks; ``test_kernel_lowering.py`` lowers every kernel for TPU and GPU).
Every case has at least one query that may see nothing (its output must be exactly 0, never NaN).
Forward tests of every kernel run by default; gradient tests are marked ``slow``.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from longjax.kernels import attention, explain
from longjax.kernels import decode as decode_lib
from longjax.kernels import flash
from longjax.kernels.blockwise import blockwise_attention
from longjax.kernels.chunked import chunked_attention
from longjax.kernels.mask import (NO_WINDOW, MaskRule, TokenMeta, allowed, block_lists,
                                  block_visits, kernel_allowed, kernel_meta, pad_kernel_meta)
from longjax.kernels.reference import dense_attention
from longjax.kernels.testing import TOL, case_meta, grad_loss, make_case, rel_err

BLOCKS = dict(block_q=16, block_k=16)


def reference(q, k, v, qm, km, rule, window):
  """Dense reference in fp32 on the (possibly bf16-rounded) inputs."""
  f = lambda x: x.astype(jnp.float32)
  return dense_attention(f(q), f(k), f(v), qm, km, rule, window=window)


def check_forward(out, lse, q, k, v, qm, km, rule, window):
  ref, ref_lse = reference(q, k, v, qm, km, rule, window)
  assert out.shape == q.shape and out.dtype == q.dtype
  assert np.all(np.isfinite(np.asarray(out, np.float32)))
  assert rel_err(out, ref) < TOL[q.dtype.type], rel_err(out, ref)
  empty = ~np.asarray(allowed(qm, km, rule, window)).any(-1)  # [B, Tq]
  assert empty.any(), "every case must contain a query that sees nothing"
  assert np.all(np.asarray(out, np.float32)[empty] == 0)
  lse, ref_lse = np.asarray(lse), np.asarray(ref_lse)
  np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(ref_lse))
  fin = np.isfinite(ref_lse)
  np.testing.assert_allclose(lse[fin], ref_lse[fin], atol=1e-4 if q.dtype == jnp.float32 else 2e-2)


# ------------------------------------------------------------------------------------------------
# Mask description.
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["beacon_memory", "step_expansion", "condense", "focus_local",
                                  "window", "noncausal_segments", "decode"])
def test_kernel_meta_and_block_visits_match_allowed(name):
  qm, km, rule, window, b, tq, tk = case_meta(name, np.random.default_rng(1))
  ok = np.asarray(allowed(qm, km, rule, window))
  m = kernel_meta(qm, km, rule, window)
  qa = lambda x: x[:, :, None]
  ka = lambda x: x[:, None, :]
  ok2 = kernel_allowed(qa(m.q_lo), qa(m.q_hi), qa(m.q_seg), qa(m.q_kind), ka(m.k_order),
                       ka(m.k_seg), ka(m.k_kind), rule.kind_sees)
  np.testing.assert_array_equal(ok, np.asarray(ok2))
  # Block visits are conservative: every block holding an allowed pair is visited.
  bq, bk = 8, 16
  tqp, tkp = -(-tq // bq) * bq, -(-tk // bk) * bk
  vis = np.asarray(block_visits(pad_kernel_meta(m, tqp, tkp), bq, bk))
  okp = np.zeros((b, tqp, tkp), bool)
  okp[:, :tq, :tk] = ok
  need = okp.reshape(b, tqp // bq, bq, tkp // bk, bk).any((2, 4))
  assert np.all(vis[need])
  if name in ("beacon_memory", "condense", "window"):
    assert not vis.all(), "causal/windowed layouts must skip some blocks"
  # Compacted lists: visited blocks first, in order; jnp and numpy (flash._lists) agree.
  blocks, counts = block_lists(jnp.asarray(vis))
  blocks, counts = np.asarray(blocks), np.asarray(counts)
  for bi in range(b):
    for i in range(vis.shape[1]):
      np.testing.assert_array_equal(blocks[bi, i, :counts[bi, i]], np.nonzero(vis[bi, i])[0])
  hb, hc, steps = flash._lists(pad_kernel_meta(m, tqp, tkp), bq, bk)
  assert steps == max(1, counts.max())
  np.testing.assert_array_equal(np.asarray(hc), counts)
  np.testing.assert_array_equal(np.asarray(hb), blocks[..., :steps])


def test_tokenmeta_kind_is_backward_compatible():
  a = TokenMeta(order=jnp.arange(3)[None], segment=jnp.zeros((1, 3), jnp.int32),
                valid=jnp.ones((1, 3), bool))
  assert a.kind is None
  c = a.concat(TokenMeta.causal(jnp.arange(2)[None], kind=jnp.ones((1, 2))))
  np.testing.assert_array_equal(np.asarray(c.kind), [[0, 0, 0, 1, 1]])
  assert jax.jit(lambda m: m.order.sum())(a) == 3  # still a pytree with a None leaf


# ------------------------------------------------------------------------------------------------
# Blockwise jnp fallback.
# ------------------------------------------------------------------------------------------------
# (case, dtype, query heads, KV heads): the jnp paths (blockwise, chunked) run every mask case.
XLA_CASES = [
    ("beacon_memory", jnp.float32, 4, 2), ("step_expansion", jnp.bfloat16, 4, 4),
    ("condense", jnp.float32, 2, 2), ("focus_local", jnp.bfloat16, 6, 2),
    ("window", jnp.float32, 4, 1), ("noncausal_segments", jnp.float32, 2, 1),
    ("decode", jnp.float32, 8, 2)]


@pytest.mark.parametrize("name,dtype,hq,hkv", XLA_CASES)
def test_blockwise_forward(name, dtype, hq, hkv):
  q, k, v, qm, km, rule, window = make_case(name, dtype, hq, hkv)
  out, lse = blockwise_attention(q, k, v, kernel_meta(qm, km, rule, window),
                                 scale=q.shape[-1] ** -0.5, kind_sees=rule.kind_sees, **BLOCKS)
  check_forward(out, lse, q, k, v, qm, km, rule, window)


def check_grads(fn, q, k, v, qm, km, rule, window, tol=1e-4):
  ref_fn = lambda q, k, v: dense_attention(q, k, v, qm, km, rule, window=window)
  g_ref = jax.grad(functools.partial(grad_loss, ref_fn), (0, 1, 2))(q, k, v)
  g = jax.grad(functools.partial(grad_loss, fn), (0, 1, 2))(q, k, v)
  for a, r in zip(g, g_ref):
    assert np.all(np.isfinite(np.asarray(a, np.float32)))
    assert rel_err(a, r) < tol, rel_err(a, r)


def test_blockwise_grads():
  q, k, v, qm, km, rule, window = make_case("beacon_memory")
  m = kernel_meta(qm, km, rule, window)
  fn = lambda q, k, v: blockwise_attention(q, k, v, m, scale=q.shape[-1] ** -0.5, **BLOCKS)
  check_grads(fn, q, k, v, qm, km, rule, window)


# ------------------------------------------------------------------------------------------------
# Query-chunked dense path (CPU).
# ------------------------------------------------------------------------------------------------
# One key tile, and several (16 x 16 tiles: a partial last one, an odd number of query blocks, two
# blocks per loop step); one block per step: test_chunked_causal_trimming_matches_dense.
CHUNK_TILINGS = {"one_tile": dict(block_q=16, block_k=4096),
                 "tiles": dict(block_q=16, block_k=16, parallel_blocks=2)}


@pytest.mark.parametrize("tiling", list(CHUNK_TILINGS))
@pytest.mark.parametrize("name,dtype,hq,hkv", XLA_CASES)
def test_chunked_forward(name, dtype, hq, hkv, tiling):
  q, k, v, qm, km, rule, window = make_case(name, dtype, hq, hkv)
  assert q.shape[1] % 16, "the query length must leave a partial block"
  out, lse = chunked_attention(q, k, v, qm, km, rule, window=window, **CHUNK_TILINGS[tiling])
  check_forward(out, lse, q, k, v, qm, km, rule, window)


def test_chunked_default_blocks():
  """The default choices: key tiles with ``TILE_Q`` (or half) queries per block past
  ``WHOLE_TILE_BYTES`` (lowered here so that a small case crosses it), one tile below it."""
  from longjax.kernels import chunked
  q, k, v, qm, km, rule, window = make_case("beacon_memory")
  saved = chunked.TILE_Q, chunked.TILE_K, chunked.WHOLE_TILE_BYTES
  try:
    chunked.TILE_Q, chunked.TILE_K = 32, 24
    whole = chunked_attention(q, k, v, qm, km, rule, window=window)
    chunked.WHOLE_TILE_BYTES = 1024
    tiled = chunked_attention(q, k, v, qm, km, rule, window=window)
  finally:
    chunked.TILE_Q, chunked.TILE_K, chunked.WHOLE_TILE_BYTES = saved
  assert k.shape[1] > 2 * 24
  for out, lse in (whole, tiled):
    check_forward(out, lse, q, k, v, qm, km, rule, window)


@pytest.mark.parametrize("tiling", list(CHUNK_TILINGS))
@pytest.mark.parametrize("remat_scores", [2048 * 2048, 0])  # plain autodiff; per-block remat
def test_chunked_grads(remat_scores, tiling):
  q, k, v, qm, km, rule, window = make_case("beacon_memory")
  fn = lambda q, k, v: chunked_attention(q, k, v, qm, km, rule, window=window,
                                         remat_scores=remat_scores, **CHUNK_TILINGS[tiling])
  check_grads(fn, q, k, v, qm, km, rule, window)


def _cached_prefill_case(seed=0, b=2, mem=37, t=203, hq=4, hkv=2, d=16):
  """A causal prefill of ``t`` tokens after a cache of ``mem`` slots (row lengths 0 and 29), as
  ``cache_forward`` builds it: key index ``mem + j`` is new token ``j``. Row 0's cache is empty
  and its last 11 new tokens are padding (they see nothing)."""
  rng = np.random.default_rng(seed)
  q = jnp.asarray(rng.standard_normal((b, t, hq, d)), jnp.float32)
  k = jnp.asarray(rng.standard_normal((b, mem + t, hkv, d)), jnp.float32)
  v = jnp.asarray(rng.standard_normal((b, mem + t, hkv, d)), jnp.float32)
  length = np.asarray([0, 29])[:, None]
  slots = np.broadcast_to(np.arange(mem), (b, mem))
  pos = length + np.arange(t)
  valid = np.ones((b, t), bool)
  valid[0, -11:] = False
  qm = TokenMeta.causal(pos, valid=valid)
  km = TokenMeta.causal(slots, valid=slots < length).concat(qm)
  return q, k, v, qm, km, mem


@pytest.mark.parametrize("tiling", [dict(block_q=64, block_k=64),
                                    dict(block_q=16, block_k=32, parallel_blocks=2),
                                    dict(block_q=16, block_k=24, parallel_blocks=1)])
def test_chunked_causal_trimming_matches_dense(tiling):
  """``causal_offset``: loop steps that skip the key tiles after their last query give the dense
  reference's output, lse and gradients (a fresh prefill and one after cached entries)."""
  q, k, v, qm, km, mem = _cached_prefill_case()
  rule = MaskRule(causal=True)
  for offset, args in ((mem, (q, k, v, qm, km)),
                       (0, (q, k[:, mem:], v[:, mem:], qm, qm))):
    # Several tiles and steps: the first steps skip some.
    assert args[1].shape[1] > 2 * tiling["block_k"] and q.shape[1] > 2 * tiling["block_q"]
    out, lse = chunked_attention(*args, rule, causal_offset=offset, **tiling)
    check_forward(out, lse, *args, rule, NO_WINDOW)
    fn = lambda q, k, v, a=args: chunked_attention(q, k, v, a[3], a[4], rule,
                                                   causal_offset=offset, **tiling)[0]
    ref = lambda q, k, v, a=args: dense_attention(q, k, v, a[3], a[4], rule)[0]
    g = jax.grad(lambda *x: jnp.sum(fn(*x) ** 2), argnums=(0, 1, 2))(*args[:3])
    g_ref = jax.grad(lambda *x: jnp.sum(ref(*x) ** 2), argnums=(0, 1, 2))(*args[:3])
    for a, r in zip(g, g_ref):
      assert rel_err(a, r) < 1e-5, rel_err(a, r)


def test_chunked_causal_bands_match_dense():
  """``causal_offset`` with the default blocks on a call that fits whole tiles: query bands, each
  over the keys up to its last query, give the dense reference's output, lse and gradients (a
  fresh prefill and one after cached entries; a partial last band with padding queries)."""
  from longjax.kernels.chunked import causal_band_ends
  q, k, v, qm, km, mem = _cached_prefill_case()
  ends = causal_band_ends(q.shape[1])
  assert len(ends) >= 3 and ends[-1] == q.shape[1] and ends[-1] - ends[-2] < ends[0], ends
  rule = MaskRule(causal=True)
  for offset, args in ((mem, (q, k, v, qm, km)),
                       (0, (q, k[:, mem:], v[:, mem:], qm, qm))):
    out, lse = chunked_attention(*args, rule, causal_offset=offset)
    check_forward(out, lse, *args, rule, NO_WINDOW)
    fn = lambda q, k, v, a=args: chunked_attention(q, k, v, a[3], a[4], rule,
                                                   causal_offset=offset)[0]
    ref = lambda q, k, v, a=args: dense_attention(q, k, v, a[3], a[4], rule)[0]
    g = jax.grad(lambda *x: jnp.sum(fn(*x) ** 2), argnums=(0, 1, 2))(*args[:3])
    g_ref = jax.grad(lambda *x: jnp.sum(ref(*x) ** 2), argnums=(0, 1, 2))(*args[:3])
    for a, r in zip(g, g_ref):
      assert rel_err(a, r) < 1e-5, rel_err(a, r)


# ------------------------------------------------------------------------------------------------
# Pallas kernels in interpret mode.
# ------------------------------------------------------------------------------------------------
def run_flash(backend, q, k, v, qm, km, rule, window, interpret=True, jit=False):
  def fn(q, k, v, m):
    return flash.flash_attention(q, k, v, m, scale=q.shape[-1] ** -0.5, kind_sees=rule.kind_sees,
                                 backend=backend, interpret=interpret, **BLOCKS)
  m = kernel_meta(qm, km, rule, window)
  return (jax.jit(fn) if jit else fn)(q, k, v, m)


FLASH_CASES = [  # (case, dtype, hq, hkv, jit): every backend runs each of these in the default run
    ("beacon_memory", jnp.float32, 4, 2, False),
    ("step_expansion", jnp.bfloat16, 2, 2, True),
    ("condense", jnp.bfloat16, 4, 1, False),
    ("focus_local", jnp.float32, 2, 2, True),
]


@pytest.mark.parametrize("name,dtype,hq,hkv,jit", FLASH_CASES)
def test_flash_gpu_forward(name, dtype, hq, hkv, jit):
  q, k, v, qm, km, rule, window = make_case(name, dtype, hq, hkv)
  out, lse = run_flash("gpu", q, k, v, qm, km, rule, window, jit=jit)
  check_forward(out, lse, q, k, v, qm, km, rule, window)


@pytest.mark.parametrize("name,dtype,hq,hkv,jit", FLASH_CASES)
def test_flash_tpu_forward(name, dtype, hq, hkv, jit):
  q, k, v, qm, km, rule, window = make_case(name, dtype, hq, hkv)
  out, lse = run_flash("tpu", q, k, v, qm, km, rule, window, jit=jit)
  check_forward(out, lse, q, k, v, qm, km, rule, window)


def test_flash_tpu_interpret_params():
  """The TPU kernel under ``pltpu.InterpretParams`` (simulated VMEM/SMEM, DMAs)."""
  q, k, v, qm, km, rule, window = make_case("window", jnp.float32, 4, 2)
  out, lse = run_flash("tpu", q, k, v, qm, km, rule, window,
                       interpret=flash.resolve_interpret("tpu", "tpu"))
  check_forward(out, lse, q, k, v, qm, km, rule, window)


def _production_case(dtype, seed=0):
  """Long enough for several 128 x 128 blocks: a sliding window of 100 over 300 tokens (query
  blocks skip the first KV block), row 1 padded from 260, one query of a segment no key has."""
  rng = np.random.default_rng(seed)
  b, t, hq, hkv, d = 2, 300, 4, 2, 64
  order = np.arange(t)[None].repeat(b, 0)
  valid = np.ones((b, t), bool)
  valid[1, 260:] = False
  q_seg = np.zeros((b, t), np.int32)
  q_seg[0, 7] = 5
  qm = TokenMeta.causal(order, valid=valid, segment=q_seg)
  km = TokenMeta.causal(order, valid=valid)
  q = jnp.asarray(rng.standard_normal((b, t, hq, d)), dtype)
  k = jnp.asarray(rng.standard_normal((b, t, hkv, d)), dtype)
  v = jnp.asarray(rng.standard_normal((b, t, hkv, d)), dtype)
  return q, k, v, qm, km, MaskRule(True), 100


@pytest.mark.parametrize("dtype,jit", [(jnp.float32, True), (jnp.bfloat16, False)])
def test_flash_tpu_production_blocks(dtype, jit):
  """The TPU kernel at its production 128 x 128 blocks (the blocks a TPU accepts; the tests above
  use 16 x 16, which only interpret mode allows): padding, GQA, block skipping, traced (jit) and
  host-built block lists."""
  q, k, v, qm, km, rule, window = _production_case(dtype)
  m = kernel_meta(qm, km, rule, window)
  assert flash.block_sizes("tpu", 300, 300) == (128, 128)
  visits = np.asarray(block_visits(pad_kernel_meta(m, 384, 384), 128, 128))
  assert not visits.all(), "the case must skip some KV blocks"
  fn = lambda q, k, v, m: flash.flash_attention(q, k, v, m, scale=q.shape[-1] ** -0.5,
                                                backend="tpu", interpret=True)
  out, lse = (jax.jit(fn) if jit else fn)(q, k, v, m)
  check_forward(out, lse, q, k, v, qm, km, rule, window)


@pytest.mark.parametrize("backend,dtype,hq,hkv,splits", [
    ("gpu", jnp.float32, 8, 2, 3), ("gpu", jnp.bfloat16, 4, 4, 2), ("tpu", jnp.float32, 8, 2, 3)])
def test_decode_forward(backend, dtype, hq, hkv, splits):
  q, k, v, qm, km, rule, window = make_case("decode", dtype, hq, hkv)
  m = kernel_meta(qm, km, rule, window)
  out, lse = decode_lib.decode_attention(q, k, v, m, scale=q.shape[-1] ** -0.5, backend=backend,
                                         interpret=True, num_splits=splits, block_k=16)
  check_forward(out, lse, q, k, v, qm, km, rule, window)


# ------------------------------------------------------------------------------------------------
# Entry point / dispatch.
# ------------------------------------------------------------------------------------------------
def test_dispatch_choices_and_errors(monkeypatch):
  monkeypatch.delenv("LONGJAX_PALLAS_INTERPRET", raising=False)
  monkeypatch.delenv("LONGJAX_PALLAS_BACKEND", raising=False)
  f32 = jnp.float32
  assert explain((1, 48, 4, 32), (1, 128, 2, 32), f32)[0] == "dense"  # one query block
  assert explain((1, 128, 4, 32), (1, 128, 2, 32), f32)[0] == "chunked"
  assert explain((1, 4096, 4, 32), (1, 4096, 2, 32), f32)[0] == "chunked"
  assert explain((1, 4096, 32, 32), (1, 40000, 8, 32), f32)[0] == "blockwise"  # 82M-score block
  assert explain((1, 48, 4, 32), (1, 128, 2, 32), f32, impl="chunked")[0] == "chunked"
  assert explain((1, 128, 4, 32), (1, 128, 2, 32), f32, impl="xla")[0] == "dense"
  with pytest.raises(ValueError, match="interpret"):
    explain((1, 128, 4, 32), (1, 128, 2, 32), f32, impl="pallas")
  with pytest.raises(ValueError, match="unknown attention impl"):
    explain((1, 128, 4, 32), (1, 128, 2, 32), f32, impl="cuda")
  with pytest.raises(ValueError, match="head_dim"):
    explain((1, 128, 4, 24), (1, 128, 2, 24), f32, impl="pallas", interpret=True, backend="gpu")
  assert explain((1, 128, 4, 32), (1, 128, 2, 32), f32, impl="pallas",
                 interpret=True)[0] == "pallas_flash"
  assert explain((1, 2, 4, 32), (1, 999, 2, 32), f32, impl="pallas",
                 interpret=True)[0] == "pallas_decode"
  choice, reason = explain((1, 128, 4, 24), (1, 128, 2, 24), f32, interpret=True, backend="gpu")
  assert choice == "dense" and "fell back" in reason and "head_dim" in reason
  monkeypatch.setenv("LONGJAX_PALLAS_INTERPRET", "1")
  assert explain((1, 128, 4, 32), (1, 128, 2, 32), f32, impl="pallas")[0] == "pallas_flash"


@pytest.mark.parametrize("impl,backend", [("pallas", "gpu"), ("pallas", "tpu"), ("blockwise", None),
                                          ("auto", None)])
def test_entry_point_traced_window_and_meta(impl, backend, monkeypatch):
  """As the decoder calls it: jitted, window and metadata traced; env-var interpret switch."""
  monkeypatch.setenv("LONGJAX_PALLAS_INTERPRET", "1")
  q, k, v, qm, km, rule, window = make_case("window", jnp.float32, 4, 2)

  @jax.jit
  def f(q, k, v, qm, km, window):
    return attention(q, k, v, qm, km, rule, window=window, impl=impl, return_lse=True,
                     pallas_backend=backend)

  out, lse = f(q, k, v, qm, km, jnp.int32(window))
  check_forward(out, lse, q, k, v, qm, km, rule, window)


def test_entry_point_decode_dispatch(monkeypatch):
  monkeypatch.setenv("LONGJAX_PALLAS_INTERPRET", "1")
  q, k, v, qm, km, rule, window = make_case("decode", jnp.bfloat16, 8, 2)
  assert explain(q.shape, k.shape, q.dtype, impl="pallas")[0] == "pallas_decode"
  out, lse = attention(q, k, v, qm, km, rule, impl="pallas", return_lse=True)
  check_forward(out, lse, q, k, v, qm, km, rule, window)


# ------------------------------------------------------------------------------------------------
# Gradients of the kernels (custom VJP) vs the dense reference's.
# ------------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("backend", ["gpu", "tpu"])
@pytest.mark.parametrize("name,hq,hkv", [("beacon_memory", 4, 2), ("step_expansion", 2, 2)])
def test_flash_grads(backend, name, hq, hkv):
  q, k, v, qm, km, rule, window = make_case(name, jnp.float32, hq, hkv)
  fn = lambda q, k, v: run_flash(backend, q, k, v, qm, km, rule, window)
  check_grads(fn, q, k, v, qm, km, rule, window)


@pytest.mark.slow
def test_decode_grads():
  q, k, v, qm, km, rule, window = make_case("decode", jnp.float32, 8, 2)
  m = kernel_meta(qm, km, rule, window)
  fn = lambda q, k, v: decode_lib.decode_attention(q, k, v, m, scale=q.shape[-1] ** -0.5,
                                                   backend="gpu", interpret=True, num_splits=2,
                                                   block_k=16)
  check_grads(fn, q, k, v, qm, km, rule, window)


@pytest.mark.slow
def test_entry_point_grads_under_jit(monkeypatch):
  monkeypatch.setenv("LONGJAX_PALLAS_INTERPRET", "1")
  q, k, v, qm, km, rule, window = make_case("condense", jnp.float32, 4, 2)
  fn = jax.jit(lambda q, k, v: attention(q, k, v, qm, km, rule, impl="pallas", return_lse=True))
  check_grads(fn, q, k, v, qm, km, rule, window)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["focus_local", "decode", "window"])
def test_blockwise_grads_more(name):
  q, k, v, qm, km, rule, window = make_case(name, jnp.float32, 4, 2)
  m = kernel_meta(qm, km, rule, window)
  fn = lambda q, k, v: blockwise_attention(q, k, v, m, scale=q.shape[-1] ** -0.5,
                                           kind_sees=rule.kind_sees, **BLOCKS)
  check_grads(fn, q, k, v, qm, km, rule, window)


@pytest.mark.slow
def test_decoder_with_pallas_matches_xla(monkeypatch):
  """The decoder's real call path: nn.scan over layers (traced per-layer sliding window), remat,
  jit, gradients; impl='pallas' (interpret) vs impl='xla'."""
  monkeypatch.setenv("LONGJAX_PALLAS_INTERPRET", "1")
  from longjax.models.config import ModelConfig
  from longjax.models.decoder import Decoder
  cfg = ModelConfig(family="mistral", vocab_size=50, hidden_size=32, intermediate_size=48,
                    num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
                    sliding_windows=(5, None), remat=True)
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, 50, (2, 37)))
  pos = jnp.broadcast_to(jnp.arange(37)[None], (2, 37))
  params = Decoder(cfg).init(jax.random.PRNGKey(0), tokens, pos)["params"]

  def loss(p, impl):
    logits, _ = Decoder(cfg, impl=impl).apply({"params": p}, tokens, pos)
    return jnp.mean(logits ** 2), logits

  (_, lg1), g1 = jax.jit(jax.value_and_grad(lambda p: loss(p, "xla"), has_aux=True))(params)
  (_, lg2), g2 = jax.jit(jax.value_and_grad(lambda p: loss(p, "pallas"), has_aux=True))(params)
  assert rel_err(lg2, lg1) < 1e-5
  for a, b in zip(jax.tree.leaves(g2), jax.tree.leaves(g1)):
    assert rel_err(a, b) < 1e-4
