"""Decoder parity with HF transformers (torch) for every supported family, KV cache, alt
projections."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import forward
from hf_models import hf_logits, save_tiny
from longjax.ckpts import load_hf
from longjax.inference.generate import generate
from longjax.plain import PlainLM
from longjax.models import CacheFullError, Decoder, KVCache, ModelConfig, cache_forward, init_params

FAMILIES = ["llama2", "llama3", "llama_linear", "llama_dynamic", "qwen2", "qwen2_tied", "mistral"]
# > the tiny models' llama3 original length (64), dynamic-NTK length (64), Mistral window (48)
SEQ = 130


@functools.lru_cache(maxsize=None)
def converted(family, tmp_root):
  import pathlib
  model, d = save_tiny(pathlib.Path(tmp_root), family)
  cfg, params = load_hf(d)
  return model, cfg, jax.tree.map(jnp.asarray, params)


@pytest.fixture(scope="module")
def tmp_root(tmp_path_factory):
  return str(tmp_path_factory.mktemp("hf"))


def _ids(batch=2, length=SEQ, seed=0, vocab=320):
  return np.random.default_rng(seed).integers(3, vocab, (batch, length))


@pytest.mark.parametrize("family", FAMILIES)
def test_logits_match_hf(family, tmp_root):
  model, cfg, params = converted(family, tmp_root)
  ids = _ids()
  diff = np.abs(forward(cfg, params, ids) - hf_logits(model, ids)).max()
  assert diff < 1e-4, f"{family}: max |dlogit| {diff}"


# Each family-specific feature must change the logits, or the parity test above proves nothing
# about it: drop the feature and the outputs must move far beyond the parity tolerance.
@pytest.mark.parametrize("family,without", [
    ("llama3", dict(rope_scaling=None)),
    ("llama_linear", dict(rope_scaling=None)),
    ("llama_dynamic", dict(rope_scaling=None)),
    ("mistral", dict(sliding_windows=None)),
    ("qwen2", dict(attention_bias=False)),
])
def test_family_feature_matters(family, without, tmp_root):
  _, cfg, params = converted(family, tmp_root)
  ids = _ids(batch=1)
  reduced = jax.tree.map(lambda x: x, params)
  if without.get("attention_bias") is False:
    for p in "qkv":
      reduced["layers"]["attn"][f"{p}_proj"].pop("bias")
  diff = np.abs(forward(cfg, params, ids) - forward(cfg.replace(**without), reduced, ids)).max()
  assert diff > 1e-2


@pytest.mark.parametrize("family", ["qwen2", "mistral", "llama3"])
def test_kv_cache_decoding_equals_full_forward(family, tmp_root):
  _, cfg, params = converted(family, tmp_root)
  ids = _ids(batch=2, length=100, seed=1)
  full = forward(cfg, params, ids)
  model = Decoder(cfg)
  step = jax.jit(functools.partial(cache_forward, model))
  cache = KVCache.create(cfg, batch=2, capacity=128)
  logits, cache = step(params, cache, jnp.asarray(ids[:, :60]))
  outs = [np.asarray(logits)]
  for t in range(60, 100):
    logits, cache = step(params, cache, jnp.asarray(ids[:, t:t + 1]))
    outs.append(np.asarray(logits))
  inc = np.concatenate(outs, axis=1)
  assert np.abs(inc - full).max() < 1e-4
  assert list(np.asarray(cache.length)) == [100, 100]


@pytest.mark.parametrize("family", ["qwen2", "llama3"])
def test_kv_cache_holds_the_keys_hf_caches(family, tmp_root):
  """A cache entry keeps its position for good, so the cache holds its key rotated (read as it
  is at every decode step): HF's cached keys and values, layer by layer."""
  import torch
  model, cfg, params = converted(family, tmp_root)
  ids = _ids(batch=1, length=40, seed=2)
  _, cache = cache_forward(Decoder(cfg), params, KVCache.create(cfg, 1, 64), jnp.asarray(ids))
  with torch.no_grad():
    past = model(torch.as_tensor(ids), use_cache=True).past_key_values
  for i in range(cfg.num_layers):
    layer = past.layers[i] if hasattr(past, "layers") else None
    k_hf, v_hf = (layer.keys, layer.values) if layer is not None else past[i]
    for ours, ref in ((cache.k, k_hf), (cache.v, v_hf)):
      np.testing.assert_allclose(np.asarray(ours[i, :, :40]).transpose(0, 2, 1, 3),
                                 ref.numpy(), atol=1e-5, err_msg=f"layer {i}")


