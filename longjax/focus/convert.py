"""FocusLLM checkpoints: official HF state dicts in and out, and initialisation from a plain LLM.

An official FocusLLM checkpoint (docs/focusllm.md §7) is a full LLaMA state dict plus per layer
``self_attn.beacon_{q,k,v,o}_proj`` weights (the candidate projections, the decoder's ``alt_*``)
and ``model.beacon_embed_tokens.weight`` (created but never used by any forward: accepted, dropped
by default). Its config.json carries ``local_window`` / ``memory_stride`` / ``beacon_param``.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Optional

from longjax import method_names
from longjax.ckpts.hf import (CheckpointError, check_method, load_hf, method_stamp,
                                read_hf_config, save_hf, shard_map)
from longjax.ckpts.layout import alt_embedding_row, embed_init_token
from longjax.ckpts.table import ALT_EMBEDDING_NAME, alt_proj_name
from longjax.focus.config import FocusConfig, FocusError

_EMBED = ALT_EMBEDDING_NAME


def _as_hf_dir(path, stack):
  """A directory load_hf can read. ``path`` may be a HF directory, a directory holding a single
  ``*.safetensors`` file under another name (e.g. ``weights.safetensors``), or such a file."""
  path = Path(path)
  if path.is_dir():
    try:
      shard_map(path)
      return path
    except CheckpointError:
      files = sorted(path.glob("*.safetensors"))
      if len(files) != 1:
        raise
      weights, config = files[0], path / "config.json"
  else:
    weights, config = path, path.parent / "config.json"
  tmp = tempfile.TemporaryDirectory(prefix="longjax-focus-")
  stack.append(tmp)
  os.symlink(weights.resolve(), Path(tmp.name) / "model.safetensors")
  if config.exists():
    os.symlink(config.resolve(), Path(tmp.name) / "config.json")
  return Path(tmp.name)


def load_focus(path, fcfg: Optional[FocusConfig] = None, *, init_candidates: Optional[str] = None,
               keep_unused_embedding: bool = False, param_dtype: Optional[str] = None,
               **focus_overrides):
  """Load a FocusLLM (or plain LLaMA) checkpoint as ``(ModelConfig, FocusConfig, params)``.

  Args:
    fcfg: settings; default read from config.json (``local_window``, ``memory_stride``,
      ``beacon_param``), with ``focus_overrides`` (FocusConfig fields) applied.
    init_candidates: ``"copy"`` fills candidate projections missing from the checkpoint with copies
      of the layer's q/k/v/o (the official ``from_pretrained``); ``None``: missing ones are an
      error.
    keep_unused_embedding: keep ``beacon_embed_tokens`` as ``params["alt_embedding"]`` (no forward
      reads it); by default it is dropped.
  """
  stack = []
  try:
    hf_dir = _as_hf_dir(path, stack)
    hf = read_hf_config(hf_dir)
    check_method(hf, method_names.FOCUS, path)
    if fcfg is None:
      fcfg = FocusConfig.from_hf(hf, **focus_overrides)
    elif focus_overrides:
      fcfg = fcfg.replace(**focus_overrides)
    names = set(shard_map(hf_dir))
    present = [p for p in fcfg.candidate_projections if alt_proj_name(p) in names]
    if len(present) < len(fcfg.candidate_projections) and init_candidates is None:
      missing = [p for p in fcfg.candidate_projections if p not in present]
      raise FocusError(
          f"checkpoint {path} has no candidate projections for {missing} "
          f"({alt_proj_name('{' + ','.join(missing) + '}', '*')}); for a plain "
          "LLM pass init_candidates='copy' to initialise them from q/k/v/o as the official "
          "from_pretrained does")
    if init_candidates not in (None, "copy"):
      raise FocusError(f"init_candidates must be 'copy' or None, got {init_candidates!r}")
    cfg, params = load_hf(hf_dir, alt_init=init_candidates, param_dtype=param_dtype,
                          alt_projections=tuple(fcfg.candidate_projections),
                          num_alt_embeddings=1 if _EMBED in names else 0)
  finally:
    for t in stack:
      t.cleanup()
  if cfg.num_alt_embeddings and not keep_unused_embedding:
    params.pop("alt_embedding", None)
    cfg = cfg.replace(num_alt_embeddings=0)
  return cfg, fcfg, params


def focus_from_llama(path, fcfg: Optional[FocusConfig] = None, **kw):
  """A FocusLLM from a plain LLaMA checkpoint: candidate projections = copies of q/k/v/o."""
  return load_focus(path, fcfg if fcfg is not None else FocusConfig(), init_candidates="copy", **kw)


def save_focus(out_dir, cfg, fcfg: FocusConfig, params, *, include_unused_embedding: bool = True,
               **kw):
  """Export an official-layout FocusLLM checkpoint (full state dict + ``beacon_*`` tensors, and
  the FocusLLM fields in config.json, plus ``longjax_method`` so that load_beacon refuses it).
  ``beacon_embed_tokens`` is written (kept if loaded, else ``embed_tokens[eos]`` like the
  official init) unless ``include_unused_embedding=False``."""
  params = dict(params)
  if include_unused_embedding and not cfg.num_alt_embeddings:
    eos = embed_init_token(cfg, "eos")
    # No EOS in the config: row 0, a placeholder (no FocusLLM forward reads this tensor).
    params["alt_embedding"] = alt_embedding_row(params["embedding"], eos if eos is not None else 0)
    cfg = cfg.replace(num_alt_embeddings=1)
  elif not include_unused_embedding and cfg.num_alt_embeddings:
    params.pop("alt_embedding", None)
    cfg = cfg.replace(num_alt_embeddings=0)
  return save_hf(out_dir, cfg, params, extra_config={**fcfg.to_hf(),
                                                  **method_stamp(method_names.FOCUS)}, **kw)
