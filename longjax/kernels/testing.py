"""Attention test cases shared by ``tests/test_kernels.py`` (CPU, interpret mode) and
``hardware/gpu_check.py`` (on a GPU): the mask layouts longjax runs, random inputs for them, and
the error measures. Kept in the package so that the GPU script need not load a test file by path.
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from longjax.kernels.errors import KernelError
from longjax.kernels.mask import NO_WINDOW, MaskRule, TokenMeta

# Relative error allowed against the fp32 dense reference, per input dtype.
TOL = {jnp.float32: 1e-5, jnp.bfloat16: 1e-2}


# ------------------------------------------------------------------------------------------------
# Cases: the attention shapes longjax runs (see issue 7).
# ------------------------------------------------------------------------------------------------
def _meta(order, valid=None, segment=None, kind=None):
  order = np.asarray(order, np.int32)
  return TokenMeta.causal(order, valid=None if valid is None else np.asarray(valid),
                          segment=None if segment is None else np.asarray(segment, np.int32),
                          kind=None if kind is None else np.asarray(kind, np.int32))


def case_meta(name: str, rng):
  """``(q_meta, k_meta, rule, window, b, tq, tk)`` for one named layout (B=2 unless noted)."""
  if name == "beacon_memory":
    # keys: sink(3) | beacon memory (capacity 24, valid m<=24 per row) | raw cache 13 | window 37
    b, sink, cap, raw, win = 2, 3, 24, 13, 37
    m = np.array([17, 24])
    mem_valid = np.arange(cap)[None] < m[:, None]
    k_order = np.concatenate([np.arange(sink), sink + np.arange(cap), sink + cap + np.arange(raw),
                              sink + cap + raw + np.arange(win)])[None].repeat(b, 0)
    k_valid = np.concatenate(
        [np.ones((b, sink), bool), mem_valid, np.ones((b, raw + win), bool)], 1)
    q_order = k_order[:, -win:]
    q_valid = np.ones((b, win), bool)
    q_valid[1, -2:] = False  # padding at the end of the last window
    q_seg = np.zeros((b, win), np.int32)
    q_seg[0, 5] = 7  # a query with no key of its segment: sees nothing
    k_seg = np.zeros(k_order.shape, np.int32)
    return (_meta(q_order, q_valid, q_seg), _meta(k_order, k_valid, k_seg), MaskRule(True),
            NO_WINDOW, b, win, k_order.shape[1])
  if name == "step_expansion":
    # append mode: window = raw tokens (kind 0) then beacons (kind 1); memory keys in front.
    b, mem, raw, ratio = 2, 11, 40, 8
    nb = raw // ratio
    win_order = np.concatenate([mem + np.arange(raw), mem + (np.arange(nb) + 1) * ratio - 1])
    win_kind = np.concatenate([np.zeros(raw), np.ones(nb)]).astype(np.int32)
    k_order = np.concatenate([np.arange(mem), win_order])[None].repeat(b, 0)
    k_kind = np.concatenate([np.zeros(mem, np.int32), win_kind])[None].repeat(b, 0)
    q_order = win_order[None].repeat(b, 0).copy()
    q_order[0, 0] = -1  # sees nothing (no key has order <= -1)
    q_kind = win_kind[None].repeat(b, 0)
    rule = MaskRule(True, kind_sees=(0b01, 0b11))
    return (_meta(q_order, kind=q_kind), _meta(k_order, kind=k_kind), rule, NO_WINDOW, b,
            q_order.shape[1], k_order.shape[1])
  if name == "condense":
    # FocusLLM chunk condensing: 3 chunks of capacity 45, causal, each with its own valid length.
    b, t = 3, 45
    lens = np.array([45, 30, 7])
    valid = np.arange(t)[None] < lens[:, None]
    order = np.arange(t)[None].repeat(b, 0)
    return _meta(order, valid), _meta(order, valid), MaskRule(True), NO_WINDOW, b, t, t
  if name == "focus_local":
    # C candidate keys in front (visible to every local token) + causal over the local tokens.
    b, c, loc = 2, 19, 35
    k_order = np.concatenate([np.full(c, -1), np.arange(loc)])[None].repeat(b, 0)
    k_valid = np.ones(k_order.shape, bool)
    k_valid[1, 15:c] = False  # second row has only 15 candidates
    q_order = np.arange(loc)[None].repeat(b, 0)
    q_valid = np.ones((b, loc), bool)
    q_valid[0, 3] = False
    return (_meta(q_order, q_valid), _meta(k_order, k_valid), MaskRule(True), NO_WINDOW, b, loc,
            k_order.shape[1])
  if name == "window":
    # Mistral-style sliding window (a traced scalar in the decoder); padded tail in row 1.
    b, t = 2, 53
    order = np.arange(t)[None].repeat(b, 0)
    valid = np.ones((b, t), bool)
    valid[1, 40:] = False
    return _meta(order, valid), _meta(order, valid), MaskRule(True), 9, b, t, t
  if name == "noncausal_segments":
    b, tq, tk = 2, 29, 41
    q_seg = rng.integers(0, 3, (b, tq))
    k_seg = rng.integers(0, 2, (b, tk))  # segment 2 queries see nothing
    return (_meta(np.zeros((b, tq)), segment=q_seg), _meta(np.zeros((b, tk)), segment=k_seg),
            MaskRule(False), NO_WINDOW, b, tq, tk)
  if name == "decode":
    # 2 query tokens against a long-ish cache with a per-row valid length.
    b, tk = 2, 150
    lens = np.array([150, 61])
    k_valid = np.arange(tk)[None] < lens[:, None]
    k_order = np.arange(tk)[None].repeat(b, 0)
    q_order = np.stack([lens, lens + 1], 1)
    q_valid = np.array([[True, True], [True, False]])
    q_seg = np.array([[0, 3], [0, 0]])  # (0, 1) sees nothing
    return (_meta(q_order, q_valid, q_seg), _meta(k_order, k_valid), MaskRule(True), NO_WINDOW, b,
            2, tk)
  raise KernelError(f"no attention test case {name!r}")


def make_case(name, dtype=jnp.float32, hq=4, hkv=2, d=32, seed=0):
  rng = np.random.default_rng(seed)
  qm, km, rule, window, b, tq, tk = case_meta(name, rng)
  q = jnp.asarray(rng.standard_normal((b, tq, hq, d)), dtype)
  k = jnp.asarray(rng.standard_normal((b, tk, hkv, d)), dtype)
  v = jnp.asarray(rng.standard_normal((b, tk, hkv, d)), dtype)
  return q, k, v, qm, km, rule, window


def rel_err(x, ref):
  x, ref = np.asarray(x, np.float32), np.asarray(ref, np.float32)
  return float(np.max(np.abs(x - ref)) / max(np.max(np.abs(ref)), 1e-30))


def grad_loss(fn, q, k, v):
  """A scalar of an attention ``fn(q, k, v) -> (out, lse)`` whose gradient reaches every output
  element with a different weight (and the finite log-sum-exps)."""
  out, lse = fn(q, k, v)
  w = jnp.cos(jnp.arange(out.size, dtype=jnp.float32).reshape(out.shape))
  return (jnp.sum(out.astype(jnp.float32) * w)
          + 0.1 * jnp.sum(jnp.where(jnp.isfinite(lse), lse, 0.0)))
