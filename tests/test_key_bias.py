"""Key score biases (``TokenMeta.bias``): every attention path (dense, chunked, blockwise, the
Pallas flash and decode kernels in interpret mode) against an explicit softmax, values and
gradients; and FocusLLM's local forward with a bias on its candidates (zero: the official method;
very negative: the candidate left out)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from longjax.kernels import attention
from longjax.kernels.chunked import chunked_attention
from longjax.kernels.mask import TokenMeta
from longjax.kernels.reference import dense_attention


def _case(seed=0, b=2, tq=150, tk=190, hq=6, hkv=2, d=16):
  r = np.random.default_rng(seed)
  q, k, v = (jnp.asarray(r.normal(size=s), jnp.float32)
             for s in ((b, tq, hq, d), (b, tk, hkv, d), (b, tk, hkv, d)))
  q_order = jnp.broadcast_to(jnp.arange(tq) + (tk - tq), (b, tq))
  k_order = jnp.broadcast_to(jnp.arange(tk), (b, tk))
  valid = jnp.asarray(r.random((b, tk)) > 0.1)
  bias = jnp.asarray(r.normal(size=(b, tk)) * 3, jnp.float32)
  return q, k, v, TokenMeta.causal(q_order), TokenMeta.causal(k_order, valid=valid, bias=bias)


def _explicit(q, k, v, qm, km):
  """Softmax over the whole ``[B, Hq, Tq, Tk]`` score matrix, keys repeated per query head."""
  g = q.shape[2] // k.shape[2]
  kr, vr = jnp.repeat(k, g, axis=2), jnp.repeat(v, g, axis=2)
  s = jnp.einsum("bqhd,bkhd->bhqk", q, kr) * q.shape[-1] ** -0.5 + km.bias[:, None, None, :]
  ok = (km.order[:, None, None, :] <= qm.order[:, None, :, None]) & km.valid[:, None, None, :]
  return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(jnp.where(ok, s, -jnp.inf), -1), vr)


def _check_gradients(fn, q, k, v, qm, km):
  """d/d (q, k, v, bias) of a loss on ``fn``'s output against the explicit softmax's; returns
  ``fn``'s gradients."""
  def loss(f, q, k, v, bias):
    meta = TokenMeta.causal(km.order, valid=km.valid, bias=bias)
    return jnp.sum(jnp.sin(f(q, k, v, qm, meta)))

  got = jax.grad(lambda *a: loss(fn, *a), argnums=(0, 1, 2, 3))(q, k, v, km.bias)
  want = jax.grad(lambda *a: loss(_explicit, *a), argnums=(0, 1, 2, 3))(q, k, v, km.bias)
  for g, w in zip(got, want):
    np.testing.assert_allclose(g, w, atol=5e-5, rtol=5e-4)
  return got


@pytest.mark.parametrize("path", ["dense", "chunked", "chunked_tiled", "auto"])
def test_biased_scores_match_an_explicit_softmax(path):
  q, k, v, qm, km = _case()
  run = dict(dense=lambda *a: dense_attention(*a)[0],
             chunked=lambda *a: chunked_attention(*a)[0],
             chunked_tiled=lambda *a: chunked_attention(*a, block_q=32, block_k=64)[0],
             auto=lambda *a: attention(*a))[path]
  want = _explicit(q, k, v, qm, km)
  np.testing.assert_allclose(run(q, k, v, qm, km), want, atol=2e-5, rtol=2e-5)
  # the bias matters: without it the output moves far beyond the tolerance
  plain = TokenMeta.causal(km.order, valid=km.valid)
  assert float(jnp.max(jnp.abs(run(q, k, v, qm, plain) - want))) > 1e-2


@pytest.mark.parametrize("path", ["dense", "chunked_tiled"])
def test_biased_gradients_match_an_explicit_softmax(path):
  q, k, v, qm, km = _case(seed=1, tq=70, tk=90)
  fn = dict(dense=lambda *a: dense_attention(*a)[0],
            chunked_tiled=lambda *a: chunked_attention(*a, block_q=32, block_k=32)[0])[path]

  _check_gradients(fn, q, k, v, qm, km)


def test_bias_survives_concatenation_and_unbiased_keys_read_zero():
  a = TokenMeta.causal(jnp.zeros((1, 2), jnp.int32), bias=jnp.array([[1.0, -2.0]]))
  b = TokenMeta.causal(jnp.zeros((1, 3), jnp.int32))
  np.testing.assert_array_equal(a.concat(b).bias, [[1.0, -2.0, 0.0, 0.0, 0.0]])
  np.testing.assert_array_equal(b.concat(a).bias, [[0.0, 0.0, 0.0, 1.0, -2.0]])
  assert b.concat(b).bias is None


