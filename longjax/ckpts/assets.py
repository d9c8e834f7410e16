"""What every method's trained-tensor asset shares (``beacon/asset.py``, ``focus/asset.py``): the
tensors in safetensors files of at most ``MAX_FILE_BYTES`` each (sharded with an index, as HF
does, when larger), the base model named or embedded, and the trained tensors read back from a
train.py checkpoint.

Layout of an asset directory with tensor stem ``s``: ``s.safetensors`` when it fits in one file,
else ``s-00001-of-0000N.safetensors`` ... plus ``s.safetensors.index.json`` (``weight_map``: tensor
name -> file, ``metadata.total_size``); a JSON of settings next to it (the method's).
"""
from __future__ import annotations

import difflib
import json
import logging
import math
import os
from pathlib import Path
from typing import Optional

import numpy as np

from longjax.errors import LongjaxError

log = logging.getLogger("longjax")

# Files in git stay below 40 MB (the repository's rule for committed assets).
MAX_FILE_BYTES = 40_000_000
BASE_DIR = "base"  # an embedded base (the tiny one of a run with no model.checkpoint)


class AssetError(LongjaxError, ValueError):
  """An asset that does not fit (missing files, another base model, no trained tensors)."""


# ------------------------------------------------------------------------------------------------
# Finding an asset: a directory, or a name in the repository's assets/.
ASSETS_ENV = "LONGJAX_ASSETS"  # another directory of named assets


def assets_root() -> Path:
  """Where asset names are looked up: ``$LONGJAX_ASSETS``, else the ``assets/`` directory of the
  repository this package is in (it is installed editable from a clone, ``pip install -e .``)."""
  env = os.environ.get(ASSETS_ENV, "").strip()
  return Path(env) if env else Path(__file__).resolve().parents[2] / "assets"


def _kind(d: Path):
  """The method whose asset ``d`` is (by its settings file ``<method>.json``), or None."""
  from longjax.method_names import ALL
  return next((m for m in ALL if m.section and (d / f"{m.name}.json").is_file()), None)


def known_assets(root: Optional[Path] = None) -> list:
  """``name (method)`` of every asset directory in ``root`` (default :func:`assets_root`)."""
  root = assets_root() if root is None else Path(root)
  if not root.is_dir():
    return []
  return [f"{d.name} ({_kind(d).title})" for d in sorted(root.iterdir())
          if d.is_dir() and _kind(d) is not None]


def find_asset(spec, method) -> Path:
  """The asset directory ``spec`` names for ``method`` (a ``method_names.MethodName``): a path
  to a directory, or the name of one in :func:`assets_root` (``"smollm2_beacon"``), so that the
  committed assets load from any working directory. An asset of another method, or a name that is
  neither, is an :class:`AssetError` of one line (listing the known assets)."""
  p = Path(spec)
  if not p.is_dir():
    root = assets_root()
    named = root / str(spec)
    if len(p.parts) == 1 and str(spec) not in (".", "..") and named.is_dir():
      p = named
    else:
      known = known_assets(root)
      where = (f"known assets in {root}: {', '.join(known)}" if known else
               f"{root} holds no assets")
      raise AssetError(f"{method.title} asset {str(spec)!r}: no such directory, nor an asset of "
                       f"that name ({where}; ${ASSETS_ENV} names another assets directory)")
  other = _kind(p)
  if other is not None and other != method and not (p / f"{method.name}.json").is_file():
    raise AssetError(f"{spec} is an asset of {other.title}, not of {method.title}: load it with "
                     f"load_{other.name}_asset (python -m longjax.{other.name} --asset {spec})")
  return p


# ------------------------------------------------------------------------------------------------
# Tensor files.
def write_tensors(out_dir: Path, stem: str, tensors: dict, max_bytes: int = MAX_FILE_BYTES):
  """Write ``tensors`` (name -> numpy array) as ``stem.safetensors`` or, when larger than
  ``max_bytes``, as shards of at most ``max_bytes`` each with an index (tensors in name order; a
  single tensor larger than ``max_bytes`` is an error: it would need splitting itself)."""
  from safetensors.numpy import save_file
  out_dir = Path(out_dir)
  names = sorted(tensors)
  total = sum(tensors[n].nbytes for n in names)
  if total <= max_bytes:
    save_file(tensors, str(out_dir / f"{stem}.safetensors"), metadata={"format": "pt"})
    return
  shards, size = [[]], 0
  for n in names:
    nb = tensors[n].nbytes
    if nb > max_bytes:
      raise AssetError(f"tensor {n} has {nb} bytes, more than one file may hold ({max_bytes})")
    if size + nb > max_bytes and shards[-1]:
      shards.append([])
      size = 0
    shards[-1].append(n)
    size += nb
  weight_map = {}
  for i, group in enumerate(shards):
    fname = f"{stem}-{i + 1:05d}-of-{len(shards):05d}.safetensors"
    save_file({n: tensors[n] for n in group}, str(out_dir / fname), metadata={"format": "pt"})
    weight_map.update({n: fname for n in group})
  index = dict(metadata=dict(total_size=int(total)), weight_map=weight_map)
  (out_dir / f"{stem}.safetensors.index.json").write_text(json.dumps(index, indent=2))


