"""Trained projections stored as a low-rank delta from the base tensor they started as.

Both methods' trained matrices start as copies of the base layer's projections (Activation Beacon's
official init: ``beacon_{q,k,v,o}_proj`` = ``{q,k,v,o}_proj``; FocusLLM's candidates: the same
copies), and training moves them by a delta whose singular values fall off fast. An asset can then
hold, for a trained matrix ``W`` (HF name ``n``, shape ``(out, in)``), two factors instead of ``W``:

  ``n.lowrank_u`` (out, r) and ``n.lowrank_v`` (in, r), with  W = B + U @ V.T

where ``B`` is the base's tensor of the same layer (``n`` without ``beacon_``), read from the base
model the asset loads on. The truncated SVD of ``W - B`` gives the factors (each scaled by the
square root of the singular values, so both carry the same magnitudes in bf16). Every other tensor
(biases, the beacon embedding, a matrix whose factors would not be smaller) is stored as it is. The
settings JSON records the rule under ``"lowrank"``, with a fingerprint of the base tensors used, so
that an asset read on another base is refused instead of silently reconstructed wrong::

  "lowrank": {"format": 1, "rank": 32, "factor_dtype": "bfloat16", "reference": "...",
              "base_fingerprint": "sha256:...", "energy_kept": 0.91}

Loaders call :func:`expand` once, on the tensors read from the asset, and get full matrices back;
an asset without ``"lowrank"`` (full tensors, the earlier format) passes through unchanged.

  python -m longjax.ckpts.lowrank --asset assets/smollm2_beacon --out runs/beacon_r32 --rank 32
"""
from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Callable, Mapping, Optional, Union

import numpy as np

from longjax.ckpts.assets import AssetError

U_SUFFIX = ".lowrank_u"
V_SUFFIX = ".lowrank_v"
KEY = "lowrank"  # the settings JSON's entry
FORMAT = 1
REFERENCE_RULE = ("the base model's tensor of the same name without 'beacon_' (the official init "
                  "copies it); W = base + U @ V.T")
# 30 layers of SmolLM2's q/k/v/o at rank 32 take 7.4 MB in bf16. Measured (docs/learning-log.md,
# "Small assets" and part 2): FocusLLM's candidates keep their held-out scores at rank 32; the
# beacons lose 0.7 % of held-out perplexity by the plain SVD and 0.07 % calibrated on their inputs,
# so beacon exports are written whole and then compressed with a calibration.
DEFAULT_RANK = 32

Reference = Union[Mapping[str, np.ndarray], Callable[[str], Optional[np.ndarray]]]


def reference_name(name: str) -> Optional[str]:
  """The base tensor a trained tensor started as (None: it has none, e.g. the beacon embedding)."""
  if ".self_attn.beacon_" not in name:
    return None
  return name.replace(".self_attn.beacon_", ".self_attn.")


def is_factor(name: str) -> bool:
  return name.endswith(U_SUFFIX) or name.endswith(V_SUFFIX)


def fingerprint(refs: Mapping[str, np.ndarray]) -> str:
  """sha256 of the reference tensors (names and float32 values, in name order)."""
  h = hashlib.sha256()
  for n in sorted(refs):
    h.update(n.encode() + b"\0" + str(refs[n].shape).encode() + b"\0")
    h.update(np.ascontiguousarray(refs[n], np.float32).tobytes())
  return "sha256:" + h.hexdigest()


def _lookup(reference: Reference, name: str):
  if callable(reference):
    return reference(name)
  return reference.get(name)


def _truncate(delta: np.ndarray, rank: int, moment: Optional[np.ndarray]):
  """``(U (out, r), V (in, r), kept, total)`` with ``U @ V.T`` the rank-``rank`` approximation of
  ``delta`` that is best for the inputs whose second moment ``E[x x^T]`` is ``moment`` (None: for
  inputs in every direction alike, the plain truncated SVD). ``kept / total``: the share of the
  output energy ``E|delta x|^2`` the factors keep (of ``|delta|_F^2`` without a moment)."""
  # With moment = S S^T, E|(delta - D) x|^2 = |(delta - D) S|_F^2: truncate delta S by its SVD and
  # map the input side back through S^-1. The eigenvalues get a small floor so that directions
  # the inputs never take keep a finite (and irrelevant) weight.
  target = delta
  if moment is not None:
    lam, q = np.linalg.eigh(moment.astype(np.float64))
    lam = np.maximum(lam, 1e-6 * max(float(lam.max()), 1e-30))
    target = delta @ (q * np.sqrt(lam))
  u, s, vt = np.linalg.svd(target, full_matrices=False)
  root, v = np.sqrt(s[:rank]), vt[:rank].T
  if moment is not None:
    v = (q / np.sqrt(lam)) @ v
  return u[:, :rank] * root, v * root, float((s[:rank] ** 2).sum()), float((s ** 2).sum())


