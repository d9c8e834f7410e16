"""Activation Beacon training path: one jitted, bucketed window scan whose memory under jax.grad
grows by a small per-window residual (not by a window's activations), a frozen base, and the same
loss / gradients as the prefill path. Tiny random model; no timing assertions."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from test_beacon import BCFG, _ids, tiny_cfg, tiny_params

from longjax.beacon import BeaconLM, RowState
from longjax.beacon.model import frozen_base
from longjax.beacon.step import loss_terms

W = BCFG.window


@pytest.fixture(scope="module")
def model():
  cfg = tiny_cfg(num_layers=4)
  return cfg, tiny_params(cfg)


def _loss_terms(lm, params, plan):
  """The training loss of a plan (the LM head frozen, as in the training task)."""
  return loss_terms(params, plan, model=lm.model, sink_cap=lm.sink_cap, frozen_head=True)


def _grad_temp_bytes(lm, params, n_windows):
  ids = _ids(W * n_windows, 3)
  plan = lm.schedule.plan(ids, ids)
  f = lambda p: (lambda ls, lc: ls.sum() / lc.sum())(*_loss_terms(lm, frozen_base(p), plan))  # noqa: E731
  return jax.jit(jax.grad(f)).lower(params).compile().memory_analysis().temp_size_in_bytes, plan


def test_grad_memory_grows_by_a_small_residual_per_window(model):
  """Compiled temporaries of the jitted gradient: each extra window adds about its KV carry,
  layer inputs and memory slices (remat), several times less than without remat, where every
  window's activations stay alive until the backward pass."""
  cfg, params = model
  lo, hi = 4, 12
  lm = BeaconLM(cfg, BCFG, max_length=W * 16, training=True)
  a, _ = _grad_temp_bytes(lm, params, lo)
  b, plan = _grad_temp_bytes(lm, params, hi)
  per_window = (b - a) / (hi - lo)
  # The bucketed scan: the attention reads memory buckets smaller than the buffer.
  assert len(plan.segments) >= 1 and max(s[1] for s in plan.segments) <= plan.capacity
  assert plan.capacity < lm.capacity  # the buffer is sized to the input, not max_length
  q, m = plan.tokens.shape[-1], max(s[1] for s in plan.segments)
  kv = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * 4  # bytes per (k, v) entry
  estimate = kv * (plan.capacity + m) + cfg.num_layers * q * cfg.hidden_size * 4
  assert per_window <= 1.5 * estimate, (per_window, estimate)
  plain = BeaconLM(cfg, BCFG, max_length=W * 16, training=True, remat=False)
  pa, _ = _grad_temp_bytes(plain, params, lo)
  pb, _ = _grad_temp_bytes(plain, params, hi)
  assert per_window < 0.35 * (pb - pa) / (hi - lo), (per_window, (pb - pa) / (hi - lo))


def test_loss_equals_prefill_path_and_freezes_the_base(model):
  """``loss`` (one jitted scan, labelled slots only, frozen-head CE gradient) equals the prefill
  path's loss and beacon gradients; the base gets a zero gradient in training mode."""
  cfg, params = model
  lm = BeaconLM(cfg, BCFG, max_length=W * 8, training=True)
  ids = _ids(W * 5 + 7, 4)
  labels = np.where(np.arange(ids.size) % 3 == 0, ids, -100)
  ref = lambda p: lm.forward(p, ids, labels=labels, training=True).loss  # noqa: E731
  loss, g = jax.value_and_grad(lambda p: lm.loss(p, ids, labels))(params)
  np.testing.assert_allclose(float(loss), float(ref(params)), rtol=1e-6)
  g_ref = jax.grad(ref)(params)
  for name in ("alt_q_proj", "alt_k_proj", "alt_v_proj"):
    np.testing.assert_allclose(g["layers"]["attn"][name]["kernel"],
                               g_ref["layers"]["attn"][name]["kernel"], rtol=1e-4, atol=1e-7)
  np.testing.assert_allclose(g["alt_embedding"], g_ref["alt_embedding"], rtol=1e-4, atol=1e-7)
  assert float(jnp.max(jnp.abs(g["layers"]["mlp"]["up_proj"]["kernel"]))) == 0.0
  assert float(jnp.max(jnp.abs(g["embedding"]))) == 0.0


