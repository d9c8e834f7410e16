"""The input checks every method and ``generate`` share, host side, before anything is traced or
allocated: integer token ids inside the vocabulary, stop ids, ``max_new_tokens``, params of the
right config, and a KV cache that fits the device. They sit below the methods and the inference
package so that each check is written once.
"""
from __future__ import annotations

import functools
import numbers
import os
from typing import Callable

import jax
import numpy as np

from longjax.errors import LongjaxError
from longjax.models.config import ModelConfig
from longjax.models.decoder import param_shapes
from longjax.runtime import program_cache

class GenerateError(LongjaxError, ValueError):
  """Arguments of ``generate`` that cannot work (params of another config)."""


class TokenIdError(LongjaxError, ValueError):
  """Token ids that are not integers, or that the model has no embedding for."""


def check_integer_ids(rows, what: str = "prompt") -> None:
  """Refuse float (or bool, or object) ids before anything casts them: ``int`` / ``astype``
  would truncate 1.5 to 1 silently. ``rows``: id arrays / lists."""
  for i, r in enumerate(rows):
    r = np.asarray(r)
    where = f"{what} {i}" if len(rows) > 1 else f"the {what}"
    if r.size and r.dtype.kind not in "iu":
      raise TokenIdError(f"token ids must be integers, got dtype {r.dtype} in {where} "
                         f"(e.g. {r.reshape(-1)[:5].tolist()}); pass integer ids")


def check_token_ids(rows, vocab_size: int, what: str = "prompt") -> None:
  """Refuse ids the model has no embedding for, host side: under jit the embedding lookup would
  clip them silently (-1 reads row 0, V + 100 reads row V - 1). ``rows``: id arrays / lists."""
  check_integer_ids(rows, what)
  for i, r in enumerate(rows):
    r = np.asarray(r)
    where = f"{what} {i}" if len(rows) > 1 else f"the {what}"
    bad = r[(r < 0) | (r >= vocab_size)]
    if bad.size:
      raise TokenIdError(f"token ids must be in [0, {vocab_size}) (the model's vocab_size); got "
                         f"{bad[:5].tolist()} in {where}")


def check_stop_ids(stop_ids, vocab_size: int) -> np.ndarray:
  """``stop_ids`` as an int array: a list / tuple / array of integer ids in the vocabulary. A bare
  int or a string ("57" would stop on 5 and 7), floats and out-of-range ids are refused."""
  if stop_ids is None:
    return np.zeros((0,), np.int64)
  if isinstance(stop_ids, jax.Array):  # e.g. jnp.array([2, 7]): its values, as a numpy array
    stop_ids = np.asarray(stop_ids)
  if isinstance(stop_ids, (str, bytes)) or not isinstance(stop_ids, (list, tuple, set, frozenset,
                                                                      range, np.ndarray)):
    one = (f" (e.g. [{int(stop_ids)}] for one)" if isinstance(stop_ids, numbers.Integral)
           and not isinstance(stop_ids, (bool, np.bool_)) else "")
    raise GenerateError(f"stop_ids must be a list of token ids{one}, got "
                        f"{type(stop_ids).__name__} {stop_ids!r}")
  ids = list(stop_ids.reshape(-1)) if isinstance(stop_ids, np.ndarray) else list(stop_ids)
  bad = [x for x in ids if isinstance(x, (bool, np.bool_)) or not isinstance(x, numbers.Integral)]
  if bad:
    raise GenerateError(f"stop_ids must be integer token ids, got {bad[:5]}")
  out = [int(x) for x in ids if not 0 <= int(x) < vocab_size]
  if out:
    raise GenerateError(f"stop_ids must be in [0, {vocab_size}) (the model's vocab_size), got "
                        f"{out[:5]}")
  return np.asarray([int(x) for x in ids], np.int64)


def memory_limit_bytes() -> int:
  """What one device can hold: its allocator's limit (accelerators) or the host's RAM (CPU)."""
  try:
    stats = jax.devices()[0].memory_stats() or {}
    if stats.get("bytes_limit"):
      return int(stats["bytes_limit"])
  except Exception:  # noqa: BLE001 -- backends without memory stats
    pass
  return host_memory_bytes()


def check_kv_fits(cfg: ModelConfig, rows: int, length: int, max_new_tokens: int) -> None:
  """Host side, before allocating: a KV cache of ``rows x length`` positions must fit the device
  (``max_new_tokens=10**12`` would otherwise exhaust memory inside the allocation)."""
  per_pos = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * np.dtype(
      cfg.compute_dtype).itemsize
  need, have = per_pos * rows * length, memory_limit_bytes()
  if need > have:
    raise GenerateError(f"max_new_tokens={max_new_tokens} needs a KV cache of {rows} x {length} "
                        f"positions ({need / 2**30:.1f} GiB), more than this device holds "
                        f"({have / 2**30:.1f} GiB): lower max_new_tokens")


def host_memory_bytes() -> int:
  try:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
  except (ValueError, OSError, AttributeError):
    return 1 << 62


def check_max_new_tokens(n, minimum: int = 1) -> None:
  # 2.5 would be truncated by range() / int() somewhere downstream; True is not a count.
  if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < minimum:
    raise GenerateError(f"max_new_tokens must be an integer >= {minimum}, got {n!r}")


@functools.lru_cache(maxsize=8)
def _expected_shapes(cfg: ModelConfig) -> dict:
  def compute():  # traces the model's init (~1 s): kept by the program cache when it is on
    flat = jax.tree_util.tree_flatten_with_path(param_shapes(cfg))[0]
    return {jax.tree_util.keystr(k): list(v.shape) for k, v in flat}
  shapes = program_cache.memo("param_shapes", repr(cfg), compute)
  return {k: tuple(v) for k, v in shapes.items()}


def check_params(params, cfg: ModelConfig):
  """Host side, before any trace: ``params`` must be the tree ``cfg`` describes (params of another
  config otherwise surface as a Flax ScopeParamNotFoundError or a shape error deep in a trace)."""
  want = _expected_shapes(cfg.replace(remat=False))
  got = {jax.tree_util.keystr(k): tuple(np.shape(v))
         for k, v in jax.tree_util.tree_flatten_with_path(params)[0]}
  missing = sorted(set(want) - set(got))  # extra leaves are harmless (Flax never reads them)
  shapes = [f"{k}: {got[k]} (config: {want[k]})" for k in sorted(set(want) & set(got))
            if got[k] != want[k]]
  if missing or shapes:
    parts = ([f"missing {missing[:3]}"] if missing else []) + \
        ([f"shapes {shapes[:3]}"] if shapes else [])
    raise GenerateError(f"params do not fit the method's model config ({cfg.family}, "
                        f"{cfg.num_layers} layers, hidden {cfg.hidden_size}, alt "
                        f"{cfg.alt_projections or 'none'}): {'; '.join(parts)}; load the params "
                        "with the config they were saved with")


def check_room(used, new: int, capacity: int, fail: Callable[[int], Exception]) -> None:
  """Host side, before a fixed-capacity buffer is written: the fullest row's ``used`` entries
  (an int or one per row) plus ``new`` must fit ``capacity``; else ``fail(need)`` is raised (the
  caller's error, which says which buffer and how to make it larger). Inside a trace the lengths
  are unknown; an overfull write there would lose entries silently (clamped or dropped), so
  every method calls this on concrete lengths first."""
  need = int(np.max(np.asarray(used))) + int(new)
  if need > capacity:
    raise fail(need)