ABOUT = "_about"  # a calibration file's description of its data (a string array)


def read_calibration(path):
  """``(moments, about)`` of a calibration file: ``.npz``, one ``(in, in)`` array of input second
  moments per trained tensor name, and optionally ``_about``, a line saying what data gave them
  (recorded in the asset's settings). Arrays only, never pickles."""
  path = Path(path)
  try:
    with np.load(path, allow_pickle=False) as f:
      about = str(f[ABOUT]) if ABOUT in f.files else f"input second moments from {path.name}"
      moments = {n: np.asarray(f[n], np.float64) for n in f.files if n != ABOUT}
  except (OSError, ValueError) as e:
    raise AssetError(f"cannot read the calibration file {path}: {e}; write it with "
                     "python -m longjax.beacon.calibrate") from None
  bad = [n for n, m in moments.items() if m.ndim != 2 or m.shape[0] != m.shape[1]
         or not np.isfinite(m).all()]
  if bad:
    raise AssetError(f"{path}: {bad[0]} is not a finite square matrix of input second moments; "
                     "write the file again with python -m longjax.beacon.calibrate")
  return moments, about


def compress(tensors: Mapping[str, np.ndarray], reference: Reference, rank: int,
             factor_dtype: str = "bfloat16", calibration: Optional[Mapping[str, np.ndarray]] = None,
             calibration_note: str = ""):
  """``(stored tensors, settings entry)``: every 2-D tensor with a reference of its shape as
  rank-``rank`` factors of its delta, the rest as they are (cast to ``factor_dtype``); the entry
  is None when no matrix was made smaller (then the tensors are all stored whole).

  ``calibration`` (tensor name -> ``(in, in)`` second moment of that tensor's inputs): truncate
  each delta where those inputs make it matter (activation-aware), instead of by its Frobenius
  norm; every factored tensor must have one. The stored format is the same either way."""
  import ml_dtypes
  if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
    raise AssetError(f"the low-rank rank must be a positive integer, got {rank!r}")
  np_dtype = {"bfloat16": ml_dtypes.bfloat16, "float32": np.float32}[factor_dtype]
  out, refs, kept, total = {}, {}, 0.0, 0.0
  for name in sorted(tensors):
    value = np.asarray(tensors[name], np.float32)
    if is_factor(name):
      raise AssetError(f"tensor {name} is already a low-rank factor; compress full tensors")
    ref_name = reference_name(name)
    ref = _lookup(reference, ref_name) if ref_name is not None else None
    if value.ndim != 2 or ref is None or rank * sum(value.shape) >= value.size:
      out[name] = np.ascontiguousarray(value.astype(np_dtype))
      continue
    ref = np.asarray(ref, np.float32)
    if ref.shape != value.shape:
      raise AssetError(f"{name} has shape {value.shape} but the base's {ref_name} has "
                       f"{ref.shape}: not the base it was trained on")
    moment = None
    if calibration is not None:
      moment = calibration.get(name)
      if moment is None or moment.shape != (value.shape[1],) * 2:
        raise AssetError(f"the calibration has {'no' if moment is None else 'a wrong-shaped'} "
                         f"input moment for {name} (inputs of size {value.shape[1]}): calibrate "
                         "on this asset")
    refs[ref_name] = ref
    u, v, k, t = _truncate(value.astype(np.float64) - ref, rank, moment)
    out[name + U_SUFFIX] = np.ascontiguousarray(u.astype(np_dtype))
    out[name + V_SUFFIX] = np.ascontiguousarray(v.astype(np_dtype))
    kept, total = kept + k, total + t
  if not refs:  # nothing smaller as factors (a tiny model): the full tensors, no entry
    return out, None
  entry = dict(format=FORMAT, rank=rank, factor_dtype=factor_dtype, reference=REFERENCE_RULE,
               base_fingerprint=fingerprint(refs),
               energy_kept=round(kept / total, 4) if total > 0 else 1.0)
  if calibration is not None:
    entry["calibration"] = calibration_note or "input second moments"
  return out, entry


