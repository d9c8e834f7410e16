"""A learning campaign's held-out curve: each saved step of a train.py run, exported and measured on
held-out cells of the long-context report (scripts/longctx_report.py), one point per step.

For every requested step of ``--workdir`` (a kept checkpoint) the script exports the method's
asset (``python -m longjax.<method>.asset``, with ``--asset_args`` such as the reading setting),
scores it on ``--cells`` (RULER through the lm-eval model ``longjax``, the project's passkey,
held-out perplexity: never trained on) and appends the point to ``--out`` (json, written
atomically) and its figure (``.png`` beside it). ``--init DIR`` adds the campaign's starting asset
as step 0. Finished points are kept: a rerun measures only the new steps, so the curve grows
while the run trains. ``--reuse CURVE`` starts a new run's curve from a committed one measured
with the same yardstick: its baselines, and the point that measured this curve's starting asset
(its step 0 from the same ``--init``, or a step exported as the same files: every point records
the sha256 of the asset it measured), are copied instead of measured again (~12 minutes a point
on two cores at 10 samples a cell).

  python scripts/heldout_curve.py --method beacon --workdir runs/general/beacon \\
      --asset_args="--stride 128 --ratios 8" --steps 25,50 --out results/curve_beacon.json
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scripts import longctx_report as report  # noqa: E402

DEFAULT_CELLS = "niah_single_1:4096,passkey:1024,passkey:4096,perplexity:4096"


def fingerprint(asset: Path) -> dict:
  """An asset's identity: its path and the sha256 over its files' relative paths and bytes."""
  h = hashlib.sha256()
  for f in sorted(p for p in Path(asset).rglob("*") if p.is_file()):
    h.update(str(f.relative_to(asset)).encode() + b"\0" + f.read_bytes())
  return dict(path=str(asset), sha256=h.hexdigest())


def load_reused(path: Path) -> dict:
  """The curve named by ``--reuse``, or one line saying why it cannot be."""
  try:
    other = json.loads(Path(path).read_text())
  except (OSError, ValueError) as e:
    raise SystemExit(f"--reuse {path}: not a readable curve ({e}); give a curve .json written "
                     f"by this script") from None
  if not isinstance(other, dict) or not {"method", "cells", "points"} <= set(other):
    raise SystemExit(f"--reuse {path}: not a curve of this script (no method, cells or points)")
  return other


def reuse(curve: dict, other: dict, other_path: Path, init) -> list:
  """Copy the reused curve's baselines, and the point that measured ``init`` (its step 0 from the
  same starting asset, or any step exported as the same files), into ``curve``; refused unless
  it was measured with the same yardstick. Returns what was copied."""
  for key in ("method", "cells", "samples", "asset_args"):
    if other.get(key) != curve[key]:
      raise SystemExit(f"--reuse {other_path}: measured with {key} {other.get(key)!r}, this "
                       f"curve with {curve[key]!r}; only a curve with the same yardstick can be "
                       f"reused")
  copied = []
  for name, cells in other.get("baselines", {}).items():
    if name not in curve["baselines"]:
      curve["baselines"][name] = cells
      copied.append(name)
  if init is None or any(p["step"] == 0 for p in curve["points"]):
    return copied
  # the starting asset measured there: its step 0 (same init), or a point exported as these bytes
  for p in sorted(other["points"], key=lambda p: p["step"]):
    same = (p["step"] == 0 and other.get("init", {}).get("sha256") == init["sha256"]
            or p.get("asset", {}).get("sha256") == init["sha256"])
    if same:
      curve["points"].append(dict(p, step=0))
      copied.append("step 0" if p["step"] == 0 else f"step 0 (its step {p['step']})")
      break
  return copied


def export(method: str, workdir: Path, step: int, out: Path, asset_args: str):
  if out.exists():
    return
  cmd = [sys.executable, "-m", f"longjax.{method}.asset", "--workdir", str(workdir), "--step",
         str(step), "--out", str(out), *shlex.split(asset_args)]
  subprocess.run(cmd, check=True)


def measure(method: str, asset, cells: str, samples: int, where: Path) -> dict:
  """The report's cells for ``method`` (with ``asset``; None: a baseline without one) in
  ``where`` (resumable): ``{"task:length": cell}``."""
  argv = ["--out", str(where), "--methods", method, "--cells", cells, "--samples", str(samples)]
  if asset is not None:
    argv += ["--assets", f"{method}={asset}"]
  if report.main(argv) != 0:
    raise SystemExit(f"the report failed for {asset}")
  out = {}
  for p in sorted((where / "longctx_cells").glob(f"{method}__*.json")):
    c = json.loads(p.read_text())
    out[f"{c['task']}:{c['length']}"] = {k: c[k] for k in ("score", "n", "seconds", "answers",
                                                              "top_prefix_share") if k in c}
  return out


def write_atomic(path: Path, text: str):
  path.parent.mkdir(parents=True, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
  with os.fdopen(fd, "w") as f:
    f.write(text)
  os.chmod(tmp, 0o644)
  os.replace(tmp, path)


def figure(path: Path, curve: dict):
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  points = sorted(curve["points"], key=lambda p: p["step"])
  keys = sorted({k for p in points for k in p["cells"]})
  if not keys:
    return
  fig, axes = plt.subplots(1, len(keys), figsize=(3.6 * len(keys), 3), squeeze=False)
  for ax, k in zip(axes[0], keys):
    pts = [(p["step"], p["cells"][k]["score"]) for p in points if k in p["cells"]]
    ax.plot([s for s, _ in pts], [v for _, v in pts], marker="o", label=curve["method"])
    for i, (name, cells) in enumerate(sorted(curve.get("baselines", {}).items())):
      if k in cells:
        ax.axhline(cells[k]["score"], color=f"C{i + 1}", linestyle="--", label=name)
    ax.legend(fontsize=7)
    ax.set_title(k, fontsize=9)
    ax.set_xlabel("training step")
  fig.suptitle(curve["title"], fontsize=9)
  fig.tight_layout()
  fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".png")
  os.close(fd)
  fig.savefig(tmp, dpi=90)
  plt.close(fig)
  os.chmod(tmp, 0o644)
  os.replace(tmp, path.with_suffix(".png"))


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--method", required=True, choices=report.harness.WITH_ASSET)
  ap.add_argument("--workdir", required=True, type=Path, help="the train.py run directory")
  ap.add_argument("--steps", required=True, help="comma list of kept checkpoint steps")
  ap.add_argument("--out", required=True, type=Path, help="the curve (.json; the figure beside)")
  ap.add_argument("--init", type=Path, help="the campaign's starting asset, measured as step 0")
  # measurement settings: a curve keeps the ones its first point used (given again, they must
  # match: one curve, one yardstick)
  ap.add_argument("--asset_args", default=None, help="extra arguments of the asset export (e.g. "
                  "the reading setting: --stride 128 --ratios 8; default none)")
  ap.add_argument("--cells", default=None, help=f"task:length pairs of the report (default "
                  f"{DEFAULT_CELLS})")
  ap.add_argument("--samples", type=int, default=None, help="samples per cell (default 5)")
  ap.add_argument("--baselines", default="truncation", help="methods measured once on the same "
                  "cells, drawn as lines (e.g. truncation,plain; '' for none)")
  ap.add_argument("--reuse", type=Path, help="a curve measured with the same yardstick whose "
                  "baselines (and its point for the --init asset, if it measured those files) are "
                  "copied; a new curve takes its settings unless given")
  ap.add_argument("--title", default="", help="the figure's title (default: method and workdir)")
  ap.add_argument("--scratch", type=Path, help="exports and per-step reports (default: "
                  "<workdir>/../curve_<workdir name>)")
  args = ap.parse_args(argv)
  steps = [int(s) for s in args.steps.split(",") if s.strip()]
  if args.init and not args.init.is_dir():
    ap.error(f"--init {args.init}: no such asset directory (the campaign's starting asset)")
  reused = load_reused(args.reuse) if args.reuse else {}
  if args.init:  # step 0 is the starting asset itself: nothing to export from the workdir
    steps = [s for s in steps if s != 0]
  scratch = args.scratch or args.workdir.parent / f"curve_{args.workdir.name}"
  given = dict(method=args.method, cells=args.cells, samples=args.samples,
               asset_args=args.asset_args)
  if args.out.exists():
    curve = json.loads(args.out.read_text())
    for key, value in given.items():
      if value is not None and value != curve.get(key):
        ap.error(f"--{key} {value!r}: the curve {args.out} was measured with {curve.get(key)!r}; "
                 f"give the same (or leave it out) or write another --out")
  else:
    # a new curve measures with the settings given, else those of the curve it reuses
    curve = dict(title=args.title or f"{args.method}: {args.workdir} (held-out cells)",
                 method=args.method, cells=args.cells or reused.get("cells", DEFAULT_CELLS),
                 samples=args.samples or reused.get("samples", 5),
                 asset_args=reused.get("asset_args", "") if args.asset_args is None
                 else args.asset_args, points=[], baselines={})
  args.cells, args.samples, args.asset_args = curve["cells"], curve["samples"], curve["asset_args"]
  init = fingerprint(args.init) if args.init else None
  if init is not None and "init" in curve and curve["init"]["sha256"] != init["sha256"]:
    ap.error(f"--init {args.init}: the curve {args.out} started from {curve['init']['path']} "
             f"(other files); write another --out")
  if init is not None and not any(p["step"] == 0 for p in curve["points"]):
    curve["init"] = init  # step 0 is measured (or reused) from this asset
  if args.reuse:
    copied = reuse(curve, reused, args.reuse, init)
    print(f"reused from {args.reuse}: {', '.join(copied) or 'nothing new'}", flush=True)
  for name in (b.strip() for b in args.baselines.split(",") if b.strip()):
    if name not in curve["baselines"]:
      curve["baselines"][name] = measure(name, None, args.cells, args.samples,
                                         scratch / f"report_{name}")
      write_atomic(args.out, json.dumps(curve, indent=1))
  done = {p["step"] for p in curve["points"]}
  todo = ([(0, args.init)] if args.init and 0 not in done else []) + [
      (s, None) for s in steps if s not in done]
  for step, asset in todo:
    if asset is None:
      asset = scratch / f"asset_{step}"
      export(args.method, args.workdir, step, asset, args.asset_args)
    cells = measure(args.method, asset, args.cells, args.samples, scratch / f"report_{step}")
    curve["points"].append(dict(step=step, cells=cells, asset=fingerprint(asset)))
    curve["points"].sort(key=lambda p: p["step"])
    write_atomic(args.out, json.dumps(curve, indent=1))
    figure(args.out, curve)
    print(f"step {step}: " + ", ".join(f"{k} {v['score']:.3g}" for k, v in cells.items()),
          flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
