"""Models for evaluation: ``build_method(config)`` and what every task needs from a model
(``config``: the run's typed ``longjax.run_config.RunConfig``).

``build_method(config)`` returns a :class:`EvalModel`:

* the checkpoint is ``config.eval.checkpoint``, else ``config.model.checkpoint``, else the model
  ``train.py`` exported to ``{workdir}/export_hf`` (if any): a HF directory or a longjax checkpoint
  (``longjax.ckpts.checkpoint.load_any``; beacon / FocusLLM tensors are initialised from the base
  projections when the checkpoint lacks them, as the official ``from_pretrained``). With none, a
  tiny random model shaped by the ``config.model`` fields. The name ``smollm2`` resolves to the
  cached SmolLM2-135M-Instruct (``longjax.ckpts.smollm2``).
  The tokenizer is ``config.model.tokenizer`` or ``config.data.tokenizer`` (``"byte"`` or a
  directory of HF tokenizer files), else the model's own: the checkpoint directory's, the byte
  tokenizer for the tiny model (``longjax.data.tokenizers.choose_tokenizer``, shared with
  train.py). ``byte`` with a checkpoint that has its own tokenizer, or a tokenizer with more ids
  than the model's vocabulary, is an error.
* the method is ``config.eval.method`` or else ``config.method``: ``beacon`` (``BeaconLM``),
  ``focus`` (``FocusLLM``) or ``plain`` (the base model with a KV cache, fed middle-truncated
  inputs: the truncation baseline).

:class:`EvalModel` gives the tasks one interface: ``generate`` (greedy, stop ids), ``suffix_nll``
(the summed NLL of the last ``n`` tokens of a sequence, the perplexity primitive), ``token_limit``
(the longest input + output the method holds, for the up-front grid check) and ``fit`` (the
truncation rule of the plain baseline).
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from longjax import methods
from longjax.data.tokenizers import (Tokenizer, TokenizerChoiceError, choose_tokenizer,
                                     get_tokenizer)
from longjax.eval.errors import EvalError
from longjax.inference.generate import generate
from longjax.models.config import ModelConfig
from longjax.models.decoder import init_params

METHODS = methods.NAMES


def middle_truncate(ids: Sequence[int], limit: int) -> list:
  """Keep the first ``limit // 2`` and the last ``limit - limit // 2`` tokens (LongBench /
  InfiniteBench middle truncation)."""
  ids = list(ids)
  if limit <= 0 or len(ids) <= limit:
    return ids
  head = limit // 2
  return ids[:head] + ids[len(ids) - (limit - head):]


def truncate_text_middle(tok: Tokenizer, text: str, limit: int) -> str:
  """LongBench's rule on the prompt text: tokenize, keep the two halves, decode and re-join."""
  ids = tok.encode(text)
  if limit <= 0 or len(ids) <= limit:
    return text
  head = limit // 2
  return tok.decode(ids[:head]) + tok.decode(ids[len(ids) - (limit - head):])


