"""Teacher forcing through a method's device plan: the decode loop of ``longjax.generate`` fed
given tokens instead of samples, each token scored by the logits before it. It is how FocusLLM's
protocol scores held-out text (``inference_ppl_forward``: prefill on the context, then one decode
step per held-out token, every step re-reading the chunks), one device loop per plan segment."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from longjax.inference.decode_loop import (DevicePlan, DevicePlanError, check_covered,
                                           check_segment, step_params)
from longjax.models.head import token_nll


def _forced(params, carry, nll, xs, first, targets, start, stop, *, step):
  """Feed ``targets[:, f]`` for feeds ``f in [start, stop)``; ``nll[:, f + 1]`` gets the NLL of
  ``targets[:, f + 1]`` under the logits that feed returns."""
  def body(f, c):
    carry, nll = c
    x = jax.tree.map(lambda a: jax.lax.dynamic_index_in_dim(a, f - first, keepdims=False), xs)
    tok = jax.lax.dynamic_index_in_dim(targets, f, axis=1, keepdims=False)
    logits, carry = step(params, carry, x, tok)
    nxt = jax.lax.dynamic_index_in_dim(targets, f + 1, axis=1, keepdims=True)
    col = token_nll(logits.astype(jnp.float32)[:, None], nxt)
    return carry, jax.lax.dynamic_update_slice_in_dim(nll, col, f + 1, axis=1)

  return jax.lax.fori_loop(start, stop, body, (carry, nll))


# The plan's carry and the NLL buffer are donated: the method's caches are updated in place.
_forced_jit = jax.jit(_forced, static_argnames=("step",), donate_argnums=(1, 2))


def teacher_forced_nll(plan: DevicePlan, params, logits, targets) -> np.ndarray:
  """``[B, n]`` NLL of ``targets [B, n]``: token 0 under the prefill ``logits [B, V]``, token
  ``t`` under the logits after feeding ``targets[:, :t]`` through the plan's steps (``n - 1``
  feeds; the plan is the method's ``device_plan(state, n - 1)``). Equal to a host loop of the
  method's ``step`` calls (tests/test_generate_device.py)."""
  targets = np.asarray(targets, np.int32)
  if targets.ndim != 2 or targets.shape[0] != logits.shape[0] or targets.shape[1] < 1:
    raise DevicePlanError(f"teacher forcing takes targets [B, n >= 1] for {logits.shape[0]} rows, "
                          f"got shape {targets.shape}")
  n_feeds = targets.shape[1] - 1
  dev_targets = jnp.asarray(targets)
  nll = jnp.zeros(targets.shape, jnp.float32).at[:, :1].set(
      token_nll(jnp.asarray(logits, jnp.float32)[:, None], dev_targets[:, :1]))
  carry, end = plan.carry, 0
  for g in plan.segments:  # may be a generator: drawn as the feeds reach it
    check_segment(g, end, n_feeds)
    xs = None if g.xs is None else jax.device_put(g.xs)
    carry, nll = _forced_jit(step_params(g.step, params), carry, nll, xs, np.int32(g.first),
                             dev_targets, np.int32(end), np.int32(g.end), step=g.step)
    end = g.end
    if end == n_feeds:
      break
  check_covered(end, n_feeds)
  return np.asarray(nll)
