"""longjax as a model of EleutherAI's lm-evaluation-harness: the model type ``longjax``.

lm-eval 0.4.13 loads no plugins, so importing this module registers the model, and
``python -m longjax.eval.harness <lm-eval CLI arguments>`` registers it and then hands the
arguments to lm-eval's own CLI::

  python -m longjax.eval.harness --model longjax \
      --model_args method=beacon,asset=smollm2_beacon,checkpoint=smollm2 \
      --tasks niah_single_1 --metadata '{"max_seq_lengths":[4096]}' --limit 2

  import longjax.eval.harness, lm_eval
  lm_eval.simple_evaluate(model="longjax", model_args="method=focus,asset=smollm2_focus", ...)

model_args (checked before anything is loaded):

* ``method``: ``plain`` (full attention over the whole prompt), ``truncation`` (the plain model
  reading a ``window=W``-token prompt: middle truncation, the project's rule, so that the
  instruction at the start and the question at the end survive), ``beacon`` (Activation Beacon)
  or ``focus`` (FocusLLM); beacon and focus need ``asset=``.
* ``checkpoint``: a HF / longjax checkpoint directory or ``smollm2`` (the cached
  SmolLM2-135M-Instruct); default: the base an asset names.
* ``asset``: a trained beacon / FocusLLM asset: a directory, or the name of one in the
  repository's ``assets/`` (``smollm2_beacon``, ``smollm2_focus``).
* ``tokenizer``: a tokenizer directory (default: the checkpoint's). RULER's tasks read it too
  (lm-eval passes model_args to the tasks); the CLI adds the checkpoint's when none is given.
* ``dtype`` (``float32`` / ``bfloat16``: the compute dtype), ``batch_size`` (prompts per
  ``longjax.generate`` call), ``loop`` (``auto`` / ``device`` / ``host``: generate's decode loop).

Requests: ``generate_until`` runs ``longjax.generate`` (greedy unless the task samples; EOS ids
and single-token stop strings end a row early; the text is cut at the first stop string, as
lm-eval's own models do). ``loglikelihood`` and ``loglikelihood_rolling`` score by the method's
own protocol (``longjax.methods``: ``suffix_nll``: one forward for the plain model and beacon,
prefill + teacher-forced decode steps for FocusLLM), so perplexity tasks measure the method; the
rolling score reads the whole document through the method (``truncation``: disjoint windows of
``W`` tokens). ``is_greedy`` is whether greedy generation through the method reproduces the
continuation. A prompt longer than the method holds is refused before any request runs. With
``answer_log`` set (``longjax.eval.answer_log.AnswerLog``), every generated answer is logged as it
comes and a rerun answers logged requests from the log (how a stopped long cell resumes).

lm-eval is an optional extra (``pip install -r requirements-eval.txt``), imported only here.
"""
from __future__ import annotations

import dataclasses
import difflib
import json
import sys
from pathlib import Path
from typing import Optional

import numpy as np

from longjax import method_names
from longjax.errors import LongjaxError, one_line

try:  # the optional extra: longjax itself imports without it
  import lm_eval.models  # noqa: F401  (lm-eval's lazy registry of its own models, kept usable)
  from lm_eval.api.model import LM as _LM
  from lm_eval.api.registry import register_model as _register_model
  HAVE_LM_EVAL = True
except ImportError:  # pragma: no cover -- exercised by tests/test_harness.py in a subprocess
  _LM, _register_model, HAVE_LM_EVAL = object, None, False

NAME = "longjax"
PLAIN, BEACON, FOCUS = (m.name for m in (method_names.PLAIN, method_names.BEACON,
                                          method_names.FOCUS))
TRUNCATION = "truncation"  # the plain decoder reading the last `window` prompt tokens
METHODS = (PLAIN, TRUNCATION, BEACON, FOCUS)
WITH_ASSET = (BEACON, FOCUS)
MODEL_ARGS = ("method", "checkpoint", "asset", "window", "tokenizer", "dtype", "batch_size", "loop",
              "candidate_gate", "gate_threshold", "gate_gain", "gate_peer_gain", "gate_top_k",
              "chunk_overlap", "chunk_vote", "vote_min", "vote_open")