def test_rotated_memory_is_refused_with_dynamic_rope(tmp_root):
  """Dynamic NTK rotates with the call's longest position: its caches stay pre-RoPE."""
  from longjax.kernels import TokenMeta
  from longjax.models.config import ModelConfigError
  from longjax.models.decoder import KVPrefix, caches_rotated
  _, cfg, params = converted("llama_dynamic", tmp_root)
  assert not caches_rotated(cfg) and caches_rotated(converted("llama3", tmp_root)[1])
  cache = KVCache.create(cfg, 1, 8)
  slots = jnp.arange(8, dtype=jnp.int32)[None]
  memory = KVPrefix(cache.k, cache.v, slots, TokenMeta.causal(slots), rotated=True)
  with pytest.raises(ModelConfigError, match="rotated at use"):
    Decoder(cfg).apply({"params": params}, jnp.ones((1, 2), jnp.int32),
                       jnp.asarray([[8, 9]]), memory=memory)


def test_kv_cache_full_raises(tmp_root):
  _, cfg, params = converted("llama2", tmp_root)
  cache = KVCache.create(cfg, batch=1, capacity=8)
  model = Decoder(cfg)
  _, cache = cache_forward(model, params, cache, jnp.ones((1, 6), jnp.int32))
  with pytest.raises(CacheFullError, match=r"needs 9 entries but the capacity is 8"):
    cache_forward(model, params, cache, jnp.ones((1, 3), jnp.int32))


def test_kv_cache_full_raises_on_the_jitted_path():
  """PlainLM steps are jitted (the cache lengths are tracers inside): the check runs on the host."""
  cfg = ModelConfig(vocab_size=97, hidden_size=32, intermediate_size=48, num_layers=1, num_heads=4,
                    num_kv_heads=2, head_dim=8)
  lm, params = PlainLM(cfg), init_params(cfg, 0)
  # 64 prompt tokens and nothing to generate: the cache (capacity rounded up to 64) is full.
  _, state = lm.prefill(params, np.ones((1, 64), np.int32), np.array([64]), max_new_tokens=0)
  assert state.capacity == 64 and int(state.length[0]) == 64
  with pytest.raises(CacheFullError, match=r"needs 65 entries but the capacity is 64"):
    lm.step(params, state, np.array([3], np.int32))


def test_cache_writes_land_per_row_in_place():
  """write_entries: each row's new entries at its own start (numpy reference), entries past the
  capacity dropped (never shifted over earlier ones); compiled with the buffer donated, the write
  holds no copy of the whole buffer (the vmapped per-row dynamic_update_slice it replaced copied
  it, and changed its layout, at every decode step)."""
  from longjax.models.kv_cache import write_entries
  rng = np.random.default_rng(0)
  buf = rng.normal(size=(3, 4, 10, 2, 5)).astype(np.float32)
  new = rng.normal(size=(3, 4, 2, 2, 5)).astype(np.float32)
  starts = np.array([0, 3, 8, 9], np.int32)
  want = buf.copy()
  for b, s in enumerate(starts):
    for t in range(2):
      if s + t < 10:
        want[:, b, s + t] = new[:, b, t]
  got = np.asarray(write_entries(jnp.asarray(buf), jnp.asarray(new), jnp.asarray(starts)))
  np.testing.assert_array_equal(got, want)
  big = jax.ShapeDtypeStruct((4, 8, 256, 2, 16), jnp.float32)
  one = jax.ShapeDtypeStruct((4, 8, 1, 2, 16), jnp.float32)
  hlo = jax.jit(write_entries, donate_argnums=0).lower(
      big, one, jax.ShapeDtypeStruct((8,), jnp.int32)).compile().as_text()
  copies = [ln for ln in hlo.splitlines() if "f32[4,8,256,2,16]" in ln and " copy(" in ln]
  assert not copies, copies


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_lm_head_equals_the_decoders_own(tied, dtype):
  """The head the methods apply to chosen rows gives the decoder's logits, dtype for dtype."""
  from longjax.models.head import lm_head
  cfg = ModelConfig(vocab_size=97, hidden_size=32, intermediate_size=48, num_layers=1, num_heads=4,
                    num_kv_heads=2, head_dim=8, tie_word_embeddings=tied, dtype=dtype)
  params = init_params(cfg, 0)
  ids = jnp.asarray(_ids(2, 12, vocab=97))
  pos = jnp.broadcast_to(jnp.arange(12), ids.shape)
  model = Decoder(cfg)
  logits, _ = model.apply({"params": params}, ids, pos)
  hidden, _ = model.apply({"params": params}, ids, pos, head=False)
  ours = lm_head(cfg, params, hidden)
  assert ours.dtype == logits.dtype == jnp.float32
  np.testing.assert_array_equal(np.asarray(ours), np.asarray(logits))
  # any leading shape: one row per batch element, as the methods pick them
  np.testing.assert_array_equal(np.asarray(lm_head(cfg, params, hidden[:, -1])),
                                np.asarray(logits[:, -1]))


