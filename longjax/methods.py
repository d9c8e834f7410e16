"""The methods longjax runs, one object each, looked up once by name.

Everything that differs between Activation Beacon, FocusLLM and the plain decoder lives on its
method object: its settings built from the run config, the parameters it adds to a base
checkpoint and trains, how a checkpoint is loaded for it, its training task, its inference model
and the most input + output tokens that model holds (``token_limit``; "capacity" is kept for the
size of a fixed buffer, in entries), how it scores a suffix, and its export. ``train.py``,
``eval.py`` and the scripts call :func:`get` once and never branch on the method name.

The module imports the method packages lazily: looking a method up costs nothing.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import numpy as np

from longjax import method_names
# UnknownMethodError: what get refuses (raised by method_names.entry, below this registry)
from longjax.method_names import UnknownMethodError, entry
from longjax.runtime.rounding import round_up


def _tiny_shape(model_section, tokenizer, **fields):
  """The ModelConfig of a tiny model shaped by ``config.model`` (``run_config.ModelSection``)
  around ``tokenizer`` (train.py pretrains one; eval.py builds a random one when no checkpoint is
  given)."""
  from longjax.models.config import ModelConfig
  m = model_section
  return ModelConfig(family=m.family, vocab_size=tokenizer.vocab_size,
                     hidden_size=m.hidden_size, intermediate_size=m.intermediate_size,
                     num_layers=m.num_layers, num_heads=m.num_heads,
                     num_kv_heads=m.num_kv_heads, head_dim=m.head_dim,
                     attention_bias=m.family == "qwen2", bos_token_id=tokenizer.bos_id,
                     eos_token_id=tokenizer.eos_id, pad_token_id=0,
                     max_position_embeddings=int(m.max_position_embeddings),
                     rope_theta=float(m.rope_theta), **fields)


def tiny_model_config(config, tokenizer, method: "Method"):
  """The tiny model of ``config.model`` with ``method``'s extra parameters declared (``config``:
  the run's ``RunConfig``)."""
  projections, n_embed, _ = method.extra_params(method.settings(config, tokenizer.bos_id))
  return _tiny_shape(config.model, tokenizer, alt_projections=projections,
                     num_alt_embeddings=n_embed)


def base_config(config, tokenizer):
  """The tiny base (no method parameters) that train.py pretrains as a plain LM."""
  return _tiny_shape(config.model, tokenizer)


def _hf_bos(path) -> Optional[int]:
  from longjax.ckpts.hf import read_hf_config
  return read_hf_config(path).get("bos_token_id")


# ------------------------------------------------------------------------------------------------
class Beacon:
  """Activation Beacon: the ``beacon`` config section, the official ``beacon_*`` tensors."""
  name = method_names.BEACON.name
  section = method_names.BEACON.section  # the run config's section of its settings
  eval_protocols = method_names.BEACON  # eval_config's defaults: the Activation Beacon paper's
  assets = True  # its trained tensors travel as a small asset (train.init_from starts from one)
  # settings that change where the trained tensors are used, not what they are: a run may start
  # from an asset trained with another value (e.g. stride 256 -> 128: overlapping windows; the
  # ratios drawn: one beacon embedding and one set of projections serve every ratio; the beacons'
  # attention pattern, step-expansion vs full-coverage: which raw tokens each beacon reads)
  layout_only_fields = ("stride", "ratios", "ratio_mix", "attn")
  reads_bos = False  # settings do not depend on the model's BOS
  plan_batch_axis = 1  # WindowPlan leaves are [windows, batch, ...]
  groups_by_windows = True  # batches of equal window counts: one compile per count
  batch_divides_mesh = True  # each data shard gets whole samples
  truncates = False
  exports = True

  def settings(self, config, bos_id=None):
    from longjax.beacon.config import BeaconConfig
    return BeaconConfig.from_config(config.beacon)

  def extra_params(self, settings):
    """``(projections, extra embedding rows, embedding init)`` this method adds to a base."""
    return tuple(settings.param), 1, settings.embed_init

  def is_trainable(self, path: str) -> bool:
    """Its projections and its beacon embedding (``alt_*``), nothing of the base."""
    from longjax.ckpts.layout import is_alt
    return is_alt(path)

  def load_hf(self, path, settings, param_dtype=None):
    """A HF directory: official tensors where present, the official init for the rest."""
    from longjax.beacon import load_beacon
    cfg, _, params = load_beacon(path, init="official", beacon=settings, param_dtype=param_dtype)
    return cfg, params

  def make_task(self, config, cfg, settings, *, max_length: int, lm_length=None):
    from longjax.beacon.task import BeaconTask
    from longjax.models.config import remat_mode
    tc, loss_on = config.train, config.data.loss_on
    return BeaconTask(cfg, settings, max_length=max_length, seed=int(config.seed),
                      remat=remat_mode(tc.remat), step_bucket=int(tc.step_bucket), impl=tc.impl,
                      answer_only=loss_on == "answer", layout=tc.layout, distill=tc.distill,
                      default_objective={"all": "lm"}.get(loss_on, loss_on))

  def inference_model(self, cfg, settings, *, max_length: Optional[int] = None):
    from longjax.beacon import BeaconLM
    return BeaconLM(cfg, settings, max_length=max_length or 4 * settings.window, progress=False)

  def with_room_for(self, model, cfg, settings, total: int):
    """``model``, or one whose memory buffers hold ``total`` tokens (rebuilt: recompiles)."""
    if total <= model.max_length:
      return model
    return self.inference_model(cfg, settings, max_length=round_up(total, settings.window))

  def token_limit(self, cfg, settings):
    """``(most input + output tokens, why)``: positions left after the window, times the
    largest compression ratio, plus the window."""
    pos = settings.positive_ratios
    cap = (cfg.max_positions if not pos
           else (cfg.max_positions - settings.window) * max(pos) + settings.window)
    return cap, (f"(max positions {cfg.max_positions} - window {settings.window}) x largest ratio "
                 f"{max(pos or (1,))} + window")

  def suffix_nll(self, model, params, cfg, ids, n: int):
    labels = ids.copy()
    labels[:len(ids) - n] = -100
    out = model.forward(params, ids, labels=labels, training=False)
    return float(np.asarray(out.loss_sum)[0]), int(np.asarray(out.loss_count)[0])

  def export(self, out, cfg, settings, params):
    from longjax.beacon import save_beacon
    save_beacon(out, cfg, settings, params, overwrite=True)

  def load_asset(self, path, base_dir=None):
    """``(cfg, settings, params)`` of a committed beacon asset (``train.init_from``)."""
    from longjax.beacon.asset import load_beacon_asset
    return load_beacon_asset(path, base_dir)


