"""The methods on the real model at long context: SmolLM2-135M-Instruct with the committed assets.

    JAX_PLATFORMS=cpu python -m bench.bench_longctx                       # 8K-64K (~45 min quiet)
    JAX_PLATFORMS=cpu python -m bench.bench_longctx --lengths 8192 --runs 1   # one length

Per method and context length, in a fresh process (one configuration each, so peak RSS is its
own): a random-token prompt (fixed seed) is prefilled and ``--decode`` greedy tokens are decoded,
after a warm-up on the same length (compiles excluded from the timed runs).

* ``beacon``: ``assets/smollm2_beacon`` at the reading setting it ships with (its ``beacon.json``),
  ``BeaconLM`` built as ``longjax.generate`` builds it (``methods.Beacon.inference_model``) with
  room for the prompt, decode on the compiled device loop;
* ``focus``: ``assets/smollm2_focus`` (its ``focus.json``: local window, stride, prompt cap),
  ``FocusLLM``, device loop;
* ``plain``: longjax full attention (``PlainLM``, fixed-capacity KV cache), device loop;
* ``hf``: transformers ``AutoModelForCausalLM`` with SDPA attention, prefill with
  ``logits_to_keep=1``, then a greedy loop over ``past_key_values`` (what ``generate`` does).

Reported per cell: prefill s, decode ms/token, the bytes the method holds for the context after
the prefill (KV cache, beacon memory buffers, FocusLLM chunk caches), peak RSS, and for beacon /
plain / hf the prefill MFU against a ``jnp.dot`` (``torch.mm``) fp32 matmul peak measured in the
same process. Full attention runs up to ``--full-max`` (default 32768): above it the cell says so
(its time, not its memory, is what does not fit a session: t(32K) x 4 at least). SmolLM2's
positions end at 8,192: beacon at ratio 8 holds (8192 - W) x 8 + W tokens; longer prompts are
refused by ``longjax.generate``; here every method reads them with the RoPE extended (timing
only, the cell says so). Results: ``bench/results/longctx.{json,md,png}``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

if __package__ in (None, ""):
  sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import harness as H  # noqa: E402
from bench import bench_beacon as BB  # noqa: E402
from longjax.methods import Beacon, Focus, Plain  # noqa: E402

# the series: the longjax methods by their registry names, and "hf" (transformers, SDPA)
BEACON, FOCUS, PLAIN, HF = Beacon.name, Focus.name, Plain.name, "hf"
METHODS = (BEACON, FOCUS, PLAIN, HF)
FULL_ATTENTION = (PLAIN, HF)
ASSETS = {BEACON: "smollm2_beacon", FOCUS: "smollm2_focus"}
SEED = 7


def _base_dir() -> str:
  from longjax.ckpts import smollm2
  return str(smollm2.get(progress=lambda *a: None))


def _load(method: str, length: int, n_dec: int):
  """``(lm, cfg, params, settings, past_positions)`` of one method at the shipped setting."""
  from longjax import methods
  from longjax.ckpts.assets import assets_root
  from longjax.ckpts.checkpoint import load_any
  from longjax.runtime.rounding import round_up
  base = _base_dir()
  if method in ASSETS:
    reg = methods.get(method)
    cfg, settings, params = reg.load_asset(assets_root() / ASSETS[method], base)
  else:
    reg, settings = methods.get(PLAIN), None
    cfg, params = load_any(base)
  need = length + n_dec + 1
  limit = reg.token_limit(cfg, settings)[0] if settings is not None else cfg.max_positions
  past = limit is not None and need > limit
  if past:  # timing only: the RoPE table extended past the base's positions
    cfg = cfg.replace(max_position_embeddings=max(cfg.max_positions, need) * 2)
  if method == BEACON:
    lm = reg.inference_model(cfg, settings, max_length=round_up(need, settings.window))
  elif method == FOCUS:
    lm = reg.inference_model(cfg, settings)
  else:
    from longjax.plain import PlainLM
    lm = PlainLM(cfg)
  return lm, cfg, params, settings, past


def worker_jax(spec: dict) -> dict:
  import jax
  import numpy as np
  t_len, n_dec, method = spec["length"], spec["decode"], spec["method"]
  peak0 = H.matmul_peak_jax("float32")
  lm, cfg, params, settings, past = _load(method, t_len, n_dec)
  params = jax.device_put(params)
  tokens = BB.prompt_tokens(t_len, cfg.vocab_size, seed=SEED)
  lengths = np.array([t_len], np.int32)
  rss_loaded = H.current_rss_mib()
  box = {}

  def run():
    return H.prefill_and_decode(lm, params, tokens, lengths, n_dec,
                                lambda logits, state: box.update(state=state), loop="device",
                                on_tokens=lambda ids: box.update(tokens=ids))

  res = H.timed_runs(run, runs=spec["runs"], budget_s=spec["budget"], warmup=None)
  peak = H.merge_peaks(peak0, H.matmul_peak_jax("float32"))
  flops_p, flops_d = _flops(method, cfg, settings, t_len, n_dec)
  extra = dict(tokens=box["tokens"], past_base_positions=past,
               setting=_setting(method, settings))
  return BB._summary(spec, res, peak, flops_p, flops_d, H.tree_nbytes(box["state"]), rss_loaded,
                     extra)


def _setting(method, settings) -> str:
  if method == BEACON:
    return (f"W {settings.window}, S {settings.stride}, ratios {settings.ratios}, "
            f"{settings.attn}")
  if method == FOCUS:
    return (f"W {settings.local_window}, S {settings.chunk_stride}, prompt cap "
            f"{settings.prompt_cap}")
  return "full attention"


def _flops(method, cfg, settings, t_len, n_dec):
  """Analytic model FLOPs (MFU); FocusLLM's depend on its chunk plan: not counted (0)."""
  if method == BEACON:
    ratio = max(settings.positive_ratios or (1,))
    return (H.beacon_prefill_flops(cfg, t_len, settings.window, ratio, settings.sink_size),
            H.beacon_decode_flops(cfg, t_len, n_dec, settings.window, ratio))
  if method in FULL_ATTENTION:
    return H.full_prefill_flops(cfg, t_len), H.full_decode_flops(cfg, t_len, n_dec)
  return 0.0, 0.0