def test_batched_generation_equals_unbatched(tmp_root):
  _, cfg, params = converted("qwen2", tmp_root)
  method = PlainLM(cfg)
  prompts = [list(_ids(1, 37, seed=2)[0]), list(_ids(1, 11, seed=3)[0])]
  batched = generate(method, params, prompts, max_new_tokens=6, return_logits=True)
  for i, p in enumerate(prompts):
    alone = generate(method, params, p, max_new_tokens=6, return_logits=True)
    assert batched.tokens[i] == alone.tokens[0]
    assert np.abs(batched.logits[i] - alone.logits[0]).max() < 1e-4


def test_generate_reports_its_timings(tmp_root):
  _, cfg, params = converted("qwen2", tmp_root)
  method = PlainLM(cfg.replace(rms_norm_eps=1.5e-6))  # a config no other test compiled
  first = generate(method, params, [5, 6, 7, 8], max_new_tokens=5).timings
  again = generate(method, params, [5, 6, 7, 8], max_new_tokens=5).timings
  assert first.decode_steps == again.decode_steps == 4
  assert first.prefill_s > 0 and first.decode_s > 0 and again.decode_tokens_per_s > 0
  assert first.compile_s > 0.05  # prefill and step programs were compiled in this call
  assert again.compile_s < first.compile_s / 5  # ... and reused by the second
  assert "prefill" in first.summary() and "compiling" in first.summary()


def test_generate_matches_hf_greedy(tmp_root):
  import torch
  model, cfg, params = converted("llama3", tmp_root)
  prompt = _ids(1, 20, seed=4)
  out = generate(PlainLM(cfg), params, prompt[0], max_new_tokens=8)
  with torch.no_grad():
    ref = model.generate(torch.as_tensor(prompt), max_new_tokens=8, do_sample=False,
                         eos_token_id=None, pad_token_id=0)
  assert out.tokens[0] == ref[0, 20:].tolist()


def test_sampling_is_seeded_and_stops(tmp_root):
  _, cfg, params = converted("llama2", tmp_root)
  method = PlainLM(cfg)
  a = generate(method, params, [5, 6, 7], max_new_tokens=10, temperature=1.0, top_k=20, top_p=0.9,
               seed=3)
  b = generate(method, params, [5, 6, 7], max_new_tokens=10, temperature=1.0, top_k=20, top_p=0.9,
               seed=3)
  assert a.tokens == b.tokens and len(a.tokens[0]) == 10
  stop = a.tokens[0][2]
  c = generate(method, params, [5, 6, 7], max_new_tokens=10, temperature=1.0, top_k=20, top_p=0.9,
               seed=3, stop_ids=[stop])
  assert c.tokens[0] == a.tokens[0][:a.tokens[0].index(stop) + 1]
  with pytest.raises(ValueError, match="empty prompt"):
    generate(method, params, [], max_new_tokens=2)


