"""One sampling loop for every method (plain LM, Activation Beacon, FocusLLM).

A *method* is any object with

* ``cfg``: its ``ModelConfig``;
* ``prefill(params, tokens [B, T] int32 right-padded, lengths [B], max_new_tokens)``
  ``-> (next_logits [B, V], state)``;
* ``step(params, state, tokens [B]) -> (next_logits [B, V], state)``.

``state`` is a pytree owned by the method (KV cache, beacon memory, chunk caches). ``generate``
handles prompts (ids or text), batching, sampling, stop ids and streaming once for all of them.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Callable, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from longjax.models.config import ModelConfig
from longjax.models.decoder import Decoder
from longjax.models.kv_cache import KVCache, cache_forward
from longjax.sampling import SamplingConfig, select_next


@dataclasses.dataclass
class GenerateOutput:
  tokens: list  # per prompt: generated ids (up to and including a stop id)
  logits: Optional[list] = None  # per prompt: [n_generated, V] float32 (return_logits=True)
  text: Optional[list] = None  # per prompt: decoded text, when a tokenizer was given
  # The method's state after the last fed token (the last generated token is not fed back):
  # lets a method continue from it (e.g. BeaconLM.resume for multi-turn).
  state: object = None


def _round_up(n: int, m: int) -> int:
  return -(-n // m) * m


class PlainLM:
  """The base decoder with a fixed-capacity KV cache (no compression): the full-attention baseline."""

  def __init__(self, cfg: ModelConfig, impl: str = "auto"):
    self.cfg = cfg
    self.model = Decoder(cfg, impl=impl)
    self._prefill = jax.jit(functools.partial(cache_forward, self.model, fresh=True, last_only=True))
    self._step = jax.jit(functools.partial(cache_forward, self.model, last_only=True))

  def prefill(self, params, tokens, lengths, max_new_tokens):
    b, t = tokens.shape
    cache = KVCache.create(self.cfg, b, _round_up(t + max_new_tokens, 64))
    valid = np.arange(t)[None] < np.asarray(lengths)[:, None]
    return self._prefill(params, cache, jnp.asarray(tokens), jnp.asarray(valid))

  def step(self, params, state, tokens):
    return self._step(params, state, jnp.asarray(tokens)[:, None])


def _as_id_lists(prompts, tokenizer) -> list:
  if hasattr(prompts, "keys") and "input_ids" in prompts:
    # a tokenizer's output (transformers 5 apply_chat_template returns a BatchEncoding)
    prompts = prompts["input_ids"]
  if isinstance(prompts, str) or (isinstance(prompts, (list, tuple)) and prompts
                                  and isinstance(prompts[0], str)):
    if tokenizer is None:
      raise ValueError("text prompts need tokenizer=...; or pass token ids")
    texts = [prompts] if isinstance(prompts, str) else list(prompts)
    return [list(tokenizer.encode(t)) for t in texts]
  arr = prompts
  if isinstance(arr, np.ndarray) or isinstance(arr, jax.Array):
    arr = np.asarray(arr)
    return [list(map(int, arr))] if arr.ndim == 1 else [list(map(int, r)) for r in arr]
  if isinstance(arr, (list, tuple)) and arr and isinstance(arr[0], (list, tuple, np.ndarray)):
    return [list(map(int, r)) for r in arr]
  return [list(map(int, arr))]


def generate(method, params, prompts, max_new_tokens: int = 32, *, tokenizer=None,
             temperature: float = 0.0, top_k: Optional[int] = None, top_p: Optional[float] = None,
             seed: int = 0, stop_ids: Sequence[int] = (), return_logits: bool = False,
             callback: Optional[Callable[[int, np.ndarray], None]] = None) -> GenerateOutput:
  """Generate continuations of one prompt or a batch of prompts of different lengths.

  Args:
    method: ``PlainLM``, a beacon model or a FocusLLM model (see module docstring).
    prompts: text (with ``tokenizer``), a list of ids, or a list of id lists / a 2-D array.
    temperature / top_k / top_p / seed: sampling; ``temperature=0`` is greedy.
    stop_ids: a row stops after emitting any of these ids (the stop id is kept in the output).
    callback: called as ``callback(step, tokens [B])`` after each generated token (streaming).
  """
  sampling = SamplingConfig(temperature, top_k, top_p)
  if max_new_tokens < 1:
    raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
  ids = _as_id_lists(prompts, tokenizer)
  empty = [i for i, r in enumerate(ids) if not r]
  if not ids or empty:
    raise ValueError(f"empty prompt (rows {empty or [0]}): give at least one token per prompt")
  lengths = np.array([len(r) for r in ids], np.int32)
  tokens = np.zeros((len(ids), int(lengths.max())), np.int32)
  for i, r in enumerate(ids):
    tokens[i, :len(r)] = r

  logits, state = method.prefill(params, tokens, lengths, max_new_tokens)
  key = jax.random.PRNGKey(seed)
  stops = np.asarray(list(stop_ids), np.int32)
  out, out_logits = [], []
  done = np.zeros(len(ids), bool)
  select = _selector(sampling)
  for t in range(max_new_tokens):
    nxt = np.asarray(select(logits, jax.random.fold_in(key, t)))
    out.append(np.where(done, -1, nxt))
    if return_logits:
      out_logits.append(np.asarray(logits))
    if callback is not None:
      callback(t, nxt)
    done |= np.isin(nxt, stops)
    if done.all() or t == max_new_tokens - 1:
      break
    logits, state = method.step(params, state, nxt)

  gen = np.stack(out, axis=1)
  rows = [[int(x) for x in row if x >= 0] for row in gen]
  result = GenerateOutput(tokens=rows, state=state)
  if return_logits:
    lg = np.stack(out_logits, axis=1)
    result.logits = [lg[i, :len(r)] for i, r in enumerate(rows)]
  if tokenizer is not None:
    result.text = [tokenizer.decode(r) for r in rows]
  return result


@functools.lru_cache(maxsize=16)
def _selector(sampling: SamplingConfig):
  return jax.jit(lambda logits, key: select_next(logits, key, sampling))