def _kernel_path(path):
  """``fn(q, k, v, qm, km) -> out`` through the kernel form of the mask (``KernelMeta.k_bias``):
  the blockwise jnp path, the Pallas GPU / TPU flash kernels and the decode kernel (interpret
  mode), with 16-wide blocks so that several blocks, padding and block skipping are exercised."""
  from longjax.kernels import decode as decode_lib
  from longjax.kernels import flash
  from longjax.kernels.blockwise import blockwise_attention
  from longjax.kernels.mask import MaskRule, kernel_meta

  def fn(q, k, v, qm, km):
    m = kernel_meta(qm, km, MaskRule(True))
    scale = q.shape[-1] ** -0.5
    if path == "blockwise":
      return blockwise_attention(q, k, v, m, scale=scale, block_q=16, block_k=16)[0]
    if path == "decode":
      return decode_lib.decode_attention(q, k, v, m, scale=scale, backend="gpu", interpret=True,
                                         num_splits=2, block_k=16)[0]
    return flash.flash_attention(q, k, v, m, scale=scale, backend=path.split("_")[1],
                                 interpret=True, block_q=16, block_k=16)[0]
  return fn


KERNEL_PATHS = ["blockwise", "pallas_gpu", "pallas_tpu", "decode"]


@pytest.mark.parametrize("path", KERNEL_PATHS)
def test_kernel_paths_add_the_bias(path):
  """Values and gradients (d/d q, k, v and the bias) against the explicit softmax."""
  tq = 2 if path == "decode" else 37
  q, k, v, qm, km = _case(seed=2, b=2, tq=tq, tk=53, hq=4, hkv=2)
  fn = _kernel_path(path)
  want = _explicit(q, k, v, qm, km)
  np.testing.assert_allclose(fn(q, k, v, qm, km), want, atol=2e-5, rtol=2e-5)
  plain = TokenMeta.causal(km.order, valid=km.valid)
  assert float(jnp.max(jnp.abs(fn(q, k, v, qm, plain) - want))) > 1e-2

  got = _check_gradients(fn, q, k, v, qm, km)
  assert float(jnp.max(jnp.abs(got[3]))) > 1e-3  # the bias gradient is not left at zero


@pytest.mark.parametrize("impl", ["blockwise", "pallas"])
def test_every_impl_takes_a_biased_call(impl, monkeypatch):
  """``attention`` no longer routes biased calls away: an explicit impl runs with the bias."""
  monkeypatch.setenv("LONGJAX_PALLAS_INTERPRET", "1")
  q, k, v, qm, km = _case(tq=8, tk=16)
  np.testing.assert_allclose(attention(q, k, v, qm, km, impl=impl), _explicit(q, k, v, qm, km),
                             atol=2e-5, rtol=2e-5)


def test_focus_candidate_bias_weighs_candidates_without_changing_the_method_at_zero():
  """FocusLLM's local forward: a zero bias is the official method, a very negative bias on a
  candidate equals leaving it out (invalid), and a moderate one changes the logits."""
  from focus_helpers import prompt, tiny_focus, tiny_model
  from longjax.focus import FocusLLM
  from longjax.focus import condense as C

  cfg, params = tiny_model()
  fm = FocusLLM(cfg, tiny_focus(), bucket=16)
  row = fm.plan(prompt(100, 0))
  cb, lb, cap = fm._pack([row], 0)
  ck, cv, _, _ = fm._condense(params, cb, cap)
  valid = np.asarray(cb.cand_valid)
  assert valid.sum() >= 3

  def logits(valid, bias=None):
    return np.asarray(C.local_next_logits(fm.model, params, ck, cv, cb.gather, valid, lb.tokens,
                                          lb.lengths, lb.n_chunks, cand_bias=bias))

  official = logits(valid)
  np.testing.assert_array_equal(logits(valid, np.zeros(valid.shape, np.float32)), official)
  drop = np.zeros(valid.shape, np.float32)
  drop[0, 1] = -1e9
  without = valid.copy()
  without[0, 1] = False
  np.testing.assert_allclose(logits(valid, drop), logits(without), atol=1e-4, rtol=1e-4)
  half = np.where(valid, np.float32(-2.0), np.float32(0.0))
  assert np.max(np.abs(logits(valid, half) - official)) > 1e-3
