"""Decode steps through the stacked layer scan vs per-layer weights (``Decoder.layer_loop``), in one
process, alternating.

    JAX_PLATFORMS=cpu python -m bench.bench_decode_layers            # ~3-6 min on 2 CPU cores
    python -m bench.bench_decode_layers --lengths 2048,16384 --rounds 2 --decode 16

Activation Beacon (the bench model of ``bench_beacon``: window 1024, ratio 8) decodes ``--decode``
greedy tokens through the compiled device loop after a prefill of each length, once with the
decoder the loop picks on CPU (``layer_loop="unrolled"``: per-layer weights, ``unstack_layers``)
and once with the stacked ``nn.scan`` (forced by ``UNROLL_MAX_LAYER_BYTES = 0``), in turn,
``--rounds`` times after a warm-up of each. Prints each layout's median decode ms/token, their
ratio and whether the greedy tokens are equal; writes ``bench/results/decode_layers.{json,md}``.
No timing assertions: on a busy host the ratio is all that means something.

Why: in a decode step of a few tokens every weight is read once, and the scan's per-layer
``dynamic_slice`` of each stacked weight is a copy as large as the read (XLA CPU does not fuse it
into the matmul): the copies cost as much memory traffic as the matmuls (docs/performance.md).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):
  sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import harness as H  # noqa: E402
from bench.bench_beacon import MODEL, RATIO, WINDOW, prompt_tokens, write_checkpoint  # noqa: E402


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--lengths", default="2048,8192,16384")
  ap.add_argument("--decode", type=int, default=32)
  ap.add_argument("--rounds", type=int, default=3)
  ap.add_argument("--out", default=None, help="results folder (default bench/results)")
  args = ap.parse_args(argv)
  import jax
  import numpy as np
  from longjax.beacon import BeaconLM, load_beacon
  from longjax.models import decoder as D
  from longjax.runtime.rounding import round_up

  machine = H.machine_info()
  lengths = [int(x) for x in args.lengths.split(",")]
  default_cap = D.UNROLL_MAX_LAYER_BYTES
  layouts = {"unrolled": default_cap, "scan": 0}  # the cap that makes decode_decoder pick each
  rows = []
  with tempfile.TemporaryDirectory() as tmp:
    ckpt = Path(tmp) / "ckpt"
    write_checkpoint(ckpt, MODEL, max(lengths) + args.decode + 2 * WINDOW)
    cfg, bcfg, params = load_beacon(str(ckpt), init="official", window=WINDOW, stride=WINDOW,
                                    ratios=(RATIO,))
    params = jax.device_put(params)
    for length in lengths:
      lm = BeaconLM(cfg, bcfg, max_length=round_up(length + args.decode + 1, WINDOW),
                    progress=False)
      tokens, lens = prompt_tokens(length, cfg.vocab_size), np.array([length], np.int32)
      times = {k: [] for k in layouts}
      ids = {}
      for r in range(args.rounds + 1):  # round 0: warm-up (compiles), not timed
        for name, cap in layouts.items():
          D.UNROLL_MAX_LAYER_BYTES = cap
          try:
            box = {}
            out = H.prefill_and_decode(lm, params, tokens, lens, args.decode, lambda *a: None,
                                       loop="device", on_tokens=lambda x: box.update(ids=x))
          finally:
            D.UNROLL_MAX_LAYER_BYTES = default_cap
          ids[name] = box["ids"]
          if r:
            times[name].append(1e3 * out["decode"] / args.decode)
      med = {k: statistics.median(v) for k, v in times.items()}
      row = dict(length=length, memory_capacity=lm.capacity, decode=args.decode,
                 rounds=args.rounds, unrolled_ms=med["unrolled"], scan_ms=med["scan"],
                 speedup=med["scan"] / med["unrolled"], tokens_equal=ids["unrolled"] == ids["scan"],
                 unrolled_runs_ms=times["unrolled"], scan_runs_ms=times["scan"],
                 load_average=H.load_average())
      H.log(f"{length}: unrolled {med['unrolled']:.2f} ms/token, scan {med['scan']:.2f} "
            f"({row['speedup']:.2f}x), tokens equal: {row['tokens_equal']}")
      rows.append(row)
  machine["load_average_end"] = H.load_average()
  table = H.markdown_table(rows, [
      ("context", "length"), ("memory capacity", "memory_capacity"),
      ("decode ms/token, per-layer weights", "unrolled_ms"), ("stacked scan", "scan_ms"),
      ("speed-up", "speedup"), ("greedy tokens equal", "tokens_equal"),
      ("load (1 min)", lambda r: r["load_average"][0])])
  md = ("# Decode steps: per-layer weights vs the stacked layer scan\n\n" + H.machine_md(machine)
        + f"\n\nActivation Beacon, window {WINDOW}, ratio {RATIO}, {args.decode} greedy tokens "
        f"through the device loop, median of {args.rounds} alternating rounds.\n\n" + table)
  out = H.write_results("decode_layers", dict(machine=machine, rows=rows), md, args.out)
  print(md)
  H.log(f"wrote {out}/decode_layers.md")


if __name__ == "__main__":
  main()
