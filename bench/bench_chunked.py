"""One layer's causal self-attention on CPU: the chunked path against torch SDPA and the blockwise
path, in one process, alternating.

    JAX_PLATFORMS=cpu python -m bench.bench_chunked                  # ~3 min on 2 CPU cores
    python -m bench.bench_chunked --lengths 8192,16384 --rounds 5

Shape of the bench model (``bench_beacon``: 8 query / 2 KV heads of 64, batch 1, fp32), a fresh
causal prefill of each length (``causal_offset=0``). Variants:

* ``chunked``: ``chunked_attention`` as ``attention(impl="auto")`` runs it on CPU (key tiles,
  ``PARALLEL_BLOCKS`` query blocks per loop step, causal tile skipping);
* ``one chain``: the same with one query block per step (what the parallel chains buy);
* ``blockwise``: the online-softmax fallback (``blockwise_attention``, its default blocks);
* ``torch``: ``torch.nn.functional.scaled_dot_product_attention(is_causal=True)`` with the KV
  heads repeated (skipped with a message when torch is not installed).

Each round times every variant once (best of 2 calls), after a warm-up that compiles (reported
apart). Prints the medians and the ratios against torch and writes
``bench/results/chunked.{json,md}``. No timing assertions: on a busy host only the ratios mean
something.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
  sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import harness as H  # noqa: E402

HEADS, KV_HEADS, HEAD_DIM = 8, 2, 64


def _best_of(fn, n=2):
  best = float("inf")
  for _ in range(n):
    t = time.perf_counter()
    fn()
    best = min(best, time.perf_counter() - t)
  return best


def _variants(length):
  import jax
  import jax.numpy as jnp
  import numpy as np
  from longjax.kernels.blockwise import blockwise_attention
  from longjax.kernels.chunked import chunked_attention
  from longjax.kernels.mask import CAUSAL_PREFILL, NO_WINDOW, TokenMeta, kernel_meta

  rng = np.random.default_rng(0)
  q, k, v = (rng.standard_normal((1, length, h, HEAD_DIM), np.float32)
             for h in (HEADS, KV_HEADS, KV_HEADS))
  meta = TokenMeta.causal(jnp.arange(length)[None])
  rule = CAUSAL_PREFILL
  args = tuple(jnp.asarray(x) for x in (q, k, v))
  jitted = {
      "chunked": jax.jit(lambda q, k, v: chunked_attention(q, k, v, meta, meta, rule,
                                                           causal_offset=0)[0]),
      "one chain": jax.jit(lambda q, k, v: chunked_attention(q, k, v, meta, meta, rule,
                                                             parallel_blocks=1,
                                                             causal_offset=0)[0]),
      "blockwise": jax.jit(lambda q, k, v: blockwise_attention(
          q, k, v, kernel_meta(meta, meta, rule, NO_WINDOW), scale=HEAD_DIM ** -0.5)[0]),
  }
  fns = {name: (lambda f=f: f(*args).block_until_ready()) for name, f in jitted.items()}
  try:
    import torch
  except ImportError:
    H.log("torch is not installed: the torch SDPA baseline is skipped")
  else:
    g = HEADS // KV_HEADS
    tq, tk, tv = (torch.from_numpy(x).transpose(1, 2) for x in (q, k, v))
    tk, tv = tk.repeat_interleave(g, 1), tv.repeat_interleave(g, 1)
    fns["torch"] = lambda: torch.nn.functional.scaled_dot_product_attention(tq, tk, tv,
                                                                             is_causal=True)
  return fns, args, jitted


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--lengths", default="2048,8192,16384")
  ap.add_argument("--rounds", type=int, default=3)
  ap.add_argument("--out", default=None, help="results folder (default bench/results)")
  args = ap.parse_args(argv)
  import numpy as np

  machine = H.machine_info()
  rows = []
  for length in [int(x) for x in args.lengths.split(",")]:
    fns, inputs, jitted = _variants(length)
    warm = {}
    for name, fn in fns.items():
      t = time.perf_counter()
      fn()
      warm[name] = time.perf_counter() - t
    ref = np.asarray(jitted["chunked"](*inputs))
    err = float(np.max(np.abs(np.asarray(jitted["blockwise"](*inputs)) - ref)))
    times = {name: [] for name in fns}
    for _ in range(args.rounds):
      for name, fn in fns.items():
        times[name].append(_best_of(fn))
    med = {name: statistics.median(ts) for name, ts in times.items()}
    row = dict(length=length, rounds=args.rounds, median_s=med, warmup_s=warm, runs_s=times,
               max_abs_diff_vs_blockwise=err, load_average=H.load_average())
    if "torch" in med:
      row["chunked_vs_torch"] = med["torch"] / med["chunked"]
    H.log(f"{length}: " + ", ".join(f"{n} {t:.3f} s" for n, t in med.items())
          + (f"; chunked {row['chunked_vs_torch']:.2f}x torch's speed" if "torch" in med else ""))
    rows.append(row)
  machine["load_average_end"] = H.load_average()
  names = list(rows[0]["median_s"])
  cols = [("keys", "length")] + [(f"{n} s", lambda r, n=n: r["median_s"].get(n)) for n in names]
  cols += [("chunked compile + run s", lambda r: r["warmup_s"]["chunked"])]
  if "torch" in names:
    cols += [("chunked speed vs torch", "chunked_vs_torch")]
  cols += [("max abs diff vs blockwise", "max_abs_diff_vs_blockwise"),
           ("load (1 min)", lambda r: r["load_average"][0])]
  md = ("# One layer's causal attention on CPU\n\n" + H.machine_md(machine)
        + f"\n\n{HEADS} query / {KV_HEADS} KV heads of {HEAD_DIM}, batch 1, fp32, fresh causal "
        f"prefill; median over {args.rounds} alternating rounds of the best of 2 calls.\n\n"
        + H.markdown_table(rows, cols))
  out = H.write_results("chunked", dict(machine=machine, rows=rows), md, args.out)
  print(md)
  H.log(f"wrote {out}/chunked.md")


if __name__ == "__main__":
  main()