# ------------------------------------------------------------------------------------------------
class Focus:
  """FocusLLM: the ``focus`` config section, candidate projections stored as ``beacon_*``."""
  name = method_names.FOCUS.name
  section = method_names.FOCUS.section
  eval_protocols = method_names.FOCUS  # the FocusLLM paper's
  assets = True  # its candidate projections travel as a small asset (longjax/focus/asset.py)
  # the candidate gate weighs the candidates when they are read (docs/focusllm.md §4.5), the
  # chunk overlap widens what each chunk row reads and the chunk vote mixes the surest chunk's
  # own prediction in; the projections are the same tensors, so a run with any of them may start
  # from an asset without them
  layout_only_fields = ("candidate_gate", "gate_threshold", "gate_gain", "gate_peer_gain",
                        "gate_top_k", "chunk_overlap", "chunk_vote", "vote_min",
                        "vote_open")
  reads_bos = True  # every chunk starts with the model's BOS
  plan_batch_axis = 0
  groups_by_windows = False
  # the packed chunk rows, not the samples, are what is sharded: any micro-batch size works
  batch_divides_mesh = False
  truncates = False
  exports = True

  def settings(self, config, bos_id=None):
    """``bos_id``: the model's BOS, inserted at the start of every chunk (None: the official 1)."""
    from longjax.focus.config import FocusConfig
    return FocusConfig.from_config(config.focus, bos_id)

  def extra_params(self, settings):
    return tuple(settings.candidate_projections), 0, "eos"

  def is_trainable(self, path: str) -> bool:
    """Only the candidate projections (its beacon embedding is never read)."""
    from longjax.ckpts.layout import is_alt_projection
    return is_alt_projection(path)

  def load_hf(self, path, settings, param_dtype=None):
    from longjax.focus import load_focus
    cfg, _, params = load_focus(path, settings, init_candidates="copy", param_dtype=param_dtype)
    return cfg, params

  def make_task(self, config, cfg, settings, *, max_length: int, lm_length=None):
    from longjax.focus.task import FocusTask
    from longjax.models.config import remat_mode
    f, tc = config.focus, config.train
    return FocusTask(cfg, settings, dict(window=f.local_window, strides=tuple(f.strides),
                                         min_local=f.min_local, objective=f.objective,
                                         steps=f.steps,
                                         dense_share=f.dense_share),
                     seed=int(config.seed), impl=tc.impl, remat=remat_mode(tc.remat),
                     default_objective=config.data.loss_on, distill=tc.distill)

  def inference_model(self, cfg, settings, *, max_length: Optional[int] = None):
    from longjax.focus import FocusLLM
    return FocusLLM(cfg, settings)

  def with_room_for(self, model, cfg, settings, total: int):
    return model  # chunks are planned per call: nothing to size

  def token_limit(self, cfg, settings):
    p = cfg.max_positions
    cap = min(settings.max_chunks, max(p - settings.local_window - 1, 0)) * settings.chunk_stride
    return cap + settings.local_window, (
        f"min(max_chunks {settings.max_chunks}, positions) x stride {settings.chunk_stride} + "
        f"local window {settings.local_window}")

  def suffix_nll(self, model, params, cfg, ids, n: int):
    """FocusLLM protocol (``inference_ppl_forward``): prefill on the context, then teacher-forced
    decode steps over the held-out tokens, each scored by the logits before it (one device loop:
    ``teacher_forcing.teacher_forced_nll``)."""
    from longjax.inference.teacher_forcing import teacher_forced_nll
    ids = np.asarray(ids, np.int32)
    ctx, tgt = ids[:len(ids) - n], ids[len(ids) - n:]
    logits, state = model.prefill(params, ctx[None], np.array([len(ctx)], np.int32), n)
    nll = teacher_forced_nll(model.device_plan(state, n - 1), params, logits, tgt[None])
    return float(np.sum(nll)), n

  def export(self, out, cfg, settings, params):
    from longjax.focus import save_focus
    save_focus(out, cfg, settings, params, overwrite=True)

  def load_asset(self, path, base_dir=None):
    """``(cfg, settings, params)`` of a committed FocusLLM asset (``train.init_from``)."""
    from longjax.focus.asset import load_focus_asset
    return load_focus_asset(path, base_dir)


