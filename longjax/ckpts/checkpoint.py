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

from longjax.ckpts.atomic_dir import atomic_dir
from longjax.errors import LongjaxError, PathNotFound, write_failed
from longjax.ckpts.hf import CheckpointError
from longjax.models.config import ModelConfig, ModelConfigError, hf_json


class CheckpointReadError(LongjaxError, ValueError):
  """A longjax checkpoint whose files cannot be read (truncated or damaged)."""


CONFIG_FILE = "config.json"
PARAMS_DIR = "params"
FORMAT_KEY = "longjax_model_config"


def _tuples(v):
  if isinstance(v, list):
    return tuple(_tuples(x) for x in v)
  return v


def config_to_json(cfg: ModelConfig) -> dict:
  d = dataclasses.asdict(cfg)
  if cfg.hf_extra is not None:  # the source HF config as a JSON object, readable in the file
    d["hf_extra"] = json.loads(cfg.hf_extra)
  return {FORMAT_KEY: d}


def config_from_json(d: dict) -> ModelConfig:
  if FORMAT_KEY not in d:
    raise ModelConfigError("this config.json is not a longjax checkpoint config (no "
                     f"'{FORMAT_KEY}' key); for a HF directory use longjax.ckpts.load_hf")
  fields = {k: _tuples(v) for k, v in d[FORMAT_KEY].items() if k != "hf_extra"}
  extra = d[FORMAT_KEY].get("hf_extra")
  if isinstance(extra, list):
    extra = _legacy_hf(ModelConfig(**fields), extra)
  if isinstance(extra, dict):
    extra = hf_json(extra)
  return ModelConfig(**fields, hf_extra=extra)


# HF config fields that are dicts; old checkpoints wrote an empty one as [] (transformers refuses
# it).
_DICT_FIELDS = ("pruned_heads", "id2label", "label2id", "task_specific_params")


def _legacy_hf(cfg: ModelConfig, pairs: list) -> dict:
  """The HF config of a checkpoint written before hf_extra held the whole config: it held only
  the unused keys, as [key, value] pairs, dicts nested as pairs too. Rebuilt as that version
  exported it: those keys, then the fields the config determines (a stored architectures wins)."""
  extra = {k: _legacy_value(v) for k, v in pairs}
  for k in _DICT_FIELDS:
    if extra.get(k) == []:
      extra[k] = {}
  fields = cfg.to_hf()
  if "architectures" in extra:
    del fields["architectures"]
  return {**extra, **fields}


def _legacy_value(v):
  if isinstance(v, list):
    if v and all(isinstance(x, list) and len(x) == 2 and isinstance(x[0], str) for x in v):
      return {k: _legacy_value(x) for k, x in v}
    return [_legacy_value(x) for x in v]
  return v


def is_longjax_checkpoint(path) -> bool:
  path = Path(path)
  return (path / PARAMS_DIR).is_dir() and (path / CONFIG_FILE).exists()


def save(path, cfg: ModelConfig, params, *, extra: dict | None = None, overwrite: bool = False,
         files: dict | None = None):
  """Save ``params`` (any pytree of arrays) and ``cfg`` under ``path``.

  ``files`` (name -> source path) are copied in as well, e.g. the tokenizer files, so that
  ``AutoTokenizer.from_pretrained(path)`` works on the checkpoint; they are part of the atomic
  write.

  In a multi-process run one process calls it and writes alone (the others would race it on
  the same path); :func:`load` is called by all of them.
  """
  import orbax.checkpoint as ocp
  path = Path(path).absolute()
  for name in files or {}:
    if name in (CONFIG_FILE, PARAMS_DIR) or Path(name).name != name:
      raise CheckpointError(f"cannot store an extra file named {name!r} in a longjax checkpoint")
  try:
    with atomic_dir(path, overwrite) as tmp:
      for name, src in (files or {}).items():
        shutil.copyfile(src, tmp / name)
      meta = config_to_json(cfg)
      if extra:
        meta["extra"] = extra
      (tmp / CONFIG_FILE).write_text(json.dumps(meta, indent=2))
      with ocp.StandardCheckpointer(multiprocessing_options=_this_process_only()) as ckptr:
        ckptr.save(tmp / PARAMS_DIR, params)
        ckptr.wait_until_finished()
  except LongjaxError:
    raise
  except Exception as e:  # noqa: BLE001 -- disk full and I/O errors, in whatever type they come
    raise write_failed(path, e) from e
  return path


def _this_process_only():
  """orbax options for a write by the calling process alone: without them orbax waits at a
  barrier for every process of a multi-process run."""
  from orbax.checkpoint import options
  if jax.process_count() == 1:
    return options.MultiprocessingOptions()
  me = jax.process_index()
  return options.MultiprocessingOptions(primary_host=me, active_processes={me})


def load(path):
  """Return ``(cfg, params, extra)`` from a directory written by :func:`save`."""
  import orbax.checkpoint as ocp
  path = Path(path).absolute()
  if not is_longjax_checkpoint(path):
    raise PathNotFound(f"{path} is not a longjax checkpoint (expected {CONFIG_FILE} and "
                       f"{PARAMS_DIR}/); convert a HF directory with convert_weights.py first")
  if not (path / CONFIG_FILE).is_file():  # a FIFO would block the read forever
    raise ModelConfigError(f"{path / CONFIG_FILE} is not a regular file (a FIFO, device or "
                           "directory); replace it with the checkpoint's config file")
  try:
    meta = json.loads((path / CONFIG_FILE).read_text(encoding="utf-8"))
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise ModelConfigError(f"{path / CONFIG_FILE} is not valid JSON ({e}): the checkpoint is "
                           "damaged; convert or save it again") from None
  if not isinstance(meta, dict) or not isinstance(meta.get(FORMAT_KEY, {}), dict):
    raise ModelConfigError(f"{path / CONFIG_FILE} is not a longjax checkpoint config (a JSON "
                           "object with a 'longjax_model_config' object); convert or save it again")
  try:
    cfg = config_from_json(meta)
  except TypeError as e:  # unknown or missing ModelConfig fields
    known = sorted(f.name for f in dataclasses.fields(ModelConfig))
    unknown = sorted(set(meta[FORMAT_KEY]) - set(known))
    raise ModelConfigError(f"{path / CONFIG_FILE} does not fit this version's model config "
                           f"({'unknown fields ' + ', '.join(unknown) if unknown else e}); it was "
                           "written by another longjax version or edited: "
                           "convert it again") from None
  try:
    with ocp.StandardCheckpointer() as ckptr:
      params = ckptr.restore(path / PARAMS_DIR)
  except Exception as e:  # noqa: BLE001 -- orbax / tensorstore raise many kinds for a cut file
    raise CheckpointReadError(f"cannot read the parameters in {path / PARAMS_DIR} "
                              f"({type(e).__name__}: {' '.join(str(e).split())[:300]}): truncated "
                              "or damaged; convert or save the checkpoint again") from None
  return cfg, params, meta.get("extra", {})


def load_any(path, **hf_kwargs):
  """Load a longjax checkpoint or a HF directory (converted on the fly) as ``(cfg, params)``."""
  if is_longjax_checkpoint(path):
    cfg, params, _ = load(path)
    return cfg, params
  from longjax.ckpts.hf import load_hf
  cfg, params = load_hf(path, **hf_kwargs)
  return cfg, jax.tree.map(jax.numpy.asarray, params)
