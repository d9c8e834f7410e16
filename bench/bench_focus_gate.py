"""What FocusLLM's candidate gate costs (docs/focusllm.md §4.5), on SmolLM2 with the committed
candidates: prefill and decode read the official way (no gate, no overlap) and with the gate,
alternating in one process, the ratio per run. The gated side is the asset's own reading (its
``focus.json``); each flag below replaces one of its settings.

    JAX_PLATFORMS=cpu python -m bench.bench_focus_gate                  # 4K and 8K (~10 min)
    JAX_PLATFORMS=cpu python -m bench.bench_focus_gate --lengths 2048 --runs 1 --decode 4
    JAX_PLATFORMS=cpu python -m bench.bench_focus_gate --gate 8 --top_k 1 --overlap 0

The gate adds, per chunk row, one token read with the base weights over the row's cache and the
output head on that row, at prefill and at every decode step; the local forward's attention
adds a bias to the candidates' scores (the dense and chunked paths). Prompts are random token
ids (the work does not depend on the text); each decode run feeds ``--decode`` greedy tokens
through the device loop. Results: ``bench/results/focus_gate.{json,md}``.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

if __package__ in (None, ""):
  sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import harness as H  # noqa: E402

# flag -> the FocusConfig field it sets on the gated side
READING_FLAGS = {"gate": "candidate_gate", "threshold": "gate_threshold", "gain": "gate_gain",
                 "peer_gain": "gate_peer_gain", "top_k": "gate_top_k", "overlap": "chunk_overlap"}


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--lengths", default="4096,8192")
  ap.add_argument("--asset", default="smollm2_focus")
  for flag, field in READING_FLAGS.items():
    ap.add_argument(f"--{flag}", type=int if flag in ("top_k", "overlap") else float,
                    help=f"FocusConfig.{field} of the gated side (default: the asset's)")
  ap.add_argument("--runs", type=int, default=2)
  ap.add_argument("--decode", type=int, default=8)
  ap.add_argument("--out", type=Path, help="results directory (default bench/results)")
  a = ap.parse_args(argv)
  import jax
  import numpy as np
  from longjax.focus import FocusLLM
  from longjax.focus.asset import load_focus_asset

  machine = H.machine_info()
  cfg, fcfg, params = load_focus_asset(a.asset)
  params = jax.tree.map(jax.numpy.asarray, params)
  gated = fcfg.replace(**{field: getattr(a, flag) for flag, field in READING_FLAGS.items()
                          if getattr(a, flag) is not None})
  if not gated.candidate_gate:
    ap.error(f"{a.asset} reads with no gate: give --gate BETA (> 0) to measure one")
  reading = {field: getattr(gated, field) for field in READING_FLAGS.values()}
  label = "gated"
  sides = {"official": FocusLLM(cfg, fcfg.replace(candidate_gate=0.0, chunk_overlap=0)),
           label: FocusLLM(cfg, gated)}
  rows = []
  for length in [int(x) for x in a.lengths.split(",")]:
    ids = np.random.default_rng(length).integers(3, cfg.vocab_size, size=(1, length))
    lengths = np.array([length], np.int32)
    times = {name: [] for name in sides}
    for r in range(a.runs + 1):  # run 0 compiles (not kept); the order alternates per run
      order = list(sides) if r % 2 == 0 else list(sides)[::-1]
      for name in order:
        t = H.prefill_and_decode(sides[name], params, ids, lengths, a.decode,
                                 lambda *_: None, loop="device")
        if r:
          times[name].append(t)
      H.log(length, "run", r, {n: v[-1] for n, v in times.items() if v})
    med = {n: {k: H.median([t[k] for t in v]) for k in ("prefill", "decode")}
           for n, v in times.items()}
    off, on = med["official"], med[label]
    rows.append(dict(length=length, chunks=-(-(length - fcfg.local_window) // fcfg.chunk_stride),
                     median=med, prefill_ratio=H.ratio(on["prefill"], off["prefill"]),
                     decode_ratio=H.ratio(on["decode"], off["decode"])))
    H.log(rows[-1])
  machine["load_average_end"] = H.load_average()
  md = ["# FocusLLM's candidate gate: its cost (SmolLM2, the committed candidates)", "",
        H.machine_md(machine), "",
        f"The gated reading {reading} against the official one (no gate, no overlap), "
        "alternating in one process; "
        f"medians of {a.runs} runs after a compiling one; decode: {a.decode} tokens, device loop.",
        "", "| tokens | chunks | prefill s (official / gate) | ratio | decode ms/token "
        "(official / gate) | ratio |", "|---|---|---|---|---|---|"]
  for r in rows:
    off, on = r["median"]["official"], r["median"][label]
    md.append(f"| {r['length']} | {r['chunks']} | {off['prefill']:.2f} / {on['prefill']:.2f} | "
              f"{r['prefill_ratio']:.2f} | {1e3 * off['decode'] / a.decode:.0f} / "
              f"{1e3 * on['decode'] / a.decode:.0f} | {r['decode_ratio']:.2f} |")
  out = H.write_results("focus_gate", dict(machine=machine, reading=reading, runs=a.runs,
                                           decode=a.decode, rows=rows), "\n".join(md), a.out)
  print("\n".join(md))
  print(f"written to {out}")


if __name__ == "__main__":
  main()
