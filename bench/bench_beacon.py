"""Activation Beacon vs full attention (longjax and HF transformers) on the same weights, on CPU.

    JAX_PLATFORMS=cpu python -m bench.bench_beacon                 # full run (~20-25 min, 2 cores)
    JAX_PLATFORMS=cpu python -m bench.bench_beacon --quick         # smoke run (~2 min)

One random Qwen2-shaped checkpoint (default: hidden 512, 4 layers, 8 query / 2 KV heads of 64,
MLP 1536, vocab 32000, fp32) is written once as an HF checkpoint (``longjax.ckpts.save_hf``);
every method loads it:

* ``beacon``: ``longjax.beacon.BeaconLM`` (``load_beacon(init="official")``: beacon projections =
  copies of q/k/v, as the official ``from_pretrained``), window 1024, ratio 8, ``impl="auto"``;
* ``plain``: ``longjax.PlainLM`` (full attention, fixed-capacity KV cache, ``impl="auto"``);
* ``hf``: ``transformers.Qwen2ForCausalLM.from_pretrained(..., attn_implementation="sdpa")``,
  prefill with ``logits_to_keep=1`` and a greedy decode loop over ``past_key_values`` (what
  ``generate`` does), torch with all usable cores.

Per configuration (method x context length), in its own subprocess: warm-up (prefill + decode,
compile included) timed separately, then the median of ``--runs`` runs of prefill and of a
``--decode``-token greedy decode (longjax: the compiled device loop ``generate`` uses by default,
or ``--loop host``: one jitted step per token from Python); peak host memory (``ru_maxrss``), the
state's bytes (KV cache / beacon memory buffers), analytic model FLOPs and MFU against a
``jnp.dot`` / ``torch.mm`` fp32 peak measured in the same process. The next-token logits of the
prefill are compared across methods (``plain`` vs ``hf`` should agree to ~1e-4). Results:
``bench/results/beacon.{json,md}``.
"""
from __future__ import annotations

import argparse
import json
import shutil
import os
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):
  sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import harness as H  # noqa: E402
from longjax.methods import Beacon, Plain  # noqa: E402

# the series: the two longjax methods by their registry names, and "hf" (transformers' Qwen2)
BEACON, PLAIN = Beacon.name, Plain.name

MODEL = dict(hidden_size=512, intermediate_size=1536, num_layers=4, num_heads=8, num_kv_heads=2,
             head_dim=64, vocab_size=32000)
QUICK_MODEL = dict(MODEL, num_layers=2)
WINDOW, RATIO = 1024, 8


# ----------------------------------------------------------------------------------------------
# Checkpoint
def write_checkpoint(path: Path, model: dict, max_len: int, seed: int = 0):
  """A random Qwen2 checkpoint (HF layout) with ``model``'s shape."""
  from longjax.ckpts.hf import save_hf
  from longjax.models.config import ModelConfig
  from longjax.models.decoder import init_params
  cfg = ModelConfig(family="qwen2", attention_bias=True, rope_theta=1e6, rms_norm_eps=1e-6,
                    max_position_embeddings=max(32768, max_len), bos_token_id=1, eos_token_id=2,
                    tie_word_embeddings=False, **model)
  params = init_params(cfg, seed)
  save_hf(path, cfg, params, overwrite=True)
  return cfg


def prompt_tokens(length: int, vocab: int, seed: int = 1):
  import numpy as np
  x = np.random.default_rng(seed).integers(3, vocab, size=(1, length)).astype(np.int32)
  x[0, 0] = 1
  return x


