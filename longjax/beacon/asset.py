"""Trained beacon tensors as a small asset: only the ``beacon_*`` tensors (official names, bf16)
plus the beacon settings in ``beacon.json``; the base model is loaded separately.

  cfg, bcfg, params = load_beacon_asset("assets/smollm2_beacon")      # base named in beacon.json
  python -m longjax.beacon.asset --workdir runs/smollm2_beacon --out assets/smollm2_beacon

``--workdir`` reads the newest training checkpoint of a ``train.py`` beacon run (it need not have
finished), so a long run can be shipped at any step.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Optional

import numpy as np

from longjax.atomic_dir import atomic_dir
from longjax.beacon import campaign
from longjax.errors import LongjaxError
from longjax.method_names import BEACON

log = logging.getLogger("longjax")


class AssetError(LongjaxError, ValueError):
  """A beacon asset that does not fit (missing files, another base model, no beacon tensors)."""


TENSORS = "beacon.safetensors"
META = "beacon.json"


def _is_beacon(name: str) -> bool:
  return ".beacon_" in name or name.startswith("model.beacon_")


BASE_DIR = "base"  # an embedded base (the tiny one of a run with no model.checkpoint)


def save_beacon_asset(out_dir, cfg, bcfg, params, *, base: str, dtype: str = "bfloat16",
                      info: Optional[dict] = None, overwrite: bool = False,
                      embed_base=None) -> Path:
  """Write the beacon tensors of ``params`` (official HF names) and the settings.

  ``base`` names the model the asset loads on (a directory or ``smollm2``); ``embed_base`` (a
  longjax or HF checkpoint directory) is copied into the asset as ``base/`` instead, for a base
  that has no name elsewhere (the tiny one a run pretrains). An asset always has one of them."""
  import ml_dtypes
  from safetensors.numpy import save_file
  from longjax.convert.hf import hf_tensors
  np_dtype = {"bfloat16": ml_dtypes.bfloat16, "float32": np.float32}[dtype]
  tensors = {n: np.ascontiguousarray(v.astype(np_dtype)) for n, v in hf_tensors(cfg, params)
             if _is_beacon(n)}
  if not tensors:
    raise AssetError("these params hold no beacon tensors")
  if embed_base is None and not str(base or "").strip():
    raise AssetError("a beacon asset must name the base model it loads on (base=...) or embed it "
                     "(embed_base=...); an empty name would load whatever model sits in the "
                     "current directory")
  meta = dict(base=BASE_DIR if embed_base is not None else str(base),
              base_embedded=embed_base is not None, dtype=dtype, **bcfg.to_hf(), **(info or {}))
  with atomic_dir(out_dir, overwrite) as tmp:
    if embed_base is not None:
      _embed(Path(embed_base), tmp / BASE_DIR)
    save_file(tensors, str(tmp / TENSORS), metadata={"format": "pt"})
    (tmp / META).write_text(json.dumps(meta, indent=2))
  return Path(out_dir)


def _embed(src: Path, dst: Path):
  """``src`` (a longjax checkpoint or a HF directory) as a HF directory at ``dst``."""
  import shutil
  from longjax import checkpoint
  from longjax.convert import save_hf
  if checkpoint.is_longjax_checkpoint(src):
    base_cfg, base_params, _ = checkpoint.load(src)
    save_hf(dst, base_cfg, base_params)
    return
  dst.mkdir()
  for f in src.iterdir():
    if f.is_file() and (f.suffix in (".json", ".safetensors", ".jinja", ".txt", ".model")):
      shutil.copyfile(f, dst / f.name)


def base_of(asset_dir, meta: dict, base_dir: Optional[str] = None) -> str:
  """The base model directory an asset loads on: ``base_dir``, else its embedded ``base/``, else
  the one named in beacon.json; never an empty name (which would read the current directory)."""
  from longjax.models.smollm2 import resolve
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
    raise AssetError(f"{asset_dir / META} names no base model (base={name!r}): pass the base "
                     "directory (load_beacon_asset(asset, base_dir)), or export the asset again "
                     "with this version (it embeds a tiny base)")
  return resolve(name)


def load_beacon_asset(asset_dir, base_dir: Optional[str] = None):
  """``(ModelConfig, BeaconConfig, params)``: the base (``base_dir``, default the one named in
  beacon.json; ``smollm2`` is fetched) with the asset's beacon tensors, in fp32."""
  from safetensors import safe_open
  from longjax.beacon.config import BeaconConfig
  from longjax.beacon.convert import load_beacon
  from longjax.convert.table import expected_names, get_path
  asset_dir = Path(asset_dir)
  if not (asset_dir / META).exists() or not (asset_dir / TENSORS).exists():
    raise AssetError(f"{asset_dir} is not a beacon asset (needs {META} and {TENSORS})")
  meta = json.loads((asset_dir / META).read_text())
  bcfg = BeaconConfig.from_hf(meta)
  cfg, bcfg, params = load_beacon(base_of(asset_dir, meta, base_dir), init="official", beacon=bcfg,
                                  param_dtype="float32")
  names = expected_names(cfg)
  with safe_open(asset_dir / TENSORS, framework="np") as f:
    missing = sorted(n for n in names if _is_beacon(n) and n not in f.keys())
    if missing:
      raise AssetError(f"{asset_dir / TENSORS} lacks {missing[:3]} ... ({len(missing)} tensors)")
    for name in f.keys():
      if name not in names:
        raise AssetError(f"{asset_dir / TENSORS}: tensor {name} does not fit this base model")
      row, layer = names[name]
      value = row.transform.to_jax(f.get_tensor(name).astype(np.float32), cfg)
      target = get_path(params, row.path)
      if layer is None:
        target[...] = value
      else:
        target[layer] = value
  return cfg, bcfg, params