def worker_hf(spec: dict) -> dict:
  import numpy as np
  import torch
  from transformers import AutoModelForCausalLM
  from longjax.models.config import ModelConfig
  torch.set_num_threads(len(os.sched_getaffinity(0)))
  t_len, n_dec = spec["length"], spec["decode"]
  peak0 = H.matmul_peak_torch()
  base = _base_dir()
  model = AutoModelForCausalLM.from_pretrained(base, attn_implementation="sdpa",
                                               dtype=torch.float32).eval()
  cfg = ModelConfig.from_hf(json.loads((Path(base) / "config.json").read_text()))
  ids = torch.from_numpy(BB.prompt_tokens(t_len, cfg.vocab_size, seed=SEED).astype(np.int64))
  rss_loaded = H.current_rss_mib()
  box = {}

  def run(ids=ids):
    return BB.hf_prefill_and_decode(model, ids, n_dec, box)

  # no compilation: the warm-up (lazy init, allocator) runs a 1024-token prompt
  res = H.timed_runs(run, runs=spec["runs"], budget_s=spec["budget"],
                     warmup=lambda: run(ids[:, :min(t_len, 1024)]))
  peak = H.merge_peaks(peak0, H.matmul_peak_torch())
  flops_p, flops_d = H.full_prefill_flops(cfg, t_len), H.full_decode_flops(cfg, t_len, n_dec)
  state = BB._cache_bytes(box["past"])
  return BB._summary(spec, res, peak, flops_p, flops_d, state, rss_loaded,
                     dict(tokens=box["tokens"], past_base_positions=t_len + n_dec > 8192,
                          setting="full attention (torch SDPA)",
                          torch_threads=torch.get_num_threads()))


# ----------------------------------------------------------------------------------------------
def plan_cells(methods, lengths, full_max):
  """``(method, length, why_not)`` for every cell: why_not is '' for a cell that runs."""
  cells = []
  for length in lengths:
    for m in methods:
      why = ""
      if m in FULL_ATTENTION and length > full_max:
        why = f"not run: full attention above --full-max {full_max} (time)"
      cells.append((m, length, why))
  return cells


def render(payload) -> str:
  rows = payload["results"]
  lines = ["# Long context on SmolLM2-135M-Instruct (`bench/bench_longctx.py`)", "",
           H.machine_md(payload["machine"]), "",
           f"`{payload['command']}`", "",
           "Each cell: prefill s · decode ms/token · memory held MiB · peak RSS MiB · prefill MFU "
           "(n runs, load average at the end).", "",
           "| context | " + " | ".join(payload["methods"]) + " |",
           "|---|" + "---|" * len(payload["methods"])]
  for length in payload["lengths"]:
    cells = []
    for m in payload["methods"]:
      r = next((x for x in rows if x["method"] == m and x["length"] == length), None)
      cells.append(_cell(r))
    lines.append(f"| {length // 1024}K | " + " | ".join(cells) + " |")
  lines += ["", "Ratios (HF full attention / method; > 1: the method is faster or smaller):", "",
            "| context | method | prefill | decode | memory held |", "|---|---|---|---|---|"]
  for r in payload["ratios"]:
    lines.append(f"| {r['length'] // 1024}K | {r['method']} | {H.fmt(r.get('prefill'))} | "
                 f"{H.fmt(r.get('decode'))} | {H.fmt(r.get('memory'))} |")
  if payload.get("growth"):
    lines += ["", "Growth with the context (t(L) / t(L/2), prefill + decode):", ""]
    lines += [f"- {m}: " + ", ".join(f"{l // 1024}K {H.fmt(g)}" for l, g in gs)
              for m, gs in payload["growth"].items()]
  return "\n".join(lines) + "\n"