# FocusLLM reading settings that override the asset's
FOCUS_READING = ("candidate_gate", "gate_threshold", "gate_gain", "gate_peer_gain", "gate_top_k",
                 "chunk_overlap", "chunk_vote", "vote_min", "vote_open")
# lm-eval's CLI hands every model these (None is dropped): JAX places arrays on its own device.
IGNORED_ARGS = ("device", "max_batch_size")
DTYPES = ("float32", "bfloat16")
GEN_KWARGS = ("until", "max_gen_toks", "do_sample", "temperature", "top_k", "top_p", "seed")
INSTALL = "pip install -r requirements-eval.txt"


class HarnessError(LongjaxError, ValueError):
  """A model_args value, request or task length the longjax lm-eval model cannot run."""


def require_lm_eval():
  if not HAVE_LM_EVAL:
    raise HarnessError(f"the longjax lm-eval model needs lm-evaluation-harness, which is not "
                       f"installed: {INSTALL}")


def _near(word, choices) -> str:
  close = difflib.get_close_matches(str(word), list(choices), n=1)
  return f" (did you mean {close[0]!r}?)" if close else ""


# ------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Args:
  """Checked model_args."""
  method: str
  checkpoint: str = ""
  asset: str = ""
  window: int = 0
  tokenizer: str = ""
  dtype: str = ""
  batch_size: int = 1
  loop: str = "auto"
  candidate_gate: Optional[float] = None  # FocusLLM: the asset's own when None
  chunk_overlap: Optional[int] = None  # FocusLLM: the asset's own when None
  gate_threshold: Optional[float] = None  # FocusLLM: the asset's own when None
  gate_gain: Optional[float] = None  # FocusLLM: the asset's own when None
  gate_peer_gain: Optional[float] = None  # FocusLLM: the asset's own when None
  gate_top_k: Optional[int] = None  # FocusLLM: the asset's own when None
  chunk_vote: Optional[float] = None  # FocusLLM: the asset's own when None
  vote_min: Optional[float] = None  # FocusLLM: the asset's own when None
  vote_open: Optional[bool] = None  # FocusLLM: the asset's own when None


def _int(key, value, minimum=1) -> int:
  if isinstance(value, str) and value.strip().isdigit():
    value = int(value)
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
    raise HarnessError(f"model_args {key}={value!r}: must be an integer >= {minimum}")
  return int(value)


def _number_ge0(key, value) -> float:
  try:
    x = float(value) if not isinstance(value, bool) else float("nan")
  except (TypeError, ValueError):
    x = float("nan")
  if not (x >= 0 and x != float("inf")):
    raise HarnessError(f"model_args {key}={value!r}: must be a finite number >= 0")
  return x


def asset_kind(path: Path) -> Optional[str]:
  """``beacon`` / ``focus`` by the settings file an asset directory holds; None otherwise."""
  from longjax.beacon.asset import META as BEACON_META
  from longjax.focus.asset import META as FOCUS_META
  for kind, meta in ((BEACON, BEACON_META), (FOCUS, FOCUS_META)):
    if (path / meta).is_file():
      return kind
  return None


def resolve_asset(spec: str) -> Path:
  """A directory, else the name of an asset where the CLIs look names up (``$LONGJAX_ASSETS`` or
  the repository's ``assets/``: :func:`longjax.ckpts.assets.assets_root`)."""
  from longjax.ckpts.assets import assets_root
  root = assets_root()
  p = Path(spec).expanduser()
  if p.is_dir():
    return p
  if "/" not in spec and (root / spec).is_dir():
    return root / spec
  names = sorted(d.name for d in root.iterdir()) if root.is_dir() else []
  raise HarnessError(f"model_args asset={spec!r}: no such directory, nor an asset of that name in "
                     f"{root}{_near(spec, names)}; give an asset directory or one of {names}")