def expand(tensors: Mapping[str, np.ndarray], entry, reference: Reference, where: str) -> dict:
  """The full tensors of an asset (float32): ``tensors`` as read, with every factor pair replaced
  by ``base + U @ V.T``. ``entry`` is the settings JSON's ``"lowrank"`` (None: a full-tensor
  asset, returned as it is); ``reference`` gives the base tensors by HF name."""
  factors = sorted(n for n in tensors if is_factor(n))
  if entry is None:
    if factors:
      raise AssetError(f"{where} holds low-rank factors ({factors[0]}, ...) but its settings "
                       f"JSON has no {KEY!r} entry: the asset is incomplete; export it again")
    return dict(tensors)
  if not isinstance(entry, dict) or entry.get("format") != FORMAT:
    raise AssetError(f"{where}: {KEY!r} is {entry!r}, not a format-{FORMAT} low-rank record; "
                     "this longjax reads only that format (update longjax or export again)")
  out = {n: v for n, v in tensors.items() if not is_factor(n)}
  refs = {}
  for u_name in (n for n in factors if n.endswith(U_SUFFIX)):
    name = u_name[:-len(U_SUFFIX)]
    v_name = name + V_SUFFIX
    if v_name not in tensors:
      raise AssetError(f"{where} holds {u_name} without {v_name}: the asset is incomplete")
    if name in out:
      raise AssetError(f"{where} holds {name} both whole and as low-rank factors")
    ref_name = reference_name(name)
    ref = _lookup(reference, ref_name) if ref_name is not None else None
    if ref is None:
      raise AssetError(f"{where}: the base model has no {ref_name} for {name}'s delta: load the "
                       "asset on the base it was trained on")
    u, v = np.asarray(tensors[u_name], np.float32), np.asarray(tensors[v_name], np.float32)
    ref = np.asarray(ref, np.float32)
    if (u.ndim != 2 or v.ndim != 2 or u.shape[1] != v.shape[1]
        or (u.shape[0], v.shape[0]) != ref.shape):
      raise AssetError(f"{where}: factors {u_name} {u.shape} and {v_name} {v.shape} do not make "
                       f"the base's {ref_name} {ref.shape}: the asset is damaged; export it again")
    refs[ref_name] = ref
    out[name] = ref + u @ v.T
  orphans = [n for n in factors if n.endswith(V_SUFFIX) and n[:-len(V_SUFFIX)] not in out]
  if orphans:
    raise AssetError(f"{where} holds {orphans[0]} without its {U_SUFFIX} factor: the asset is "
                     "incomplete; export it again")
  want = entry.get("base_fingerprint")
  if want != fingerprint(refs):
    raise AssetError(f"{where} stores deltas from a base whose projections have fingerprint "
                     f"{want}, but this base's are {fingerprint(refs)}: load it on the base it "
                     "was trained on (its settings JSON's 'base')")
  return out


def base_reader(base_dir) -> Callable[[str], Optional[np.ndarray]]:
  """The tensors of a HF checkpoint directory by name, as float32 (None: it has no such tensor)."""
  from longjax.ckpts.hf import safe_open, shard_map
  files = shard_map(base_dir)

  def read(name: str):
    if name not in files:
      return None
    with safe_open(files[name], framework="np") as f:
      return f.get_tensor(name).astype(np.float32)
  return read