# The asset JSON field holding :func:`base_fingerprint` of the base it was trained on (assets
# written before it was recorded lack it: train.init_from then says it cannot check).
BASE_WEIGHTS_KEY = "base_weights"


def base_fingerprint(params) -> str:
  """A hash of every base tensor of a longjax param tree (the method's ``alt_*`` tensors left
  out): names, shapes and values, each rounded to bfloat16 first, so that the base loaded in
  float32 for an export and the same base loaded in its own dtype by a run hash the same."""
  import hashlib
  import ml_dtypes
  from flax import traverse_util
  h = hashlib.blake2b(digest_size=16)
  flat = traverse_util.flatten_dict(params, sep="/")
  for name in sorted(flat):
    if any(part.startswith("alt_") for part in name.split("/")):
      continue
    x = np.ascontiguousarray(np.asarray(flat[name]).astype(ml_dtypes.bfloat16))
    h.update(f"{name}:{x.shape};".encode())
    h.update(memoryview(x.reshape(-1).view(np.uint8)))
  return h.hexdigest()


def has_tensors(asset_dir: Path, stem: str) -> bool:
  asset_dir = Path(asset_dir)
  return ((asset_dir / f"{stem}.safetensors").exists()
          or (asset_dir / f"{stem}.safetensors.index.json").exists())


# ------------------------------------------------------------------------------------------------
# Validation: an asset is untrusted input (downloaded, hand-edited, cut by a full disk). Every
# file it names stays inside it, every tensor has the exact shape, the declared dtype and finite
# values, and every setting is a known field of the JSON type it must have; anything else is one
# AssetError line naming the file, the field or the tensor.
DTYPES = ("bfloat16", "float32")  # what an asset's "dtype" may declare (save_*_asset writes them)


def read_json(path: Path, what: str = "settings") -> dict:
  """The JSON object in ``path``; a file that is not JSON, or holds no object, is one line."""
  path = Path(path)
  _check_file(path)
  try:
    value = json.loads(path.read_text(encoding="utf-8"))
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise AssetError(f"{path} is not valid JSON ({e}): the asset's {what} file is damaged; "
                     "export the asset again") from None
  if not isinstance(value, dict):
    raise AssetError(f"{path} holds a JSON {type(value).__name__}, not an object: the asset's "
                     f"{what} file is damaged; export the asset again")
  return value


def _check_file(path: Path, root: Optional[Path] = None):
  """``path`` is a regular file (not a FIFO, which would block the read forever) and, resolved
  (symlinks followed), lies inside ``root`` (default: its own directory)."""
  root = Path(root if root is not None else path.parent).resolve()
  real = path.resolve()
  if root not in real.parents:
    raise AssetError(f"{path} resolves to {real}, outside the asset {root}: an asset's files must "
                     "lie inside it; copy the file in, or export the asset again")
  if real.exists() and not real.is_file():
    raise AssetError(f"{path} is not a regular file; export the asset again")


# JSON types of the settings fields (see check_settings). A bool is not an integer, and an integer
# is written without a decimal point: 64.0 is refused like 64.5 (never truncated), so that what a
# file says is exactly the setting in use.
def _int(v) -> bool:
  return isinstance(v, int) and not isinstance(v, bool)


def _str(v) -> bool:
  return isinstance(v, str)