def check_model_args(kwargs: dict) -> Args:
  """The model_args lm-eval passes, checked host side: one line naming the problem and the fix."""
  unknown = [k for k in kwargs if k not in MODEL_ARGS + IGNORED_ARGS]
  if unknown:
    k = unknown[0]
    raise HarnessError(f"unknown model_args key {k!r}{_near(k, MODEL_ARGS)}; the longjax model "
                       f"takes {', '.join(MODEL_ARGS)}")
  kw = {k: v for k, v in kwargs.items() if k in MODEL_ARGS and v is not None}
  method = str(kw.get("method", "")).strip().lower()
  if not method:
    raise HarnessError(f"model_args needs method=, one of {', '.join(METHODS)}")
  if method not in METHODS:
    raise HarnessError(f"model_args method={method!r} is not a longjax method"
                       f"{_near(method, METHODS)}; use one of {', '.join(METHODS)}")
  window = kw.get("window")
  if method == TRUNCATION:
    if window is None:
      raise HarnessError("method=truncation needs window=W (the prompt tokens the model reads), "
                         "e.g. window=256")
    window = _int("window", window)
  elif window is not None:
    raise HarnessError(f"model_args window= applies to method=truncation only, not {method}: drop "
                       "it (or use method=truncation)")
  asset = str(kw.get("asset", "") or "")
  if method in WITH_ASSET:
    if not asset:
      raise HarnessError(f"method={method} needs asset= (its trained tensors: a directory or e.g. "
                         f"smollm2_{method}); untrained {method} tensors are not the method")
    kind = asset_kind(resolve_asset(asset))
    if kind != method:
      what = f"a {kind} asset" if kind else "not a beacon or FocusLLM asset"
      raise HarnessError(f"model_args asset={asset!r} is {what}, but method={method}: pass a "
                         f"{method} asset" + (f" or method={kind}" if kind else ""))
  elif asset:
    raise HarnessError(f"model_args asset= applies to method=beacon / focus, not {method}: drop it")
  dtype = str(kw.get("dtype", "") or "")
  if dtype and dtype not in DTYPES:
    raise HarnessError(f"model_args dtype={dtype!r}{_near(dtype, DTYPES)}: use one of "
                       f"{', '.join(DTYPES)}")
  bs = kw.get("batch_size", 1)
  if isinstance(bs, str) and bs.startswith("auto"):
    raise HarnessError("batch_size=auto is not supported by the longjax model: give a number, "
                       "e.g. --batch_size 4")
  loop = str(kw.get("loop", "auto"))
  if loop not in ("auto", "device", "host"):
    raise HarnessError(f"model_args loop={loop!r}: use auto, device or host")
  ckpt = str(kw.get("checkpoint", "") or "")
  if method in (PLAIN, TRUNCATION) and not ckpt:
    raise HarnessError(f"method={method} needs checkpoint= (a model directory or smollm2)")
  if ckpt and ckpt.lower() != "smollm2" and not Path(ckpt).expanduser().is_dir():
    raise HarnessError(f"model_args checkpoint={ckpt!r} is not a directory: give a HF / longjax "
                       "checkpoint directory or smollm2")
  tok = str(kw.get("tokenizer", "") or "")
  if tok and not Path(tok).expanduser().is_dir():
    raise HarnessError(f"model_args tokenizer={tok!r} is not a directory: give a directory of HF "
                       "tokenizer files (default: the checkpoint's)")
  for key in FOCUS_READING:
    if kw.get(key) is not None and method != FOCUS:
      raise HarnessError(f"model_args {key}= applies to method=focus only, not {method}: drop it")
  gate, overlap, tau = (kw.get(k) for k in ("candidate_gate", "chunk_overlap", "gate_threshold"))
  gate = None if gate is None else _number_ge0("candidate_gate", gate)
  overlap = None if overlap is None else _int("chunk_overlap", overlap, minimum=0)
  tau = None if tau is None else _number_ge0("gate_threshold", tau)
  if tau is not None and not 0 < tau <= 1:
    raise HarnessError(f"model_args gate_threshold={kw['gate_threshold']!r}: must be a number in "
                       "(0, 1] (1: the plain gate)")
  gain = kw.get("gate_gain")
  gain = None if gain is None else _number_ge0("gate_gain", gain)
  peer = kw.get("gate_peer_gain")
  peer = None if peer is None else _number_ge0("gate_peer_gain", peer)
  top_k = kw.get("gate_top_k")
  top_k = None if top_k is None else _int("gate_top_k", top_k)
  vote = kw.get("chunk_vote")
  vote = None if vote is None else _number_ge0("chunk_vote", vote)
  vote_min = kw.get("vote_min")
  vote_min = None if vote_min is None else _number_ge0("vote_min", vote_min)
  if vote_min is not None and not vote_min < 1:
    raise HarnessError(f"model_args vote_min={kw['vote_min']!r}: must be a number in [0, 1) (0: "
                       "the surest chunk always votes)")
  vote_open = kw.get("vote_open")
  if vote_open is not None:
    flag = str(vote_open).strip().lower()
    if flag not in ("true", "false", "1", "0"):
      raise HarnessError(f"model_args vote_open={vote_open!r}: give true or false")
    vote_open = flag in ("true", "1")
  return Args(method, ckpt, asset, window or 0, tok, dtype, _int("batch_size", bs), loop, gate,
              overlap, tau, gain, peer, top_k, vote, vote_min, vote_open)


