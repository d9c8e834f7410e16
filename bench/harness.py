"""Common benchmark harness: machine description, timing, per-configuration subprocesses, peak
host memory, an in-process matmul peak, analytic model FLOPs, JSON + markdown tables.

Conventions (every bench script follows them):

* **Warm-up excluded.** The first call of every timed function (tracing + XLA compilation, torch
  lazy init) is timed separately and reported as ``warmup_s``; it never enters the medians.
* **Median of >= 5 runs** after the warm-up, unless the per-configuration time budget runs out
  first: then the runs done are reported (``n_runs`` < requested, ``note: "budget"``). A
  configuration predicted (from the previous, shorter one) to exceed its budget is not started
  and is recorded as ``status: "skipped: budget"``.
* **One subprocess per configuration**, so that peak host memory (``ru_maxrss`` of that process)
  and compilation caches do not leak between configurations. The worker prints one line
  ``RESULT {json}`` that the driver collects.
* **Matmul peak in the same process**: each worker times a large ``jnp.dot`` (or ``torch.mm``) in
  the compute dtype before and after its runs; MFU = model FLOP/s / the larger of the two.

Model FLOPs (``model_flops``), for a decoder with hidden ``H``, ``Hq`` query / ``Hkv`` KV heads of
size ``D``, MLP width ``I``, ``L`` layers and vocabulary ``V``:

* per token and layer, the matmuls: ``2 * (H*Hq*D + 2*H*Hkv*D + Hq*D*H + 3*H*I)``;
* attention, per layer: ``4 * Hq * D * P`` where ``P`` is the number of (query, key) pairs the mask
  allows (``QK^T`` and ``PV``, 2 FLOPs per multiply-add each); masked pairs are not counted;
* LM head: ``2 * H * V`` per token whose logits are *needed* (generation needs one per prompt in
  prefill and one per decoded token). Logits a method computes but does not need are not model
  FLOPs (they show up as lower MFU).

Elementwise work (norms, RoPE, softmax, SiLU) is not counted.
"""
from __future__ import annotations

import json
import math
import os
import platform
import re
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = ROOT / "bench" / "results"


# ----------------------------------------------------------------------------------------------
# Machine
def _cpu_model() -> str:
  try:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
      if line.startswith("model name"):
        return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or "unknown"


def _mem_total_gib() -> Optional[float]:
  try:
    for line in Path("/proc/meminfo").read_text().splitlines():
      if line.startswith("MemTotal"):
        return round(int(line.split()[1]) / 2**20, 1)
  except OSError:
    pass
  return None


def _git_commit() -> Optional[str]:
  try:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                         text=True, timeout=10)
    dirty = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True,
                           text=True, timeout=10).stdout.strip()
    return out.stdout.strip() + ("+dirty" if dirty else "")
  except Exception:  # noqa: BLE001
    return None


def load_average() -> list:
  try:
    return [round(x, 2) for x in os.getloadavg()]
  except OSError:
    return []


def uptime_line() -> str:
  try:
    return subprocess.run(["uptime"], capture_output=True, text=True, timeout=5).stdout.strip()
  except Exception:  # noqa: BLE001
    return ""


def machine_info(extra: Optional[dict] = None) -> dict:
  """Description of this machine and software (no jax / torch import here: the driver stays
  light)."""
  info = {
      "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
      "host": platform.node(),
      "platform": platform.platform(),
      "python": platform.python_version(),
      "cpu_model": _cpu_model(),
      "cpu_count": os.cpu_count(),
      "cpu_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
      "mem_total_gib": _mem_total_gib(),
      "load_average_1_5_15": load_average(),
      "uptime": uptime_line(),
      "git": _git_commit(),
      "env": {k: os.environ.get(k) for k in ("JAX_PLATFORMS", "XLA_FLAGS", "OMP_NUM_THREADS")
              if os.environ.get(k)},
  }
  for mod in ("jax", "jaxlib", "flax", "torch", "transformers", "numpy"):
    try:
      from importlib.metadata import version
      info[mod] = version(mod)
    except Exception:  # noqa: BLE001
      pass
  if extra:
    info.update(extra)
  return info