FIELD_KINDS = {
    "int": (_int, "an integer (written without a decimal point)"),
    "ints": (lambda v: _int(v) or (isinstance(v, list) and bool(v) and all(map(_int, v))),
             "an integer or a non-empty list of integers"),
    "int?": (lambda v: v is None or _int(v), "an integer or null"),
    "int>=0": (lambda v: _int(v) and v >= 0, "an integer >= 0"),
    "int>=1": (lambda v: _int(v) and v >= 1, "an integer >= 1"),
    "number>=0": (lambda v: (not isinstance(v, bool) and isinstance(v, (int, float))
                             and math.isfinite(v) and v >= 0), "a finite number >= 0"),
    "str": (_str, "a string"),
    "strs": (lambda v: isinstance(v, list) and all(map(_str, v)), "a list of strings"),
    "bool": (lambda v: isinstance(v, bool), "true or false"),
    "dtype": (lambda v: v in DTYPES, f"one of {list(DTYPES)}"),
    "object": (lambda v: isinstance(v, dict), "a JSON object"),
}

# Fields every method's settings JSON may hold (the base, the tensors' dtype, the export's record);
# a method's loader adds its own (``check_settings(fields=...)``).
COMMON_FIELDS = {"base": "str", "base_embedded": "bool", "dtype": "dtype", "train_step": "int",
                 "campaign": "object", BASE_WEIGHTS_KEY: "str",
                 "lowrank": "object"}  # lowrank.KEY: its content is checked by lowrank.expand


def check_settings(meta: dict, path, fields: dict) -> None:
  """Every field of ``meta`` (an asset's settings JSON, read from ``path``) is one of ``fields``
  or :data:`COMMON_FIELDS` (field -> a :data:`FIELD_KINDS` key), with a value of that JSON type.
  A misspelt field would otherwise be ignored and its default used; a fraction or a bool would be
  truncated to an integer."""
  known = {**COMMON_FIELDS, **fields}
  for k, v in meta.items():
    if k not in known:
      near = difflib.get_close_matches(k, sorted(known), n=1)
      raise AssetError(f"{path}: unknown field {k!r}"
                       + (f", did you mean {near[0]!r}?" if near else "")
                       + f" (known fields: {sorted(known)})")
    ok, want = FIELD_KINDS[known[k]]
    if not ok(v):
      raise AssetError(f"{path}: field {k!r} must be {want}, got {json.dumps(v)}; fix the file "
                       "or export the asset again")


def shard_files(asset_dir: Path, stem: str):
  """``(weight_map or None, file names)`` of the tensors of ``stem``: one file, or the shards its
  index names (checked as HF checkpoint indexes are: an object with a ``weight_map`` of tensor
  name -> file inside the asset; symlinks leaving the asset are refused too)."""
  from longjax.ckpts.hf import CheckpointError, index_shards
  asset_dir = Path(asset_dir)
  index = asset_dir / f"{stem}.safetensors.index.json"
  if index.exists():
    try:
      shards = index_shards(asset_dir, read_json(index, "index"), index.name,
                             fix="export the asset again")
    except CheckpointError as e:
      raise AssetError(str(e)) from None
    weight_map = {n: str(p.relative_to(asset_dir)) for n, p in shards.items()}
    files = sorted(set(weight_map.values()))
  else:
    weight_map, files = None, [f"{stem}.safetensors"]
  for f in files:
    _check_file(asset_dir / f, asset_dir)
  return weight_map, files


def read_tensors(asset_dir: Path, stem: str, dtype: Optional[str] = None) -> dict:
  """Every tensor of ``stem`` (one file or the shards its index names) as float32 numpy; each
  must be of ``dtype`` (what the settings declare; None: any float type, for assets that declare
  none) and finite."""
  from longjax.ckpts.hf import safe_open
  asset_dir = Path(asset_dir)
  weight_map, files = shard_files(asset_dir, stem)
  index_name = f"{stem}.safetensors.index.json"
  out = {}
  for fname in files:
    path = asset_dir / fname
    if not path.exists():
      raise AssetError(f"{asset_dir} lacks {fname} (named by {index_name}): the asset is "
                       "incomplete; export it again")
    with safe_open(path, framework="np") as f:
      for name in f.keys():
        if weight_map is not None and weight_map.get(name) != fname:
          raise AssetError(f"{path}: tensor {name} is not where {index_name} says it is")
        try:
          value = f.get_tensor(name)
        except Exception as e:  # noqa: BLE001 -- a header that promises more bytes than there are
          raise AssetError(f"cannot read tensor {name} from {path}: {e} (truncated file?); "
                           "export the asset again") from None
        out[name] = check_tensor_values(name, value, path, dtype)
  if weight_map is not None and set(weight_map) != set(out):
    raise AssetError(f"{asset_dir / index_name} names tensors its shards do not hold: "
                     f"{sorted(set(weight_map) - set(out))[:3]}")
  return out