def checkpoint_dir(args: Args) -> str:
  """The base model directory: ``checkpoint=`` (``smollm2`` resolved, fetched once) or the base
  the asset names."""
  from longjax.ckpts import smollm2
  if args.checkpoint:
    return str(Path(smollm2.resolve(args.checkpoint)).expanduser())
  meta = resolve_asset(args.asset) / f"{args.method}.json"
  base = json.loads(meta.read_text()).get("base", "")
  if json.loads(meta.read_text()).get("base_embedded"):
    return str(resolve_asset(args.asset) / base)
  return str(smollm2.resolve(base)) if base else ""


# ------------------------------------------------------------------------------------------------
@dataclasses.dataclass
class Parts:
  """What the adapter runs: a ``longjax.generate`` method object and its parameters."""
  method: str  # plain / truncation / beacon / focus
  model: object  # PlainLM / BeaconLM / FocusLLM
  params: object
  cfg: object  # ModelConfig
  tokenizer: object  # longjax.data.tokenizers.Tokenizer
  settings: object = None  # BeaconConfig / FocusConfig
  window: int = 0  # truncation: prompt tokens kept
  extra_eos: tuple = ()  # generation_config.json eos ids

  @property
  def registry(self):
    from longjax import methods
    return methods.get(PLAIN if self.method == TRUNCATION else self.method)

  def token_limit(self):
    """``(most input + output tokens, why)``; ``(None, ...)`` for plain / truncation."""
    return self.registry.token_limit(self.cfg, self.settings)


def load_parts(args: Args) -> Parts:
  import jax
  import jax.numpy as jnp
  from longjax import methods
  from longjax.data.tokenizers import get_tokenizer
  from longjax.eval.models import generation_eos
  base = checkpoint_dir(args)
  reg = methods.get(PLAIN if args.method == TRUNCATION else args.method)
  settings = None
  if args.method in WITH_ASSET:
    cfg, settings, params = reg.load_asset(resolve_asset(args.asset), base or None)
    # reading settings: the trained tensors stay the same (FocusConfig checks them: an overlap
    # must stay below the asset's chunk stride)
    settings = settings.replace(**{k: getattr(args, k) for k in FOCUS_READING
                                   if getattr(args, k) is not None})
  else:
    from longjax.ckpts.checkpoint import load_any
    cfg, params = load_any(base)
  if args.dtype:
    cfg = cfg.replace(dtype=args.dtype)
  tok = get_tokenizer(args.tokenizer or base)
  if tok.vocab_size > cfg.vocab_size:
    raise HarnessError(f"the tokenizer has {tok.vocab_size} ids but the model's vocabulary is "
                       f"{cfg.vocab_size}: give the model's own tokenizer (tokenizer=)")
  params = jax.tree.map(jnp.asarray, params)
  model = reg.inference_model(cfg, settings)
  return Parts(args.method, model, params, cfg, tok, settings, args.window, generation_eos(base))


