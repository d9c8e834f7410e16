"""The matmul ceiling of a model's own shapes, against the square ``jnp.dot`` peak, in one process.

    python -m bench.bench_shapes [--base smollm2] [--rows 288,1024,8192] [--reps 7]

MFU is quoted against the peak of a 2048 x 2048 fp32 ``jnp.dot`` (``harness.matmul_peak_jax``).
A prefill cannot run its matmuls faster than those matmuls run alone, and their shapes differ from
the square one: an Activation Beacon window at W = 256, ratio 8 sends 288 rows (256 raw tokens +
32 beacons) through each projection; a full-attention prefill sends thousands. This prints, for
each linear layer of the model (q, k, v, o, gate, up, down) and each row count, the GFLOP/s of that
``jnp.dot`` alone and its share of the square peak, and the FLOP-weighted ceiling of one layer
(time of all seven dots at their own speed): the highest linear-layer MFU a prefill of those rows
could reach on this host. Results go to ``bench/results/shapes.{json,md}``.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from statistics import median

from bench import harness as H


def layer_dots(cfg) -> dict:
  """``name -> (in, out)`` of one decoder layer's linear maps."""
  h, q, kv, i = (cfg.hidden_size, cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim,
                 cfg.intermediate_size)
  return dict(q=(h, q), k=(h, kv), v=(h, kv), o=(q, h), gate=(h, i), up=(h, i), down=(i, h))


def time_dot(m: int, k: int, n: int, reps: int, batch_s: float = 0.05) -> float:
  """Median seconds of one ``[m, k] x [k, n]`` fp32 ``jnp.dot`` after a warm-up, each of the
  ``reps`` timings over enough back-to-back calls to last ``batch_s`` (a small dot takes
  microseconds: one call alone is mostly noise)."""
  import jax
  import jax.numpy as jnp
  a = jax.random.normal(jax.random.PRNGKey(0), (m, k), jnp.float32)
  b = jax.random.normal(jax.random.PRNGKey(1), (k, n), jnp.float32)
  f = jax.jit(jnp.dot)
  f(a, b).block_until_ready()
  t = time.perf_counter()
  f(a, b).block_until_ready()
  calls = max(1, int(batch_s / max(time.perf_counter() - t, 1e-6)))
  ts = []
  for _ in range(reps):
    t = time.perf_counter()
    outs = [f(a, b) for _ in range(calls)]
    jax.block_until_ready(outs)
    ts.append((time.perf_counter() - t) / calls)
  return median(ts)


def attention_dots(cfg, queries: int, keys: int) -> dict:
  """``name -> (m, k, n)`` of one KV head's attention matmuls, its query group stacked (as the
  CPU path runs them): scores ``[G * queries, D] x [D, keys]``, then ``[G * queries, keys] x
  [keys, D]``."""
  rows = cfg.num_heads // cfg.num_kv_heads * queries
  return dict(scores=(rows, cfg.head_dim, keys), pv=(rows, keys, cfg.head_dim))


def _gflops(dots: dict, reps: int):
  per, total_t, total_f = {}, 0.0, 0.0
  for name, (m, k, n) in dots.items():
    t = time_dot(m, k, n, reps)
    flops = 2.0 * m * k * n
    per[name] = round(flops / t / 1e9, 1)
    total_t += t
    total_f += flops
  return per, round(total_f / total_t / 1e9, 1)


def measure(cfg, rows, reps: int, attention=()) -> dict:
  before = H.matmul_peak_jax()
  table, att = [], []
  for m in rows:
    per, layer = _gflops({n: (m, k, o) for n, (k, o) in layer_dots(cfg).items()}, reps)
    table.append(dict(rows=m, gflops=per, layer_gflops=layer))
  for q, k in attention:
    per, both = _gflops(attention_dots(cfg, q, k), reps)
    att.append(dict(queries=q, keys=k, gflops=per, both_gflops=both))
  peak = H.merge_peaks(before, H.matmul_peak_jax())
  for row in table:
    row["layer_share_of_peak"] = round(row["layer_gflops"] * 1e9 / peak["best_flops"], 3)
  for row in att:
    row["share_of_peak"] = round(row["both_gflops"] * 1e9 / peak["best_flops"], 3)
  return dict(peak_gflops=round(peak["best_flops"] / 1e9, 1), peaks=peak["all_best"], table=table,
              attention=att)


