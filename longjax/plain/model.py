"""The plain decoder as a ``longjax.generate`` method: the base model with a fixed-capacity KV cache
(no compression), the full-attention and truncation baseline of the other methods."""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from longjax.models.protocol import DevicePlan, Segment
from longjax.models.inputs import check_kv_fits, check_max_new_tokens, check_token_ids
from longjax.models.config import ModelConfig
from longjax.models.decoder import CAUSAL_PREFILL, Decoder, decode_decoder
from longjax.models.kv_cache import KVCache, cache_forward, check_room
from longjax.runtime.rounding import round_up


class PlainLM:
  """The base decoder with a fixed-capacity KV cache (no compression): the full-attention
  baseline."""

  def __init__(self, cfg: ModelConfig, impl: str = "auto"):
    self.cfg = cfg
    self.model = Decoder(cfg, rule=CAUSAL_PREFILL, impl=impl)
    self._prefill = jax.jit(functools.partial(cache_forward, self.model, fresh=True,
                                              last_only=True))
    self._step = jax.jit(functools.partial(cache_forward, self.model, last_only=True))

  def prefill(self, params, tokens, lengths, max_new_tokens):
    check_max_new_tokens(max_new_tokens, minimum=0)
    tokens = np.asarray(tokens)
    lengths = np.asarray(lengths)
    check_token_ids([r[:int(n)] for r, n in zip(tokens, lengths)], self.cfg.vocab_size)
    b, t = tokens.shape
    check_kv_fits(self.cfg, b, round_up(t + max_new_tokens, 64), max_new_tokens)
    cache = KVCache.create(self.cfg, b, round_up(t + max_new_tokens, 64))
    valid = np.arange(t)[None] < np.asarray(lengths)[:, None]
    return self._prefill(params, cache, jnp.asarray(tokens), jnp.asarray(valid))

  def step(self, params, state, tokens):
    # Host side: under jit cache_forward cannot see the lengths (a state stepped past the
    # max_new_tokens it was prefilled for would otherwise overwrite its last entries).
    check_token_ids([tokens], self.cfg.vocab_size, what="step tokens")
    check_room(state, 1)
    return self._step(params, state, jnp.asarray(tokens)[:, None])

  def device_plan(self, state: KVCache, n_feeds: int) -> DevicePlan:
    # prefill sized the cache for max_new_tokens: the n_feeds tokens fit.
    check_room(state, n_feeds)
    step = PlainStep(decode_decoder(self.model))
    return DevicePlan(state, [Segment(n_feeds, step)])


@dataclasses.dataclass(frozen=True)
class PlainStep:
  """``PlainLM``'s decode step as a pure function, hashable by its decoder (a static argument of
  the device loop: equal decoders share one compiled loop)."""
  model: Decoder

  def __call__(self, params, cache, x, tokens):
    return cache_forward(self.model, params, cache, tokens[:, None], last_only=True)

  def prepare_params(self, params):
    return self.model.prepare_params(params)


class BucketedPlainLM(PlainLM):
  """``PlainLM`` that pads prompts to a multiple of ``bucket`` tokens (one compile per bucket)."""

  def __init__(self, cfg: ModelConfig, bucket: int = 128):
    super().__init__(cfg)
    self.bucket = bucket

  def prefill(self, params, tokens, lengths, max_new_tokens):
    tokens = np.asarray(tokens)
    t = tokens.shape[1]
    pad = round_up(t, self.bucket) - t
    if pad:
      tokens = np.pad(tokens, ((0, 0), (0, pad)))
    return super().prefill(params, tokens, lengths, max_new_tokens)
