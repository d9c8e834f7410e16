"""Cold vs warm start: what the persistent compilation cache (``longjax.runtime.compile_cache``)
saves.

One fresh process per run, on the same random Qwen2-shaped model and prompt (built in-process,
nothing downloaded): the first process compiles into an empty cache directory (cold), the second
loads from it (warm), a third runs with the cache off (control). Each process times the first
prefill + decode (compile + run) and a second, identical one (run only); compile seconds are what
JAX's monitoring events report for the first call (``GenerateOutput.timings.compile_s``): tracing
and lowering, which every process repeats, and the backend compile, which the cache replaces by a
load. The ratio cold / warm compile is the figure of merit (issue target: >= 5x).

  python -m bench.bench_compile_cache [--length 4096] [--out bench/results]
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):
  sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import harness as H  # noqa: E402

MODEL = dict(family="qwen2", vocab_size=32000, hidden_size=512, intermediate_size=1408,
             num_layers=4, num_heads=8, num_kv_heads=2, head_dim=64, attention_bias=True,
             max_position_embeddings=32768)


def worker(spec: dict) -> dict:
  t_start = time.perf_counter()
  from longjax.runtime import compile_cache
  where = compile_cache.enable(spec["cache"])
  import jax
  import numpy as np
  from longjax.beacon import BeaconConfig, BeaconLM
  from longjax.inference.generate import generate
  from longjax.models.config import ModelConfig
  from longjax.models.decoder import init_params
  cfg = ModelConfig(**MODEL, alt_projections=("q", "k", "v"), num_alt_embeddings=1)
  bcfg = BeaconConfig(window=spec["window"], stride=spec["window"], ratios=(spec["ratio"],))
  params = jax.jit(lambda: init_params(cfg, 0))()
  lm = BeaconLM(cfg, bcfg, max_length=spec["length"] + spec["window"], progress=False)
  ids = np.random.default_rng(1).integers(3, cfg.vocab_size, spec["length"]).tolist()
  t_setup = time.perf_counter() - t_start

  events = {}
  jax.monitoring.register_event_duration_secs_listener(
      lambda e, d, **_: events.__setitem__(e, events.get(e, 0.0) + d))

  def once():
    events.clear()
    t0 = time.perf_counter()
    out = generate(lm, params, [ids], max_new_tokens=spec["decode"])
    return time.perf_counter() - t0, out, dict(events)

  first, out1, ev = once()
  second, out2, _ = once()
  stage = lambda name: round(ev.get(f"/jax/core/compile/{name}_duration", 0.0), 2)  # noqa: E731
  return dict(spec, cache_dir=str(where) if where else None, setup_s=round(t_setup, 2),
              first_s=round(first, 2), second_s=round(second, 2),
              compile_s=round(out1.timings.compile_s, 2), trace_s=stage("jaxpr_trace"),
              lower_s=stage("jaxpr_to_mlir_module"), backend_s=stage("backend_compile"),
              cache_hits=int(ev.get("/jax/compilation_cache/cache_hits", 0)),
              same_tokens=out1.tokens == out2.tokens, tokens=out1.tokens[0])


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
  ap.add_argument("--length", type=int, default=4096)
  ap.add_argument("--window", type=int, default=1024)
  ap.add_argument("--ratio", type=int, default=8)
  ap.add_argument("--decode", type=int, default=16)
  ap.add_argument("--out", default=str(H.RESULTS_DIR))
  args = ap.parse_args(argv)
  if args.worker:
    H.emit(worker(json.loads(args.worker)))
    return 0
  machine = H.machine_info()
  base = dict(length=args.length, window=args.window, ratio=args.ratio, decode=args.decode)
  rows = []
  with tempfile.TemporaryDirectory(prefix="longjax-jit-cache-") as d:
    for run, cache in (("cold", d), ("warm", d), ("off", "off")):
      H.log(f"{run} process (cache {cache})")
      res = H.run_worker("bench.bench_compile_cache", dict(base, run=run, cache=cache),
                         timeout_s=1800)
      H.log(json.dumps({k: res.get(k) for k in ("status", "first_s", "second_s", "compile_s",
                                                 "wall_s")}))
      rows.append(res)
  by = {r["run"]: r for r in rows}
  speedup = H.ratio(by["cold"].get("compile_s"), by["warm"].get("compile_s"))
  backend_speedup = H.ratio(by["cold"].get("backend_s"), by["warm"].get("backend_s"))
  same = len({json.dumps(r.get("tokens")) for r in rows}) == 1
  machine["load_average_end"] = H.load_average()
  payload = dict(machine=machine, rows=rows, compile_speedup_cold_over_warm=speedup,
                 backend_compile_speedup_cold_over_warm=backend_speedup,
                 identical_outputs=same)
  table = H.markdown_table(rows, [("process", "run"), ("first call s", "first_s"),
                                  ("second call s", "second_s"), ("compile s", "compile_s"),
                                  ("trace s", "trace_s"), ("lower s", "lower_s"),
                                  ("XLA compile / cache load s", "backend_s"),
                                  ("process wall s", "wall_s")])
  md = (f"# Cold vs warm start (persistent compilation cache)\n\n{H.machine_md(machine)}\n\n"
        f"Beacon prefill of {args.length} tokens (W = {args.window}, ratio {args.ratio}) + "
        f"{args.decode} decoded tokens on a random Qwen2-shaped model (hidden 512, 4 layers, "
        f"8/2 heads, vocab 32000, fp32).\n\n{table}\n\n"
        f"Compile seconds, cold / warm: **{H.fmt(speedup)}x** (XLA compile vs cache load: "
        f"{H.fmt(backend_speedup)}x); identical tokens in all three "
        f"processes: {same}.\n\n`python -m bench.bench_compile_cache --length {args.length}`\n")
  out = H.write_results("compile_cache", payload, md, Path(args.out))
  print(md)
  H.log(f"wrote {out}/compile_cache.{{json,md}}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