def params_from_workdir(workdir, step=None):
  """Checkpoint ``step`` (default: the newest) of a train.py beacon run merged into its base:
  ``(ModelConfig, BeaconConfig, params, step, checkpoint name)``."""
  import ml_collections
  import orbax.checkpoint as ocp
  from longjax.beacon.config import BeaconConfig
  from longjax import checkpoint
  from longjax.beacon.convert import load_beacon
  from longjax.models.smollm2 import resolve
  workdir = Path(workdir).absolute()
  try:
    c = ml_collections.ConfigDict(json.loads((workdir / "config.json").read_text(encoding="utf-8")))
  except (ValueError, TypeError, AttributeError) as e:
    raise AssetError(f"{workdir / 'config.json'} is not a train.py run config ({e})") from None
  if c.get("method") != BEACON.name or BEACON.section not in c:
    raise AssetError(f"{workdir} is a {c.get('method')!r} run, not an Activation Beacon one: a "
                     "beacon asset holds beacon tensors only; use that run's export_hf (or "
                     "train.py's export) instead")
  bcfg = BeaconConfig.from_config(c[BEACON.section])
  if str(c.model.get("checkpoint") or "").strip():
    cfg, bcfg, params = load_beacon(resolve(c.model.checkpoint), init="official", beacon=bcfg,
                                    param_dtype="float32")
  else:  # the tiny base the run pretrained and cached in workdir/base
    import tempfile
    if not checkpoint.is_longjax_checkpoint(workdir / "base"):
      raise AssetError(f"{workdir} trained on the tiny base, but {workdir / 'base'} holds no "
                       "longjax checkpoint: rerun train.py on that workdir to rebuild it")
    with tempfile.TemporaryDirectory(prefix="longjax-asset-base-") as tmp:
      _embed(workdir / "base", Path(tmp) / "hf")
      cfg, bcfg, params = load_beacon(Path(tmp) / "hf", init="official", beacon=bcfg,
                                      param_dtype="float32")
  from longjax.quiet_reads import _quiet_unraisable, _short
  mgr = ocp.CheckpointManager(workdir / "checkpoints")
  steps = sorted(mgr.all_steps())
  if step is None:
    if not steps:
      raise AssetError(f"{workdir}/checkpoints holds no checkpoint yet")
    tries = steps[::-1]  # the newest readable one, as train.py resumes (nothing is moved here)
  elif step not in steps:
    raise AssetError(f"{workdir}/checkpoints has no step {step} (kept: {steps})")
  else:
    tries = [step]
  state = None
  for s in tries:
    try:
      with _quiet_unraisable(f"reading checkpoint step {s}"):
        state = mgr.restore(s, args=ocp.args.Composite(state=ocp.args.StandardRestore()))["state"]
      step = s
      break
    except Exception as e:  # noqa: BLE001 -- any read failure means "unreadable"
      log.warning("checkpoint step %d in %s/checkpoints is unreadable (%s: %s)%s", s, workdir,
                  type(e).__name__, _short(e), "; trying the previous one" if s != tries[-1] else "")
  if state is None:
    raise AssetError(f"none of the checkpoints {tries} in {workdir}/checkpoints could be read "
                     "(truncated or corrupt)")
  _merge(params, state["params"])
  return cfg, bcfg, params, int(step), c.model.checkpoint


def _merge(into: dict, trained: dict):
  for k, v in trained.items():
    if isinstance(v, dict):
      _merge(into[k], v)
    else:
      into[k] = np.asarray(v, np.float32).reshape(np.shape(into[k]))


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--workdir", required=True, help="a train.py beacon run directory")
  ap.add_argument("--out", required=True)
  ap.add_argument("--overwrite", action="store_true")
  ap.add_argument("--debug", action="store_true", help="show tracebacks")
  args = ap.parse_args(argv)

  def export():
    from longjax.atomic_dir import check_output_apart
    check_output_apart(args.out, "--out", {"--workdir": args.workdir})
    if not (Path(args.workdir) / "config.json").exists():
      raise AssetError(f"{args.workdir} is not a train.py run directory (no config.json)")
    cfg, bcfg, params, step, base = params_from_workdir(args.workdir)
    embed = None if str(base or "").strip() else Path(args.workdir) / "base"
    save_beacon_asset(args.out, cfg, bcfg, params, base=base, info=dict(train_step=step,
                                campaign=campaign.record(args.workdir, step)),
                      overwrite=args.overwrite, embed_base=embed)
    print(f"wrote {args.out} (step {step})")
  from longjax import cli
  return cli.run("python -m longjax.beacon.asset", export, debug=args.debug)


if __name__ == "__main__":
  sys.exit(main())
