"""Trained beacon tensors as a small asset: only the ``beacon_*`` tensors (official names, bf16)
plus the beacon settings in ``beacon.json``; the base model is loaded separately.

  cfg, bcfg, params = load_beacon_asset("assets/smollm2_beacon")      # base named in beacon.json
  python -m longjax.beacon.asset --workdir runs/smollm2_beacon --out assets/smollm2_beacon

``--workdir`` reads the newest training checkpoint of a ``train.py`` beacon run (it need not have
finished), or the one ``--step`` names, so a long run can be shipped at any kept step.
"""
from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Optional


from longjax.ckpts.atomic_dir import atomic_dir
from longjax.ckpts import campaign
from longjax.ckpts import assets, lowrank
from longjax.ckpts.assets import BASE_DIR, AssetError  # noqa: F401  (re-exported)
from longjax.method_names import BEACON

log = logging.getLogger("longjax")


STEM = BEACON.name
TENSORS = f"{STEM}.safetensors"  # one file; larger tensor sets are sharded (ckpts/assets.py)
META = f"{STEM}.json"
# beacon.json's own fields (the official beacon_* config fields; assets.COMMON_FIELDS besides) and
# their JSON types (assets.FIELD_KINDS): anything else is refused, a misspelt name included.
FIELDS = {"beacon_window": "int", "beacon_stride": "int", "beacon_ratio": "ints",
          "beacon_ratio_mix": "str", "beacon_pos": "str", "beacon_attn": "str",
          "beacon_param": "strs", "beacon_sink_size": "int", "beacon_embed_init": "str",
          "beacon_attend_prev": "bool", "beacon_parallel_window": "int"}


def _is_beacon(name: str) -> bool:
  return ".beacon_" in name or name.startswith("model.beacon_")


def save_beacon_asset(out_dir, cfg, bcfg, params, *, base: str, dtype: str = "bfloat16",
                      info: Optional[dict] = None, overwrite: bool = False,
                      embed_base=None, rank: Optional[int] = None) -> Path:
  """Write the beacon tensors of ``params`` (official HF names) and the settings.

  ``base`` names the model the asset loads on (a directory or ``smollm2``); ``embed_base`` (a
  longjax or HF checkpoint directory) is copied into the asset as ``base/`` instead, for a base
  that has no name elsewhere (the tiny one a run pretrains). An asset always has one of them.
  ``rank``: the trained matrices as rank-``rank`` deltas from the base (ckpts/lowrank.py)."""
  tensors, lowrank_entry = lowrank.stored_tensors(cfg, params, _is_beacon, rank, dtype)
  if not tensors:
    raise AssetError("these params hold no beacon tensors")
  if embed_base is None and not str(base or "").strip():
    raise AssetError("a beacon asset must name the base model it loads on (base=...) or embed it "
                     "(embed_base=...); an empty name would load whatever model sits in the "
                     "current directory")
  meta = dict(base=BASE_DIR if embed_base is not None else str(base),
              base_embedded=embed_base is not None, dtype=dtype, **bcfg.to_hf(), **(info or {}))
  if lowrank_entry is not None:
    meta[lowrank.KEY] = lowrank_entry
  assets.check_replaceable(out_dir, overwrite, META, STEM, BEACON.title)
  meta[assets.BASE_WEIGHTS_KEY] = assets.base_fingerprint(params)  # checked by train.init_from
  assets.check_settings(meta, META, FIELDS)  # what the loader will accept, before any work
  with atomic_dir(out_dir, overwrite) as tmp:
    if embed_base is not None:
      _embed(Path(embed_base), tmp / BASE_DIR)
    assets.write_tensors(tmp, STEM, tensors)
    (tmp / META).write_text(json.dumps(meta, indent=2))
  return Path(out_dir)


def _embed(src: Path, dst: Path):
  """``src`` (a longjax checkpoint or a HF directory) as a HF directory at ``dst``."""
  import shutil
  from longjax.ckpts import checkpoint
  from longjax.ckpts import save_hf
  if checkpoint.is_longjax_checkpoint(src):
    base_cfg, base_params, _ = checkpoint.load(src)
    save_hf(dst, base_cfg, base_params)
    return
  dst.mkdir()
  for f in src.iterdir():
    if f.is_file() and (f.suffix in (".json", ".safetensors", ".jinja", ".txt", ".model")):
      shutil.copyfile(f, dst / f.name)


def base_of(asset_dir, meta: dict, base_dir: Optional[str] = None) -> str:
  """The base model directory a beacon asset loads on (see :func:`assets.base_of`)."""
  return assets.base_of(asset_dir, meta, META, base_dir)


