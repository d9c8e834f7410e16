"""Shared helpers for the FocusLLM tests: a tiny random FocusLLM model."""
from __future__ import annotations

import os
import textwrap
from pathlib import Path

import jax
import numpy as np

from longjax.focus import FocusConfig
from longjax.models.config import ModelConfig
from longjax.models.decoder import init_params


def tiny_model(seed: int = 0, kv_heads: int = 2, projections=("q", "k", "v", "o")):
  cfg = ModelConfig(family="llama", vocab_size=97, hidden_size=32, intermediate_size=48,
                    num_layers=2, num_heads=4, num_kv_heads=kv_heads, head_dim=8,
                    rms_norm_eps=1e-5, alt_projections=tuple(projections), bos_token_id=1,
                    eos_token_id=2)
  params = init_params(cfg, seed)
  # Larger kernels than the 0.02 init so attention is not uniform and logits are well separated.
  params = jax.tree_util.tree_map_with_path(
      lambda p, a: np.asarray(a) * (8.0 if "kernel" in jax.tree_util.keystr(p) else 1.0), params)
  return cfg, params


def tiny_focus(**kw) -> FocusConfig:
  base = dict(local_window=24, chunk_stride=16, prompt_cap=8, min_len_threshold=0)
  base.update(kw)
  return FocusConfig(**base)


def prompt(length: int, seed: int, vocab: int = 97) -> np.ndarray:
  rng = np.random.default_rng(seed)
  x = rng.integers(3, vocab, size=length)
  x[0] = 1
  return x.astype(np.int64)


def prompt_batch():
  """Three prompts of 5, 2 and 0 memory chunks (at ``tiny_focus``'s stride) and their padded
  ``(tokens, lengths)``: chunk counts that divide neither a chunk batch nor a device count."""
  prompts = [prompt(100, 0), prompt(45, 1), prompt(20, 2)]
  return (prompts, *padded(prompts))


def padded(prompts) -> tuple:
  """``(tokens [B, longest], lengths [B])`` of ``prompts``, zero-padded on the right."""
  lengths = np.array([len(p) for p in prompts], np.int32)
  tokens = np.zeros((len(prompts), lengths.max()), np.int32)
  for i, p in enumerate(prompts):
    tokens[i, :len(p)] = p
  return tokens, lengths


def decode_logits(m, params, tokens, lengths, max_new_tokens: int, feeds) -> tuple:
  """``({prefill, step0, step1, ...}: logits as numpy, final state)`` of ``m`` (a FocusLLM): the
  prefill of ``tokens``, then one cached decode step per row of ``feeds`` (a token per prompt)."""
  res = {}
  logits, state = m.prefill(params, tokens, lengths, max_new_tokens)
  res["prefill"] = np.asarray(logits)
  for t, g in enumerate(feeds):
    logits, state = m.step(params, state, np.asarray(g))
    res[f"step{t}"] = np.asarray(logits)
  return res, state


# Start of a subprocess script with 8 fake CPU devices (the test process already initialised JAX
# with one), the compilation cache when given, and the tests folder importable; format it with
# ``cache`` and ``tests``.
EIGHT_DEVICE_PREAMBLE = textwrap.dedent("""
    import os, sys
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax, numpy as np
    if {cache!r}:
      jax.config.update("jax_compilation_cache_dir", {cache!r})
      jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
    sys.path.insert(0, {tests!r})
""")


def run_eight_devices(worker: str, tmp_path, **fields) -> dict:
  """Run ``worker`` (EIGHT_DEVICE_PREAMBLE + a script that saves ``np.savez({out!r}, ...)``,
  formatted with ``fields``) in a subprocess with 8 fake CPU devices: what it saved, as a dict."""
  from conftest import REPO, run_python
  script, out = tmp_path / "worker.py", tmp_path / "worker.npz"
  script.write_text(worker.format(tests=str(Path(__file__).parent), out=str(out),
                                  cache=jax.config.jax_compilation_cache_dir or "", **fields))
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
  env.pop("XLA_FLAGS", None)
  proc = run_python(script, env=env, timeout=600, cwd=None)
  assert proc.returncode == 0, proc.stderr[-4000:]
  return dict(np.load(out))
