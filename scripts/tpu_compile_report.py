#!/usr/bin/env python
"""Compile longjax's programs for TPU slices on this CPU host and print memory / FLOPs (nothing
runs).

Needs ``libtpu`` (``pip install -r requirements-tpu.txt``). From the repository root:

    JAX_PLATFORMS=cpu python scripts/tpu_compile_report.py --kernels v4,v5e,v5p,v6e
    JAX_PLATFORMS=cpu python scripts/tpu_compile_report.py --train v5p-8 --length 4096 \\
        --impl blockwise
    JAX_PLATFORMS=cpu python scripts/tpu_compile_report.py --train v5p-8 --config beacon_llama3 \\
        --length 4096 --impl blockwise
    JAX_PLATFORMS=cpu python scripts/tpu_compile_report.py --infer v5p-8,v5e-16

Per program and slice: per-device bytes at the peak (arguments + outputs + temporaries - donated
aliases, from ``compiled.memory_analysis()``) against the chip's HBM, the FLOPs XLA counts
(``cost_analysis()``, per device) and the time they take at the chip's bf16 peak. XLA counts a
``while`` / ``scan`` body once, not once per trip: for the scanned models (layers under
``nn.scan``, beacon windows under ``lax.scan``) the FLOPs and time are lower bounds; the memory
numbers are exact for the compiled program. Writes the markdown table to ``--out`` if given.
"""
from __future__ import annotations

import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from scripts import compile_only as co  # noqa: E402  (beside this script)
from longjax.method_names import BEACON, FOCUS  # noqa: E402


def row(r: co.Result) -> str:
  gib = lambda b: f"{b / 2**30:.2f}"  # noqa: E731
  hbm = r.hbm()
  if not r.ok:
    return (f"| {r.program} | {r.slice} | {r.devices} | FAILED | {gib(hbm)} | | | "
            f"{r.compile_s:.0f} s | {r.error} |")
  fit = "yes" if r.fits() else "**no**"
  kernels = f"; {r.pallas_calls} Pallas calls" if r.pallas_calls else ""
  return (f"| {r.program} | {r.slice} | {r.devices} | {gib(r.peak_bytes)} "
          f"(temp {gib(r.temp_bytes)}) | {gib(hbm)} ({fit}) | {r.flops / 1e12:.3g} | "
          f"{1e3 * r.seconds_at_peak():.3g} ms | {r.compile_s:.0f} s | {r.note}{kernels} |")


HEADER = ("| program | slice | devices | per-device GiB at peak | HBM GiB (fits) | TFLOP / device "
          "(XLA count) | at bf16 peak | compile | notes |\n|---|---|---|---|---|---|---|---|---|")


PROG = "scripts/tpu_compile_report.py"


def build_parser():
  from longjax.runtime import cli
  ap = cli.parser(PROG, __doc__)
  ap.add_argument("--kernels", default="", help="chips for the kernel cases, e.g. v4,v5e,v5p,v6e")
  ap.add_argument("--train", default="", help="slices for the --config training step, "
                  "e.g. v5p-8,v5e-16")
  ap.add_argument("--config", default="beacon_qwen2", choices=sorted(co.SHAPES),
                  help="the training config whose step --train compiles (at its model's shape)")
  ap.add_argument("--focus-stride", type=int, default=0, help="FocusLLM training: the chunk "
                  "stride of the step (default: the one with the most chunk-row tokens)")
  ap.add_argument("--length", type=int, default=0, help="tokens per training sample "
                  "(default: the config's data.max_length)")
  ap.add_argument("--impl", default="", help="attention impl override (--train, --infer) "
                  "(default: the program's own)")
  ap.add_argument("--mesh", default="", help='mesh override, JSON, e.g. {"fsdp": 8, "tensor": 2} '
                  "(default: the config's)")
  ap.add_argument("--infer", default="", help="slices for the 128K inference programs: the "
                  "beacon_qwen2 prefill chunk + decode step and the focus_llama2 prefill + decode "
                  "step, e.g. v5p-8,v5e-16")
  ap.add_argument("--infer-methods", default=f"{BEACON.name},{FOCUS.name}",
                  help=f"which of them ({BEACON.name},{FOCUS.name})")
  ap.add_argument("--infer-length", type=int, default=131072, help="prompt tokens for --infer")
  ap.add_argument("--out", default="", help="also write the markdown table here")
  return ap


def main(argv=None):
  ap = build_parser()
  args = ap.parse_args(argv)
  if not co.libtpu_available():
    print("libtpu is not installed: pip install -r requirements-tpu.txt", file=sys.stderr)
    return 2
  t0 = time.time()
  results = []
  for chip in filter(None, args.kernels.split(",")):
    rs = co.kernel_results(chip)
    results += rs
    for r in rs:
      print(row(r), flush=True)
  for sl in filter(None, args.train.split(",")):
    r = co.train_step(sl, config=args.config, length=args.length or None, impl=args.impl or None,
                        mesh=json.loads(args.mesh) if args.mesh else None,
                        focus_stride=args.focus_stride or None)
    results.append(r)
    print(row(r), flush=True)
  methods = set(filter(None, args.infer_methods.split(",")))
  for sl in filter(None, args.infer.split(",")):
    rs = []
    if BEACON.name in methods:
      rs += co.beacon_infer(sl, length=args.infer_length, impl=args.impl or None)
    if FOCUS.name in methods:
      rs += co.focus_infer(sl, length=args.infer_length, impl=args.impl or None)
    results += rs
    for r in rs:
      print(row(r), flush=True)
  table = HEADER + "\n" + "\n".join(row(r) for r in results)
  print("\n" + table)
  print(f"\n{len(results)} programs, {sum(r.ok for r in results)} compiled, "
        f"{time.time() - t0:.0f} s")
  if args.out:
    with open(args.out, "w") as f:
      f.write(table + "\n")
  return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
  sys.exit(main())