def check_tensor_values(name: str, value: np.ndarray, where, dtype: Optional[str] = None):
  """``value`` as float32, after checking its dtype (``dtype``, else any float type) and that
  every entry is finite: an int or bool tensor would be cast silently, a NaN would make every
  generated token 0."""
  got = str(value.dtype)
  if (got != dtype) if dtype is not None else got not in ("bfloat16", "float16", "float32"):
    raise AssetError(f"{where}: tensor {name} is {got}, but the asset declares "
                     f"{dtype or 'a float type'}; export the asset again")
  value = value.astype(np.float32)
  if not np.isfinite(value).all():
    bad = int(value.size - np.isfinite(value).sum())
    raise AssetError(f"{where}: tensor {name} holds {bad} NaN/inf values (of {value.size}): "
                     "the trained tensors are broken; export a checkpoint from before the "
                     "divergence")
  return value


def set_tensors(cfg, params, tensors: dict, where: str, expected=None):
  """Write HF-named ``tensors`` into ``params`` (in place) through the conversion table; every
  name must belong to ``cfg``, have exactly the shape ``cfg`` gives it (numpy would broadcast a
  ``(64, 1)`` into a ``(64, 64)`` slot), and every name ``expected(name)`` accepts must be
  present."""
  from longjax.ckpts.table import expected_names, get_path, hf_shape, put_tensor
  names = expected_names(cfg)
  if expected is not None:
    missing = sorted(n for n in names if expected(n) and n not in tensors)
    if missing:
      raise AssetError(f"{where} lacks {missing[:3]} ... ({len(missing)} tensors)")
  bad = []
  for name, value in tensors.items():
    if name not in names:
      raise AssetError(f"{where}: tensor {name} does not fit this base model")
    row, layer = names[name]
    shape = np.shape(get_path(params, row.path))
    want = tuple(hf_shape(row, cfg, shape[1:] if row.per_layer else shape))
    if tuple(np.shape(value)) != want:
      bad.append(f"{name} is {tuple(np.shape(value))}, this base model needs {want}")
  if bad:
    raise AssetError(f"{where}: {len(bad)} tensors of the wrong shape ({'; '.join(bad[:3])}): "
                     "the asset was trained on another base model, or is damaged")
  for name, value in tensors.items():
    row, layer = names[name]
    put_tensor(params, row, layer, row.transform.to_jax(value, cfg))
  return params


def check_replaceable(out_dir, overwrite: bool, meta_name: str, stem: str, title: str) -> None:
  """Before an export: an ``out_dir`` whose replacing write was killed midway is put back first
  (``atomic_dir.restore_interrupted_swap``); ``overwrite`` replaces only an asset of this kind (or
  an empty directory), never a directory of unrelated files it would delete."""
  from longjax.ckpts.atomic_dir import restore_interrupted_swap
  from longjax.errors import PathExists
  out = Path(out_dir)
  restore_interrupted_swap(out)
  if not (out.exists() or out.is_symlink()):
    return
  if not overwrite:
    raise PathExists(f"{out} exists; pass overwrite=True (--overwrite) to replace it")
  if out.is_dir() and (not any(out.iterdir()) or (
      (out / meta_name).is_file() and has_tensors(out, stem))):
    return
  raise AssetError(f"{out} exists and is not an asset of {title} (no {meta_name} with "
                   f"{stem}.safetensors): --overwrite replaces only an asset, it would delete "
                   "these files; choose another output or remove it yourself")


def export_parser(prog: str, doc: str, run_kind: str, rank: int = 0):
  """The command line of an asset export (``prog``: ``python -m longjax.<method>.asset``); ``rank``:
  the default of ``--rank`` (0: whole tensors)."""
  from longjax.runtime import cli
  ap = cli.parser(prog, doc)
  ap.add_argument("--workdir", required=True, metavar="DIR",
                  help=f"a train.py {run_kind} run directory")
  ap.add_argument("--step", type=int, default=None,
                  help="that checkpoint (default: the newest readable one)")
  ap.add_argument("--out", required=True, metavar="DIR",
                  help="the asset directory to write (all or nothing)")
  ap.add_argument("--overwrite", action="store_true",
                  help="replace an existing --out (only an asset of this method is replaced)")
  ap.add_argument("--rank", type=int, default=rank, metavar="N",
                  help="store the trained matrices as rank-N deltas from the base projections "
                       f"they started as (ckpts/lowrank.py); 0: whole tensors (default {rank})")
  ap.add_argument("--debug", action="store_true", help="show the traceback of an error")
  return ap


