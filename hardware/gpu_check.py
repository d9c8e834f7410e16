#!/usr/bin/env python
"""GPU check for the longjax attention kernels (issue 7): correctness on the real GPU + timings.

Run on one GPU (written for an H200, jax 0.11 with CUDA), from the repository root:

    python hardware/gpu_check.py            # or: bash scripts/gpu_check.sh

Budget: under 8 minutes (a deadline, ``--budget`` seconds, default 450, skips what is left and still
writes the table). Every section is guarded: a failure prints its traceback and the script goes on.
Outputs under ``$OUT`` (default ``./gpu_check_out``): ``gpu_check.md`` (tables), ``gpu_check.json``.

Sections
1. Environment: jax version, devices, which Pallas GPU backends import, what ``impl="auto"`` picks.
2. Correctness, compiled kernels (``interpret=False``): the test-suite cases (beacon window with
   memory prefix, step-expansion kinds, chunk condensing with padding, FocusLLM candidates + local,
   sliding window, decode) at small sizes, fp32 (IEEE dots) and bf16, forward (out, lse, empty rows
   exactly 0) and gradients (custom VJP) vs the dense reference computed at HIGHEST precision.
3. Timings, bf16, head_dim 128, 28 query / 4 KV heads, Pallas vs XLA (dense ``impl="xla"``), for:
   beacon window step (32K / 128K context: memory 1/8 of it + 2304-token window), FocusLLM chunk
   condensing (2048-token chunks, 16 / 64 chunks), decode (1 token vs 32K / 128K), plus one
   forward+backward. TFLOP/s counts only the unmasked score entries (4 * D * Hq * pairs).
4. The lowering tests (``tests/test_kernel_lowering.py``: every kernel lowered for ``tpu`` and
   ``cuda``; with the CUDA plugin of jaxlib > 0.10.2 the ``cuda`` lowering also runs the Triton
   compiler, so shared-memory limits are checked too) and the CPU-interpret test file
   (``tests/test_kernels.py``, not slow) under this machine's jax, to catch Pallas API drift
   between jax versions, if time is left.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from longjax.kernels import attention, explain, flash  # noqa: E402
from longjax.kernels import decode as decode_lib  # noqa: E402
from longjax.kernels import testing as kernel_cases  # noqa: E402
from longjax.kernels.mask import MaskRule, TokenMeta, allowed, kernel_meta  # noqa: E402
from longjax.kernels.reference import dense_attention  # noqa: E402

START = time.time()
RESULTS = {"env": {}, "correctness": [], "timings": [], "errors": []}


def elapsed():
  return time.time() - START


def log(*a):
  print(f"[{elapsed():6.1f}s]", *a, flush=True)


def guarded(name, fn, *a, **kw):
  try:
    return fn(*a, **kw)
  except Exception as e:  # keep going: report everything we can
    tb = traceback.format_exc()
    log(f"ERROR in {name}: {type(e).__name__}: {e}")
    print(tb, flush=True)
    RESULTS["errors"].append({"where": name, "error": f"{type(e).__name__}: {e}",
                              "trace": tb[-3000:]})
    return None


# ------------------------------------------------------------------------------------------------
def section_env():
  env = RESULTS["env"]
  env["jax"] = jax.__version__
  env["python"] = sys.version.split()[0]
  env["devices"] = [str(d) for d in jax.devices()]
  env["backend"] = jax.default_backend()
  for mod in ("triton", "mosaic_gpu", "tpu"):
    try:
      __import__(f"jax.experimental.pallas.{mod}")
      env[f"pallas_{mod}"] = "importable"
    except Exception as e:
      env[f"pallas_{mod}"] = f"missing ({type(e).__name__})"
  env["kernel_backend"] = flash.resolve_backend(None)
  env["kernel_available"] = flash.backend_available(env["kernel_backend"])
  shapes = {"beacon_step": ((1, 2304, 28, 128), (1, 18688, 4, 128)),
            "condense": ((16, 2048, 28, 128), (16, 2048, 4, 128)),
            "decode": ((1, 1, 28, 128), (1, 131072, 4, 128))}
  env["auto_choice"] = {k: list(explain(q, kk, jnp.bfloat16)) for k, (q, kk) in shapes.items()}
  for k, v in env.items():
    log(f"env {k}: {v}")


# ------------------------------------------------------------------------------------------------
def _rel(a, b):
  a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
  return float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(b))), 1e-30))


def section_correctness():
  tk = kernel_cases
  cases = [("beacon_memory", jnp.float32, 4, 2), ("beacon_memory", jnp.bfloat16, 4, 2),
           ("step_expansion", jnp.float32, 2, 2), ("condense", jnp.bfloat16, 4, 1),
           ("focus_local", jnp.float32, 6, 2), ("window", jnp.float32, 4, 2),
           ("noncausal_segments", jnp.bfloat16, 2, 1), ("decode", jnp.float32, 8, 2),
           ("decode", jnp.bfloat16, 28, 4)]
  for name, dtype, hq, hkv in cases:
    for kind in ("flash", "decode") if name == "decode" else ("flash",):
      guarded(f"correctness {name} {jnp.dtype(dtype).name} {kind}", _check_case, tk, name, dtype,
              hq, hkv, kind)


def _check_case(tk, name, dtype, hq, hkv, kind):
  q, k, v, qm, km, rule, window = tk.make_case(name, dtype, hq, hkv, d=64)
  m = kernel_meta(qm, km, rule, window)
  scale = q.shape[-1] ** -0.5
  if kind == "flash":
    fn = lambda q, k, v: flash.flash_attention(q, k, v, m, scale=scale, kind_sees=rule.kind_sees,
                                               backend="gpu", interpret=INTERPRET, block_q=16,
                                               block_k=16)
  else:
    fn = lambda q, k, v: decode_lib.decode_attention(q, k, v, m, scale=scale, backend="gpu",
                                                     interpret=INTERPRET, num_splits=3, block_k=16)
  f32 = lambda x: x.astype(jnp.float32)
  with jax.default_matmul_precision("highest"):
    ref_fn = lambda q, k, v: dense_attention(q, k, v, qm, km, rule, window=window)
    ref, ref_lse = jax.jit(ref_fn)(f32(q), f32(k), f32(v))
    out, lse = jax.jit(fn)(q, k, v)
    tol = tk.TOL[q.dtype.type]
    err = _rel(out, ref)
    empty = ~np.asarray(allowed(qm, km, rule, window)).any(-1)
    empty_ok = bool(np.all(np.asarray(out, np.float32)[empty] == 0))
    finite = bool(np.all(np.isfinite(np.asarray(out, np.float32))))
    lse_np, rl = np.asarray(lse), np.asarray(ref_lse)
    lse_ok = bool(np.array_equal(np.isneginf(lse_np), np.isneginf(rl)))
    fin = np.isfinite(rl)
    lse_err = float(np.max(np.abs(lse_np[fin] - rl[fin]))) if fin.any() else 0.0
    gerr = None
    if dtype == jnp.float32:
      loss = lambda f: (lambda q, k, v: tk.grad_loss(f, q, k, v))
      g_ref = jax.jit(jax.grad(loss(ref_fn), (0, 1, 2)))(q, k, v)
      g = jax.jit(jax.grad(loss(fn), (0, 1, 2)))(q, k, v)
      gerr = max(_rel(a, b) for a, b in zip(g, g_ref))
  # fp32 on GPU: different summation order than the reference; allow 2x the CPU tolerance.
  ok = err < 2 * tol and empty_ok and finite and lse_ok and (gerr is None or gerr < 1e-4)
  row = dict(case=name, dtype=jnp.dtype(dtype).name, kernel=kind, hq=hq, hkv=hkv, rel_err=err,
             tol=tol, lse_err=lse_err, grad_rel_err=gerr, empty_rows_zero=empty_ok, finite=finite,
             ok=bool(ok))
  RESULTS["correctness"].append(row)
  log(f"correctness {'PASS' if ok else 'FAIL'}: {row}")


# ------------------------------------------------------------------------------------------------
def _time(fn, args, iters=5):
  out = fn(*args)
  jax.block_until_ready(out)  # compile + warm up
  ts = []
  for _ in range(iters):
    t = time.perf_counter()
    jax.block_until_ready(fn(*args))
    ts.append(time.perf_counter() - t)
  return float(np.median(ts))


def _bench_inputs(b, tq, tk, hq=28, hkv=4, d=128, seed=0):
  key = jax.random.PRNGKey(seed)
  kq, kk, kv = jax.random.split(key, 3)
  q = jax.random.normal(kq, (b, tq, hq, d), jnp.bfloat16)
  k = jax.random.normal(kk, (b, tk, hkv, d), jnp.bfloat16)
  v = jax.random.normal(kv, (b, tk, hkv, d), jnp.bfloat16)
  return q, k, v


def _beacon_layout(ctx, window=None, ratio=8):
  """keys: [beacon memory (ctx/ratio, capacity rounded) | window raw + beacons]; causal offset."""
  window = window or SIZES["window"]
  nb = window // ratio
  mem = ctx // ratio
  tq = window + nb
  k_order = np.arange(mem + tq)[None]
  q_order = k_order[:, mem:]
  pairs = tq * mem + tq * (tq + 1) // 2
  return TokenMeta.causal(q_order), TokenMeta.causal(k_order), tq, mem + tq, pairs


def _condense_layout(chunks, t=None):
  t = t or SIZES["chunk"]
  order = np.arange(t)[None].repeat(chunks, 0)
  meta = TokenMeta.causal(order)
  return meta, meta, t, t, chunks * t * (t + 1) // 2


def _decode_layout(ctx):
  k_order = np.arange(ctx)[None]
  return TokenMeta.causal(np.array([[ctx]])), TokenMeta.causal(k_order), 1, ctx, ctx


def bench(label, qm, km, b, tq, tk, pairs, impls=("xla", "pallas"), grad=False, iters=5):
  q, k, v = _bench_inputs(b, tq, tk)
  rule = MaskRule(True)
  flops = 4 * 128 * 28 * pairs * (3.5 if grad else 1.0)  # fwd+bwd ~ 3.5x fwd matmul work
  row = dict(shape=label, b=b, tq=tq, tk=tk, grad=grad)
  for impl in impls:
    if elapsed() > BUDGET:
      row[impl] = "skipped (budget)"
      continue

    def fwd(q, k, v, qm, km, impl=impl):
      return attention(q, k, v, qm, km, rule, impl=impl)

    if grad:
      fn = jax.jit(jax.grad(lambda q, k, v, qm, km, impl=impl: jnp.sum(
          fwd(q, k, v, qm, km, impl).astype(jnp.float32) ** 2), (0, 1, 2)))
    else:
      fn = jax.jit(fwd)
    try:
      t = _time(fn, (q, k, v, qm, km), iters)
      row[f"{impl}_ms"] = t * 1e3
      row[f"{impl}_tflops"] = flops / t / 1e12
      log(f"bench {label} {impl}{' fwd+bwd' if grad else ''}: {t * 1e3:.3f} ms, "
          f"{flops / t / 1e12:.1f} TFLOP/s")
    except Exception as e:
      row[impl] = f"error: {type(e).__name__}: {str(e)[:200]}"
      log(f"bench {label} {impl} failed: {type(e).__name__}: {str(e)[:500]}")
      RESULTS["errors"].append({"where": f"bench {label} {impl}", "error": str(e)[:2000]})
  if "xla_ms" in row and "pallas_ms" in row:
    row["speedup_pallas_vs_xla"] = row["xla_ms"] / row["pallas_ms"]
    log(f"bench {label}: Pallas / XLA speed ratio {row['speedup_pallas_vs_xla']:.2f}x")
  RESULTS["timings"].append(row)
  return row


def bench_gpu_configs():
  """A small sweep of Triton block configs on the beacon 32K step (kernel only, forward)."""
  qm, km, tq, tk, pairs = _beacon_layout(SIZES["ctx"][0])
  q, k, v = _bench_inputs(1, tq, tk)
  m = kernel_meta(qm, km, MaskRule(True))
  flops = 4 * 128 * 28 * pairs
  for bq, bk, warps, stages in [(128, 64, 4, 2), (128, 128, 8, 2), (64, 64, 4, 3), (128, 64, 8, 3)]:
    if elapsed() > BUDGET:
      return
    fn = jax.jit(lambda q, k, v, m, bq=bq, bk=bk, w=warps, s=stages: flash.flash_attention(
        q, k, v, m, scale=128 ** -0.5, backend="gpu", interpret=INTERPRET, block_q=bq, block_k=bk,
        gpu_opts=dict(num_warps=w, num_stages=s))[0])
    label = f"beacon32K cfg bq={bq} bk={bk} warps={warps} stages={stages}"
    try:
      t = _time(fn, (q, k, v, m))
      log(f"{label}: {t * 1e3:.3f} ms {flops / t / 1e12:.1f} TFLOP/s")
      RESULTS["timings"].append(dict(shape=label, b=1, tq=tq, tk=tk, grad=False, pallas_ms=t * 1e3,
                                     pallas_tflops=flops / t / 1e12))
    except Exception as e:
      log(f"{label} failed: {type(e).__name__}: {str(e)[:300]}")


def section_bench():
  for ctx in SIZES["ctx"]:
    qm, km, tq, tk, pairs = _beacon_layout(ctx)
    guarded(f"bench beacon {ctx}", bench, f"beacon_step ctx={ctx // 1024}K", qm, km, 1, tq, tk,
            pairs)
  for chunks in SIZES["chunks"]:
    qm, km, tq, tk, pairs = _condense_layout(chunks)
    guarded(f"bench condense {chunks}", bench,
            f"condense {chunks}x{tq} (ctx={chunks * tq // 1024}K)", qm, km, chunks, tq, tk, pairs)
  for ctx in SIZES["ctx"]:
    qm, km, tq, tk, pairs = _decode_layout(ctx)
    guarded(f"bench decode {ctx}", bench, f"decode 1 tok ctx={ctx // 1024}K", qm, km, 1, tq, tk,
            pairs, iters=20)
  chunks = SIZES["chunks"][0]
  qm, km, tq, tk, pairs = _condense_layout(chunks)
  guarded("bench condense grad", bench, f"condense {chunks}x{tq} fwd+bwd", qm, km, chunks, tq, tk,
          pairs, grad=True, iters=3)
  guarded("bench configs", bench_gpu_configs)


# ------------------------------------------------------------------------------------------------
def section_interpret_tests():
  left = BUDGET + 30 - elapsed()
  if left < 60:
    log("skipping interpret-mode test file (budget)")
    return
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-m", "not slow", "-p", "no:cacheprovider",
         os.path.join(ROOT, "tests", "test_kernel_lowering.py"),
         os.path.join(ROOT, "tests", "test_kernels.py")]
  log(f"running {' '.join(cmd)} (timeout {left:.0f}s)")
  try:
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=left)
    tail = (r.stdout + r.stderr)[-3000:]
    print(tail, flush=True)
    RESULTS["interpret_tests"] = {"rc": r.returncode, "tail": tail[-1500:]}
  except subprocess.TimeoutExpired:
    log("interpret-mode tests timed out")
    RESULTS["interpret_tests"] = {"rc": "timeout"}


# ------------------------------------------------------------------------------------------------
def _fmt(x):
  if isinstance(x, float):
    return f"{x:.3g}"
  return str(x)


def _md_section(title, header, rows):
  """Markdown lines of a ``## title`` section holding one table (cells through ``_fmt``)."""
  return (["", f"## {title}", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
          + ["| " + " | ".join(_fmt(c) for c in cells) + " |" for cells in rows])


def write_outputs(out_dir):
  os.makedirs(out_dir, exist_ok=True)
  with open(os.path.join(out_dir, "gpu_check.json"), "w") as f:
    json.dump(RESULTS, f, indent=1, default=str)
  lines = [f"# longjax gpu_check ({elapsed():.0f}s)", ""]
  lines += [f"- {k}: {v}" for k, v in RESULTS["env"].items()]
  lines += _md_section(
      "Correctness (compiled kernels vs dense reference)",
      ["case", "dtype", "kernel", "Hq/Hkv", "rel err", "tol", "lse err", "grad rel err", "ok"],
      [[r["case"], r["dtype"], r["kernel"], f"{r['hq']}/{r['hkv']}", r["rel_err"], r["tol"],
        r["lse_err"], r["grad_rel_err"], r["ok"]] for r in RESULTS["correctness"]])
  lines += _md_section(
      "Timings (bf16, D=128, Hq=28, Hkv=4)",
      ["shape", "B", "Tq", "Tk", "XLA ms", "XLA TFLOP/s", "Pallas ms", "Pallas TFLOP/s",
       "Pallas/XLA speedup"],
      [[r["shape"], r["b"], r["tq"], r["tk"], r.get("xla_ms", r.get("xla", "-")),
        r.get("xla_tflops", "-"), r.get("pallas_ms", r.get("pallas", "-")),
        r.get("pallas_tflops", "-"), r.get("speedup_pallas_vs_xla", "-")]
       for r in RESULTS["timings"]])
  if "interpret_tests" in RESULTS:
    lines += ["", f"## Interpret-mode test file: rc={RESULTS['interpret_tests'].get('rc')}"]
  lines += ["", f"## Errors: {len(RESULTS['errors'])}"]
  lines += [f"- {e['where']}: {e['error'][:300]}" for e in RESULTS["errors"]]
  text = "\n".join(lines) + "\n"
  with open(os.path.join(out_dir, "gpu_check.md"), "w") as f:
    f.write(text)
  print(text, flush=True)


def main():
  global BUDGET
  ap = argparse.ArgumentParser()
  ap.add_argument("--budget", type=float, default=450.0, help="seconds before skipping the rest")
  ap.add_argument("--skip-interpret-tests", action="store_true")
  ap.add_argument("--smoke", action="store_true",
                  help="CPU smoke run of this script: interpret mode, tiny shapes")
  args = ap.parse_args()
  BUDGET = args.budget
  if args.smoke:
    global INTERPRET
    INTERPRET = True
    os.environ["LONGJAX_PALLAS_INTERPRET"] = "1"
    SIZES.update(ctx=(512, 1024), window=64, chunk=128, chunks=(2, 3))
  out_dir = os.environ.get("OUT") or os.path.join(ROOT, "gpu_check_out")
  try:
    guarded("env", section_env)
    guarded("correctness", section_correctness)
    guarded("bench", section_bench)
    if not args.skip_interpret_tests:
      guarded("interpret tests", section_interpret_tests)
  finally:
    write_outputs(out_dir)
  bad = [r for r in RESULTS["correctness"] if not r["ok"]]
  return 1 if (bad or not RESULTS["correctness"]) else 0


BUDGET = 450.0
INTERPRET = False
SIZES = dict(ctx=(32768, 131072), window=2048, chunk=2048, chunks=(16, 64))

if __name__ == "__main__":
  sys.exit(main())