# ----------------------------------------------------------------------------------------------
# Workers (one configuration each, in a fresh process)
def worker_jax(spec: dict) -> dict:
  import jax
  import numpy as np
  from longjax.plain import PlainLM
  from longjax.beacon import BeaconLM, load_beacon
  from longjax.ckpts.hf import load_hf
  from longjax.runtime.rounding import round_up

  t_len, n_dec = spec["length"], spec["decode"]
  peak0 = H.matmul_peak_jax("float32")
  if spec["method"] == BEACON:
    cfg, bcfg, params = load_beacon(spec["ckpt"], init="official", window=WINDOW, stride=WINDOW,
                                    ratios=(RATIO,))
    steps = ({} if spec.get("bucket_steps") is None
             else dict(memory_bucket_steps=spec["bucket_steps"]))
    lm = BeaconLM(cfg, bcfg, max_length=round_up(t_len + n_dec + 1, WINDOW), impl=spec["impl"],
                  progress=False, **steps)
    flops_p = H.beacon_prefill_flops(cfg, t_len, WINDOW, RATIO, bcfg.sink_size)
    flops_d = H.beacon_decode_flops(cfg, t_len, n_dec, WINDOW, RATIO)
    extra = dict(window=WINDOW, ratio=RATIO, memory_capacity=lm.capacity,
                 q_slots=lm.schedule.q_slots, memory_bucket_steps=lm.schedule.memory_bucket_steps)
  else:
    cfg, params = load_hf(spec["ckpt"])
    lm = PlainLM(cfg, impl=spec["impl"])
    flops_p = H.full_prefill_flops(cfg, t_len)
    flops_d = H.full_decode_flops(cfg, t_len, n_dec)
    extra = dict(logits_computed_per_prefill=t_len,
                 unneeded_head_gflop=round(H.head_flops(cfg, t_len - 1) / 1e9, 1))
  params = jax.device_put(params)
  tokens = prompt_tokens(t_len, cfg.vocab_size)
  lengths = np.array([t_len], np.int32)
  rss_loaded = H.current_rss_mib()
  box = {}

  def run(tokens=tokens, lengths=lengths):
    return H.prefill_and_decode(lm, params, tokens, lengths, n_dec,
                                lambda logits, state: box.update(logits=logits, state=state),
                                loop=spec.get("loop", "host"),
                                on_tokens=lambda ids: box.update(tokens=ids))

  # Warm up on the full length: BeaconLM compiles one step per memory-size bucket (power of two)
  # that the prompt reaches, so a shorter warm-up would leave compiles inside the timed runs.
  res = H.timed_runs(run, runs=spec["runs"], budget_s=spec["budget"], warmup=None)
  extra["warmup_input"] = t_len
  peak1 = H.matmul_peak_jax("float32")
  peak = H.merge_peaks(peak0, peak1)
  state = box["state"]
  state_bytes = int(state.k.nbytes + state.v.nbytes)
  if spec.get("logits_out"):
    np.save(spec["logits_out"], np.asarray(box["logits"][0], np.float32))
  if spec.get("want_tokens"):
    extra["tokens"] = box["tokens"]  # greedy ids (bench_official compares them)
  return _summary(spec, res, peak, flops_p, flops_d, state_bytes, rss_loaded,
                  dict(extra, attention_choice=_attn_choice(spec, lm, t_len)))


def _attn_choice(spec, lm, t_len):
  from longjax.kernels import explain
  from longjax.runtime.rounding import round_up
  c = lm.cfg
  if spec["method"] == BEACON:
    tq, tk = lm.schedule.q_slots, lm.capacity + lm.schedule.q_slots
  else:
    tq = t_len
    tk = round_up(t_len + spec["decode"], 64) + t_len
  return explain((1, tq, c.num_heads, c.head_dim), (1, tk, c.num_kv_heads, c.head_dim),
                 c.compute_dtype, impl=spec["impl"])[0]


def worker_hf(spec: dict) -> dict:
  import numpy as np
  import torch
  from transformers import Qwen2ForCausalLM
  from longjax.models.config import ModelConfig

  torch.set_num_threads(len(os.sched_getaffinity(0)))
  t_len, n_dec = spec["length"], spec["decode"]
  peak0 = H.matmul_peak_torch()
  model = Qwen2ForCausalLM.from_pretrained(spec["ckpt"], attn_implementation="sdpa",
                                           dtype=torch.float32).eval()
  cfg = ModelConfig.from_hf(json.loads((Path(spec["ckpt"]) / "config.json").read_text()))
  ids = torch.from_numpy(prompt_tokens(t_len, cfg.vocab_size).astype(np.int64))
  rss_loaded = H.current_rss_mib()
  box = {}

  def run(ids=ids):
    return hf_prefill_and_decode(model, ids, n_dec, box)

  # torch has no compilation: warm up (lazy init, allocator) on a 1024-token prompt.
  short = min(t_len, 1024)
  res = H.timed_runs(run, runs=spec["runs"], budget_s=spec["budget"],
                     warmup=lambda: run(ids[:, :short]))
  peak1 = H.matmul_peak_torch()
  peak = H.merge_peaks(peak0, peak1)
  state_bytes = _cache_bytes(box["past"])
  if spec.get("logits_out"):
    np.save(spec["logits_out"], box["logits"][0].float().numpy())
  flops_p = H.full_prefill_flops(cfg, t_len)
  flops_d = H.full_decode_flops(cfg, t_len, n_dec)
  return _summary(spec, res, peak, flops_p, flops_d, state_bytes, rss_loaded,
                  dict(attention_choice="torch sdpa", torch_threads=torch.get_num_threads(),
                       warmup_input=short))