# ------------------------------------------------------------------------------------------------
def _middle(ids, limit: int) -> list:
  from longjax.eval.models import middle_truncate
  return middle_truncate(ids, limit)


class LongjaxLM(_LM):
  """The lm-eval model (module docstring)."""

  def __init__(self, parts: Optional[Parts] = None, **model_args):
    require_lm_eval()
    super().__init__()
    if parts is None:
      args = check_model_args(model_args)
      parts = load_parts(args)
      self.batch_size, self.loop = args.batch_size, args.loop
    else:  # built in Python (tests): only the request settings may come with it
      extra = sorted(set(model_args) - {"batch_size", "loop"})
      if extra:
        raise HarnessError(f"LongjaxLM(parts=...) takes batch_size and loop only, got {extra}")
      self.batch_size = _int("batch_size", model_args.get("batch_size", 1))
      self.loop = model_args.get("loop", "auto")
    self.parts = parts
    # an AnswerLog (longjax.eval.answer_log): answers logged as they come, reused by a rerun
    self.answer_log = None

  # --- what lm-eval reads ------------------------------------------------------------------------
  @property
  def tokenizer(self):
    return self.parts.tokenizer

  @property
  def eot_token_id(self) -> int:
    eos = self.parts.tokenizer.eos_id
    return int(eos if eos is not None else self._eos_ids()[0])

  @property
  def prefix_token_id(self) -> int:
    bos = self.parts.tokenizer.bos_id
    return int(bos) if bos is not None else self.eot_token_id

  @property
  def tokenizer_name(self) -> str:
    return str(self.parts.tokenizer.name).replace("/", "__")

  def chat_template(self, chat_template=False) -> str:
    hf = self.parts.tokenizer.hf
    return (getattr(hf, "chat_template", None) or "") if hf is not None else ""

  def apply_chat_template(self, chat_history, add_generation_prompt: bool = True) -> str:
    """The tokenizer's chat template; lm-eval passes ``add_generation_prompt=False`` when the
    last message is the task's ``gen_prefix`` as an assistant turn: continue that turn (closing
    it would make the model start a new one)."""
    if not self.parts.tokenizer.has_chat_template:
      raise HarnessError(f"the tokenizer {self.parts.tokenizer.name!r} has no chat template: drop "
                         "--apply_chat_template, or give a tokenizer that has one")
    return self.parts.tokenizer.hf.apply_chat_template(
        chat_history, tokenize=False, add_generation_prompt=add_generation_prompt,
        continue_final_message=not add_generation_prompt)

  # --- helpers ----------------------------------------------------------------------------------
  def _eos_ids(self) -> list:
    p, ids = self.parts, set()
    eos = p.cfg.eos_token_id
    for e in (eos if isinstance(eos, (list, tuple)) else [eos]):
      if e is not None:
        ids.add(int(e))
    if p.tokenizer.eos_id is not None:
      ids.add(int(p.tokenizer.eos_id))
    ids.update(int(e) for e in p.extra_eos)
    return sorted(ids)

  def tok_encode(self, text: str) -> list:
    # lm-eval's HF model encodes without special tokens (a chat-templated prompt carries its own)
    return [int(i) for i in self.parts.tokenizer.encode(text, special=False)]

  def check_fits(self, n_tokens: int, what: str):
    """Refuse what the method cannot hold (host side, before any request runs)."""
    cap, why = self.parts.token_limit()
    if cap is not None and n_tokens > cap:
      raise HarnessError(
          f"{what} needs {n_tokens} tokens (input + output), more than method={self.parts.method} "
          f"holds ({cap}: {why}); evaluate shorter lengths (max_seq_lengths) or lower "
          "max_gen_toks, or use method=truncation")

  def _reserve(self, total: int):
    p = self.parts
    p.model = p.registry.with_room_for(p.model, p.cfg, p.settings, total)

  def _generate(self, rows, max_new: int, stop_ids, sampling: dict) -> list:
    from longjax.inference.generate import generate
    self._reserve(max(len(r) for r in rows) + max_new)
    out = generate(self.parts.model, self.parts.params, [list(r) for r in rows],
                   max_new_tokens=max_new, stop_ids=tuple(stop_ids), loop=self.loop, **sampling)
    return out.tokens

  def _suffix_nll(self, ids, n: int) -> float:
    ids = np.asarray(ids, np.int64)
    self._reserve(len(ids))
    s, _ = self.parts.registry.suffix_nll(self.parts.model, self.parts.params, self.parts.cfg,
                                          ids, n)
    return float(s)

  def _progress(self, total, desc, disable):
    from tqdm import tqdm
    return tqdm(total=total, desc=f"longjax {self.parts.method}: {desc}", disable=disable)

  # --- requests ---------------------------------------------------------------------------------
  def _gen_settings(self, gen_kwargs: dict):
    bad = sorted(set(gen_kwargs) - set(GEN_KWARGS))
    if bad:
      raise HarnessError(f"generation kwarg {bad[0]!r}{_near(bad[0], GEN_KWARGS)} is not supported "
                         f"by the longjax model; it takes {', '.join(GEN_KWARGS)}")
    until = gen_kwargs.get("until") or []
    until = [until] if isinstance(until, str) else list(until)
    max_new = _int("max_gen_toks", gen_kwargs.get("max_gen_toks", 256))
    temp = float(gen_kwargs.get("temperature", 0.0) or 0.0)
    if not gen_kwargs.get("do_sample", False):
      temp = 0.0
    sampling = dict(temperature=temp)
    if temp > 0:
      for k in ("top_k", "top_p", "seed"):
        if gen_kwargs.get(k) is not None:
          sampling[k] = gen_kwargs[k]
    return until, max_new, sampling

  def stop_ids_for(self, until) -> list:
    """EOS ids, plus every stop string that is one token on its own: a row may end there (the
    text is cut at the string anyway, so stopping there changes nothing before the cut)."""
    ids = set(self._eos_ids())
    for s in until:
      enc = self.tok_encode(s)
      if len(enc) == 1 and self.parts.tokenizer.decode(enc) == s:
        ids.add(enc[0])
    return sorted(ids)

  @staticmethod
  def cut(text: str, until) -> str:
    """The text before the first stop string (lm-eval's models split at each of them)."""
    for s in until:
      if s:
        text = text.split(s)[0]
    return text

  def generate_until(self, requests, disable_tqdm: bool = False) -> list:
    jobs = []
    results = [None] * len(requests)
    log = self.answer_log
    for i, req in enumerate(requests):
      if log is not None and (hit := log.get("generate_until", req.args)) is not None:
        results[i] = hit  # answered before a stop: the rerun goes on from there
        continue
      context, gen_kwargs = req.args
      until, max_new, sampling = self._gen_settings(dict(gen_kwargs or {}))
      ids = self.tok_encode(context)
      if not ids:
        ids = [self.prefix_token_id]
      if self.parts.window:
        ids = _middle(ids, self.parts.window)
      self.check_fits(len(ids) + max_new, f"request {i} ({len(ids)} prompt tokens + max_gen_toks "
                                          f"{max_new})")
      jobs.append((i, ids, until, max_new, sampling))
    # longest first (a failure or a memory limit shows at once), equal settings batched
    jobs.sort(key=lambda j: (-len(j[1]), j[3], repr(j[4]), j[0]))
    bar = self._progress(len(jobs), "generate_until", disable_tqdm)
    k = 0
    while k < len(jobs):
      batch = [jobs[k]]
      key = lambda j: (j[3], repr(j[4]), tuple(self.stop_ids_for(j[2])))  # noqa: E731
      while (len(batch) < self.batch_size and k + len(batch) < len(jobs)
             and key(jobs[k + len(batch)]) == key(batch[0])):
        batch.append(jobs[k + len(batch)])
      _, _, until0, max_new, sampling = batch[0]
      stops = self.stop_ids_for(until0)
      tokens = self._generate([j[1] for j in batch], max_new, stops, sampling)
      for (i, _, until, _, _), gen in zip(batch, tokens):
        if gen and gen[-1] in stops:
          gen = gen[:-1]
        text = self.cut(self.parts.tokenizer.decode(gen), until)
        results[i] = text
        self.cache_hook.add_partial("generate_until", requests[i].args, text)
        if log is not None:
          log.add("generate_until", requests[i].args, text)
      bar.update(len(batch))
      k += len(batch)
    bar.close()
    return results

  def _encode_pair(self, context: str, continuation: str):
    """lm-eval's rule: trailing spaces of the context move to the continuation, and the
    continuation's ids are those of the whole text after the context's."""
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces:
      continuation = context[-n_spaces:] + continuation
      context = context[:-n_spaces]
    whole = self.tok_encode(context + continuation)
    ctx = self.tok_encode(context)
    return ctx, whole[len(ctx):]

  def _scored(self, ctx, cont, what: str):
    """``ids`` to score whose last ``len(cont)`` tokens are ``cont``."""
    if not cont:
      raise HarnessError(f"{what}: the continuation is empty: nothing to score")
    ids = (list(ctx) or [self.prefix_token_id]) + list(cont)
    if self.parts.window:
      # each scored token reads at most W tokens (lm-eval's models keep the last max_length + 1)
      if len(cont) > self.parts.window:
        raise HarnessError(f"{what}: a continuation of {len(cont)} tokens does not fit "
                           f"window={self.parts.window}: raise window")
      ids = ids[-(self.parts.window + 1):]
    self.check_fits(len(ids), what)
    return ids

  def loglikelihood(self, requests, disable_tqdm: bool = False) -> list:
    jobs = []
    for i, req in enumerate(requests):
      context, continuation = req.args
      if context == "":
        ctx, cont = [self.prefix_token_id], self.tok_encode(continuation)
      else:
        ctx, cont = self._encode_pair(context, continuation)
      jobs.append((self._scored(ctx, cont, f"request {i}"), len(cont)))
    out = []
    bar = self._progress(len(jobs), "loglikelihood", disable_tqdm)
    for (ids, n), req in zip(jobs, requests):
      ll = -self._suffix_nll(ids, n)
      greedy = self._generate([ids[:-n]], n, (), dict(temperature=0.0))[0]
      res = (ll, [int(x) for x in greedy] == [int(x) for x in ids[-n:]])
      out.append(res)
      self.cache_hook.add_partial("loglikelihood", req.args, res)
      bar.update(1)
    bar.close()
    return out

  def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list:
    from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
    jobs = []
    for i, req in enumerate(requests):
      (text,) = req.args
      toks = self.tok_encode(text)
      if not toks:
        raise HarnessError(f"request {i}: the document is empty: nothing to score")
      if self.parts.window:  # the truncation baseline reads W tokens at a time
        wins = [make_disjoint_window(w) for w in get_rolling_token_windows(
            toks, self.prefix_token_id, self.parts.window, 1)]
      else:  # the whole document through the method
        wins = [([self.prefix_token_id], toks)]
      pieces = [(list(c) + list(p), len(p)) for c, p in wins]
      for ids, _ in pieces:
        self.check_fits(len(ids), f"request {i} ({len(toks)} tokens)")
      jobs.append(pieces)
    out = []
    bar = self._progress(len(jobs), "loglikelihood_rolling", disable_tqdm)
    for pieces, req in zip(jobs, requests):
      ll = -sum(self._suffix_nll(ids, n) for ids, n in pieces)
      out.append(ll)
      self.cache_hook.add_partial("loglikelihood_rolling", req.args, ll)
      bar.update(1)
    bar.close()
    return out


