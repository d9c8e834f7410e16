"""The decode paths of the decoder against its general form: ``Decoder(layer_loop="unrolled")``
(the CPU decode loops' layout, per-layer weights) against the stacked ``nn.scan`` decoder (same
logits and KV, with a memory prefix, per-layer sliding windows and alternative projections; the
per-layer copy made once per parameter tree; decode loops through either layout give the same
tokens), and a memory prefix's RoPE tables gathered from one table (``KVPrefix.position_bound``)
against the tables of its positions."""
from __future__ import annotations

import gc

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import longjax
from longjax.kernels import TokenMeta
from longjax.models import decoder as D
from longjax.models.config import ModelConfig, ModelConfigError
from longjax.plain import PlainLM

CFG = ModelConfig(vocab_size=96, hidden_size=32, intermediate_size=48, num_layers=3, num_heads=4,
                  num_kv_heads=2, head_dim=8, attention_bias=True, sliding_windows=(None, 6, None),
                  alt_projections=("q", "k", "v", "o"), num_alt_embeddings=1)


def _call(layer_loop, params, with_memory):
  rng = np.random.default_rng(0)
  b, t, m = 2, 5, 9
  tokens = jnp.asarray(rng.integers(3, CFG.vocab_size, (b, t)), jnp.int32)
  positions = m + jnp.arange(t)[None].repeat(b, 0)
  alt = jnp.asarray([[1, 7], [0, 3]], jnp.int32)  # slot indices; 7 >= T is padding
  memory = None
  if with_memory:
    shape = (CFG.num_layers, b, m, CFG.num_kv_heads, CFG.head_dim)
    k = jnp.asarray(rng.standard_normal(shape), jnp.float32)
    v = jnp.asarray(rng.standard_normal(shape), jnp.float32)
    pos = jnp.arange(m)[None].repeat(b, 0)
    valid = jnp.asarray(np.arange(m)[None] < np.array([[m], [m - 3]]))
    memory = D.KVPrefix(k, v, pos, TokenMeta.causal(pos, valid=valid))
  model = D.Decoder(CFG, layer_loop=layer_loop)
  return model.apply({"params": model.prepare_params(params)}, tokens, positions, alt=alt,
                     memory=memory)


@pytest.mark.parametrize("with_memory", [False, True])
def test_unrolled_layers_equal_the_scan(with_memory):
  params = D.init_params(CFG, 3)
  logits_s, (k_s, v_s) = _call("scan", params, with_memory)
  logits_u, (k_u, v_u) = _call("unrolled", params, with_memory)
  assert k_u.shape == k_s.shape == (CFG.num_layers, 2, 5, CFG.num_kv_heads, CFG.head_dim)
  np.testing.assert_allclose(logits_u, logits_s, atol=1e-5, rtol=0)
  np.testing.assert_allclose(k_u, k_s, atol=1e-6, rtol=0)
  np.testing.assert_allclose(v_u, v_s, atol=1e-6, rtol=0)
  # the per-layer windows and weights are really per layer: running every layer with layer 0's
  # parameters must change the result (otherwise this test could not fail on a wrong index)
  p0 = dict(D.unstack_layers(params))
  for i in range(1, CFG.num_layers):
    p0[f"layers_{i}"] = p0["layers_0"]
  model = D.Decoder(CFG, layer_loop="unrolled")
  tokens = jnp.ones((1, 4), jnp.int32) * 5
  wrong = model.apply({"params": p0}, tokens, jnp.arange(4)[None])[0]
  right = model.apply({"params": model.prepare_params(params)}, tokens, jnp.arange(4)[None])[0]
  assert np.abs(np.asarray(wrong) - np.asarray(right)).max() > 1e-3


def test_unstacked_copy_is_made_once_per_parameter_tree():
  params = jax.tree.map(jnp.array, D.init_params(CFG, 1))
  a = D.unstack_layers(params)
  assert D.unstack_layers(params) is a  # a second generation does not copy the weights again
  assert D.unstack_layers(a) is a  # already unstacked
  assert sorted(k for k in a if k.startswith("layers")) == ["layers_0", "layers_1", "layers_2"]
  np.testing.assert_array_equal(a["layers_2"]["mlp"]["up_proj"]["kernel"],
                                params["layers"]["mlp"]["up_proj"]["kernel"][2])
  n = len(D._UNSTACKED)
  del params, a
  gc.collect()
  assert len(D._UNSTACKED) == n - 1  # dropped with the parameters it was made from
  # numpy leaves may change in place: never kept, so a changed weight is always seen
  host = jax.tree.map(np.array, D.init_params(CFG, 1))
  first = np.array(D.unstack_layers(host)["layers_2"]["mlp"]["up_proj"]["kernel"])
  host["layers"]["mlp"]["up_proj"]["kernel"][2] += 1.0
  second = D.unstack_layers(host)
  assert len(D._UNSTACKED) == n - 1
  np.testing.assert_array_equal(np.asarray(second["layers_2"]["mlp"]["up_proj"]["kernel"]),
                                first + 1.0)


