"""longjax's Activation Beacon against the official PyTorch code, alternating fresh processes.

    python -m bench.bench_official --official-dir DIR --official-python PY [--lengths 8192,16384]

``DIR``: the official ``research/Long_LLM/activation_beacon`` directory (FlagOpen/FlagEmbedding;
the fixtures' commit 7ed43d67); ``PY``: a Python with its requirements (transformers 4.39.3,
torch; docs/performance.md says how to build one). Both default to the environment variables
``LONGJAX_OFFICIAL_BEACON_DIR`` / ``LONGJAX_OFFICIAL_PYTHON``; without them the script says what
is missing and exits 0 (nothing is measured, nothing written).

One random Qwen2-shaped checkpoint (``bench_beacon``'s shape, W = 1024, ratio 8, official beacon
init) is exported once in the official format; both sides load that export. Per length, ``--rounds``
rounds each run both sides in fresh processes, the order swapped every round (so slow drift of the
host hits both alike); each process warms up, then times ``--runs`` runs of prefill + a
``--decode``-token greedy decode (longjax: the compiled decode loop, ``generate``'s default). The
load average is recorded beside every number: PyTorch's CPU code slows down much more than XLA's
on a loaded host, so only quiet-host ratios mean anything. Greedy tokens must be identical.

Results: ``bench/results/official.{json,md}``: per length, the median over rounds of each side's
per-process medians, and official / longjax (> 1: longjax faster).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):
  sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import harness as H  # noqa: E402
from bench import bench_beacon as BB  # noqa: E402

LONGJAX, OFFICIAL = BB.BEACON, "official"


def missing_setup(official_dir, official_python) -> str:
  """Why the official side cannot run here ('' when it can)."""
  if not official_dir:
    return ("no official code: pass --official-dir (or set LONGJAX_OFFICIAL_BEACON_DIR) to the "
            "official research/Long_LLM/activation_beacon directory")
  if not (Path(official_dir) / "src" / "qwen2" / "modeling_qwen2.py").is_file():
    return (f"{official_dir} has no src/qwen2/modeling_qwen2.py: point --official-dir at the "
            "official research/Long_LLM/activation_beacon directory")
  if not official_python:
    return ("no official environment: pass --official-python (or set LONGJAX_OFFICIAL_PYTHON) to "
            "a Python with transformers 4.39.3 and torch")
  if not Path(official_python).is_file():
    return f"--official-python {official_python} does not exist"
  return ""


def export_checkpoint(tmp: Path, max_len: int) -> Path:
  """The bench's random Qwen2 with official-init beacon tensors, in the official format."""
  from longjax.beacon import load_beacon
  from longjax.beacon.convert import save_beacon
  plain = tmp / "qwen2"
  BB.write_checkpoint(plain, BB.MODEL, max_len)
  cfg, bcfg, params = load_beacon(plain, init="official", window=BB.WINDOW, stride=BB.WINDOW,
                                  ratios=(BB.RATIO,))
  return save_beacon(tmp / "export", cfg, bcfg, params)


def summarise(rows) -> list:
  """Per length: each side's median over rounds, the ratios, token agreement, load range."""
  out = []
  for length in sorted({r["length"] for r in rows}):
    pair = H.paired_sides(rows, length, LONGJAX, OFFICIAL)
    if pair is None:
      out.append(dict(length=length, status="incomplete"))
      continue
    pair.pop("tokens")
    out.append(dict(length=length, **pair))
  return out


COLUMNS = [
    ("length", "length"), ("rounds", "rounds"),
    ("prefill s longjax / official",
     lambda r: f"{H.fmt(r.get('longjax_prefill_s'))} / {H.fmt(r.get('official_prefill_s'))}"),
    ("prefill speed-up", "prefill_speedup"),
    ("decode ms/token longjax / official",
     lambda r: f"{H.fmt(r.get('longjax_decode_ms'))} / {H.fmt(r.get('official_decode_ms'))}"),
    ("decode speed-up", "decode_speedup"),
    ("greedy tokens identical", "tokens_identical"),
    ("load (1 min) range", "load_1min")]


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  ap.add_argument("--official-dir", default=os.environ.get("LONGJAX_OFFICIAL_BEACON_DIR"))
  ap.add_argument("--official-python", default=os.environ.get("LONGJAX_OFFICIAL_PYTHON"))
  ap.add_argument("--lengths", default="8192,16384")
  ap.add_argument("--rounds", type=int, default=3)
  ap.add_argument("--runs", type=int, default=3)
  ap.add_argument("--decode", type=int, default=32)
  ap.add_argument("--budget", type=float, default=300.0,
                  help="seconds per process (warm-up + runs)")
  ap.add_argument("--out", default=str(H.RESULTS_DIR))
  ap.add_argument("--name", default="official")
  args = ap.parse_args(argv)
  why = missing_setup(args.official_dir, args.official_python)
  if why:
    print(f"bench_official: skipped, {why}. Nothing measured.")
    return 0
  lengths = [int(x) for x in args.lengths.split(",")]
  machine = H.machine_info()
  H.log("machine:", json.dumps(machine))
  tmp = Path(tempfile.mkdtemp(prefix="longjax-official-"))
  ckpt = export_checkpoint(tmp, max(lengths) + args.decode + 2 * BB.WINDOW)
  rows = []
  for length in lengths:
    prompt = tmp / f"prompt_{length}.npy"
    import numpy as np
    np.save(prompt, BB.prompt_tokens(length, BB.MODEL["vocab_size"]))
    for rnd in range(args.rounds):
      order = (LONGJAX, OFFICIAL) if rnd % 2 == 0 else (OFFICIAL, LONGJAX)
      for method in order:
        spec = dict(method=method, length=length, decode=args.decode, runs=args.runs,
                    budget=args.budget, ckpt=str(ckpt), round=rnd)
        if method == LONGJAX:
          spec.update(impl="auto", loop="device", want_tokens=True)
          r = H.run_worker("bench.bench_beacon", spec, timeout_s=2 * args.budget + 120)
        else:
          spec.update(official_dir=str(Path(args.official_dir).resolve()), prompt=str(prompt))
          r = H.run_worker("bench.official_beacon_worker", spec, timeout_s=2 * args.budget + 120,
                           python=args.official_python)
        rows.append(r)
        if r.get("status") == "ok":
          H.log(f"{method} @ {length} round {rnd}: prefill {r['prefill_s']:.3f}s decode "
                f"{r['decode_ms_per_token']:.1f} ms/tok load {r.get('load_average')}")
        else:
          H.log(f"{method} @ {length} round {rnd}: {r.get('status')}: "
                f"{r.get('stderr_tail', '')[-800:]}")
  for r in rows:  # committed results name no machine's paths
    if "official_dir" in r:
      r["official_dir"] = "<official dir>"
  table = summarise(rows)
  machine["load_average_end"] = H.load_average()
  payload = dict(machine=machine, args=vars(args) | dict(official_dir="<official dir>",
                                                         official_python="<official python>"),
                 summary=table, rows=rows)
  md = (f"# longjax vs the official Activation Beacon code\n\n{H.machine_md(machine)}\n\n"
        + H.markdown_table(table, COLUMNS) + "\n")
  path = H.write_results(args.name, payload, md, Path(args.out))
  print(md)
  H.log(f"wrote {path}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
