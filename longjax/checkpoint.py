"""longjax's own checkpoint format: ``config.json`` (the ModelConfig) + ``params/`` (orbax).

Saving writes into a temporary sibling directory and renames it into place at the end, so a
crash never leaves a directory that looks like a complete checkpoint.
"""
from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import jax

from longjax.atomic_dir import atomic_dir
from longjax.models.config import ModelConfig

CONFIG_FILE = "config.json"
PARAMS_DIR = "params"
FORMAT_KEY = "longjax_model_config"


def _tuples(v):
  if isinstance(v, list):
    return tuple(_tuples(x) for x in v)
  return v


def config_to_json(cfg: ModelConfig) -> dict:
  return {FORMAT_KEY: dataclasses.asdict(cfg)}


def config_from_json(d: dict) -> ModelConfig:
  if FORMAT_KEY not in d:
    raise ValueError("this config.json is not a longjax checkpoint config (no "
                     f"'{FORMAT_KEY}' key); for a HF directory use longjax.convert.load_hf")
  return ModelConfig(**{k: _tuples(v) for k, v in d[FORMAT_KEY].items()})


def is_longjax_checkpoint(path) -> bool:
  path = Path(path)
  return (path / PARAMS_DIR).is_dir() and (path / CONFIG_FILE).exists()


def save(path, cfg: ModelConfig, params, *, extra: dict | None = None, overwrite: bool = False,
         files: dict | None = None):
  """Save ``params`` (any pytree of arrays) and ``cfg`` under ``path``.

  ``files`` (name -> source path) are copied in as well, e.g. the tokenizer files, so that
  ``AutoTokenizer.from_pretrained(path)`` works on the checkpoint; they are part of the atomic write.
  """
  import orbax.checkpoint as ocp
  path = Path(path).absolute()
  for name in files or {}:
    if name in (CONFIG_FILE, PARAMS_DIR) or Path(name).name != name:
      raise ValueError(f"cannot store an extra file named {name!r} in a longjax checkpoint")
  with atomic_dir(path, overwrite) as tmp:
    for name, src in (files or {}).items():
      shutil.copyfile(src, tmp / name)
    meta = config_to_json(cfg)
    if extra:
      meta["extra"] = extra
    (tmp / CONFIG_FILE).write_text(json.dumps(meta, indent=2))
    with ocp.StandardCheckpointer() as ckptr:
      ckptr.save(tmp / PARAMS_DIR, params)
      ckptr.wait_until_finished()
  return path


def load(path):
  """Return ``(cfg, params, extra)`` from a directory written by :func:`save`."""
  import orbax.checkpoint as ocp
  path = Path(path).absolute()
  if not is_longjax_checkpoint(path):
    raise FileNotFoundError(f"{path} is not a longjax checkpoint (expected {CONFIG_FILE} and "
                            f"{PARAMS_DIR}/); convert a HF directory with convert_weights.py first")
  meta = json.loads((path / CONFIG_FILE).read_text())
  cfg = config_from_json(meta)
  with ocp.StandardCheckpointer() as ckptr:
    params = ckptr.restore(path / PARAMS_DIR)
  return cfg, params, meta.get("extra", {})


def load_any(path, **hf_kwargs):
  """Load a longjax checkpoint or a HF directory (converted on the fly) as ``(cfg, params)``."""
  if is_longjax_checkpoint(path):
    cfg, params, _ = load(path)
    return cfg, params
  from longjax.convert.hf import load_hf
  cfg, params = load_hf(path, **hf_kwargs)
  return cfg, jax.tree.map(jax.numpy.asarray, params)