# ----------------------------------------------------------------------------------------------
# Memory
def peak_rss_mib() -> float:
  """Peak resident set size of this process so far (Linux ``ru_maxrss`` is in KiB)."""
  return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def proc_status_mib(field: str) -> Optional[float]:
  """A memory field of ``/proc/self/status`` (``VmRSS``, ``VmHWM``: KiB there) in MiB; None where
  there is no ``/proc``."""
  try:
    for line in Path("/proc/self/status").read_text().splitlines():
      if line.startswith(field):
        return round(int(line.split()[1]) / 1024, 1)
  except OSError:
    pass
  return None


def current_rss_mib() -> Optional[float]:
  return proc_status_mib("VmRSS")


def tree_nbytes(tree) -> int:
  import jax
  return int(sum(getattr(x, "nbytes", 0) for x in jax.tree.leaves(tree)))


# ----------------------------------------------------------------------------------------------
# Timing
def median(xs: Sequence[float]) -> Optional[float]:
  xs = sorted(xs)
  if not xs:
    return None
  n = len(xs)
  return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


def timed_runs(run: Callable[[], dict], *, runs: int, budget_s: float, min_runs: int = 1,
               warmup: Optional[Callable[[], dict]] = None) -> dict:
  """Call ``run()`` (which returns a dict of named durations in seconds, e.g.
  ``{"prefill": 1.2, "decode": 0.4}``) once as warm-up (or ``warmup()``: the same compiled
  functions on a shorter input, where shapes do not depend on the length), then up to ``runs``
  times.

  Stops early (after ``min_runs``) when the next run would exceed ``budget_s`` seconds in total
  (warm-up included). Returns ``warmup`` (the first call's durations), ``times`` (per name, the
  list), ``median`` (per name), ``n_runs`` and ``note`` ("budget" when stopped early).
  """
  t0 = time.perf_counter()
  warm = (warmup or run)()
  times: dict = {k: [] for k in warm}
  note = None
  last = sum(warm.values()) if warmup is None else 0.0
  for i in range(runs):
    spent = time.perf_counter() - t0
    if i >= min_runs and spent + last > budget_s:
      note = "budget"
      break
    d = run()
    for k, v in d.items():
      times[k].append(v)
    last = sum(d.values())
  return dict(warmup={k: round(v, 4) for k, v in warm.items()},
              times={k: [round(x, 4) for x in v] for k, v in times.items()},
              median={k: median(v) for k, v in times.items()},
              n_runs=len(next(iter(times.values()))) if times else 0, note=note)