def hf_prefill_and_decode(model, ids, n_dec: int, box: dict) -> dict:
  """One timed run of a transformers model as ``generate`` runs it: prefill with
  ``logits_to_keep=1``, then ``n_dec`` greedy tokens over ``past_key_values``. ``box`` receives the
  prefill's next-token ``logits``, the final ``past`` and the ``n_dec + 1`` greedy ``tokens`` of row
  0; returns ``{"prefill": s, "decode": s}``."""
  import torch
  with torch.inference_mode():
    t0 = time.perf_counter()
    out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
    logits, past = out.logits[:, -1], out.past_key_values
    t1 = time.perf_counter()
    box["logits"], picks = logits.clone(), [logits.argmax(-1, keepdim=True)]
    for _ in range(n_dec):
      out = model(input_ids=picks[-1], past_key_values=past, use_cache=True)
      logits, past = out.logits[:, -1], out.past_key_values
      picks.append(logits.argmax(-1, keepdim=True))
    t2 = time.perf_counter()
  box["past"], box["tokens"] = past, [int(p[0, 0]) for p in picks]
  return {"prefill": t1 - t0, "decode": t2 - t1}


def _cache_bytes(past) -> int:
  import torch
  total = 0
  layers = getattr(past, "layers", None)
  if layers is not None:
    for lay in layers:
      for name in ("keys", "values"):
        t = getattr(lay, name, None)
        if isinstance(t, torch.Tensor):
          total += t.numel() * t.element_size()
    return total
  for kv in past:
    for t in kv:
      total += t.numel() * t.element_size()
  return total


def _summary(spec, res, peak, flops_p, flops_d, state_bytes, rss_loaded, extra):
  t_len, n_dec = spec["length"], spec["decode"]
  tp, td = res["median"].get("prefill"), res["median"].get("decode")
  out = dict(spec, **extra)
  out.update(
      n_runs=res["n_runs"], note=res["note"], warmup_prefill_s=res["warmup"]["prefill"],
      warmup_decode_s=res["warmup"]["decode"], prefill_times_s=res["times"]["prefill"],
      decode_times_s=res["times"]["decode"], prefill_s=tp, decode_s=td,
      prefill_tok_s=None if not tp else t_len / tp,
      decode_ms_per_token=None if not td else 1e3 * td / n_dec,
      decode_tok_s=None if not td else n_dec / td,
      peak_rss_mib=H.peak_rss_mib(), rss_after_load_mib=rss_loaded,
      state_mib=round(state_bytes / 2**20, 2),
      prefill_model_gflop=round(flops_p / 1e9, 2), decode_model_gflop=round(flops_d / 1e9, 3),
      prefill_gflop_s=None if not tp else round(flops_p / tp / 1e9, 2),
      decode_gflop_s=None if not td else round(flops_d / td / 1e9, 2),
      matmul_peak_gflop_s=round(peak["best_flops"] / 1e9, 1), matmul_peak_all=peak["all_best"],
      prefill_mfu=None if not tp else flops_p / tp / peak["best_flops"],
      decode_mfu=None if not td else flops_d / td / peak["best_flops"],
      load_average=H.load_average())
  return out


# ----------------------------------------------------------------------------------------------
# Driver
def predicted_run_s(history, method, length):
  """Seconds one run (prefill + decode) of ``method`` at ``length`` is expected to take, from the
  measured shorter lengths (growth per doubling as last observed, at least 2x; 4x for full
  attention when only one point is known)."""
  pts = [(l, r["prefill_s"] + r["decode_s"]) for l, r in sorted(history.get(method, {}).items())
         if r.get("prefill_s")]
  if not pts:
    return None
  l1, t1 = pts[-1]
  if len(pts) >= 2:
    l0, t0 = pts[-2]
    growth = max(2.0, (t1 / t0) ** (1.0 / _log2(l1 / l0)))
  else:
    growth = 2.0 if method == BEACON else 4.0
  return t1 * growth ** _log2(length / l1)