if HAVE_LM_EVAL and __name__ != "__main__":  # run as a script, main() imports the module proper
  _register_model(NAME)(LongjaxLM)


# ------------------------------------------------------------------------------------------------
def ruler_metric_lengths(task: str) -> Optional[list]:
  """The lengths a RULER task of lm-eval has a metric for (the metric keys of its task file or of
  the file it includes); None for a task that is not one of lm-eval's RULER files."""
  from lm_eval import tasks as tasks_pkg
  root = Path(tasks_pkg.__file__).parent / "ruler"

  def keys(text: str) -> list:
    return [int(line.split('"')[1]) for line in text.splitlines()
            if line.strip().startswith("- metric:") and line.count('"') >= 2
            and line.split('"')[1].isdigit()]

  for f in sorted(root.glob("*.yaml")):
    text = f.read_text()
    if f"task: {task}\n" not in text:
      continue
    for _ in range(8):  # a task file takes its metrics from the file it includes
      if keys(text):
        return keys(text)
      inc = [line.split(":", 1)[1].strip() for line in text.splitlines()
             if line.startswith("include:")]
      if not inc or not (root / inc[0]).is_file():
        return []
      text = (root / inc[0]).read_text()
    return []
  return None


def check_ruler_lengths(tasks, lengths) -> None:
  """A length with no metric key in the task file would be generated and then dropped from the
  results: refuse it up front."""
  for t in tasks:
    have = ruler_metric_lengths(t)
    if have is None:
      continue
    bad = [n for n in lengths if int(n) not in have]
    if bad:
      raise HarnessError(f"RULER task {t} has no metric for max_seq_lengths {bad} (its task file "
                         f"scores {have} only): use those lengths")


