"""GPU variant of the benchmarks (issue 8), for one H200 (jax 0.11 with CUDA, no network).

    bash scripts/bench_gpu.sh            # = python -m bench.bench_gpu --budget 400, tee'd to $OUT
    # tiny shapes on CPU: checks the code paths
    JAX_PLATFORMS=cpu python -m bench.bench_gpu --smoke

Qwen2-7B-shaped random weights in bf16 (hidden 3584, 28 layers, 28 query / 4 KV heads of 128, MLP
18944, vocab 152064; beacon q/k/v and candidate q/k/v/o projections, ~8.4 B parameters, ~17 GB),
initialised on the device. Sections, each guarded (a failure is logged and the script goes on) and
under one deadline (``--budget`` seconds: what is left is skipped, the table is still written):

1. environment and the attention implementation ``impl="auto"`` picks for the beacon shapes;
2. bf16 matmul peak measured on the spot (``jnp.dot`` 8192², best of 10), again at the end;
3. Activation Beacon prefill at 32K and 128K (window 1024, ratio 8; one ``BeaconLM`` built for
   128K so both lengths share one compiled window step; warm-up = compile on one window, reported
   apart), median of up to 5 runs, then a 32-token greedy decode after the 128K prefill (tokens/s);
4. FocusLLM condensing at 32K (local window 1024, chunk stride 1024: 31 chunks, batched), median of
   up to 5 runs, plus 4 cached decode steps; the sequential chunk loop as the baseline if time is
   left;
5. MFU = analytic model FLOPs (``bench.harness``) / time / the bf16 peak of section 2.

Writes ``$OUT/bench_gpu.md`` (table), ``$OUT/bench_gpu.json``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

if __package__ in (None, ""):
  sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from bench import harness as H  # noqa: E402
from longjax.methods import Beacon, Focus  # noqa: E402

BEACON, FOCUS = Beacon.name, Focus.name  # the sections timing each method, by its registry name

START = time.time()
QWEN2_7B = dict(hidden_size=3584, intermediate_size=18944, num_layers=28, num_heads=28,
                num_kv_heads=4, head_dim=128, vocab_size=152064)
SMOKE = dict(hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2,
             head_dim=16, vocab_size=512)
R = {"env": {}, "peak": [], BEACON: [], FOCUS: [], "errors": []}


def log(*a):
  print(f"[{time.time() - START:6.1f}s]", *a, flush=True)


def left(args):
  return args.budget - (time.time() - START)


def guarded(name, fn, *a, **kw):
  try:
    return fn(*a, **kw)
  except Exception as e:  # noqa: BLE001
    log(f"!! {name} failed: {type(e).__name__}: {e}")
    traceback.print_exc()
    R["errors"].append(dict(section=name, error=f"{type(e).__name__}: {e}"[:2000]))
    return None


def build(args):
  from longjax.models.config import ModelConfig
  from longjax.models.decoder import init_params
  shape = SMOKE if args.smoke else QWEN2_7B
  dt = "float32" if args.smoke else "bfloat16"
  cfg = ModelConfig(family="qwen2", attention_bias=True, rope_theta=1e6, rms_norm_eps=1e-6,
                    max_position_embeddings=131072, bos_token_id=1, eos_token_id=2,
                    alt_projections=("q", "k", "v", "o"), num_alt_embeddings=1, dtype=dt,
                    param_dtype=dt, **shape)
  t0 = time.time()
  params = jax.jit(lambda: init_params(cfg, 0))()
  params = jax.block_until_ready(params)
  n = sum(x.size for x in jax.tree.leaves(params))
  log(f"params: {n / 1e9:.2f} B ({H.tree_nbytes(params) / 2**30:.1f} GiB) in "
      f"{time.time() - t0:.1f}s")
  R["env"]["params_b"] = round(n / 1e9, 3)
  R["env"]["init_s"] = round(time.time() - t0, 1)
  # Beacon: q/k/v copies + the beacon embedding; FocusLLM: q/k/v/o candidates, no embedding row.
  attn = dict(params["layers"]["attn"])
  pb = dict(params, layers=dict(params["layers"], attn={k: v for k, v in attn.items()
                                                        if k != "alt_o_proj"}))
  pf = {k: v for k, v in params.items() if k != "alt_embedding"}
  return (cfg.replace(alt_projections=("q", "k", "v")), pb), (cfg.replace(num_alt_embeddings=0), pf)


def section_env(args):
  R["env"].update(jax=jax.__version__, devices=[str(d) for d in jax.devices()],
                  backend=jax.default_backend(), machine=H.machine_info())
  try:
    R["env"]["device_kind"] = jax.devices()[0].device_kind
  except Exception:  # noqa: BLE001
    pass
  log("env:", json.dumps({k: v for k, v in R["env"].items() if k != "machine"}))


def section_peak(args, when):
  n = 1024 if args.smoke else 8192
  p = H.matmul_peak_jax("float32" if args.smoke else "bfloat16", n=n, reps=10)
  p["when"] = when
  R["peak"].append(p)
  log(f"matmul peak ({when}): best {p['best_flops'] / 1e12:.1f} TFLOP/s, median "
      f"{p['median_flops'] / 1e12:.1f}")


def peak_flops():
  return max(p["best_flops"] for p in R["peak"]) if R["peak"] else None


def section_beacon(args, cfg, params):
  from longjax.beacon import BeaconConfig, BeaconLM
  from longjax.kernels import explain
  w, ratio = (64, 8) if args.smoke else (1024, 8)
  lengths = [512, 2048] if args.smoke else [32768, 131072]
  bcfg = BeaconConfig(window=w, stride=w, ratios=(ratio,))
  lm = BeaconLM(cfg, bcfg, max_length=max(lengths) + 2 * w, impl=args.impl, progress=False)
  q = lm.schedule.q_slots
  choice = explain((1, q, cfg.num_heads, cfg.head_dim),
                   (1, lm.capacity + q, cfg.num_kv_heads, cfg.head_dim),
                   cfg.compute_dtype, impl=args.impl)
  R["env"]["beacon_attention"] = list(choice)
  log(f"beacon: window {w}, ratio {ratio}, capacity {lm.capacity}, attention {choice}")
  rng = np.random.default_rng(1)
  t0 = time.time()
  # Warm up on the longest prompt: it compiles the window step for every memory-size bucket
  # (powers of two) that any of the timed lengths will use.
  warm = np.asarray(rng.integers(3, cfg.vocab_size, (1, max(lengths))), np.int32)
  logits, state = lm.prefill(params, warm, np.array([max(lengths)], np.int32), 32)
  jax.block_until_ready(logits)
  logits, state = lm.step(params, state, np.asarray(jnp.argmax(logits, -1)))
  jax.block_until_ready(logits)
  compile_s = time.time() - t0
  log("beacon warm-up (compile all memory buckets + one full prefill + one step): "
      f"{compile_s:.1f}s")
  for t_len in lengths:
    if left(args) < 40:
      R[BEACON].append(dict(length=t_len, status="skipped: budget"))
      continue
    toks = np.asarray(rng.integers(3, cfg.vocab_size, (1, t_len)), np.int32)
    times = []
    for i in range(args.runs):
      t0 = time.time()
      logits, state = lm.prefill(params, toks, np.array([t_len], np.int32), 32)
      jax.block_until_ready(logits)
      times.append(time.time() - t0)
      if left(args) < 30 + 2 * times[-1] * (1 if t_len == lengths[-1] else 2):
        break
    tp = H.median(times)
    fl = H.beacon_prefill_flops(cfg, t_len, w, ratio)
    row = dict(length=t_len, prefill_s=tp, prefill_times_s=[round(x, 3) for x in times],
               n_runs=len(times), warmup_compile_s=round(compile_s, 1),
               prefill_tok_s=t_len / tp, model_tflop=fl / 1e12, tflop_s=fl / tp / 1e12,
               memory_mib=round((state.k.nbytes + state.v.nbytes) / 2**20, 1), status="ok")
    if peak_flops():
      row["mfu"] = fl / tp / peak_flops()
    if t_len == lengths[-1] and left(args) > 30:
      n_dec = 32
      t0 = time.time()
      for _ in range(n_dec):
        logits, state = lm.step(params, state, np.asarray(jnp.argmax(logits, -1)))
      jax.block_until_ready(logits)
      td = time.time() - t0
      row.update(decode_tokens=n_dec, decode_s=td, decode_tok_s=n_dec / td,
                 decode_ms_per_token=1e3 * td / n_dec)
    R[BEACON].append(row)
    log("beacon:", json.dumps(row))


def section_focus(args, cfg, params):
  from longjax.focus import FocusConfig, FocusLLM
  from longjax.focus import condense as C
  from longjax.models.head import lm_head
  from longjax.focus.planner import pack_chunks, pack_local
  w = 64 if args.smoke else 1024
  t_len = 16 * w if args.smoke else 32768
  fcfg = FocusConfig(local_window=w, chunk_stride=w, min_len_threshold=0)
  lm = FocusLLM(cfg, fcfg, impl=args.impl)
  toks = np.asarray(np.random.default_rng(2).integers(3, cfg.vocab_size, (1, t_len)), np.int32)
  lens = np.array([t_len], np.int32)
  row = lm.plan(toks[0])
  n_dec = 4
  t0 = time.time()
  logits, state = lm.prefill(params, toks, lens, n_dec)
  logits, state = lm.step(params, state, np.asarray(jnp.argmax(logits, -1)))
  jax.block_until_ready(logits)
  compile_s = time.time() - t0
  log(f"focus warm-up (compile): {compile_s:.1f}s; {row.n_chunks} chunks")
  times = []
  for _ in range(args.runs):
    t0 = time.time()
    logits, state = lm.prefill(params, toks, lens, n_dec)
    jax.block_until_ready(logits)
    times.append(time.time() - t0)
    if left(args) < 30 + 2 * times[-1]:
      break
  t0 = time.time()
  for _ in range(n_dec):
    logits, state = lm.step(params, state, np.asarray(jnp.argmax(logits, -1)))
  jax.block_until_ready(logits)
  td = time.time() - t0
  from bench.bench_focus import focus_flops
  fp, fd = focus_flops(cfg, row, n_dec)
  tp = H.median(times)
  res = dict(mode="parallel", context=t_len, chunks=row.n_chunks, prefill_s=tp,
             prefill_times_s=[round(x, 3) for x in times], n_runs=len(times),
             warmup_compile_s=round(compile_s, 1), prefill_tok_s=t_len / tp,
             model_tflop=fp / 1e12, tflop_s=fp / tp / 1e12, decode_step_ms=1e3 * td / n_dec,
             decode_tflop_s=fd / td / 1e12, status="ok")
  if peak_flops():
    res["mfu"] = fp / tp / peak_flops()
  R[FOCUS].append(res)
  log("focus:", json.dumps(res))
  del state
  if left(args) < 60:
    R[FOCUS].append(dict(mode="sequential", context=t_len, status="skipped: budget"))
    return
  # Baseline: one chunk row at a time (the official strategy), same local forward.
  cb = pack_chunks([row], row_multiple=1, length_multiple=lm.bucket, cmax_multiple=1)
  lb = pack_local([row], capacity=len(row.local), length_multiple=lm.bucket)
  one = jax.jit(lambda p, t, pos, v, l: C.condense(lm.model, p, t, pos, v, l)[:2])

  @jax.jit
  def local(p, ck, cv):
    h = C.local_hidden(lm.model, p, ck, cv, cb.gather, cb.cand_valid, lb.tokens, lb.lengths,
                       lb.n_chunks)
    return lm_head(cfg, p, C.last_hidden(h, lb.lengths))

  def seq():
    ks, vs = [], []
    for n in range(cb.n_rows):
      sl = slice(n, n + 1)
      ck, cv = one(params, cb.tokens[sl], cb.positions[sl], cb.valid[sl], cb.lengths[sl])
      ks.append(ck)
      vs.append(cv)
    return jax.block_until_ready(local(params, jnp.concatenate(ks, 1), jnp.concatenate(vs, 1)))

  t0 = time.time()
  seq()
  compile_s = time.time() - t0
  times = []
  for _ in range(args.runs):
    t0 = time.time()
    seq()
    times.append(time.time() - t0)
    if left(args) < 20 + 2 * times[-1]:
      break
  ts = H.median(times)
  res = dict(mode="sequential", context=t_len, chunks=row.n_chunks, prefill_s=ts,
             prefill_times_s=[round(x, 3) for x in times], n_runs=len(times),
             warmup_compile_s=round(compile_s, 1), prefill_tok_s=t_len / ts,
             model_tflop=fp / 1e12, tflop_s=fp / ts / 1e12, time_vs_parallel=ts / tp, status="ok")
  if peak_flops():
    res["mfu"] = fp / ts / peak_flops()
  R[FOCUS].append(res)
  log("focus:", json.dumps(res))


def render(args) -> str:
  pk = peak_flops()
  lines = ["### GPU (H200): Qwen2-7B-shaped random bf16 weights" if not args.smoke
           else "### bench_gpu smoke run (tiny shapes)", ""]
  lines.append(f"jax {R['env'].get('jax')}, {R['env'].get('device_kind')}; bf16 matmul peak "
               f"measured on the spot: {'–' if pk is None else f'{pk / 1e12:.0f} TFLOP/s'} "
               f"(8192² jnp.dot, best of 10; {[round(p['best_flops'] / 1e12) for p in R['peak']]}"
               f" TFLOP/s at start/end). Beacon attention: {R['env'].get('beacon_attention')}.")
  lines.append("")
  lines.append(H.markdown_table(R[BEACON], [
      ("beacon prefill", lambda r: f"{r['length'] / 1024:g}K"), ("s (median)", "prefill_s"),
      ("tok/s", "prefill_tok_s"), ("runs", "n_runs"), ("compile s", "warmup_compile_s"),
      ("model TFLOP", "model_tflop"), ("TFLOP/s", "tflop_s"),
      ("MFU %", H.percent("mfu")),
      ("memory MiB", "memory_mib"), ("decode tok/s", "decode_tok_s"),
      ("decode ms/tok", "decode_ms_per_token"), ("status", "status")]))
  lines.append("")
  lines.append(H.markdown_table(R[FOCUS], [
      ("FocusLLM condensing", "mode"), ("context", "context"), ("chunks", "chunks"),
      ("s (median)", "prefill_s"), ("tok/s", "prefill_tok_s"), ("runs", "n_runs"),
      ("compile s", "warmup_compile_s"), ("TFLOP/s", "tflop_s"),
      ("MFU %", H.percent("mfu")),
      ("time / parallel", "time_vs_parallel"), ("decode ms/step", "decode_step_ms"),
      ("status", "status")]))
  if R["errors"]:
    lines += ["", "Errors: " + "; ".join(f"{e['section']}: {e['error'][:300]}"
                                         for e in R["errors"])]
  lines += ["", f"Total wall time {time.time() - START:.0f} s."]
  return "\n".join(lines)


def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  ap.add_argument("--budget", type=float, default=400.0, help="deadline in seconds")
  ap.add_argument("--runs", type=int, default=5)
  ap.add_argument("--impl", default="auto")
  ap.add_argument("--smoke", action="store_true", help="tiny shapes (CPU check of the script)")
  ap.add_argument("--skip", default="", help="comma list of sections to skip: beacon,focus")
  args = ap.parse_args()
  out = Path(os.environ.get("OUT") or (H.ROOT / "bench" / "results"))
  out.mkdir(parents=True, exist_ok=True)
  guarded("env", section_env, args)
  guarded("peak", section_peak, args, "start")
  built = guarded("build", build, args)
  if built:
    (cb, pb), (cf, pf) = built
    if BEACON not in args.skip:
      guarded(BEACON, section_beacon, args, cb, pb)
    if FOCUS not in args.skip and left(args) > 60:
      guarded(FOCUS, section_focus, args, cf, pf)
  if left(args) > 10:
    guarded("peak", section_peak, args, "end")
  pk = peak_flops()
  for r in R[BEACON] + R[FOCUS]:  # MFU against the best peak of the run
    if pk and r.get("tflop_s"):
      r["mfu"] = r["tflop_s"] * 1e12 / pk
  name = "bench_gpu_smoke" if args.smoke else "bench_gpu"
  table = render(args)
  (out / f"{name}.md").write_text(table + "\n")
  (out / f"{name}.json").write_text(json.dumps(R, indent=1, default=str))
  print(table, flush=True)
  log(f"wrote {out / (name + '.md')}")


if __name__ == "__main__":
  main()
