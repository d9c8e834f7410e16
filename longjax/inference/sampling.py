"""Next-token selection: greedy, temperature, top-k, top-p (nucleus). Pure jnp, jittable."""
from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Optional

import jax
import jax.numpy as jnp

from longjax.errors import LongjaxError


class SamplingError(LongjaxError, ValueError):
  """A sampling setting that selects nothing sensible (temperature, top_k, top_p)."""


# Below these floors a setting is refused (pass temperature=0 for greedy, which is what both would
# amount to): logits / 1e-40 overflows float32 to inf (the samples are then noise, e.g. [0, 1, 0,
# 1, ...]), and a top_p that rounds to 0 in float32 (1e-46) masks every token (all samples 0).
# At the floors the arithmetic is still exact enough: |logits| / 1e-6 stays far below float32's
# 3.4e38, and a top_p of 1e-6 keeps only the most likely token of any vocabulary up to 10^6, as
# greedy does.
MIN_TEMPERATURE = 1e-6
MIN_TOP_P = 1e-6


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
  temperature: float = 0.0  # 0 = greedy
  top_k: Optional[int] = None
  top_p: Optional[float] = None

  def __post_init__(self):
    # NaN fails every comparison, so `t < 0` let it through and the NaN logits then sampled token
    # 0 every time; inf flattened them to uniform noise. Only finite numbers are settings.
    t, k, p = self.temperature, self.top_k, self.top_p
    if not _real(t) or not math.isfinite(t) or t < 0:
      raise SamplingError(f"temperature must be a finite number >= 0 (0 = greedy), got {t!r}")
    if 0 < t < MIN_TEMPERATURE:
      raise SamplingError(f"temperature {t!r} is below the floor {MIN_TEMPERATURE:g} (logits / t "
                          "would overflow float32); pass temperature=0 for greedy, which is what "
                          "so low a temperature means")
    if k is not None and (isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 1):
      raise SamplingError(f"top_k must be an integer >= 1 (or None), got {k!r}")
    if p is not None and not (_real(p) and 0 < p <= 1):  # written so that NaN fails
      raise SamplingError(f"top_p must be in (0, 1] (or None), got {p!r}")
    if p is not None and p < MIN_TOP_P:
      raise SamplingError(f"top_p {p!r} is below the floor {MIN_TOP_P:g} (it rounds towards 0 in "
                          "float32, which masks every token); pass temperature=0 for greedy, "
                          "which is what so small a top_p means")


def _real(x) -> bool:
  return isinstance(x, numbers.Real) and not isinstance(x, bool)


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
