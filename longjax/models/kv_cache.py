"""Fixed-capacity KV cache for incremental decoding with the plain decoder.

The cache is a pytree (``KVCache``): keys/values ``[L, B, capacity, Hkv, D]`` and an explicit
per-row ``length``. Entry ``i`` of a row sits at position ``i`` for good, so its key is stored
rotated (``KVPrefix.rotated``): a decode step reads the cache as it is instead of rotating every
cached key again (pre-RoPE only for dynamic NTK RoPE, whose rotation depends on the call).
Every call attends to the whole buffer with the unfilled part masked, so one compiled step serves
every length. Rows have independent lengths, which is what makes a
batch of prompts of different lengths equal to running each prompt alone.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from longjax.kernels import TokenMeta
from longjax.models.config import ModelConfig
from longjax.models import inputs
from longjax.models.decoder import Decoder, KVPrefix, caches_rotated, rotate_kv
from longjax.errors import LongjaxError


class KVCacheError(LongjaxError, ValueError):
  """A KV cache that cannot be made or used as asked."""


class CacheFullError(KVCacheError):
  pass


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class KVCache:
  k: jax.Array  # [L, B, capacity, Hkv, D]: rotated at their positions (pre-RoPE: dynamic NTK)
  v: jax.Array
  length: jax.Array  # [B] int32: filled entries per row (entry i sits at position i)

  @classmethod
  def create(cls, cfg: ModelConfig, batch: int, capacity: int, dtype=None) -> "KVCache":
    if capacity < 1:
      raise KVCacheError(f"KV cache capacity must be >= 1, got {capacity}")
    shape = (cfg.num_layers, batch, capacity, cfg.num_kv_heads, cfg.head_dim)
    dtype = dtype or cfg.compute_dtype
    return cls(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype), jnp.zeros((batch,), jnp.int32))

  @property
  def capacity(self) -> int:
    return self.k.shape[2]


def check_room(cache: KVCache, new_tokens: int):
  """Raise when ``new_tokens`` more entries would not fit.

  Call it on the host before a jitted ``cache_forward`` (as ``PlainLM`` does): inside a trace the
  lengths are unknown, so the check here is skipped, and the entries of an overfull write would be
  dropped silently (:func:`write_entries`)."""
  if isinstance(cache.length, jax.core.Tracer):
    return
  inputs.check_room(cache.length, new_tokens, cache.capacity, lambda need: CacheFullError(
      f"KV cache full: a row needs {need} entries but the capacity is {cache.capacity}; "
      f"create the cache with a larger capacity (prompt length + max_new_tokens)"))


def cache_forward(model: Decoder, params, cache: KVCache, tokens, valid=None, *,
                  fresh: bool = False, last_only: bool = False):
  """Run ``tokens [B, T]`` after the cached entries; returns ``(logits, new cache)``.

  ``valid [B, T]`` marks real tokens; padding must come after a row's real tokens (right padding).
  Padding is written past the row's new length, i.e. it stays invisible and is overwritten later.
  ``fresh=True`` (static) promises an empty cache: the new tokens then attend only to themselves
  instead of to a fully masked buffer. ``last_only=True`` returns logits ``[B, V]`` at each row's
  last valid token instead of ``[B, T, V]``.
  """
  check_room(cache, tokens.shape[1])
  b, t = tokens.shape
  if valid is None:
    valid = jnp.ones((b, t), bool)
  memory = None
  if not fresh:
    slots = jnp.broadcast_to(jnp.arange(cache.capacity, dtype=jnp.int32), (b, cache.capacity))
    memory = KVPrefix(cache.k, cache.v, slots,
                      TokenMeta.causal(slots, valid=slots < cache.length[:, None]),
                      rotated=caches_rotated(model.cfg))
  positions = cache.length[:, None] + jnp.arange(t, dtype=jnp.int32)
  head_rows = None
  if last_only:
    head_rows = jnp.maximum(jnp.sum(valid, axis=-1, dtype=jnp.int32) - 1, 0)[:, None]
  logits, (k, v) = model.apply({"params": params}, tokens, positions, head_rows=head_rows,
                               q_meta=TokenMeta.causal(positions, valid=valid), memory=memory)
  if last_only:
    logits = logits[:, 0]
  if caches_rotated(model.cfg):
    k = rotate_kv(model.cfg, k, positions)

  cache = KVCache(write_entries(cache.k, k, cache.length), write_entries(cache.v, v, cache.length),
                  cache.length + jnp.sum(valid, axis=-1, dtype=jnp.int32))
  return logits, cache


def write_entries(buf, new, starts):
  """``buf [L, B, capacity, H, D]`` with ``new [L, B, T, H, D]`` written at entries ``starts[b]
  .. starts[b] + T - 1`` of each row: one scatter, in place when ``buf`` is not read afterwards (a
  decode step's cache). A per-row ``dynamic_update_slice`` under ``vmap`` made XLA copy the whole
  buffer (and change its layout) at every step: at a FocusLLM decode step's 32 chunk rows of 400
  entries on SmolLM2 that copy was 40 % of the step. Entries past the capacity are dropped; callers
  check the room on the host first (:func:`check_room`)."""
  b, t = new.shape[1], new.shape[2]
  pos = starts[:, None].astype(jnp.int32) + jnp.arange(t, dtype=jnp.int32)[None]
  return buf.at[:, jnp.arange(b)[:, None], pos].set(new.astype(buf.dtype), mode="drop")