def test_remat_dots_same_gradient_more_kept(model):
  """``remat="dots"`` keeps the matmul outputs (no matmul recomputed in the backward pass): the
  same loss and beacon gradients as ``remat=True``, with more compiled temporaries; an unknown
  mode is refused by the model config."""
  cfg, params = model
  ids = _ids(W * 3 + 5, 6)
  out = {}
  for mode in (True, "dots"):
    lm = BeaconLM(cfg, BCFG, max_length=W * 4, training=True, remat=mode)
    out[mode] = jax.value_and_grad(lambda p: lm.loss(p, ids))(params)
    out[mode, "temp"] = _grad_temp_bytes(lm, params, 3)[0]
  np.testing.assert_allclose(float(out["dots"][0]), float(out[True][0]), rtol=1e-6)
  for name in ("alt_q_proj", "alt_k_proj", "alt_v_proj"):
    np.testing.assert_allclose(out["dots"][1]["layers"]["attn"][name]["kernel"],
                               out[True][1]["layers"]["attn"][name]["kernel"], rtol=1e-4, atol=1e-7)
  assert out["dots", "temp"] > out[True, "temp"], (out["dots", "temp"], out[True, "temp"])
  from longjax.models.config import ModelConfigError
  with pytest.raises(ModelConfigError, match="remat must be one of"):
    cfg.replace(remat="dot")


def test_plan_padding_and_seeded_rows(model):
  """No-op padding steps (``steps_multiple``) and a seeded ratio RNG change nothing but shapes;
  only labelled slots get logits."""
  cfg, params = model
  lm = BeaconLM(cfg, BCFG.replace(ratios=(2, 4), ratio_mix="step-random"), max_length=W * 8,
                training=True)
  ids = _ids(W * 4 + 5, 5)  # 5 calls
  rows = [RowState.seeded(np.random.default_rng(7))]
  a = lm.schedule.plan(ids, ids, rows=rows)
  b = lm.schedule.plan(ids, ids, rows=rows, steps_multiple=4)
  assert b.n_steps % 4 == 0 and b.n_steps > a.n_steps and not b.guard
  assert a.labels.shape[-1] < a.tokens.shape[-1]  # beacon slots have no label: no logits
  la = jnp.sum(_loss_terms(lm, params, a)[0])
  lb = jnp.sum(_loss_terms(lm, params, b)[0])
  np.testing.assert_allclose(float(la), float(lb), rtol=1e-6)
  with pytest.raises(ValueError, match="empty memory"):
    lm.schedule.plan(ids, rows=[RowState(fed=3)])


def test_bf16_training_gradient_traces():
  """The real configs train in bf16 (configs/beacon_qwen2.py): the frozen-head NLL's custom JVP
  must give an fp32 tangent for its fp32 NLL whatever the hidden dtype (it gave bf16 and the
  Qwen2-7B training step failed to trace; found by the compile-only TPU report)."""
  cfg = tiny_cfg(dtype="bfloat16", param_dtype="bfloat16")
  params = jax.eval_shape(lambda: tiny_params(cfg))
  lm = BeaconLM(cfg, BCFG, max_length=W * 4, training=True)
  ids = _ids(W * 3, 3)
  plan = lm.schedule.plan(ids, ids)
  f = lambda p: (lambda ls, lc: ls.sum() / lc.sum())(*_loss_terms(lm, frozen_base(p), plan))  # noqa: E731
  grads = jax.eval_shape(jax.grad(f), params)
  assert grads["layers"]["attn"]["alt_q_proj"]["kernel"].dtype == jnp.bfloat16
