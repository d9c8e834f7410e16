"""Models for evaluation: ``build_method(config)`` and what every task needs from a model.

``build_method(config)`` returns a :class:`Built` (it also unpacks as
``method, params, tokenizer, truncation_limit``):

* the checkpoint is ``config.eval.checkpoint``, else ``config.model.checkpoint``, else the model
  ``train.py`` exported to ``{workdir}/export_hf`` (if any): a HF directory or a longjax checkpoint
  (``longjax.checkpoint.load_any``; beacon / FocusLLM tensors are initialised from the base
  projections when the checkpoint lacks them, as the official ``from_pretrained``). With none, a
  tiny random model shaped by the ``config.model`` fields. The name ``smollm2`` resolves to the
  cached SmolLM2-135M-Instruct (``longjax.models.smollm2``).
  The tokenizer is ``config.model.tokenizer`` or ``config.data.tokenizer`` (``"byte"`` or a
  directory of HF tokenizer files), else the model's own: the checkpoint directory's, the byte
  tokenizer for the tiny model (``longjax.data.tokenizers.choose_tokenizer``, shared with
  train.py). ``byte`` with a checkpoint that has its own tokenizer, or a tokenizer with more ids
  than the model's vocabulary, is an error.
* the method is ``config.eval.method`` or else ``config.method``: ``beacon`` (``BeaconLM``),
  ``focus`` (``FocusLLM``) or ``plain`` (the base model with a KV cache, fed middle-truncated
  inputs: the truncation baseline).

:class:`Built` gives the tasks one interface: ``generate`` (greedy, stop ids), ``suffix_nll``
(the summed NLL of the last ``n`` tokens of a sequence, the perplexity primitive), ``capacity``
(the longest input + output the method holds, for the up-front grid check) and ``fit`` (the
truncation rule of the plain baseline).
"""
from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from longjax.data.tokenizers import (Tokenizer, TokenizerChoiceError, choose_tokenizer,
                                     get_tokenizer)
from longjax.eval.errors import EvalError
from longjax.generate import PlainLM, generate
from longjax.models.config import ModelConfig
from longjax.models.decoder import Decoder, init_params
from longjax.models.head import lm_head
from longjax.sizes import round_up

METHODS = ("beacon", "focus", "plain")
IGNORE = -100


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
# The plain model: fewer compiled shapes, and a hidden-state forward for log-likelihoods.
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