def _log2(x):
  import math
  return math.log2(x)


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  ap.add_argument("--worker", help=argparse.SUPPRESS)
  ap.add_argument("--quick", action="store_true", help="small model and lengths (smoke run)")
  ap.add_argument("--lengths", default=None, help="comma list (default 2048,...,32768)")
  ap.add_argument("--methods", default="beacon,plain,hf")
  ap.add_argument("--full-max", type=int, default=16384,
                  help="longest context for the full-attention baselines (plain, hf)")
  ap.add_argument("--runs", type=int, default=5)
  ap.add_argument("--decode", type=int, default=32)
  ap.add_argument("--budget", type=float, default=100.0,
                  help="seconds per configuration (warm-up + runs); longer ones are cut / skipped")
  ap.add_argument("--skip-factor", type=float, default=3.0,
                  help="skip a configuration whose predicted warm-up + 1 run exceeds this x budget")
  ap.add_argument("--layers", type=int, default=None)
  ap.add_argument("--impl", default="auto")
  ap.add_argument("--loop", choices=("device", "host"), default="device",
                  help="longjax decoding: the compiled loop (longjax.generate's default) or "
                       "one jitted step per token from Python")
  ap.add_argument("--bucket-steps", type=int, default=None,
                  help="beacon memory buckets per octave (default: BeaconLM's)")
  ap.add_argument("--out", default=str(H.RESULTS_DIR))
  ap.add_argument("--name", default=None)
  args = ap.parse_args(argv)

  if args.worker:
    spec = json.loads(args.worker)
    H.emit(worker_hf(spec) if spec["method"] == "hf" else worker_jax(spec))
    return

  model = dict(QUICK_MODEL if args.quick else MODEL)
  if args.layers:
    model["num_layers"] = args.layers
  lengths = ([int(x) for x in args.lengths.split(",")] if args.lengths else
             ([1024, 2048] if args.quick else [2048, 4096, 8192, 16384, 32768]))
  full_max = args.full_max or max(lengths)
  methods = args.methods.split(",")
  name = args.name or (f"{BEACON}_quick" if args.quick else BEACON)
  machine = H.machine_info()
  H.log("machine:", json.dumps(machine))
  tmp = Path(tempfile.mkdtemp(prefix="longjax-bench-"))
  ckpt = tmp / "qwen2"
  t0 = time.perf_counter()
  write_checkpoint(ckpt, model, max(lengths) + args.decode + 2 * WINDOW)
  H.log(f"checkpoint written in {time.perf_counter() - t0:.1f}s: {ckpt}")

  results, history = [], {}
  for length in lengths:
    for method in methods:
      spec = dict(method=method, length=length, decode=args.decode, runs=args.runs,
                  budget=args.budget, impl=args.impl, bucket_steps=args.bucket_steps,
                  loop=args.loop,
                  ckpt=str(ckpt),
                  logits_out=str(tmp / f"logits_{method}_{length}.npy"))
      if method != BEACON and length > full_max:
        results.append(dict(spec, status=f"skipped: --full-max {full_max}"))
        continue
      pred = predicted_run_s(history, method, length)
      # plain warms up on the full length (its shapes depend on it): warm-up + 1 run must fit.
      need = None if pred is None else (2 if method == PLAIN else 1) * pred
      if need is not None and need > args.skip_factor * args.budget:
        results.append(dict(spec, status="skipped: budget",
                            predicted_run_s=round(pred, 1)))
        H.log(f"{method} @ {length}: skipped (predicted {pred:.0f}s per run, budget "
              f"{args.budget:.0f}s)")
        continue
      H.log(f"{method} @ {length} ...")
      r = H.run_worker("bench.bench_beacon", spec, timeout_s=1.6 * args.budget + 120)
      results.append(r)
      if r.get("status") == "ok":
        history.setdefault(method, {})[length] = r
        H.log(f"  prefill {r['prefill_s']:.3f}s  decode {r['decode_ms_per_token']:.1f} ms/tok  "
              f"warm-up {r['warmup_prefill_s']:.1f}s  runs {r['n_runs']}  rss "
              f"{r['peak_rss_mib']:.0f} MiB  MFU {100 * r['prefill_mfu']:.1f}% of "
              f"{r['matmul_peak_gflop_s']:.0f} GFLOP/s  ({r['wall_s']}s wall)")
      else:
        H.log(f"  {r.get('status')}: {r.get('stderr_tail', '')[-600:]}")

  _scaling_and_parity(results, tmp)
  machine["load_average_end"] = H.load_average()
  machine["uptime_end"] = H.uptime_line()
  payload = dict(benchmark="beacon_vs_full_attention", machine=machine, model=model,
                 beacon=dict(window=WINDOW, ratio=RATIO), args=vars(args), results=results,
                 summary=summarise(results))
  table = render(payload)
  out = H.write_results(name, payload, table, args.out)
  print(table)
  H.log(f"wrote {out / (name + '.json')} and {out / (name + '.md')}")
  shutil.rmtree(tmp, ignore_errors=True)  # the checkpoint and the saved logits


