"""Read and write HF safetensors checkpoints, one tensor at a time.

Reading never holds more than the output tree plus one tensor: each shard is opened on its own
(``safetensors`` numpy API, memory-mapped), every tensor is transformed straight into its slot of a
preallocated output array, then dropped. Writing goes to a temporary directory that is renamed into
place only when every shard is complete, so an interrupted export never leaves a half-written
checkpoint that looks whole.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional

import numpy as np
from safetensors import safe_open as _safe_open
from safetensors.numpy import save_file

from longjax import method_names
from longjax.ckpts.atomic_dir import atomic_dir
from longjax.ckpts.layout import (alt_embedding_row, copy_projection, embed_init_token, is_alt,
                                    is_alt_projection)
from longjax.ckpts.table import (ALT_EMBEDDING_NAME, IGNORED_SUFFIXES, alt_proj_name,
                                   alt_projections_in, expected_names, get_path, hf_shape,
                                   put_tensor, rows_for, set_path)
from longjax.models.config import ModelConfig
from longjax.models.decoder import param_shapes
from longjax.errors import LongjaxError

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"


class CheckpointError(LongjaxError, ValueError):
  """A checkpoint does not match what the model config says it should hold."""


def regular_file(path, what: str = "checkpoint file") -> Path:
  """``path``, refused unless it is a regular file (symlinks followed): reading a FIFO blocks
  forever, a device or directory fails deep inside the reader (the GGUF path refuses them too)."""
  path = Path(path)
  if path.exists() and not path.is_file():
    raise CheckpointError(f"{what} {path} is not a regular file (a FIFO, device or directory); "
                          "replace it with the file itself")
  return path


def safe_open(path, framework="np"):
  """``safetensors.safe_open`` whose failures (truncated or corrupt file) name the file."""
  if not Path(path).exists():
    raise CheckpointError(f"checkpoint shard {path} is missing (listed in the index?)")
  regular_file(path, "checkpoint shard")
  try:
    return _safe_open(path, framework=framework)
  except Exception as e:  # noqa: BLE001 -- SafetensorError is not importable by a stable name
    raise CheckpointError(f"cannot read {path}: {e} (truncated or corrupt safetensors file?)") \
        from None


def _read_json(path: Path) -> dict:
  regular_file(path)
  try:
    return json.loads(path.read_text(encoding="utf-8"))
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise CheckpointError(f"{path} is not valid JSON ({e})") from None


def _listing(names, limit=20) -> str:
  names = sorted(names)
  more = f" ... and {len(names) - limit} more" if len(names) > limit else ""
  return ", ".join(names[:limit]) + more


def shard_map(hf_dir) -> dict:
  """HF tensor name -> shard file path, for single-file and sharded checkpoints."""
  hf_dir = Path(hf_dir)
  if (hf_dir / INDEX_FILE).exists():
    return index_shards(hf_dir, _read_json(hf_dir / INDEX_FILE))
  if (hf_dir / SINGLE_FILE).exists():
    with safe_open(hf_dir / SINGLE_FILE, framework="np") as f:
      return {name: hf_dir / SINGLE_FILE for name in f.keys()}
  if list(hf_dir.glob("*.bin")) or list(hf_dir.glob("*.pt")):
    raise CheckpointError(f"{hf_dir} holds only pickle checkpoints (.bin/.pt); longjax loads "
                          "safetensors only. Re-save it with "
                          "save_pretrained(safe_serialization=True).")
  raise CheckpointError(f"no {SINGLE_FILE} or {INDEX_FILE} in {hf_dir}")


def index_shards(hf_dir: Path, index, index_name: str = INDEX_FILE,
                  fix: str = "re-save the checkpoint with save_pretrained") -> dict:
  """The index's ``weight_map`` checked: a JSON object of tensor name -> shard file name, each
  shard inside ``hf_dir`` (an absolute name or ``..`` would read files from elsewhere into the
  output). ``index_name`` and ``fix`` word the messages (trained-tensor assets share this check,
  ``longjax.ckpts.assets``)."""
  path = hf_dir / index_name
  weight_map = index.get("weight_map") if isinstance(index, dict) else None
  if not isinstance(weight_map, dict):
    got = (f"a JSON {type(index).__name__}" if not isinstance(index, dict) else
           "no 'weight_map'" if "weight_map" not in index else
           f"a 'weight_map' that is a JSON {type(weight_map).__name__}")
    raise CheckpointError(f"{path} holds {got}, not an object with a 'weight_map' of tensor "
                          f"name -> shard file; {fix}")
  out = {}
  for name, f in weight_map.items():
    if not isinstance(f, str) or not f:
      raise CheckpointError(f"{path}: tensor {name!r} maps to {f!r}, not a shard file name")
    p = Path(f)
    if p.is_absolute() or ".." in p.parts:
      raise CheckpointError(f"{path}: tensor {name!r} names the shard {f!r}, outside the "
                            f"checkpoint directory; shard names must be files inside {hf_dir}")
    out[name] = hf_dir / p
  return out


def read_hf_config(hf_dir) -> dict:
  path = Path(hf_dir) / "config.json"
  if not path.exists():
    raise CheckpointError(f"{hf_dir} has no config.json: is it a HF model directory?")
  return _read_json(path)


# config.json field naming the method an export was trained with (written by save_beacon /
# save_focus): loading it as the other method would silently invent that method's settings.
METHOD_KEY = "longjax_method"


def checkpoint_method(hf: dict):
  """``(method name, why)`` for a config.json that shows which method it belongs to, else
  ``(None, "")`` (a plain LLM). Official checkpoints have no METHOD_KEY: each method's official
  fields (``method_names.MethodName.official_fields``) tell them apart, when only one method's
  are there."""
  if hf.get(METHOD_KEY) is not None:
    return hf[METHOD_KEY], f"{METHOD_KEY}={hf[METHOD_KEY]!r}"
  found = {m.name: [k for k in m.official_fields if k in hf] for m in method_names.ALL}
  found = {name: keys for name, keys in found.items() if keys}
  if len(found) != 1:  # none, or several: nothing to go by
    return None, ""
  (name, keys), = found.items()
  return name, "official fields " + ", ".join(keys)


def check_method(hf: dict, want: method_names.MethodName, where) -> None:
  """Refuse a checkpoint of another method (or of an unknown one) with a message naming both."""
  got, why = checkpoint_method(hf)
  if got is None or got == want.name:
    return
  other = next((m for m in method_names.ALL if m.name == got), None)
  name = other.title if other is not None else f"{got!r}"
  hint = f"load it with {other.loader}. " if other is not None and other.loader else ""
  raise CheckpointError(
      f"{where} is a checkpoint of {name} (config.json {why}), not of {want.title}: {hint}"
      f"Loading it as {want.title} would read its tensors as that method's and use default "
      "settings it was not trained with")


def method_stamp(method: method_names.MethodName) -> dict:
  """The config.json field an export of ``method`` carries (:data:`METHOD_KEY`)."""
  return {METHOD_KEY: method.name}


def config_from_hf_dir(hf_dir, names=None, **overrides) -> ModelConfig:
  """The model config of a HF directory; beacon/candidate extras are detected from tensor names."""
  names = set(shard_map(hf_dir)) if names is None else names
  present = alt_projections_in(names)
  has_embed = ALT_EMBEDDING_NAME in names
  overrides.setdefault("alt_projections", present)
  overrides.setdefault("num_alt_embeddings", 1 if has_embed else 0)
  return ModelConfig.from_hf(read_hf_config(hf_dir), **overrides)


def load_hf(hf_dir, *, param_dtype: Optional[str] = None, alt_init: Optional[str] = None,
            alt_embed_init: Optional[str] = None, **overrides):
  """Load a HF checkpoint as ``(ModelConfig, params)`` with numpy leaves.

  Args:
    param_dtype: convert parameters to this dtype (default: the checkpoint's own, so bf16 stays
      bf16).
    alt_init: ``"copy"`` fills alternative (beacon / candidate) projections that the config asks for
      but the checkpoint lacks with copies of the base q/k/v/o, as the official ``from_pretrained``
      does. ``None`` makes their absence an error.
    alt_embed_init: ``"eos"`` / ``"bos"`` fills a missing beacon embedding row from that token's
      embedding.
    overrides: ModelConfig fields (e.g. ``alt_projections=("q","k","v")``).
  """
  names_to_file = shard_map(hf_dir)
  names = set(names_to_file)
  cfg = config_from_hf_dir(hf_dir, names, **overrides)
  if param_dtype is not None:
    cfg = cfg.replace(param_dtype=param_dtype)
  expected = expected_names(cfg)
  _check_names(hf_dir, cfg, expected, names, _initialisable(expected, alt_init, alt_embed_init))
  shapes = param_shapes(cfg)
  by_file = {}
  for name in sorted(set(expected) & names):
    by_file.setdefault(names_to_file[name], []).append(name)
  _check_shapes(hf_dir, cfg, expected, shapes, by_file)
  params = _read_tensors(cfg, expected, shapes, by_file)
  _init_missing_alt(cfg, params, names, alt_embed_init)
  return cfg, params


def _initialisable(expected, alt_init, alt_embed_init) -> set:
  """The expected tensors that ``alt_init`` / ``alt_embed_init`` fill when the checkpoint lacks
  them."""
  initialisable = set()
  if alt_init == "copy":
    initialisable |= {n for n, (row, _) in expected.items() if is_alt_projection(row.path)}
  elif alt_init is not None:
    raise CheckpointError(f"alt_init must be 'copy' or None, got {alt_init!r}")
  if alt_embed_init in ("eos", "bos"):
    initialisable.add(ALT_EMBEDDING_NAME)
  elif alt_embed_init is not None:
    raise CheckpointError(f"alt_embed_init must be 'eos', 'bos' or None, got {alt_embed_init!r}")
  return initialisable


def _check_names(hf_dir, cfg, expected, names, initialisable):
  """Every tensor the config expects is in the checkpoint (or initialisable), and nothing else."""
  missing = set(expected) - names - initialisable
  extra = {n for n in names - set(expected) if not n.endswith(IGNORED_SUFFIXES)}
  if missing or extra:
    lines = [f"checkpoint {hf_dir} does not match a {cfg.family} model with {cfg.num_layers} layers"
             f" (alt projections {cfg.alt_projections or 'none'}):"]
    if missing:
      lines.append(f"  missing tensors ({len(missing)}): {_listing(missing)}")
      if any(is_alt(expected[n][0].path) for n in missing):
        lines.append("  (beacon/candidate tensors missing: pass alt_init='copy' / "
                     "alt_embed_init='eos' to initialise them as the official from_pretrained "
                     "does)")
    if extra:
      lines.append(f"  unexpected tensors ({len(extra)}): {_listing(extra)}")
    raise CheckpointError("\n".join(lines))


def _check_shapes(hf_dir, cfg, expected, shapes, by_file):
  """Pass 1: headers only, so every shape mismatch is reported before any data is read."""
  bad = []
  for path, file_names in by_file.items():
    with safe_open(path, framework="np") as f:
      for name in file_names:
        row, layer = expected[name]
        want = get_path(shapes, row.path).shape
        want = hf_shape(row, cfg, want[1:] if row.per_layer else want)
        got = tuple(f.get_slice(name).get_shape())
        if got != tuple(want):
          bad.append(f"{name}: checkpoint {got}, config expects {tuple(want)}")
  if bad:
    raise CheckpointError(f"shape mismatches in {hf_dir} ({len(bad)}):\n  " + "\n  ".join(bad))


def _read_tensors(cfg, expected, shapes, by_file) -> dict:
  """Pass 2: preallocate the output, then fill it shard by shard, tensor by tensor."""
  dtype = np.dtype(cfg.params_dtype)
  params: dict = {}
  for row in rows_for(cfg):
    set_path(params, row.path, np.empty(get_path(shapes, row.path).shape, dtype))
  for path, file_names in by_file.items():
    with safe_open(path, framework="np") as f:
      for name in file_names:
        row, layer = expected[name]
        try:
          tensor = f.get_tensor(name)
        except Exception as e:  # noqa: BLE001 -- a header that promises more bytes than the file has
          raise CheckpointError(f"cannot read tensor {name} from {path}: {e} (truncated file?)") \
              from None
        value = row.transform.to_jax(tensor, cfg)
        del tensor  # at most one source tensor alive (the one-tensor memory bound)
        put_tensor(params, row, layer, value)
        del value
  return params


def _init_missing_alt(cfg, params, names, alt_embed_init):
  """Fill the preallocated alternative tensors the checkpoint lacks (load_hf has checked that an
  init rule was given for each), in place."""
  attn = params.get("layers", {}).get("attn", {})
  for p in cfg.alt_projections:
    if alt_proj_name(p) not in names:
      copy_projection(attn, p)
  if cfg.num_alt_embeddings and ALT_EMBEDDING_NAME not in names:
    token = embed_init_token(cfg, alt_embed_init)
    if token is None:
      raise CheckpointError(f"alt_embed_init={alt_embed_init!r} but the config has no "
                            f"{alt_embed_init}_token_id")
    params["alt_embedding"][...] = alt_embedding_row(params["embedding"], token)


def hf_tensors(cfg: ModelConfig, params):
  """Yield ``(hf_name, numpy array)`` in HF layout, one tensor at a time."""
  for row in rows_for(cfg):
    value = get_path(params, row.path)
    if row.per_layer:
      for i in range(cfg.num_layers):
        yield (row.hf.format(i=i),
               np.ascontiguousarray(row.transform.to_hf(np.asarray(value[i]), cfg)))
    else:
      yield row.hf, np.ascontiguousarray(row.transform.to_hf(np.asarray(value), cfg))


def save_hf(out_dir, cfg: ModelConfig, params, *, max_shard_bytes: int = 5 * 2**30,
            extra_config: Optional[dict] = None, overwrite: bool = False):
  """Write ``params`` as a HF checkpoint (safetensors shards + index + config.json).

  ``extra_config`` adds fields to config.json (e.g. the official beacon_* settings).
  """
  from longjax.errors import LongjaxError
  try:
    _write_hf(out_dir, cfg, params, max_shard_bytes, extra_config, overwrite)
  except LongjaxError:
    raise
  except Exception as e:  # noqa: BLE001 -- disk full and I/O errors, in whatever type they come
    from longjax.errors import write_failed
    raise write_failed(out_dir, e) from e
  return out_dir


def _write_hf(out_dir, cfg, params, max_shard_bytes, extra_config, overwrite):
  if not max_shard_bytes > 0:
    raise CheckpointError(f"the largest shard must be > 0 bytes, got {max_shard_bytes}")
  with atomic_dir(out_dir, overwrite) as tmp:
    # Only the shard being filled is held in memory; finished shards are on disk.
    current, size, weight_map, total, total_bytes = {}, 0, {}, 0, 0

    def flush():
      nonlocal current, size, total
      if current:
        total += 1
        name = f"model-{total:05d}.safetensors"
        save_file(current, str(tmp / name), metadata={"format": "pt"})
        weight_map.update({key: name for key in current})
        current, size = {}, 0

    for name, value in hf_tensors(cfg, params):
      if current and size + value.nbytes > max_shard_bytes:
        flush()
      current[name] = value
      size += value.nbytes
      total_bytes += value.nbytes
    flush()
    if total == 1:
      os.rename(tmp / "model-00001.safetensors", tmp / SINGLE_FILE)
    else:
      for i in range(1, total + 1):
        os.rename(tmp / f"model-{i:05d}.safetensors",
                  tmp / f"model-{i:05d}-of-{total:05d}.safetensors")
      weight_map = {k: v.replace(".safetensors", f"-of-{total:05d}.safetensors")
                    for k, v in weight_map.items()}
      index = {"metadata": {"total_size": total_bytes}, "weight_map": weight_map}
      (tmp / INDEX_FILE).write_text(json.dumps(index, indent=2))
    hf_config = cfg.to_hf()
    hf_config.update(extra_config or {})
    (tmp / "config.json").write_text(json.dumps(hf_config, indent=2))