def test_decode_decoder_choice_and_bad_layer_loop(monkeypatch):
  model = D.Decoder(CFG)
  assert D.decode_decoder(model).layer_loop == ("unrolled" if jax.default_backend() == "cpu"
                                                else "scan")
  monkeypatch.setattr(D, "UNROLL_MAX_LAYER_BYTES", 0)  # a model too large to copy: the scan
  assert D.decode_decoder(model).layer_loop == "scan"
  with pytest.raises(ModelConfigError, match="layer_loop must be one of"):
    D.Decoder(CFG, layer_loop="python").apply({"params": D.init_params(CFG)},
                                               jnp.ones((1, 2), jnp.int32), jnp.arange(2)[None])


def test_device_loop_tokens_equal_in_both_layouts(monkeypatch):
  cfg = ModelConfig(vocab_size=96, hidden_size=32, intermediate_size=48, num_layers=2,
                    num_heads=4, num_kv_heads=2, head_dim=8)
  params = D.init_params(cfg, 5)
  prompts = [np.random.default_rng(1).integers(3, 96, 11).tolist()]
  unrolled = longjax.generate(PlainLM(cfg), params, prompts, max_new_tokens=9, loop="device",
                              return_logits=True)
  monkeypatch.setattr(D, "UNROLL_MAX_LAYER_BYTES", 0)
  scan = longjax.generate(PlainLM(cfg), params, prompts, max_new_tokens=9, loop="device",
                          return_logits=True)
  assert unrolled.tokens == scan.tokens
  np.testing.assert_allclose(unrolled.logits[0], scan.logits[0], atol=1e-5, rtol=0)


@pytest.mark.parametrize("rope_scaling", [None, (("factor", 2.0), ("rope_type", "dynamic"))])
def test_memory_rope_from_one_table_equals_per_position_tables(rope_scaling):
  import dataclasses
  cfg = dataclasses.replace(CFG, rope_scaling=rope_scaling, max_position_embeddings=8)
  params = D.init_params(cfg, 2)
  rng = np.random.default_rng(4)
  b, m, t = 2, 11, 3
  shape = (cfg.num_layers, b, m, cfg.num_kv_heads, cfg.head_dim)
  k = jnp.asarray(rng.standard_normal(shape), jnp.float32)
  v = jnp.asarray(rng.standard_normal(shape), jnp.float32)
  j = np.arange(m)[None].repeat(b, 0)
  # a beacon-like layout: a sink of 2 slots, row 1 with one sink entry (later positions shift)
  pos = jnp.asarray(np.where(j < 2, j, np.array([[2], [1]]) + j - 2), jnp.int32)
  valid = jnp.asarray(~((j == 1) & (np.arange(b)[:, None] == 1)))
  meta = TokenMeta.causal(pos, valid=valid)
  tokens = jnp.asarray(rng.integers(3, cfg.vocab_size, (b, t)), jnp.int32)
  positions = jnp.asarray([[m, m + 1, m + 2], [m - 1, m, m + 1]], jnp.int32)
  model = D.Decoder(cfg)
  run = lambda mem: np.asarray(jax.jit(lambda p: model.apply(  # noqa: E731
      {"params": p}, tokens, positions, memory=mem)[0])(params))
  per_position = run(D.KVPrefix(k, v, pos, meta))
  one_table = run(D.KVPrefix(k, v, pos, meta, position_bound=m))
  np.testing.assert_allclose(one_table, per_position, atol=1e-5, rtol=0)
  # the positions matter (a table indexed wrongly would show): all-zero positions move the logits
  zero = run(D.KVPrefix(k, v, jnp.zeros_like(pos), meta, position_bound=m))
  assert np.abs(zero - per_position).max() > 1e-3