def load_beacon_asset(asset_dir, base_dir: Optional[str] = None):
  """``(ModelConfig, BeaconConfig, params)``: the base (``base_dir``, default the one named in
  beacon.json; ``smollm2`` is fetched) with the asset's beacon tensors, in fp32. ``asset_dir``: a
  directory, or the name of one in the repository's assets/ (``"smollm2_beacon"``; see
  ``longjax.ckpts.assets.find_asset``)."""
  from longjax.beacon.config import BeaconConfig
  from longjax.beacon.convert import load_beacon
  from longjax.ckpts.atomic_dir import restore_interrupted_swap
  restore_interrupted_swap(asset_dir)  # first: an overwrite killed midway leaves the path missing
  asset_dir = assets.find_asset(asset_dir, BEACON)  # a path, or a name in assets/
  if not (asset_dir / META).exists() or not assets.has_tensors(asset_dir, STEM):
    raise AssetError(f"{asset_dir} is not a beacon asset (needs {META} and {TENSORS})")
  meta = assets.read_json(asset_dir / META)
  assets.check_settings(meta, asset_dir / META, FIELDS)
  bcfg = BeaconConfig.from_hf(meta)
  tensors = assets.read_tensors(asset_dir, STEM, meta.get("dtype"))  # before the (slow) base
  base = base_of(asset_dir, meta, base_dir)
  cfg, bcfg, params = load_beacon(base, init="official", beacon=bcfg, param_dtype="float32")
  tensors = lowrank.expand(tensors, meta.get(lowrank.KEY), lowrank.base_reader(base),
                           str(asset_dir))
  assets.set_tensors(cfg, params, tensors, str(asset_dir / TENSORS), expected=_is_beacon)
  return cfg, bcfg, params


def params_from_workdir(workdir, step=None):
  """Checkpoint ``step`` (default: the newest) of a train.py beacon run merged into its base:
  ``(ModelConfig, BeaconConfig, params, step, checkpoint name)``."""
  from longjax.beacon.config import BeaconConfig
  from longjax.ckpts import checkpoint
  from longjax.beacon.convert import load_beacon
  from longjax.ckpts.smollm2 import resolve
  workdir = Path(workdir).absolute()
  c, method = assets.run_config(workdir, BEACON)
  if c is None:
    raise AssetError(f"{workdir} is a {method!r} run, not an Activation Beacon one: a "
                     "beacon asset holds beacon tensors only; use that run's export_hf (or "
                     "train.py's export) instead")
  bcfg = BeaconConfig.from_config(c.beacon)
  if str(c.model.checkpoint or "").strip():
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
  trained, step = assets.restore_trained(workdir, step)
  assets.merge_trained(params, trained)
  return cfg, bcfg, params, int(step), c.model.checkpoint


PROG = "python -m longjax.beacon.asset"


def build_parser():
  ap = assets.export_parser(PROG, __doc__, BEACON.title)
  ap.add_argument("--ratios", default="",
                  help="comma list: the compression ratios the asset runs at (default: the run's); "
                       "e.g. 8 for a run trained on 8,32,128 one per document, which would "
                       "otherwise draw one at random per document at inference too (the "
                       "campaign record keeps the training recipe)")
  ap.add_argument("--stride", type=int, default=0,
                  help="the window stride the asset runs at (default: the run's); e.g. the window "
                       "itself for beacons trained at a shorter stride, to read as the official "
                       "code does (the campaign record keeps the training recipe)")
  return ap


def main(argv=None):
  ap = build_parser()
  args = ap.parse_args(argv)

  def export():
    import dataclasses
    from longjax.ckpts.atomic_dir import check_output_apart
    check_output_apart(args.out, "--out", {"--workdir": args.workdir})
    assets.check_replaceable(args.out, args.overwrite, META, STEM, BEACON.title)  # before loading
    if not (Path(args.workdir) / "config.json").exists():
      raise AssetError(f"{args.workdir} is not a train.py run directory (no config.json)")
    ratios = None
    if args.ratios.strip():
      try:
        ratios = tuple(int(r) for r in args.ratios.split(","))
      except ValueError:
        raise AssetError("--ratios must be a comma list of integers, "
                         f"got {args.ratios!r}") from None
    if args.stride < 0:
      raise AssetError(f"--stride must be positive (0: the run's), got {args.stride}")
    cfg, bcfg, params, step, base = params_from_workdir(args.workdir, args.step)
    if ratios is not None:
      bcfg = dataclasses.replace(bcfg, ratios=ratios)  # validated by BeaconConfig itself
    if args.stride:
      bcfg = dataclasses.replace(bcfg, stride=args.stride)  # validated by BeaconConfig itself
    embed = None if str(base or "").strip() else Path(args.workdir) / "base"
    save_beacon_asset(args.out, cfg, bcfg, params, base=base, info=dict(train_step=step,
                                campaign=campaign.record(args.workdir, step)),
                      overwrite=args.overwrite, embed_base=embed, rank=args.rank or None)
    print(f"wrote {args.out} (step {step})")
  from longjax.runtime import cli
  return cli.run(PROG, export, debug=args.debug)


if __name__ == "__main__":
  sys.exit(main())