# ------------------------------------------------------------------------------------------------
# The base model.
def base_of(asset_dir, meta: dict, meta_name: str, base_dir: Optional[str] = None) -> str:
  """The base model directory an asset loads on: ``base_dir``, else its embedded ``base/``, else
  the one its settings JSON names; never an empty name (which would read the current directory)."""
  from longjax.ckpts.smollm2 import resolve
  asset_dir = Path(asset_dir)
  if base_dir is not None and str(base_dir).strip():
    return resolve(str(base_dir))
  if meta.get("base_embedded"):
    if not (asset_dir / BASE_DIR / "config.json").exists():
      raise AssetError(f"{asset_dir} says its base is embedded, but {asset_dir / BASE_DIR} holds "
                       "no model: the asset is incomplete; export it again")
    return str(asset_dir / BASE_DIR)
  name = meta.get("base")
  if not isinstance(name, str) or not name.strip():
    raise AssetError(f"{asset_dir / meta_name} names no base model (base={name!r}): pass the base "
                     "directory (load_*_asset(asset, base_dir)), or export the asset again "
                     "with this version (it embeds a tiny base)")
  return resolve(name)


# ------------------------------------------------------------------------------------------------
# A train.py run's trained tensors.
def restore_trained(workdir: Path, step: Optional[int] = None):
  """``(trained params, step)`` of checkpoint ``step`` of a train.py run (default: the newest
  readable one, as train.py resumes; nothing is moved)."""
  import orbax.checkpoint as ocp
  from longjax.ckpts.orbax_noise import quiet_unraisable, short_error
  workdir = Path(workdir).absolute()
  mgr = ocp.CheckpointManager(workdir / "checkpoints")
  steps = sorted(mgr.all_steps())
  if step is None:
    if not steps:
      raise AssetError(f"{workdir}/checkpoints holds no checkpoint yet")
    tries = steps[::-1]
  elif step not in steps:
    raise AssetError(f"{workdir}/checkpoints has no step {step} (kept: {steps})")
  else:
    tries = [step]
  for s in tries:
    try:
      with quiet_unraisable(f"reading checkpoint step {s}"):
        state = mgr.restore(s, args=ocp.args.Composite(state=ocp.args.StandardRestore()))["state"]
      return state["params"], int(s)
    except Exception as e:  # noqa: BLE001 -- any read failure means "unreadable"
      log.warning("checkpoint step %d in %s/checkpoints is unreadable (%s: %s)%s", s, workdir,
                  type(e).__name__, short_error(e),
                  "; trying the previous one" if s != tries[-1] else "")
  raise AssetError(f"none of the checkpoints {tries} in {workdir}/checkpoints could be read "
                   "(truncated or corrupt)")


def run_config(workdir: Path, method):
  """``(config, its method's name)`` of the train.py run in ``workdir`` (its ``config.json``):
  the typed ``RunConfig`` if the run is of ``method`` (a ``method_names.MethodName``), else None
  (the caller says why such a run has no asset of this kind)."""
  from longjax.run_config import from_config, stored_config
  path = Path(workdir) / "config.json"
  try:
    stored = stored_config(path)
    if stored.get("method") != method.name:
      return None, stored.get("method")
    return from_config(stored), method.name
  except LongjaxError as e:
    raise AssetError(f"{path} is not a train.py run config ({e})") from None


def merge_trained(into: dict, trained: dict):
  """Copy the ``trained`` subtree (a checkpoint's trainable tensors) into ``into``, as float32."""
  for k, v in trained.items():
    if isinstance(v, dict):
      merge_trained(into[k], v)
    else:
      into[k] = np.asarray(v, np.float32).reshape(np.shape(into[k]))


def asset_base(asset_dir: Path, method, base: Optional[str]) -> str:
  """The base model directory the asset ``asset_dir`` of ``method`` (a ``MethodName``) loads on
  (``base``, else the one its settings name): where its tokenizer is."""
  meta_name = f"{method.name}.json"
  meta_path = Path(asset_dir) / meta_name
  if not meta_path.is_file():
    raise AssetError(f"{asset_dir} is not a {method.title} asset (no {meta_name})")
  return base_of(asset_dir, json.loads(meta_path.read_text()), meta_name, base)


def known_names(method) -> list:
  """The names of ``method``'s assets in the repository's ``assets/`` (or ``$LONGJAX_ASSETS``)."""
  return [k.split(" (")[0] for k in known_assets() if k.endswith(f"({method.title})")]