def test_alternative_projections_follow_the_flag():
  """Flagged rows use alt_{q,k,v,o}; unflagged rows use the base projections."""
  cfg = ModelConfig(family="qwen2", vocab_size=50, hidden_size=32, intermediate_size=48,
                    num_layers=1, num_heads=4, num_kv_heads=2, head_dim=8, attention_bias=True,
                    alt_projections=("q", "k", "v", "o"), num_alt_embeddings=1)
  params = init_params(cfg, seed=1)
  params = jax.tree.map(
      lambda x: x + 0.05 * jax.random.normal(jax.random.PRNGKey(x.size), x.shape), params)
  tokens = jnp.asarray([[3, 7, 50, 9, 11, 50]])  # 50 = vocab_size -> the alt embedding row
  alt = tokens == 50
  pos = jnp.arange(6)[None]
  model = Decoder(cfg)
  logits, (k, v) = model.apply({"params": params}, tokens, pos, alt=alt)

  # Manual first-layer K/V (pre-RoPE): RMSNorm of the embedding, then the flagged projection.
  a = params["layers"]["attn"]
  emb = np.where(np.asarray(alt)[0, :, None], np.asarray(params["alt_embedding"][0]),
                 np.asarray(params["embedding"])[np.asarray(tokens)[0] % 50])
  h = emb / np.sqrt((emb ** 2).mean(-1, keepdims=True) + cfg.rms_norm_eps)
  h = h * np.asarray(params["layers"]["input_norm"]["scale"][0])
  for name, got in (("k", k), ("v", v)):
    for row in range(6):
      proj = f"alt_{name}_proj" if bool(alt[0, row]) else f"{name}_proj"
      want = (np.einsum("h,hnd->nd", h[row], np.asarray(a[proj]["kernel"][0]))
              + np.asarray(a[proj]["bias"][0]))
      np.testing.assert_allclose(np.asarray(got[0, 0, row]), want, rtol=1e-5, atol=1e-5)

  # Every row flagged == the base projections replaced by the alternative ones.
  swapped = jax.tree.map(lambda x: x, params)
  for p in "qkvo":
    swapped["layers"]["attn"][f"{p}_proj"] = params["layers"]["attn"][f"alt_{p}_proj"]
  all_alt, _ = model.apply({"params": params}, tokens % 50, pos, alt=jnp.ones_like(alt))
  base_on_swapped, _ = model.apply({"params": swapped}, tokens % 50, pos)
  np.testing.assert_allclose(all_alt, base_on_swapped, rtol=1e-5, atol=1e-5)
  # Rows before the first flagged token cannot see it (causal): equal to an unflagged run; the
  # flagged rows themselves differ.
  plain, _ = model.apply({"params": params}, tokens % 50, pos)
  np.testing.assert_allclose(logits[0, :2], plain[0, :2], rtol=1e-5, atol=1e-5)
  assert np.abs(np.asarray(logits[0, 2:] - plain[0, 2:])).max() > 1e-3


def test_remat_and_bf16_compute(tmp_root):
  """nn.remat changes memory, not numbers; bf16 compute stays within bf16 tolerance of fp32."""
  _, cfg, params = converted("llama2", tmp_root)
  ids = jnp.asarray(_ids(batch=1, length=48))
  pos = jnp.arange(48)[None]

  def loss(p, c):
    logits, _ = Decoder(c).apply({"params": p}, ids, pos)
    return jnp.mean(jax.nn.logsumexp(logits, -1))

  g_plain = jax.grad(loss)(params, cfg)
  g_remat = jax.grad(loss)(params, cfg.replace(remat=True))
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
               g_plain, g_remat)
  ref = forward(cfg, params, np.asarray(ids))
  bf16 = forward(cfg.replace(dtype="bfloat16"), params, np.asarray(ids))
  scale = np.abs(ref).max()
  assert np.abs(bf16 - ref).max() < 0.05 * scale and np.abs(bf16 - ref).mean() < 0.01 * scale


def test_fresh_prefill_and_last_row_logits_equal_the_general_path(tmp_root):
  _, cfg, params = converted("qwen2", tmp_root)
  model = Decoder(cfg)
  ids = jnp.asarray(_ids(batch=2, length=40, seed=5))
  valid = jnp.arange(40)[None] < jnp.asarray([[40], [23]])
  cache = KVCache.create(cfg, batch=2, capacity=64)
  full, c1 = cache_forward(model, params, cache, ids, valid)
  last, c2 = cache_forward(model, params, cache, ids, valid, fresh=True, last_only=True)
  np.testing.assert_allclose(last, np.asarray(full)[[0, 1], [39, 22]], rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(c1.k, c2.k, rtol=1e-5, atol=1e-5)
  assert c2.length.tolist() == [40, 23]