# ------------------------------------------------------------------------------------------------
@dataclasses.dataclass
class EvalModel:
  name: str  # the method's registry name
  model: object  # its inference model (BeaconLM / FocusLLM / PlainLM): what generate() runs
  params: object
  tokenizer: Tokenizer
  truncation_limit: Optional[int]  # plain: most input + output tokens (inputs are truncated)
  cfg: ModelConfig
  extra: object = None  # BeaconConfig / FocusConfig
  user_cap: int = 0  # config.eval.model_max_length
  description: str = ""
  extra_eos: tuple = ()  # generation_config.json eos ids of the checkpoint
  weights: str = ""  # the weights' fingerprint (computed on first use when not given)

  @property
  def fingerprint(self) -> str:
    """A hash of every byte of the weights (names, shapes, dtypes, values), as train.py
    fingerprints a run's base: eval's resume and results files match a model by it, never by
    its path (a checkpoint retrained in place keeps its path)."""
    if not self.weights:
      from longjax.ckpts.fingerprint import weights_hash_full
      self.weights = weights_hash_full(self.params)
    return self.weights

  @property
  def method(self) -> "methods.Method":
    """The method object (``longjax.methods``) that owns every method-specific rule here."""
    return methods.get(self.name)

  # ---------------------------------------------------------------------------------------------
  @property
  def max_positions(self) -> int:
    return self.cfg.max_positions

  @property
  def token_limit(self) -> Optional[int]:
    """Most input + output tokens this method holds; ``None`` for the plain baseline, which
    truncates instead."""
    cap, _ = self.method.token_limit(self.cfg, self.extra)
    if cap is not None and self.user_cap:
      cap = min(cap, self.user_cap)
    return cap

  def check_fits(self, total: int, what: str):
    """``total`` = input + output tokens of the largest sample of a task: error when the method
    cannot hold it (the plain baseline truncates instead)."""
    self.check_capacity(total, what)
    self.reserve(total)

  def check_capacity(self, total: int, what: str):
    """:meth:`check_fits` without reserving: a task asks it before building its documents."""
    cap = self.token_limit
    if cap is not None and total > cap:
      raise EvalError(
          f"{what} needs {total} tokens (input + output), more than this {self.name} model can "
          f"hold ({cap} tokens: {self._limit_reason()}); shorten the grid / max_length, or raise "
          "the limit in the model config")

  def _limit_reason(self) -> str:
    if self.user_cap and self.token_limit == self.user_cap:
      return "config.eval.model_max_length"
    return self.method.token_limit(self.cfg, self.extra)[1]

  def reserve(self, total: int):
    """Make sure the model's buffers hold ``total`` tokens (beacon memory: rebuilds, recompiles)."""
    self.model = self.method.with_room_for(self.model, self.cfg, self.extra, total)

  def input_limit(self, max_new_tokens: int) -> int:
    """Plain baseline: the most prompt tokens kept (0: no truncation)."""
    if not self.method.truncates:
      return 0
    return max(int(self.truncation_limit) - int(max_new_tokens), 1)

  def fit(self, ids: Sequence[int], max_new_tokens: int) -> list:
    """The plain baseline's truncation (middle); other methods get ``ids`` unchanged."""
    lim = self.input_limit(max_new_tokens)
    return middle_truncate(ids, lim) if lim else list(ids)

  # ---------------------------------------------------------------------------------------------
  def stop_ids(self, newline: bool = False) -> list:
    ids = set()
    eos = self.cfg.eos_token_id
    for e in (eos if isinstance(eos, (list, tuple)) else [eos]):
      if e is not None:
        ids.add(int(e))
    if self.tokenizer.eos_id is not None:
      ids.add(int(self.tokenizer.eos_id))
    ids.update(int(e) for e in self.extra_eos)
    if newline:
      ids.add(int(self.tokenizer.newline_id))
    return sorted(ids)

  def generate(self, ids: Sequence[int], max_new_tokens: int, stop_ids: Sequence[int] = ()):
    """Greedy continuation of one prompt; returns ``(generated ids without the stop id, text)``."""
    out = generate(self.model, self.params, [list(map(int, ids))], max_new_tokens=max_new_tokens,
                   stop_ids=tuple(stop_ids))
    gen = out.tokens[0]
    if gen and gen[-1] in set(stop_ids):
      gen = gen[:-1]
    return gen, self.tokenizer.decode(gen)

  def suffix_nll(self, ids: Sequence[int], n_scored: int):
    """Summed NLL (nats) and count of the last ``n_scored`` tokens of ``ids``, each predicted
    from everything before it within ``ids`` (the first token is never scored), by the
    method's own protocol (``Method.suffix_nll``)."""
    ids = np.asarray(ids, np.int64)
    n = min(int(n_scored), len(ids) - 1)
    if n < 1:
      return 0.0, 0
    self.reserve(len(ids))
    return self.method.suffix_nll(self.model, self.params, self.cfg, ids, n)