def render(payload) -> str:
  names = list(payload["table"][0]["gflops"])
  lines = ["# Matmul ceiling of the model's own shapes", "", H.machine_md(payload["machine"]), "",
           f"Square 2048 fp32 `jnp.dot` peak: {payload['peak_gflops']} GFLOP/s (before / after: "
           f"{payload['peaks']}). Model: {payload['base']} (hidden {payload['hidden']}). GFLOP/s "
           "of each layer's `[rows, in] x [in, out]` dot alone (median of the runs); `layer`: the "
           "seven at their own speed, FLOP-weighted.", "",
           "| rows | " + " | ".join(names) + " | layer | layer / peak |",
           "|---" * (len(names) + 3) + "|"]
  for r in payload["table"]:
    lines.append(f"| {r['rows']} | " + " | ".join(str(r["gflops"][n]) for n in names)
                 + f" | {r['layer_gflops']} | {r['layer_share_of_peak']:.0%} |")
  if payload["attention"]:
    lines += ["", "One KV head's attention matmuls, its query group stacked "
              "(`[G * queries, D] x [D, keys]`, then `[G * queries, keys] x [keys, D]`):", "",
              "| queries | keys | scores | pv | both | both / peak |", "|---|---|---|---|---|---|"]
    for r in payload["attention"]:
      lines.append(f"| {r['queries']} | {r['keys']} | {r['gflops']['scores']} | "
                   f"{r['gflops']['pv']} | {r['both_gflops']} | {r['share_of_peak']:.0%} |")
  return "\n".join(lines) + "\n"


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--base", default="smollm2", help="smollm2 (the default; fetched on first use)")
  ap.add_argument("--rows", default="288,1024,8192",
                  help="row counts: 288 = one beacon window (W 256 + 32 beacons)")
  ap.add_argument("--attention", default="288:1312,64:1600,128:16384",
                  help="queries:keys pairs of attention matmuls to time (default: a beacon window "
                       "at 16K, W 256, ratio 8, over its mean memory; a 64-query block of a "
                       "1,600-token FocusLLM row; a 128-query block of a 16K prefill)")
  ap.add_argument("--reps", type=int, default=7)
  ap.add_argument("--out", default="bench/results", help="folder for shapes.{json,md}")
  args = ap.parse_args(argv)
  if args.base != "smollm2":
    ap.error(f"--base {args.base!r}: only smollm2 is wired here")
  rows = [int(x) for x in args.rows.split(",") if x.strip()]
  if not rows or min(rows) < 1:
    ap.error(f"--rows {args.rows!r}: give positive row counts, e.g. 288,1024")
  try:
    attention = [tuple(int(v) for v in p.split(":")) for p in args.attention.split(",") if p]
  except ValueError:
    attention = [()]
  if any(len(p) != 2 or min(p) < 1 for p in attention):
    ap.error(f"--attention {args.attention!r}: give queries:keys pairs, e.g. 288:1312")
  from longjax.ckpts import smollm2
  from longjax.models.config import ModelConfig
  base = smollm2.get(progress=lambda *a: None)
  cfg = ModelConfig.from_hf(json.loads((Path(base) / "config.json").read_text()))
  machine = H.machine_info()
  payload = dict(base=args.base, hidden=cfg.hidden_size, **measure(cfg, rows, args.reps, attention))
  machine["load_average_end"] = H.load_average()
  payload = dict(machine=machine, **payload)
  text = render(payload)
  print(text)
  H.write_results("shapes", payload, text, out_dir=Path(args.out))
  return 0


if __name__ == "__main__":
  sys.exit(main())