def prefill_and_decode(lm, params, tokens, lengths, n_dec: int,
                       on_prefill: Callable[[object, object], None], loop: str = "host",
                       on_tokens: Optional[Callable[[list], None]] = None) -> dict:
  """One timed run through a ``longjax.generate`` method: ``prefill``, then ``n_dec`` greedy
  tokens fed back, ``{"prefill": s, "decode": s}``. ``loop="host"``: ``n_dec`` cached ``step``
  calls from Python; ``"device"``: the compiled decode loop ``longjax.generate(loop="device")``
  runs (``lm.device_plan`` + ``decode_loop.run``: the same tokens fed). ``on_prefill(logits,
  state)`` sees the prefill's result before the decode (keep it cheap: it is inside its span);
  ``on_tokens(ids)`` the ``n_dec + 1`` greedy ids of row 0, after the timed span."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  t0 = time.perf_counter()
  logits, state = lm.prefill(params, tokens, lengths, n_dec)
  logits = jax.block_until_ready(logits)
  t1 = time.perf_counter()
  on_prefill(logits, state)
  if loop == "device":
    from longjax.inference import decode_loop
    from longjax.inference.sampling import SamplingConfig
    plan = lm.device_plan(state, n_dec)
    samples, _, _ = decode_loop.run(plan, params, logits, n_dec + 1, SamplingConfig(),
                                    jax.random.PRNGKey(0), [], return_logits=False)
    ids = [int(x) for x in np.asarray(samples)[0]]
  elif loop == "host":
    ids = []
    for _ in range(n_dec):
      nxt = np.asarray(jnp.argmax(logits, axis=-1))
      ids.append(int(nxt[0]))
      logits, state = lm.step(params, state, nxt)
    ids.append(int(np.asarray(jnp.argmax(logits, axis=-1))[0]))  # waits for the last step
  else:
    raise ValueError(f"loop must be 'host' or 'device', got {loop!r}")
  t2 = time.perf_counter()
  if on_tokens is not None:
    on_tokens(ids)
  return {"prefill": t1 - t0, "decode": t2 - t1}


def matmul_peak_jax(dtype: str = "float32", n: int = 2048, reps: int = 5) -> dict:
  """FLOP/s of a square ``jnp.dot`` in ``dtype`` (best and median of ``reps`` after a warm-up)."""
  import jax
  import jax.numpy as jnp
  a = jax.random.normal(jax.random.PRNGKey(0), (n, n), jnp.float32).astype(dtype)
  b = jax.random.normal(jax.random.PRNGKey(1), (n, n), jnp.float32).astype(dtype)
  f = jax.jit(lambda x, y: jnp.dot(x, y))
  f(a, b).block_until_ready()
  ts = []
  for _ in range(reps):
    t = time.perf_counter()
    f(a, b).block_until_ready()
    ts.append(time.perf_counter() - t)
  flops = 2.0 * n ** 3
  return dict(n=n, dtype=dtype, best_flops=flops / min(ts), median_flops=flops / median(ts))


def matmul_peak_torch(n: int = 2048, reps: int = 5) -> dict:
  import torch
  a, b = torch.randn(n, n), torch.randn(n, n)
  torch.mm(a, b)
  ts = []
  for _ in range(reps):
    t = time.perf_counter()
    torch.mm(a, b)
    ts.append(time.perf_counter() - t)
  flops = 2.0 * n ** 3
  return dict(n=n, dtype="float32", best_flops=flops / min(ts), median_flops=flops / median(ts))


def merge_peaks(*peaks: dict) -> dict:
  """The best FLOP/s of several measurements (before / after the runs)."""
  best = max(peaks, key=lambda p: p["best_flops"])
  return dict(best, all_best=[round(p["best_flops"] / 1e9, 1) for p in peaks])


# ----------------------------------------------------------------------------------------------
# Analytic FLOPs
def linear_flops_per_token(c) -> float:
  """Matmul FLOPs of one token through all layers (``c``: ModelConfig or a dict of its fields)."""
  g = (lambda k: c[k]) if isinstance(c, dict) else (lambda k: getattr(c, k))
  h, hq, hkv, d, i = (g("hidden_size"), g("num_heads"), g("num_kv_heads"), g("head_dim"),
                      g("intermediate_size"))
  return 2.0 * g("num_layers") * (h * hq * d + 2 * h * hkv * d + hq * d * h + 3 * h * i)


def attention_flops(c, pairs: float) -> float:
  """``QK^T`` + ``PV`` over ``pairs`` allowed (query, key) pairs, all layers."""
  g = (lambda k: c[k]) if isinstance(c, dict) else (lambda k: getattr(c, k))
  return 4.0 * g("num_layers") * g("num_heads") * g("head_dim") * pairs


def head_flops(c, n_tokens: float) -> float:
  g = (lambda k: c[k]) if isinstance(c, dict) else (lambda k: getattr(c, k))
  return 2.0 * g("hidden_size") * g("vocab_size") * n_tokens


def causal_pairs(t: int, past: int = 0) -> float:
  """Pairs of ``t`` new tokens attending causally to themselves after ``past`` cached tokens."""
  return t * past + t * (t + 1) / 2


def full_prefill_flops(c, t: int) -> float:
  """Full attention prefill of ``t`` tokens (next-token logits only)."""
  return linear_flops_per_token(c) * t + attention_flops(c, causal_pairs(t)) + head_flops(c, 1)


def full_decode_flops(c, t: int, n: int) -> float:
  """``n`` decoded tokens after a ``t``-token prompt with a full KV cache."""
  pairs = sum(t + j + 1 for j in range(n))
  return (linear_flops_per_token(c) + head_flops(c, 1)) * n + attention_flops(c, pairs)


def beacon_prefill_flops(c, t: int, window: int, ratio: int, sink: int = 0) -> float:
  """Activation Beacon prefill (interleave, full-coverage, stride == window): window ``i`` runs
  ``w_i`` raw tokens + ``w_i / ratio`` beacons (``Q_i`` slots) causally among themselves, after the
  sink and the ``i * window / ratio`` beacons kept from earlier windows; next-token logits once
  per window (the method computes them; only the last is needed, the rest are counted too since
  they are part of the algorithm as implemented, ``n_windows * 2HV`` is < 0.1 %)."""
  n_win = -(-t // window)
  tokens, pairs, mem = 0, 0.0, min(sink, t)
  for i in range(n_win):
    w = min(window, t - i * window)
    q = w + w // ratio
    tokens += q
    pairs += causal_pairs(q, mem)
    mem += window // ratio
  return linear_flops_per_token(c) * tokens + attention_flops(c, pairs) + head_flops(c, n_win)


def beacon_decode_flops(c, t: int, n: int, window: int, ratio: int) -> float:
  """``n`` decoded tokens after a ``t``-token prompt: each sees the beacons of the prompt's windows
  and the raw tokens decoded so far (a window boundary inside the ``n`` tokens is ignored)."""
  mem = (-(-t // window)) * (window // ratio)
  pairs = sum(mem + j + 1 for j in range(n))
  return (linear_flops_per_token(c) + head_flops(c, 1)) * n + attention_flops(c, pairs)


# ----------------------------------------------------------------------------------------------
# Subprocesses
def run_worker(module: str, spec: dict, *, timeout_s: float, env_extra: Optional[dict] = None,
               log=None, python: Optional[str] = None) -> dict:
  """Run ``python -m module --worker '<spec json>'`` and return its ``RESULT`` dict (``python``:
  another interpreter, e.g. the official code's environment; default this one).

  A worker that runs past ``timeout_s`` is killed and recorded as ``status: "skipped: timeout"``;
  one that fails is recorded with the tail of its stderr.
  """
  env = dict(os.environ)
  env.setdefault("JAX_PLATFORMS", "cpu")
  env.setdefault("HF_HUB_OFFLINE", "1")
  env.setdefault("TRANSFORMERS_OFFLINE", "1")
  env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
  env.update(env_extra or {})
  cmd = [python or sys.executable, "-m", module, "--worker", json.dumps(spec)]
  t0 = time.perf_counter()
  try:
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s)
  except subprocess.TimeoutExpired as e:
    return dict(spec, status="skipped: timeout", wall_s=round(time.perf_counter() - t0, 1),
                stderr_tail=(e.stderr or b"")[-800:].decode("utf-8", "replace")
                if isinstance(e.stderr, bytes) else (e.stderr or "")[-800:])
  wall = round(time.perf_counter() - t0, 1)
  for line in reversed(p.stdout.splitlines()):
    if line.startswith("RESULT "):
      res = json.loads(line[len("RESULT "):])
      res.setdefault("status", "ok")
      res["wall_s"] = wall
      return res
  return dict(spec, status=f"error (rc {p.returncode})", wall_s=wall,
              stderr_tail=p.stderr[-2000:])


def emit(result: dict):
  """Worker side: print the result line the driver parses."""
  print("RESULT " + json.dumps(result, default=_json_default), flush=True)


def _json_default(x):
  try:
    import numpy as np
    if isinstance(x, np.generic):
      return x.item()
    if isinstance(x, np.ndarray):
      return x.tolist()
  except ImportError:
    pass
  return str(x)


# ----------------------------------------------------------------------------------------------
# Output
def fmt(x, digits=3):
  if x is None:
    return "–"
  if isinstance(x, float):
    if x == 0:
      return "0"
    if abs(x) >= 1000:
      return f"{x:,.0f}"
    return f"{x:.{digits}g}"
  return str(x)


def percent(key: str) -> Callable[[dict], Optional[float]]:
  """A ``markdown_table`` column value: ``row[key]`` (a fraction) in percent, one decimal."""
  return lambda r: None if r.get(key) is None else round(100 * r[key], 1)


# The prefill-time columns of the CPU prefill tables (keys as ``bench_beacon`` / ``bench_focus``
# record them).
PREFILL_TIME_COLUMNS = (("prefill s (median)", "prefill_s"), ("prefill tok/s", "prefill_tok_s"))
# What the harness records of every configuration: the timed runs (``timed_runs``), the peak RSS
# (``peak_rss_mib``) and how the worker ended (``run_worker``).
RUN_COLUMNS = (("runs", "n_runs"), ("peak RSS MiB", "peak_rss_mib"))
STATUS_COLUMN = ("status", "status")
# The compute-efficiency columns of the CPU prefill tables: analytic model FLOPs, achieved rate,
# the measured matmul peak and MFU (keys as ``bench_beacon`` / ``bench_focus`` record them).
PREFILL_COMPUTE_COLUMNS = (
    ("model GFLOP", "prefill_model_gflop"), ("GFLOP/s", "prefill_gflop_s"),
    ("matmul peak GFLOP/s", "matmul_peak_gflop_s"), ("MFU %", percent("prefill_mfu")))


def markdown_table(rows: Sequence[dict], columns: Sequence[tuple]) -> str:
  """``columns``: ``(header, key or callable(row))``."""
  head = "| " + " | ".join(h for h, _ in columns) + " |"
  sep = "|" + "|".join("---" for _ in columns) + "|"
  lines = [head, sep]
  for r in rows:
    cells = []
    for _, k in columns:
      v = k(r) if callable(k) else r.get(k)
      cells.append(fmt(v))
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines)


def portable_paths(text: str) -> str:
  """Results are committed: paths of this checkout become repo-relative, temporary folders
  ``<tmp>/...``, so no machine's layout ends up in git."""
  text = text.replace(str(ROOT) + os.sep, "").replace(str(ROOT), ".")
  return re.sub(r"/tmp/[^/\"]+", "<tmp>", text)


def write_results(name: str, payload: dict, table_md: str, out_dir: Optional[Path] = None) -> Path:
  out_dir = Path(out_dir or RESULTS_DIR)
  out_dir.mkdir(parents=True, exist_ok=True)
  (out_dir / f"{name}.json").write_text(
      portable_paths(json.dumps(payload, indent=1, default=_json_default)))
  (out_dir / f"{name}.md").write_text(table_md + "\n")
  return out_dir


def machine_md(m: dict) -> str:
  return (f"Machine: {m.get('cpu_model')} · {m.get('cpu_affinity')} usable cores · "
          f"{m.get('mem_total_gib')} GiB · {m.get('platform')} · Python {m.get('python')} · "
          f"jax {m.get('jax')} · torch {m.get('torch')} · transformers {m.get('transformers')} · "
          f"git {m.get('git')}\n\nLoad average at start (1/5/15 min): "
          f"{m.get('load_average_1_5_15')}; at end: {m.get('load_average_end')}")


def log(*a):
  print(time.strftime("[%H:%M:%S]"), *a, flush=True)


def gflops(x):
  return None if x is None else round(x / 1e9, 2)


def ratio(a, b):
  return None if (a is None or b is None or b == 0) else a / b


def isclose(a, b):
  return math.isclose(a, b, rel_tol=1e-9)


def paired_sides(rows, length: int, ours: str, theirs: str) -> Optional[dict]:
  """Two implementations timed in alternating processes at ``length`` (the official-code
  benchmarks): each side's median over its processes, the speed-ups (theirs / ours), whether every
  process decoded the same greedy tokens, and the load range; None unless both sides have a run."""
  ok = {m: [r for r in rows if r["length"] == length and r.get("method") == m
            and r.get("status") == "ok"] for m in (ours, theirs)}
  if not ok[ours] or not ok[theirs]:
    return None
  med = {m: dict(prefill_s=median([r["prefill_s"] for r in rs]),
                 decode_ms=median([r["decode_ms_per_token"] for r in rs]))
         for m, rs in ok.items()}
  toks = {json.dumps(r["tokens"]) for rs in ok.values() for r in rs}
  loads = [r["load_average"][0] for rs in ok.values() for r in rs if r.get("load_average")]
  return dict(
      rounds=min(len(ok[ours]), len(ok[theirs])),
      longjax_prefill_s=med[ours]["prefill_s"], official_prefill_s=med[theirs]["prefill_s"],
      prefill_speedup=ratio(med[theirs]["prefill_s"], med[ours]["prefill_s"]),
      longjax_decode_ms=med[ours]["decode_ms"], official_decode_ms=med[theirs]["decode_ms"],
      decode_speedup=ratio(med[theirs]["decode_ms"], med[ours]["decode_ms"]),
      tokens_identical=len(toks) == 1, tokens=sorted(toks),
      load_1min=[round(min(loads), 2), round(max(loads), 2)] if loads else None)