def _scaling_and_parity(results, tmp):
  import numpy as np
  by = {(r["method"], r["length"]): r for r in results if r.get("status") == "ok"}
  for (m, l), r in by.items():
    prev = by.get((m, l // 2))
    if prev and prev.get("prefill_s") and r.get("prefill_s"):
      r["scaling_2x"] = r["prefill_s"] / prev["prefill_s"]
    ref = by.get(("hf", l))
    if m != "hf" and ref:
      a, b = Path(r["logits_out"]), Path(ref["logits_out"])
      if a.exists() and b.exists():
        r["max_abs_dlogit_vs_hf"] = float(np.max(np.abs(np.load(a) - np.load(b))))
    if m == BEACON:
      for other in ("hf", PLAIN):
        o = by.get((other, l))
        if o and o.get("prefill_s"):
          r[f"speedup_vs_{other}"] = o["prefill_s"] / r["prefill_s"]


def summarise(results):
  ok = {(r["method"], r["length"]): r for r in results if r.get("status") == "ok"}
  s = {}
  b16, b32 = ok.get((BEACON, 16384)), ok.get((BEACON, 32768))
  if b16 and b32:
    s["beacon_time_32k_over_16k"] = b32["prefill_s"] / b16["prefill_s"]
  if b16:
    for other in ("hf", PLAIN):
      if (other, 16384) in ok:
        s[f"beacon_16k_speedup_vs_{other}"] = ok[(other, 16384)]["prefill_s"] / b16["prefill_s"]
  mfus = {l: r["prefill_mfu"] for (m, l), r in ok.items() if m == BEACON}
  if mfus:
    s["beacon_prefill_mfu_by_length"] = mfus
  return s


def render(payload) -> str:
  rows = sorted(payload["results"], key=lambda r: (r["length"], r["method"]))
  cols = [
      ("method", "method"), ("context", "length"),
      *H.PREFILL_TIME_COLUMNS, ("t(L)/t(L/2)", "scaling_2x"),
      ("decode ms/tok", "decode_ms_per_token"), ("decode tok/s", "decode_tok_s"),
      ("warm-up s (compile+run)", "warmup_prefill_s"), ("warm-up on", "warmup_input"),
      *H.RUN_COLUMNS, ("KV / memory MiB", "state_mib"), *H.PREFILL_COMPUTE_COLUMNS,
      ("attention", "attention_choice"), ("buckets / octave", "memory_bucket_steps"),
      H.STATUS_COLUMN]
  m = payload["model"]
  head = (f"### Activation Beacon vs full attention (CPU)\n\n"
          f"Model: random Qwen2-shaped, hidden {m['hidden_size']}, {m['num_layers']} layers, "
          f"{m['num_heads']}/{m['num_kv_heads']} heads × {m['head_dim']}, MLP "
          f"{m['intermediate_size']}, vocab {m['vocab_size']}, fp32. Beacon window "
          f"{payload['beacon']['window']}, ratio {payload['beacon']['ratio']}. Decode: "
          f"{payload['args']['decode']} greedy tokens (longjax: "
          f"{payload['args'].get('loop', 'host')} loop). Median of up to {payload['args']['runs']} "
          f"runs after a warm-up (per-configuration budget {payload['args']['budget']:.0f} s).\n\n"
          + H.machine_md(payload["machine"]) + "\n\n")
  extra = []
  for r in rows:
    if r.get("max_abs_dlogit_vs_hf") is not None:
      extra.append(f"{r['method']}@{r['length']}: max|Δlogit| vs HF "
                   f"{r['max_abs_dlogit_vs_hf']:.2e}")
  s = payload.get("summary", {})
  tail = "\n\nSummary: " + json.dumps({k: (round(v, 3) if isinstance(v, float) else v)
                                       for k, v in s.items()}, default=str)
  if extra:
    tail += "\n\nNext-token logits after prefill: " + "; ".join(extra)
  return head + H.markdown_table(rows, cols) + tail


if __name__ == "__main__":
  main()