@functools.lru_cache(maxsize=8)
def _plain_nll_fn(cfg: ModelConfig, block: int):
  model = Decoder(cfg)

  def f(params, tokens, targets, weights):
    # tokens/targets/weights [1, T] with T a multiple of block; returns summed weighted NLL.
    t = tokens.shape[1]
    hidden, _ = model.apply({"params": params}, tokens, jnp.arange(t)[None], head=False)
    hb = hidden[0].reshape(t // block, block, -1)
    tb = targets[0].reshape(t // block, block)
    wb = weights[0].reshape(t // block, block)

    def one(xs):
      h, y, w = xs
      logits = lm_head(cfg, params, h)
      nll = jax.nn.logsumexp(logits, axis=-1) - jnp.take_along_axis(logits, y[:, None], -1)[:, 0]
      return jnp.sum(nll * w)

    return jnp.sum(jax.lax.map(one, (hb, tb, wb)))

  return jax.jit(f)


# ------------------------------------------------------------------------------------------------
@dataclasses.dataclass
class Built:
  name: str  # beacon | focus | plain
  method: object
  params: object
  tokenizer: Tokenizer
  truncation_limit: Optional[int]  # plain: most input + output tokens (inputs are truncated)
  cfg: ModelConfig
  extra: object = None  # BeaconConfig / FocusConfig
  user_cap: int = 0  # config.eval.model_max_length
  description: str = ""
  extra_eos: tuple = ()  # generation_config.json eos ids of the checkpoint

  def __iter__(self):
    return iter((self.method, self.params, self.tokenizer, self.truncation_limit))

  # ---------------------------------------------------------------------------------------------
  @property
  def max_positions(self) -> int:
    return self.cfg.max_positions

  @property
  def capacity(self) -> Optional[int]:
    """Most input + output tokens this method holds; ``None`` for the plain baseline, which
    truncates instead."""
    if self.name == "plain":
      return None
    p = self.max_positions
    if self.name == "beacon":
      b = self.extra
      pos = b.positive_ratios
      cap = p if not pos else (p - b.window) * max(pos) + b.window
    else:
      f = self.extra
      cap = min(f.max_chunks, max(p - f.local_window - 1, 0)) * f.chunk_stride + f.local_window
    if self.user_cap:
      cap = min(cap, self.user_cap)
    return cap

  def check_fits(self, total: int, what: str):
    """``total`` = input + output tokens of the largest sample of a task: error when the method
    cannot hold it (the plain baseline truncates instead)."""
    cap = self.capacity
    if cap is not None and total > cap:
      raise EvalError(
          f"{what} needs {total} tokens (input + output), more than this {self.name} model can hold "
          f"({cap} tokens: {self._cap_reason()}); shorten the grid / max_length, or raise the "
          "limit in the model config")
    if self.name == "beacon":
      self.reserve(total)

  def _cap_reason(self) -> str:
    if self.user_cap and self.capacity == self.user_cap:
      return "config.eval.model_max_length"
    if self.name == "beacon":
      b = self.extra
      return (f"(max positions {self.max_positions} - window {b.window}) x largest ratio "
              f"{max(b.positive_ratios or (1,))} + window")
    f = self.extra
    return (f"min(max_chunks {f.max_chunks}, positions) x stride {f.chunk_stride} + local window "
            f"{f.local_window}")

  def reserve(self, total: int):
    """Beacon: make sure the memory buffers hold ``total`` tokens (rebuilds -> recompiles)."""
    if self.name != "beacon" or total <= self.method.max_length:
      return
    from longjax.beacon import BeaconLM
    w = self.extra.window
    self.method = BeaconLM(self.cfg, self.extra, max_length=round_up(total, w), progress=False)

  def input_limit(self, max_new_tokens: int) -> int:
    """Plain baseline: the most prompt tokens kept (0: no truncation)."""
    if self.name != "plain":
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
    out = generate(self.method, self.params, [list(map(int, ids))], max_new_tokens=max_new_tokens,
                   stop_ids=tuple(stop_ids))
    gen = out.tokens[0]
    if gen and gen[-1] in set(stop_ids):
      gen = gen[:-1]
    return gen, self.tokenizer.decode(gen)

  def suffix_nll(self, ids: Sequence[int], n_scored: int):
    """Summed NLL (nats) and count of the last ``n_scored`` tokens of ``ids``, each predicted
    from everything before it within ``ids`` (the first token is never scored)."""
    ids = np.asarray(ids, np.int64)
    t = len(ids)
    n = min(int(n_scored), t - 1)
    if n < 1:
      return 0.0, 0
    if self.name == "plain":
      return self._plain_nll(ids, n)
    if self.name == "beacon":
      labels = ids.copy()
      labels[:t - n] = IGNORE
      self.reserve(t)
      out = self.method.forward(self.params, ids, labels=labels, training=False)
      return float(np.asarray(out.loss_sum)[0]), int(np.asarray(out.loss_count)[0])
    return self._teacher_forced(ids, n)

  def _plain_nll(self, ids, n):
    block = 256
    t = len(ids)
    tp = round_up(t, block)
    tokens = np.zeros((1, tp), np.int32)
    tokens[0, :t] = ids
    targets = np.zeros((1, tp), np.int32)
    targets[0, :t - 1] = ids[1:]
    weights = np.zeros((1, tp), np.float32)
    weights[0, t - 1 - n:t - 1] = 1.0
    fn = _plain_nll_fn(self.cfg, block)
    return float(fn(self.params, jnp.asarray(tokens), jnp.asarray(targets),
                    jnp.asarray(weights))), n

  def _teacher_forced(self, ids, n):
    """FocusLLM protocol (``inference_ppl_forward``): prefill on the context, then teacher-forced
    decode steps over the held-out tokens, each scored by the logits before it."""
    t = len(ids)
    ctx, tgt = ids[:t - n], ids[t - n:]
    logits, state = self.method.prefill(self.params, ctx[None].astype(np.int32),
                                        np.array([len(ctx)], np.int32), n)
    total = 0.0
    for j, y in enumerate(tgt):
      lp = jax.nn.log_softmax(jnp.asarray(logits)[0].astype(jnp.float32))
      total -= float(lp[int(y)])
      if j < n - 1:
        logits, state = self.method.step(self.params, state, np.array([int(y)], np.int32))
    return total, n


# ------------------------------------------------------------------------------------------------
def _get(c, name, default=None):
  try:
    return c.get(name, default) if hasattr(c, "get") else getattr(c, name, default)
  except AttributeError:
    return default


def _tiny_model(config, name: str, tok: Tokenizer):
  """A random model shaped by ``config.model`` around ``tok`` (as train.py's tiny base)."""
  m = config.model
  family = _get(m, "family", "llama")
  kw = dict(family=family, vocab_size=tok.vocab_size, hidden_size=m.hidden_size,
            intermediate_size=m.intermediate_size, num_layers=m.num_layers,
            num_heads=m.num_heads, num_kv_heads=m.num_kv_heads, head_dim=m.head_dim,
            attention_bias=family == "qwen2", bos_token_id=tok.bos_id,
            eos_token_id=tok.eos_id, dtype=_get(m, "dtype", "float32"))
  for opt in ("max_position_embeddings", "rope_theta"):
    if _get(m, opt) is not None:
      kw[opt] = _get(m, opt)
  if name == "beacon":
    kw.update(alt_projections=tuple(config.beacon.param), num_alt_embeddings=1)
  elif name == "focus":
    kw.update(alt_projections=tuple(config.focus.param))
  cfg = ModelConfig(**kw)
  seed = int(_get(config, "seed", 0))
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
  name = (_get(config.eval, "method", "") or _get(config, "method", "") or "plain").lower()
  if name not in METHODS:
    raise EvalError(f"unknown method {name!r} (config.eval.method / config.method); valid: "
                    f"{', '.join(METHODS)}")
  return name


def checkpoint_path(config) -> str:
  """``config.eval.checkpoint``, else ``config.model.checkpoint``, else the model train.py
  exported to ``{workdir}/export_hf`` if there is one; "" = the tiny random model."""
  ckpt = str(_get(config.eval, "checkpoint", "") or _get(config.model, "checkpoint", "") or "")
  if ckpt:
    from longjax.models import smollm2
    try:
      return smollm2.resolve(ckpt)
    except smollm2.FetchError as e:
      raise EvalError(str(e)) from None
  workdir = _get(config, "workdir", "")
  export = Path(str(workdir)) / "export_hf" if workdir else None
  if export is not None and (export / "config.json").exists():
    return str(export)
  return ""


def build_method(config, name: Optional[str] = None) -> Built:
  """See the module docstring."""
  name = name or method_name(config)
  ckpt = checkpoint_path(config)
  if ckpt and not Path(ckpt).exists():
    raise EvalError(f"checkpoint {ckpt!r} (config.model.checkpoint) does not exist")
  tok = run_tokenizer(config, ckpt)
  if not ckpt:
    cfg, params = _tiny_model(config, name, tok)
    desc = f"tiny random {cfg.family} ({'byte tokenizer' if not tok.hf else tok.tok.name_or_path})"
  else:
    cfg, params = _load_checkpoint(config, ckpt, name)
    desc = ckpt
  if tok.vocab_size > cfg.vocab_size:
    # ids past the embedding table would be silently clamped by the gather: refuse instead
    raise EvalError(f"the tokenizer has {tok.vocab_size} ids but the model's vocabulary is "
                    f"{cfg.vocab_size}: set config.data.tokenizer to the model's own tokenizer "
                    "(or '' for the checkpoint's)")
  params = jax.tree.map(jnp.asarray, params)
  user_cap = int(_get(config.eval, "model_max_length", 0) or 0)
  eos = _generation_eos(ckpt)
  if name == "plain":
    limit = int(_get(config.eval, "truncate_to", 0) or 0)
    limit = limit or cfg.max_positions
    return Built("plain", BucketedPlainLM(cfg), params, tok, limit, cfg, None, user_cap,
                 f"plain {desc} (middle truncation to {limit} tokens incl. output)", eos)
  if name == "beacon":
    from longjax.beacon import BeaconLM
    bcfg = beacon_config(config)
    lm = BeaconLM(cfg, bcfg, max_length=4 * bcfg.window, progress=False)
    return Built("beacon", lm, params, tok, None, cfg, bcfg, user_cap, f"beacon {desc}", eos)
  from longjax.focus import FocusLLM
  fcfg = focus_config(config, cfg.bos_token_id)
  return Built("focus", FocusLLM(cfg, fcfg), params, tok, None, cfg, fcfg, user_cap,
               f"focus {desc}", eos)


def _generation_eos(ckpt: str) -> tuple:
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


def _load_checkpoint(config, ckpt: str, name: str):
  from longjax.checkpoint import is_longjax_checkpoint, load_any
  if is_longjax_checkpoint(ckpt):
    cfg, params = load_any(ckpt)
    want = {"beacon": tuple(config.beacon.param), "focus": tuple(config.focus.param)}.get(name)
    if want and set(want) - set(cfg.alt_projections):
      raise EvalError(f"{ckpt} has no {name} projections {sorted(set(want) - set(cfg.alt_projections))}: "
                      f"convert it with --init_beacon (convert_weights.py) or use the HF directory")
    return cfg, params
  if name == "beacon":
    from longjax.beacon import load_beacon
    cfg, _, params = load_beacon(ckpt, init="official", beacon=beacon_config(config))
  elif name == "focus":
    from longjax.focus import load_focus
    from longjax.convert.hf import read_hf_config
    bos = read_hf_config(ckpt).get("bos_token_id")
    cfg, _, params = load_focus(ckpt, focus_config(config, bos), init_candidates="copy")
  else:
    cfg, params = load_any(ckpt)
  return cfg, params