@pytest.mark.parametrize("layer_loop", D.LAYER_LOOPS)
def test_mlp_row_blocks_match_one_block(monkeypatch, layer_loop):
  """The MLP run in row blocks (CPU, long calls; a partial last block, two rows of a batch) gives
  the one-block MLP's logits and gradients."""
  params = D.init_params(CFG, seed=1)
  model = D.Decoder(CFG, rule=D.CAUSAL_PREFILL, layer_loop=layer_loop)
  rng = np.random.default_rng(3)
  tokens = jnp.asarray(rng.integers(3, CFG.vocab_size, (2, 45)), jnp.int32)
  positions = jnp.arange(45)[None].repeat(2, 0)
  assert D.mlp_row_blocks(tokens.size) is None  # the default threshold: one block here

  def loss(p):
    logits, _ = model.apply({"params": model.prepare_params(p)}, tokens, positions,
                            q_meta=TokenMeta.causal(positions))
    return jnp.sum(jax.nn.log_softmax(logits) * jax.nn.softmax(logits * 0.5)), logits

  (ref, ref_logits), ref_grads = jax.value_and_grad(loss, has_aux=True)(params)
  monkeypatch.setattr(D, "MLP_BLOCKED_MIN_ROWS", 16)
  monkeypatch.setattr(D, "MLP_ROW_BLOCK", 32)  # 2 rows x 45 tokens: blocks of 16 tokens, 3 padding
  assert D.mlp_row_blocks(tokens.size) == 32
  (out, logits), grads = jax.value_and_grad(loss, has_aux=True)(params)
  np.testing.assert_allclose(np.asarray(logits), np.asarray(ref_logits), rtol=1e-5, atol=1e-5)
  for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("layer_loop", D.LAYER_LOOPS)
@pytest.mark.parametrize("alt_kind", ["slots", "mask"])
@pytest.mark.parametrize("with_memory", [False, True])
def test_head_rows_last_layer_equals_the_full_call(layer_loop, alt_kind, with_memory):
  """With ``head_rows`` the last layer computes only those rows' outputs: their logits / hidden
  states and every token's keys and values equal the full call's (rows with and without the
  alternative projections, a repeated row, and R = 0: keys and values only), with gradients."""
  params = D.init_params(CFG, 3)
  model = D.Decoder(CFG, rule=D.CAUSAL_PREFILL, layer_loop=layer_loop)
  p = model.prepare_params(params)
  rng = np.random.default_rng(5)
  b, t, m = 2, 7, 4
  tokens = jnp.asarray(rng.integers(3, CFG.vocab_size, (b, t)), jnp.int32)
  positions = m + jnp.arange(t)[None].repeat(b, 0)
  slots = jnp.asarray([[1, 6], [0, 9]], jnp.int32)  # 9 >= T: padding
  alt = slots if alt_kind == "slots" else jnp.zeros((b, t), bool).at[[0, 0, 1], [1, 6, 0]].set(True)
  memory = None
  if with_memory:
    shape = (CFG.num_layers, b, m, CFG.num_kv_heads, CFG.head_dim)
    pos = jnp.arange(m)[None].repeat(b, 0)
    memory = D.KVPrefix(jnp.asarray(rng.standard_normal(shape), jnp.float32),
                        jnp.asarray(rng.standard_normal(shape), jnp.float32), pos,
                        TokenMeta.causal(pos, valid=jnp.asarray([[True] * m, [True, False] * 2])))
  rows = jnp.asarray([[6, 1, 3], [0, 2, 2]], jnp.int32)
  run = lambda p, **kw: model.apply({"params": p}, tokens, positions, alt=alt, memory=memory,
                                    q_meta=TokenMeta.causal(positions), **kw)
  full, (k, v) = run(p)
  part, (k_r, v_r) = run(p, head_rows=rows)
  want = np.take_along_axis(np.asarray(full), np.asarray(rows)[..., None], axis=1)
  np.testing.assert_allclose(np.asarray(part), want, atol=1e-5, rtol=0)
  np.testing.assert_allclose(np.asarray(k_r), np.asarray(k), atol=1e-6, rtol=0)
  np.testing.assert_allclose(np.asarray(v_r), np.asarray(v), atol=1e-6, rtol=0)
  hidden, _ = run(p, head=False)
  hidden_r, _ = run(p, head=False, head_rows=rows)
  np.testing.assert_allclose(np.asarray(hidden_r),
                             np.take_along_axis(np.asarray(hidden), np.asarray(rows)[..., None], 1),
                             atol=1e-5, rtol=0)
  none, (k0, v0) = run(p, head=False, head_rows=jnp.zeros((b, 0), jnp.int32))
  assert none.shape == (b, 0, CFG.hidden_size)
  np.testing.assert_allclose(np.asarray(k0), np.asarray(k), atol=1e-6, rtol=0)
  np.testing.assert_allclose(np.asarray(v0), np.asarray(v), atol=1e-6, rtol=0)

  def loss(p, **kw):
    logits, (k, v) = run(p, **kw)
    sel = logits if kw else jnp.take_along_axis(logits, rows[..., None], axis=1)
    return jnp.sum(jnp.tanh(sel)) + jnp.sum(jnp.sin(k[-1])) + jnp.sum(v[-1] ** 2)

  g_full = jax.grad(loss)(p)
  g_rows = jax.grad(lambda p: loss(p, head_rows=rows))(p)
  for a, b_ in zip(jax.tree.leaves(g_rows), jax.tree.leaves(g_full)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b_), rtol=1e-4, atol=1e-6)