# ------------------------------------------------------------------------------------------------
class Plain:
  """The base decoder alone: the truncation baseline of eval.py (``plain``) and the LM
  pretraining of the tiny bases in train.py (``lm``, every parameter trained)."""
  name = method_names.PLAIN.name
  section = method_names.PLAIN.section  # None: no settings of its own
  eval_protocols = method_names.BEACON  # the truncation baseline of the Activation Beacon paper
  assets = False
  layout_only_fields = ()
  reads_bos = False
  plan_batch_axis = 0
  groups_by_windows = False
  batch_divides_mesh = True
  truncates = True  # eval inputs are middle-truncated to what the model holds
  exports = False  # train.py's "lm" runs pretrain the tiny bases: the parameters are the result

  def settings(self, config, bos_id=None):
    return None

  def extra_params(self, settings):
    return (), 0, "eos"

  def is_trainable(self, path: str) -> bool:
    """Every parameter (train.py's ``lm`` runs pretrain the tiny bases)."""
    return True

  def load_hf(self, path, settings, param_dtype=None):
    from longjax.ckpts.checkpoint import load_any
    return load_any(path)

  def make_task(self, config, cfg, settings, *, max_length: int, lm_length=None):
    from longjax.plain import LMTask
    return LMTask(cfg, length=lm_length, seed=int(config.seed),
                  answer_only=config.data.loss_on == "answer")

  def inference_model(self, cfg, settings, *, max_length: Optional[int] = None):
    from longjax.plain import BucketedPlainLM
    return BucketedPlainLM(cfg)

  def with_room_for(self, model, cfg, settings, total: int):
    return model

  def token_limit(self, cfg, settings):
    return None, "truncates its input instead"

  def suffix_nll(self, model, params, cfg, ids, n: int):
    """One forward over ``ids``, the LM head applied block by block (``plain.suffix_nll``)."""
    from longjax.plain import suffix_nll
    return suffix_nll(cfg, params, ids, n)

  def export(self, out, cfg, settings, params):
    raise UnknownMethodError("the plain decoder has no method tensors to export: train.py's 'lm' "
                             "runs return their parameters instead")


# ------------------------------------------------------------------------------------------------
Method = Beacon | Focus | Plain
_REGISTRY = {m.name: m for m in (Beacon(), Focus(), Plain())}
# train.py's config.method spells the plain decoder "lm" (it pretrains it)
PRETRAIN = method_names.PLAIN_PRETRAIN
NAMES = tuple(_REGISTRY)
ALL = tuple(_REGISTRY.values())


def get(name: str) -> Method:
  """The method called ``name`` (``beacon``, ``focus``, ``plain``; ``lm`` = ``plain``)."""
  return _REGISTRY[entry(name).name]


def load(method: Method, path, config, *, param_dtype=None):
  """``(cfg, params, settings)``: the checkpoint at ``path`` (a HF directory or a longjax
  checkpoint) with ``method``'s extra parameters, initialised as the official
  ``from_pretrained`` does where the checkpoint lacks them."""
  from longjax.ckpts import checkpoint as ckpt
  p = Path(path)
  if ckpt.is_longjax_checkpoint(p):
    cfg, params, _ = ckpt.load(p)
    settings = method.settings(config, cfg.bos_token_id)
  else:
    settings = method.settings(config, _hf_bos(p) if method.reads_bos else None)
    cfg, params = method.load_hf(p, settings, param_dtype)
  return (*with_extra_params(method, cfg, params, settings), settings)


def with_extra_params(method: Method, cfg, params, settings):
  """``(cfg, params)`` with ``method``'s extra parameters (kept where present)."""
  from longjax.ckpts.layout import add_alt_params
  projections, n_embed, embed_init = method.extra_params(settings)
  if not projections and not n_embed:
    return cfg, params
  return add_alt_params(cfg, params, projections, n_embed, embed_init)