def stored_tensors(cfg, params, keep: Callable[[str], bool], rank: Optional[int], dtype: str):
  """``(tensors to write, "lowrank" entry or None)`` for an asset export: the HF-named tensors of
  ``params`` that ``keep`` accepts, as rank-``rank`` deltas from ``params``' own base projections
  (the frozen ones they started as), or whole in ``dtype`` when ``rank`` is None or 0."""
  import ml_dtypes
  from longjax.ckpts.hf import hf_tensors
  every = {n: np.asarray(v, np.float32) for n, v in hf_tensors(cfg, params)}
  kept = {n: v for n, v in every.items() if keep(n)}
  if not rank:
    np_dtype = {"bfloat16": ml_dtypes.bfloat16, "float32": np.float32}[dtype]
    return {n: np.ascontiguousarray(v.astype(np_dtype)) for n, v in kept.items()}, None
  return compress(kept, every, rank, dtype)


# ------------------------------------------------------------------------------------------------
# An existing asset (full tensors) written again with low-rank deltas.
def _asset_kind(asset_dir: Path) -> str:
  from longjax import method_names
  from longjax.ckpts import assets
  kinds = [s for s in (method_names.BEACON.name, method_names.FOCUS.name)
           if (asset_dir / f"{s}.json").exists() and assets.has_tensors(asset_dir, s)]
  if len(kinds) != 1:
    raise AssetError(f"{asset_dir} is not a beacon or FocusLLM asset (needs beacon.json or "
                     "focus.json and its tensors)")
  return kinds[0]


def compress_asset(asset_dir, out_dir, rank: int = DEFAULT_RANK, overwrite: bool = False,
                   base_dir: Optional[str] = None, calibration=None) -> dict:
  """Write the asset at ``asset_dir`` again at ``out_dir`` with its trained matrices as
  rank-``rank`` deltas from its base; returns the ``"lowrank"`` entry written. ``calibration``:
  a file of the trained tensors' input second moments (:func:`read_calibration`), for
  activation-aware truncation."""
  from longjax.ckpts.atomic_dir import atomic_dir, check_output_apart
  from longjax.ckpts import assets
  asset_dir = Path(asset_dir)
  check_output_apart(out_dir, "--out", {"--asset": asset_dir})
  stem = _asset_kind(asset_dir)
  meta = json.loads((asset_dir / f"{stem}.json").read_text())
  if meta.get(KEY) is not None:
    raise AssetError(f"{asset_dir} already stores low-rank deltas (rank "
                     f"{meta[KEY].get('rank') if isinstance(meta[KEY], dict) else '?'})")
  base = assets.base_of(asset_dir, meta, f"{stem}.json", base_dir)
  moments = note = None
  if calibration is not None:
    moments, about = read_calibration(calibration)
    note = f"activation-aware: {about}"
  stored, entry = compress(assets.read_tensors(asset_dir, stem), base_reader(base), rank,
                           meta.get("dtype", "bfloat16"), moments, note)
  if entry is None:
    raise AssetError(f"no matrix of {asset_dir} is smaller as rank-{rank} factors: "
                     "keep it as it is")
  with atomic_dir(out_dir, overwrite) as tmp:
    if meta.get("base_embedded"):
      import shutil
      shutil.copytree(asset_dir / assets.BASE_DIR, tmp / assets.BASE_DIR)
    assets.write_tensors(tmp, stem, stored)
    (tmp / f"{stem}.json").write_text(json.dumps(dict(meta, **{KEY: entry}), indent=2))
  return entry


def main(argv=None):
  from longjax.runtime import cli
  ap = cli.parser("python -m longjax.ckpts.lowrank", __doc__)
  ap.add_argument("--asset", required=True, help="a beacon or FocusLLM asset of full tensors")
  ap.add_argument("--out", required=True)
  ap.add_argument("--rank", type=int, default=DEFAULT_RANK)
  ap.add_argument("--base", default=None, help="the base model directory (default: the asset's)")
  ap.add_argument("--calibration", default=None,
                  help="an .npz of the trained tensors' input second moments "
                       "(python -m longjax.beacon.calibrate): truncate where the inputs are")
  ap.add_argument("--overwrite", action="store_true")
  ap.add_argument("--debug", action="store_true", help="show tracebacks")
  args = ap.parse_args(argv)

  def run():
    entry = compress_asset(args.asset, args.out, args.rank, args.overwrite, args.base,
                           args.calibration)
    print(f"wrote {args.out}: rank {entry['rank']}, energy kept {entry['energy_kept']}")
  return cli.run("python -m longjax.ckpts.lowrank", run, debug=args.debug)


if __name__ == "__main__":
  sys.exit(main())