def _flag(argv, name):
  """The value of ``--name v`` / ``--name=v`` in ``argv`` and its index (or None)."""
  for i, a in enumerate(argv):
    if a == name and i + 1 < len(argv):
      return argv[i + 1], i + 1
    if a.startswith(name + "="):
      return a.split("=", 1)[1], i
  return None, None


def _prepare_cli(argv: list) -> list:
  """Checks the longjax model's arguments and RULER lengths before lm-eval starts, and gives
  RULER's tasks the model's tokenizer when none is named."""
  from lm_eval.utils import simple_parse_args_string
  argv = list(argv)
  model, _ = _flag(argv, "--model")
  meta_s, meta_i = _flag(argv, "--metadata")
  try:
    meta = json.loads(meta_s) if meta_s else {}
  except json.JSONDecodeError as e:
    raise HarnessError(f"--metadata is not JSON ({e.msg}): e.g. "
                       "--metadata '{\"max_seq_lengths\":[4096]}'") from None
  tasks_s, _ = _flag(argv, "--tasks")
  if tasks_s and meta.get("max_seq_lengths"):
    check_ruler_lengths([t.strip() for t in tasks_s.split(",") if t.strip()],
                        meta["max_seq_lengths"])
  if model != NAME:
    return argv
  ma_s, ma_i = _flag(argv, "--model_args")
  kw = simple_parse_args_string(ma_s or "")
  args = check_model_args(kw)
  if not (kw.get("tokenizer") or meta.get("tokenizer") or meta.get("pretrained")):
    tok = str(Path(args.tokenizer or checkpoint_dir(args)).resolve())
    new = f"{ma_s},tokenizer={tok}" if ma_s else f"tokenizer={tok}"
    if ma_i is None:
      argv += ["--model_args", new]
    elif argv[ma_i].startswith("--model_args="):
      argv[ma_i] = f"--model_args={new}"
    else:
      argv[ma_i] = new
  return argv


def main(argv=None) -> int:
  argv = sys.argv[1:] if argv is None else list(argv)
  try:
    require_lm_eval()
    argv = _prepare_cli(argv)
    from lm_eval.__main__ import cli_evaluate
    sys.argv = ["lm-eval", *argv]
    cli_evaluate()
  except LongjaxError as e:
    print(f"error: {one_line(e)}", file=sys.stderr)
    return 2
  return 0


if __name__ == "__main__":
  # the model is registered once, by the module under its own name (not this __main__ copy)
  from longjax.eval import harness as _harness
  sys.exit(_harness.main())