def _cell(r) -> str:
  if r is None:
    return "–"
  if r.get("status") != "ok":
    return r.get("status", "?")
  mfu = r.get("prefill_mfu")
  past = " †" if r.get("past_base_positions") else ""
  load = (r.get("load_average") or [None])[0]
  return (f"{H.fmt(r['prefill_s'])} · {H.fmt(r['decode_ms_per_token'])} · "
          f"{H.fmt(r['state_mib'])} · {r['peak_rss_mib']:,.0f} · "
          f"{'–' if not mfu else f'{100 * mfu:.0f} %'} (n {r['n_runs']}, {H.fmt(load)}){past}")


def ratios(rows) -> list:
  ok = {(r["method"], r["length"]): r for r in rows if r.get("status") == "ok"}
  out = []
  for (m, length), r in sorted(ok.items(), key=lambda kv: (kv[0][1], kv[0][0])):
    ref = ok.get((HF, length))
    if m == HF or ref is None:
      continue
    out.append(dict(length=length, method=m,
                    prefill=H.ratio(ref["prefill_s"], r["prefill_s"]),
                    decode=H.ratio(ref["decode_ms_per_token"], r["decode_ms_per_token"]),
                    memory=H.ratio(ref["state_mib"], r["state_mib"])))
  return out


def growth(rows) -> dict:
  out = {}
  for m in METHODS:
    pts = sorted((r["length"], r["prefill_s"] + r["decode_s"]) for r in rows
                 if r["method"] == m and r.get("status") == "ok")
    gs = [(l1, t1 / t0) for (l0, t0), (l1, t1) in zip(pts, pts[1:]) if l1 == 2 * l0]
    if gs:
      out[m] = gs
  return out


def plot(payload, path: Path):
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
  for m in payload["methods"]:
    rs = sorted((r for r in payload["results"] if r["method"] == m and r.get("status") == "ok"),
                key=lambda r: r["length"])
    if not rs:
      continue
    xs = [r["length"] for r in rs]
    for ax, key in zip(axes, ("prefill_s", "decode_ms_per_token", "peak_rss_mib")):
      ax.plot(xs, [r[key] for r in rs], marker="o", label=m)
  for ax, title in zip(axes, ("prefill (s)", "decode (ms/token)", "peak RSS (MiB)")):
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("context (tokens)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
  axes[0].legend()
  fig.suptitle("SmolLM2-135M-Instruct on CPU: Activation Beacon, FocusLLM, full attention")
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  ap.add_argument("--worker", help=argparse.SUPPRESS)
  ap.add_argument("--lengths", default="8192,16384,32768,65536")
  ap.add_argument("--methods", default=",".join(METHODS))
  ap.add_argument("--full-max", type=int, default=32768)
  ap.add_argument("--runs", type=int, default=2)
  ap.add_argument("--decode", type=int, default=32)
  ap.add_argument("--budget", type=float, default=300.0, help="seconds per cell (warm-up + runs)")
  ap.add_argument("--timeout", type=float, default=2400.0, help="seconds before a cell is killed")
  ap.add_argument("--name", default="longctx")
  args = ap.parse_args(argv)
  if args.worker:
    spec = json.loads(args.worker)
    H.emit(worker_hf(spec) if spec["method"] == HF else worker_jax(spec))
    return
  methods = [m.strip() for m in args.methods.split(",") if m.strip()]
  bad = [m for m in methods if m not in METHODS]
  if bad:
    sys.exit(f"--methods: unknown {bad}; use some of {', '.join(METHODS)}")
  lengths = [int(x) for x in args.lengths.split(",")]
  _base_dir()  # fetch SmolLM2 once, before the workers
  results = []
  for m, length, why in plan_cells(methods, lengths, args.full_max):
    spec = dict(method=m, length=length, decode=args.decode, runs=args.runs,
                budget=args.budget)
    if why:
      results.append(dict(spec, status=why))
      continue
    H.log(f"{m} {length}: running (load {H.load_average()[0]})")
    r = H.run_worker("bench.bench_longctx", spec, timeout_s=args.timeout, log=H.log)
    results.append(r)
    H.log(f"{m} {length}: {r.get('status')} prefill {r.get('prefill_s')} s, decode "
          f"{r.get('decode_ms_per_token')} ms/token, wall {r.get('wall_s')} s")
  payload = dict(machine=H.machine_info(), methods=methods, lengths=lengths,
                 command="python -m bench.bench_longctx " + " ".join(sys.argv[1:] if argv is None
                                                                    else argv),
                 results=results, ratios=ratios(results), growth=growth(results))
  path = H.write_results(args.name, payload, render(payload))
  plot(payload, Path(path) / f"{args.name}.png")
  print(render(payload))
  print(f"wrote {path}")


if __name__ == "__main__":
  main()