# ------------------------------------------------------------------------------------------------
def _tiny_model(config, method, tok):
  """A random model shaped by ``config.model`` around ``tok`` (as train.py's tiny base)."""
  cfg = methods.tiny_model_config(config, tok, method)
  cfg = cfg.replace(dtype=config.model.dtype)
  seed = int(config.seed)
  params = jax.jit(lambda: init_params(cfg, seed))()  # jitted: ~3x faster than eager init
  return cfg, params


def run_tokenizer(config, ckpt: str) -> Tokenizer:
  """The run's tokenizer by the rule train.py uses too (module docstring)."""
  try:
    return load_tokenizer(choose_tokenizer(config, ckpt))
  except TokenizerChoiceError as e:
    raise EvalError(str(e)) from None


def load_tokenizer(spec: str) -> Tokenizer:
  """``get_tokenizer(spec)``, its refusals (no such directory, no tokenizer files, unloadable)
  reported as :class:`EvalError`, the error eval.py explains."""
  try:
    return get_tokenizer(spec)
  except FileNotFoundError as e:
    raise EvalError(str(e)) from None


def method_name(config) -> str:
  name = (config.eval.method or config.method or methods.Plain.name).lower()
  if name not in METHODS:
    raise EvalError(f"unknown method {name!r} (config.eval.method / config.method); valid: "
                    f"{', '.join(METHODS)}")
  return name


def checkpoint_path(config) -> str:
  """``config.eval.checkpoint``, else ``config.model.checkpoint``, else the model train.py
  exported to ``{workdir}/export_hf`` if there is one; "" = the tiny random model."""
  ckpt = str(config.eval.checkpoint or config.model.checkpoint or "")
  if ckpt:
    from longjax.ckpts import smollm2
    try:
      return smollm2.resolve(ckpt)
    except smollm2.FetchError as e:
      raise EvalError(str(e)) from None
  workdir = config.workdir
  export = Path(str(workdir)) / "export_hf" if workdir else None
  if export is not None and (export / "config.json").exists():
    return str(export)
  return ""


def build_method(config, name: Optional[str] = None) -> EvalModel:
  """See the module docstring."""
  name = name or method_name(config)
  method = methods.get(name)
  ckpt = checkpoint_path(config)
  if ckpt and not Path(ckpt).exists():
    raise EvalError(f"checkpoint {ckpt!r} (config.model.checkpoint) does not exist")
  tok = run_tokenizer(config, ckpt)
  if not ckpt:
    cfg, params = _tiny_model(config, method, tok)
    settings = method.settings(config, cfg.bos_token_id)
    desc = f"tiny random {cfg.family} ({'byte tokenizer' if not tok.hf else tok.tok.name_or_path})"
  else:
    cfg, params, settings = methods.load(method, ckpt, config)
    desc = ckpt
  if tok.vocab_size > cfg.vocab_size:
    # ids past the embedding table would be silently clamped by the gather: refuse instead
    raise EvalError(f"the tokenizer has {tok.vocab_size} ids but the model's vocabulary is "
                    f"{cfg.vocab_size}: set config.data.tokenizer to the model's own tokenizer "
                    "(or '' for the checkpoint's)")
  from longjax.ckpts.fingerprint import weights_hash_full
  weights = weights_hash_full(params)  # on the host copy, before it moves to the device
  params = jax.tree.map(jnp.asarray, params)
  user_cap = int(config.eval.model_max_length or 0)
  limit = None
  if method.truncates:
    limit = int(config.eval.truncate_to or 0) or cfg.max_positions
    desc = f"{desc} (middle truncation to {limit} tokens incl. output)"
  return EvalModel(name, method.inference_model(cfg, settings), params, tok, limit, cfg, settings,
               user_cap, f"{name} {desc}", generation_eos(ckpt), weights)


def generation_eos(ckpt: str) -> tuple:
  """EOS ids of the checkpoint's generation_config.json (chat models list their end-of-turn
  token there), as HF ``generate`` stops on them."""
  import json
  path = Path(ckpt) / "generation_config.json" if ckpt else None
  if path is None or not path.exists():
    return ()
  eos = json.loads(path.read_text()).get("eos_token_id")
  if eos is None:
    return ()
  return tuple(int(e) for e in (eos if isinstance(eos, list) else [eos]))
