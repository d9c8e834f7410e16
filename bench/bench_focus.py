"""FocusLLM on CPU: parallel chunk condensing vs a sequential chunk loop, decode latency vs the
number of chunks, 1 vs 8 (fake) devices.

    JAX_PLATFORMS=cpu python -m bench.bench_focus            # full run (~6-8 min, 2 cores)
    JAX_PLATFORMS=cpu python -m bench.bench_focus --quick    # smoke run
    # bounded-memory condensing (bench/results/focus_bounded.md):
    JAX_PLATFORMS=cpu python -m bench.bench_focus --chunks 8,16,32,64 \
        --modes parallel,all,sequential --all-chunks 8,16 --decode 0 --runs 2 --budget 150 \
        --name focus_bounded

The same random Qwen2-shaped checkpoint as ``bench_beacon`` (candidate projections = copies of
q/k/v/o, ``load_focus(init_candidates="copy")``); ``FocusConfig(local_window=1024,
chunk_stride=1024)`` (prompt cap 512): a prompt of ``1024 * (n + 1)`` tokens has ``n`` chunks.

Modes (each configuration in its own subprocess):

* ``parallel``: ``FocusLLM.prefill`` (the chunk rows ``c_i ⊕ d`` condensed ``--chunk-batch`` rows
  per forward in one device loop, default: the device kind's, 1 on CPU; then the local forward),
  then ``--decode`` cached ``FocusLLM.step`` calls (per-step latency).
* ``all``: ``parallel`` with every chunk row in one batched forward (``chunk_batch_size`` above the
  row count: the behaviour before bounded condensing).
* ``sequential``: the official code's strategy, written here as a baseline: one chunk row at a
  time through the same jitted single-row ``condense`` (Python loop), then the same local forward.
  Same FLOPs as ``parallel`` (without its padding rows); the baseline for time and memory.
* ``paired``: ``parallel`` and ``sequential`` alternately in one process (order swapped every
  run): the median of the per-run time ratios is robust to a host whose load drifts (no memory
  columns: the process runs both).
* ``parallel8``: ``parallel`` with the chunk axis sharded over 8 fake CPU devices
  (``XLA_FLAGS=--xla_force_host_platform_device_count=8``, ``longjax.focus.chunk_mesh(8)``). On a
  2-core host the 8 "devices" share the same 2 cores: this measures the sharding overhead, not a
  speed-up.

Memory: ``peak RSS`` is this configuration's process ``ru_maxrss`` over its whole life (checkpoint
loading, compilation, the runs); ``run peak RSS`` the peak during the timed runs only (after the
warm-up; ``/proc/self/clear_refs`` resets the high-water mark at the start of each run): params,
JAX runtime, outputs and condensing workspace. ``chunk caches`` are the bytes of the chunk KV
caches the decode step needs (an output, linear in the chunks); ``run peak − caches`` the rest,
which stays flat when condensing is bounded.

Results: ``bench/results/focus.{json,md}``.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):
  sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import harness as H  # noqa: E402
from longjax.methods import Focus  # noqa: E402

FOCUS = Focus.name  # the results are named after the method
from bench.bench_beacon import MODEL, QUICK_MODEL, prompt_tokens, write_checkpoint  # noqa: E402

LOCAL, STRIDE = 1024, 1024


def focus_flops(cfg, row, n_dec: int):
  """Model FLOPs of the prefill (chunk rows + local forward + 1 head) and of ``n_dec`` cached
  decode steps (each: every chunk row runs 2 tokens over its cache, the local context is
  recomputed with the fresh candidates, 1 head)."""
  lin = H.linear_flops_per_token(cfg)
  rows = [len(c) + len(row.prompt) for c in row.chunks]
  c, u = len(rows), len(row.local)
  pre = (lin * (sum(rows) + u) + H.attention_flops(cfg, sum(H.causal_pairs(t) for t in rows)
                                                   + H.causal_pairs(u, c)) + H.head_flops(cfg, 1))
  dec = 0.0
  for j in range(n_dec):
    # chunk step: [previous candidate, new token] after (row length - 1 + j) cached entries
    pairs = sum(H.causal_pairs(2, t - 1 + j) for t in rows) + H.causal_pairs(u + j + 1, c)
    dec += lin * (2 * c + u + j + 1) + H.attention_flops(cfg, pairs) + H.head_flops(cfg, 1)
  return pre, dec


def reset_peak_rss() -> bool:
  """Reset this process's peak RSS (Linux ``VmHWM``) to the current RSS, so that a later
  :func:`peak_rss_since_reset` is the peak of what ran since (False: not supported). ``ru_maxrss``
  does not follow: it also keeps the peak of every thread that exited (XLA's compile threads)."""
  try:
    Path("/proc/self/clear_refs").write_text("5")
    return True
  except OSError:
    return False


def peak_rss_since_reset() -> float:
  """``VmHWM`` in MiB (the process peak where ``/proc`` is missing)."""
  hwm = H.proc_status_mib("VmHWM")
  return H.peak_rss_mib() if hwm is None else hwm


def worker(spec: dict) -> dict:
  import jax
  import jax.numpy as jnp
  import numpy as np
  from longjax.focus import FocusConfig, FocusLLM, chunk_mesh, load_focus
  from longjax.focus import condense as C
  from longjax.models.head import lm_head
  from longjax.focus.planner import pack_chunks, pack_local

  n_chunks, n_dec, mode = spec["chunks"], spec["decode"], spec["mode"]
  t_len = LOCAL + n_chunks * STRIDE
  peak0 = H.matmul_peak_jax("float32")
  fcfg = FocusConfig(local_window=LOCAL, chunk_stride=STRIDE, min_len_threshold=0)
  cfg, fcfg, params = load_focus(spec["ckpt"], fcfg, init_candidates="copy")
  params = jax.device_put(params)
  mesh = chunk_mesh(8) if mode == "parallel8" else None
  batch = 1 << 30 if mode == "all" else spec.get("chunk_batch")
  lm = FocusLLM(cfg, fcfg, mesh=mesh, impl=spec["impl"], chunk_batch_size=batch)
  tokens = prompt_tokens(t_len, cfg.vocab_size)
  lengths = np.array([t_len], np.int32)
  row = lm.plan(tokens[0])
  assert row.n_chunks == n_chunks, (row.n_chunks, n_chunks)
  rss_loaded = H.current_rss_mib()
  box = {}

  if mode in ("sequential", "paired"):
    cb = pack_chunks([row], row_multiple=1, length_multiple=lm.bucket, cmax_multiple=1)
    lb = pack_local([row], capacity=len(row.local), length_multiple=lm.bucket)
    one = jax.jit(lambda p, t, pos, v, l: C.condense(lm.model, p, t, pos, v, l))

    @jax.jit
    def local(p, cand_k, cand_v, gather, cand_valid, toks, lens, nch):
      h = C.local_hidden(lm.model, p, cand_k, cand_v, gather, cand_valid, toks, lens, nch)
      return lm_head(cfg, p, C.last_hidden(h, lens))

    def run_seq():
      t0 = time.perf_counter()
      ks, vs, caches = [], [], []
      for n in range(cb.n_rows):  # the official strategy: one chunk after the other
        sl = slice(n, n + 1)
        ck, cv, k, v = one(params, cb.tokens[sl], cb.positions[sl], cb.valid[sl], cb.lengths[sl])
        ks.append(ck)
        vs.append(cv)
        caches.append((k, v))
      logits = local(params, jnp.concatenate(ks, 1), jnp.concatenate(vs, 1), cb.gather,
                     cb.cand_valid, lb.tokens, lb.lengths, lb.n_chunks)
      logits = jax.block_until_ready(logits)
      dt = time.perf_counter() - t0
      if mode == "sequential":
        box["logits"] = logits
        box["state_bytes"] = box["cache_bytes"] = sum(k.nbytes + v.nbytes for k, v in caches)
      return {"prefill": dt}

  def run_par():
    # loop "device": the compiled decode loop generate() uses for FocusLLM (bench_official_focus)
    return H.prefill_and_decode(
        lm, params, tokens, lengths, n_dec,
        lambda logits, state: box.update(logits=logits, state_bytes=H.tree_nbytes(state),
                                         cache_bytes=state.cache_k.nbytes + state.cache_v.nbytes),
        loop=spec.get("loop", "host"), on_tokens=lambda ids: box.update(tokens=ids))

  if mode == "sequential":
    run = run_seq
  elif mode == "paired":  # both in this process, alternating: a time ratio under the same load
    def run():
      box["pair"] = box.get("pair", -1) + 1
      if box["pair"] % 2:
        seq = run_seq()["prefill"]
        par = run_par()
      else:
        par = run_par()
        seq = run_seq()["prefill"]
      if box["pair"]:  # not the warm-up
        box.setdefault("ratios", []).append(par["prefill"] / seq)
      return dict(par, sequential=seq)
  else:
    run = run_par

  peaks = []  # per call (warm-up first): (RSS at start, peak RSS during the call) in MiB

  def measured():
    reset_peak_rss()
    start = H.current_rss_mib()
    d = run()
    peaks.append((start, peak_rss_since_reset()))
    return d

  res = H.timed_runs(measured, runs=spec["runs"], budget_s=spec["budget"])
  peak = H.merge_peaks(peak0, H.matmul_peak_jax("float32"))
  if spec.get("logits_out"):
    np.save(spec["logits_out"], np.asarray(box["logits"][0], np.float32))
  flops_p, flops_d = focus_flops(cfg, row, n_dec)
  tp, td = res["median"]["prefill"], res["median"].get("decode") if n_dec else None
  peak_rss, cache_mib = H.peak_rss_mib(), box["cache_bytes"] / 2**20
  run_peak = max(p for _, p in peaks[1:]) if len(peaks) > 1 and mode != "paired" else None
  return dict(spec, context=t_len, devices=jax.device_count(), n_runs=res["n_runs"],
              note=res["note"], warmup_prefill_s=res["warmup"]["prefill"],
              warmup_decode_s=res["warmup"].get("decode"), prefill_times_s=res["times"]["prefill"],
              decode_times_s=res["times"].get("decode"), prefill_s=tp,
              prefill_tok_s=t_len / tp, decode_step_ms=None if td is None else 1e3 * td / n_dec,
              decode_tok_s=None if td is None else n_dec / td,
              chunk_rows=[len(c) + len(row.prompt) for c in row.chunks], local_len=len(row.local),
              chunk_batch_size=None if mode == "sequential" else lm.chunk_batch_size,
              peak_rss_mib=peak_rss, rss_after_load_mib=rss_loaded,
              state_mib=round(box["state_bytes"] / 2**20, 2), cache_mib=round(cache_mib, 2),
              peak_minus_cache_mib=round(peak_rss - cache_mib, 1),
              warmup_peak_rss_mib=peaks[0][1], run_peak_rss_mib=run_peak,
              run_start_rss_mib=peaks[-1][0],
              run_peak_minus_cache_mib=None if run_peak is None else round(run_peak - cache_mib, 1),
              sequential_s=res["median"].get("sequential"),
              paired_time_ratios=[round(x, 3) for x in box.get("ratios", [])],
              paired_time_ratio=H.median(box.get("ratios", [])),
              prefill_model_gflop=round(flops_p / 1e9, 2),
              prefill_gflop_s=round(flops_p / tp / 1e9, 2),
              matmul_peak_gflop_s=round(peak["best_flops"] / 1e9, 1),
              matmul_peak_all=peak["all_best"], prefill_mfu=flops_p / tp / peak["best_flops"],
              decode_gflop_per_step=round(flops_d / max(n_dec, 1) / 1e9, 2),
              decode_mfu=None if not td else flops_d / td / peak["best_flops"],
              load_average=H.load_average(),
              **({"tokens": box.get("tokens")} if spec.get("want_tokens") else {}))


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  ap.add_argument("--worker", help=argparse.SUPPRESS)
  ap.add_argument("--quick", action="store_true")
  ap.add_argument("--chunks", default=None, help="comma list of chunk counts (default 2,8,16)")
  ap.add_argument("--modes", default="parallel,sequential,parallel8",
                  help="comma list of parallel, all, sequential, paired, parallel8")
  ap.add_argument("--chunk-batch", type=int, default=None,
                  help="FocusLLM chunk_batch_size for parallel/parallel8 (default: device kind's)")
  ap.add_argument("--sharded-chunks", default="8", help="chunk counts for parallel8")
  ap.add_argument("--all-chunks", default="2,8,16",
                  help="chunk counts for mode all (its memory grows with the chunks)")
  ap.add_argument("--paired-chunks", default="8", help="chunk counts for mode paired")
  ap.add_argument("--runs", type=int, default=5)
  ap.add_argument("--decode", type=int, default=4, help="decode steps per run (parallel modes)")
  ap.add_argument("--budget", type=float, default=60.0)
  ap.add_argument("--impl", default="auto")
  ap.add_argument("--ckpt", default=None, help="reuse a checkpoint written by bench_beacon")
  ap.add_argument("--out", default=str(H.RESULTS_DIR))
  ap.add_argument("--name", default=None)
  args = ap.parse_args(argv)

  if args.worker:
    H.emit(worker(json.loads(args.worker)))
    return

  model = dict(QUICK_MODEL if args.quick else MODEL)
  chunks = ([int(x) for x in args.chunks.split(",")] if args.chunks else
            ([1, 2] if args.quick else [2, 8, 16]))
  sharded = [int(x) for x in args.sharded_chunks.split(",")] if not args.quick else [2]
  all_rows = [int(x) for x in args.all_chunks.split(",")]
  paired = [int(x) for x in args.paired_chunks.split(",")]
  name = args.name or (f"{FOCUS}_quick" if args.quick else FOCUS)
  machine = H.machine_info()
  H.log("machine:", json.dumps(machine))
  tmp = Path(tempfile.mkdtemp(prefix="longjax-bench-focus-"))
  ckpt = Path(args.ckpt) if args.ckpt else tmp / "qwen2"
  if not args.ckpt:
    write_checkpoint(ckpt, model, LOCAL + max(chunks) * STRIDE + 1024)
  results = []
  for n in chunks:
    for mode in args.modes.split(","):
      if ((mode == "parallel8" and n not in sharded) or (mode == "all" and n not in all_rows)
          or (mode == "paired" and n not in paired)):
        continue
      spec = dict(mode=mode, chunks=n, decode=0 if mode == "sequential" else args.decode,
                  chunk_batch=args.chunk_batch,
                  runs=args.runs, budget=args.budget, impl=args.impl, ckpt=str(ckpt),
                  logits_out=str(tmp / f"logits_{mode}_{n}.npy"))
      prev = [r for r in results if r.get("mode") == mode and r.get("status") == "ok"]
      if prev:
        p = prev[-1]
        pred = (p["prefill_s"] + (p.get("decode_step_ms") or 0) * spec["decode"] / 1e3) * (
            n / p["chunks"])
        if pred > 1.5 * args.budget:
          results.append(dict(spec, status="skipped: budget", predicted_run_s=round(pred, 1)))
          H.log(f"{mode} @ {n} chunks: skipped (predicted {pred:.0f}s per run)")
          continue
      H.log(f"{mode} @ {n} chunks ...")
      env = {"XLA_FLAGS": "--xla_force_host_platform_device_count=8"} if mode == "parallel8" else {}
      r = H.run_worker("bench.bench_focus", spec, timeout_s=1.6 * args.budget + 150, env_extra=env)
      results.append(r)
      if r.get("status") == "ok":
        H.log(f"  prefill {r['prefill_s']:.2f}s  decode/step "
              f"{r['decode_step_ms'] or 0:.0f} ms  warm-up {r['warmup_prefill_s']:.1f}s  runs "
              f"{r['n_runs']}  rss {r['peak_rss_mib']:.0f} MiB (runs {r['run_peak_rss_mib']}, "
              f"caches {r['cache_mib']:.0f})  MFU {100 * r['prefill_mfu']:.1f}%"
              + (f"  paired par/seq {r['paired_time_ratios']}" if mode == "paired" else "")
              + f"  ({r['wall_s']}s wall)")
      else:
        H.log(f"  {r.get('status')}: {r.get('stderr_tail', '')[-600:]}")
  _compare(results)
  machine["load_average_end"] = H.load_average()
  machine["uptime_end"] = H.uptime_line()
  payload = dict(benchmark="focusllm_condensing", machine=machine, model=model,
                 focus=dict(local_window=LOCAL, chunk_stride=STRIDE, prompt_cap=512),
                 args=vars(args), results=results)
  table = render(payload)
  out = H.write_results(name, payload, table, args.out)
  print(table)
  H.log(f"wrote {out / (name + '.json')} and {out / (name + '.md')}")
  shutil.rmtree(tmp, ignore_errors=True)  # the checkpoint and the saved logits


def _compare(results):
  import numpy as np
  by = {(r["mode"], r["chunks"]): r for r in results if r.get("status") == "ok"}
  for (mode, n), r in by.items():
    par = by.get(("parallel", n))
    if par and mode != "parallel":
      r["time_vs_parallel"] = r["prefill_s"] / par["prefill_s"]
      a, b = Path(r["logits_out"]), Path(par["logits_out"])
      if a.exists() and b.exists():
        r["max_abs_dlogit_vs_parallel"] = float(np.max(np.abs(np.load(a) - np.load(b))))
    seq = by.get(("sequential", n))
    if seq and mode not in ("sequential", "paired"):
      r["rss_vs_sequential"] = r["peak_rss_mib"] / seq["peak_rss_mib"]
      if r.get("run_peak_rss_mib") and seq.get("run_peak_rss_mib"):
        r["run_rss_vs_sequential"] = r["run_peak_rss_mib"] / seq["run_peak_rss_mib"]
      r["time_vs_sequential"] = r["prefill_s"] / seq["prefill_s"]


def render(payload) -> str:
  rows = sorted(payload["results"], key=lambda r: (r["chunks"], r["mode"]))
  cols = [("mode", "mode"), ("chunks", "chunks"), ("context", "context"),
          ("devices", "devices"), *H.PREFILL_TIME_COLUMNS, ("time / parallel", "time_vs_parallel"),
          ("time / sequential", "time_vs_sequential"),
          ("paired time parallel / sequential", "paired_time_ratio"),
          ("peak RSS / sequential", "rss_vs_sequential"),
          ("run peak / sequential", "run_rss_vs_sequential"),
          ("decode ms/step", "decode_step_ms"), ("warm-up s", "warmup_prefill_s"),
          ("rows / forward", "chunk_batch_size"), *H.RUN_COLUMNS,
          ("run peak RSS MiB", "run_peak_rss_mib"),
          ("chunk caches MiB", "cache_mib"), ("peak − caches MiB", "peak_minus_cache_mib"),
          ("run peak − caches MiB", "run_peak_minus_cache_mib"),
          ("RSS after load MiB", "rss_after_load_mib"), ("state MiB", "state_mib"),
          *H.PREFILL_COMPUTE_COLUMNS,
          ("max|Δlogit| vs parallel", "max_abs_dlogit_vs_parallel"), H.STATUS_COLUMN]
  m = payload["model"]
  head = (f"### FocusLLM condensing and decoding (CPU)\n\nModel: as the beacon table (hidden "
          f"{m['hidden_size']}, {m['num_layers']} layers), candidate projections q/k/v/o. "
          f"local_window {LOCAL}, chunk_stride {STRIDE}, prompt cap 512: context = 1024 × "
          f"(chunks + 1). Decode: {payload['args']['decode']} cached steps per run. Median of up "
          f"to {payload['args']['runs']} runs after a warm-up (budget "
          f"{payload['args']['budget']:.0f} s per configuration).\n\n"
          + H.machine_md(payload["machine"]) + "\n\n")
  return head + H.markdown_table(rows, cols)


if __name__ == "__main__":
  main()
