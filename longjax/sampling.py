"""Next-token selection: greedy, temperature, top-k, top-p (nucleus). Pure jnp, jittable."""
from __future__ import annotations

import dataclasses
from typing import Optional

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
  temperature: float = 0.0  # 0 = greedy
  top_k: Optional[int] = None
  top_p: Optional[float] = None

  def __post_init__(self):
    if self.temperature < 0:
      raise ValueError(f"temperature must be >= 0, got {self.temperature}")
    if self.top_k is not None and self.top_k < 1:
      raise ValueError(f"top_k must be >= 1, got {self.top_k}")
    if self.top_p is not None and not 0 < self.top_p <= 1:
      raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")


def select_next(logits, key, cfg: SamplingConfig):
  """``logits [B, V]`` -> token ids ``[B]``."""
  if cfg.temperature == 0:
    return jnp.argmax(logits, axis=-1).astype(jnp.int32)
  logits = logits.astype(jnp.float32) / cfg.temperature
  if cfg.top_k is not None:
    kth = jax.lax.top_k(logits, min(cfg.top_k, logits.shape[-1]))[0][..., -1:]
    logits = jnp.where(logits < kth, -jnp.inf, logits)
  if cfg.top_p is not None:
    sorted_logits = jnp.sort(logits, axis=-1)[..., ::-1]
    probs = jax.nn.softmax(sorted_logits, axis=-1)
    # Keep the smallest prefix whose mass reaches top_p (the first token is always kept).
    before = jnp.cumsum(probs, axis=-1) - probs
    cutoff = jnp.min(jnp.where(before < cfg.top_p, sorted_logits, jnp.inf), axis=-1, keepdims=True)
    logits = jnp.where(logits < cutoff, -jnp.inf, logits)
  return jax.random.categorical(key, logits, axis=-1).astype(jnp.int32)
