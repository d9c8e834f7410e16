"""Rotary position embeddings (rotate-half convention, as in HF LLaMA/Qwen2/Mistral).

Positions are always explicit inputs: Activation Beacon re-positions its memory on every call and
FocusLLM places candidates at 0..C-1, so nothing here assumes ``arange(T)``.
"""
from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from longjax.models.config import ModelConfig


def inv_frequencies(cfg: ModelConfig) -> np.ndarray:
  """Base inverse frequencies ``[head_dim // 2]`` (float32), with static rope_scaling applied."""
  d = cfg.head_dim
  inv = 1.0 / (cfg.rope_theta ** (np.arange(0, d, 2, dtype=np.int64).astype(np.float32) / d))
  rs = cfg.rope_scaling_dict or {}
  kind = cfg.rope_type
  if kind == "linear":
    inv = inv / rs["factor"]
  elif kind == "llama3":
    factor, lo, hi = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
    old_len = rs["original_max_position_embeddings"]
    lo_wavelen, hi_wavelen = old_len / lo, old_len / hi
    wavelen = 2 * math.pi / inv
    scaled = np.where(wavelen > lo_wavelen, inv / factor, inv)
    smooth = (old_len / wavelen - lo) / (hi - lo)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < hi_wavelen) & ~(wavelen > lo_wavelen)
    inv = np.where(medium, smoothed, scaled)
  return inv.astype(np.float32)


def _dynamic_inv_frequencies(cfg: ModelConfig, seq_len):
  """Dynamic NTK: the base grows with the sequence length once it exceeds the trained length.

  ``seq_len`` is the largest position in the call + 1 (traced). This matches HF for a forward whose
  positions start at 0; HF's own cache keeps stale frequencies across calls, which we do not copy.
  """
  rs = cfg.rope_scaling_dict
  factor = rs["factor"]
  max_len = rs.get("original_max_position_embeddings") or cfg.max_position_embeddings
  d = cfg.head_dim
  seq_len = jnp.maximum(jnp.asarray(seq_len, jnp.float32), max_len)
  base = cfg.rope_theta * ((factor * seq_len / max_len) - (factor - 1)) ** (d / (d - 2))
  exps = jnp.arange(0, d, 2, dtype=jnp.int32).astype(jnp.float32) / d
  return 1.0 / (base ** exps)


def rope_tables(cfg: ModelConfig, positions, seq_len=None):
  """``(cos, sin)`` of shape ``positions.shape + [head_dim]`` in float32."""
  if cfg.rope_type == "dynamic":
    if seq_len is None:
      seq_len = jnp.max(positions) + 1
    inv = _dynamic_inv_frequencies(cfg, seq_len)
  else:
    inv = jnp.asarray(inv_frequencies(cfg))
  freqs = positions.astype(jnp.float32)[..., None] * inv
  emb = jnp.concatenate([freqs, freqs], axis=-1)
  return jnp.cos(emb), jnp.sin(emb)


def apply_rope(x, cos, sin):
  """Rotate ``x [B, T, H, D]`` with tables ``[B, T, D]``; returns x's dtype.

  The tables are cast to x's dtype first, as HF does, so bf16 runs round like the reference.
  """
  cos = cos[:, :, None, :].astype(x.dtype)
  sin = sin[:, :, None, :].astype(x.dtype)
  half = x.shape[-1] // 2
  rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
  return x * cos + rotated * sin
