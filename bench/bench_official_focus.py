"""longjax's FocusLLM against the official PyTorch code, alternating fresh processes.

    python -m bench.bench_official_focus --official-dir DIR --official-python PY \\
        [--lengths 4096,16384]

``DIR``: a checkout of the official FocusLLM repository (leezythu/FocusLLM, commit ac695a6, the
commit docs/focusllm.md was read at; its model is ``src/activation_beacon_llama``); ``PY``: a
Python with its requirements (transformers 4.36.2, accelerate, torch; docs/performance.md says how
to build one). Both default to the environment variables ``LONGJAX_OFFICIAL_FOCUS_DIR`` /
``LONGJAX_OFFICIAL_FOCUS_PYTHON``; without them the script says what is missing and exits 0
(nothing is measured, nothing written).

One random LLaMA-shaped checkpoint (``bench_beacon``'s sizes: hidden 512, 4 layers, 8 / 2 heads of
64, MLP 1536, vocab 32000, fp32) with candidate projections drawn independently of q/k/v/o (so a
side that ignored them, or loaded copies, would disagree) is exported once with ``save_focus``
(W = S = 1024 as ``bench_focus``; prompt cap min(512, S, W) = 512); both sides load that export.
The official code chunks only inputs of >= 4096 tokens, so lengths must be >= 4096 and multiples
of 1024 (``bench_focus``'s worker counts chunks of 1024 after a 1024-token local window).

Per length, ``--rounds`` rounds each run both sides in fresh processes, the order swapped every
round (slow drift of the host hits both alike); each process warms up, then times ``--runs`` runs
of prefill (the chunks condensed + the local forward, to the first token's logits) and a
``--decode``-token greedy decode (longjax: ``FocusLLM`` through the compiled decode loop,
``generate``'s default for FocusLLM; official: one forward per token, as ``generate`` calls it).
Every FocusLLM decode step re-runs the local window, so decoding is slow on both sides by
definition. The load average is recorded beside every number: PyTorch's CPU code slows down much
more than XLA's on a loaded host, so only quiet-host ratios mean anything. Greedy tokens must be
identical; the prefill's next-token logits of the first round are compared too.

Results: ``bench/results/official_focus.{json,md}``: per length, the median over rounds of each
side's per-process medians, and official / longjax (> 1: longjax faster).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):
  sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import harness as H  # noqa: E402
from bench import bench_beacon as BB  # noqa: E402
from bench import bench_focus as BF  # noqa: E402

LONGJAX, OFFICIAL = BF.FOCUS, "official"
OFFICIAL_MIN_LEN = 4096  # the official code's hard-coded chunking threshold
OFFICIAL_MODEL = Path("src") / "activation_beacon_llama" / "modeling_llama.py"
ENV_DIR, ENV_PYTHON = "LONGJAX_OFFICIAL_FOCUS_DIR", "LONGJAX_OFFICIAL_FOCUS_PYTHON"


def missing_setup(official_dir, official_python) -> str:
  """Why the official side cannot run here ('' when it can)."""
  if not official_dir:
    return (f"no official code: pass --official-dir (or set {ENV_DIR}) to a checkout of "
            "leezythu/FocusLLM at commit ac695a6")
  if not (Path(official_dir) / OFFICIAL_MODEL).is_file():
    return (f"{official_dir} has no {OFFICIAL_MODEL}: point --official-dir at the root of a "
            "leezythu/FocusLLM checkout")
  if not official_python:
    return (f"no official environment: pass --official-python (or set {ENV_PYTHON}) to a Python "
            "with transformers 4.36.2, accelerate and torch")
  if not Path(official_python).is_file():
    return f"--official-python {official_python} does not exist"
  return ""


def check_lengths(lengths) -> str:
  """Why a length cannot be compared ('' when all can)."""
  for n in lengths:
    if n < OFFICIAL_MIN_LEN or (n - BF.LOCAL) % BF.STRIDE:
      return (f"length {n}: lengths must be >= {OFFICIAL_MIN_LEN} (below it the official code "
              f"runs the plain model) and {BF.LOCAL} + a multiple of {BF.STRIDE}")
  return ""


def export_checkpoint(tmp: Path, max_len: int) -> Path:
  """The bench's random LLaMA with independent candidate projections, in the official format."""
  from longjax.focus import FocusConfig
  from longjax.focus.convert import save_focus
  from longjax.models.config import ModelConfig
  from longjax.models.decoder import init_params
  # LLaMA, not bench_beacon's Qwen2: the official FocusLLM is LLaMA code (no q/k/v biases) and
  # hard-codes BOS = 1.
  cfg = ModelConfig(family="llama", rope_theta=10000.0, rms_norm_eps=1e-6,
                    max_position_embeddings=max(32768, max_len), bos_token_id=1, eos_token_id=2,
                    tie_word_embeddings=False, alt_projections=("q", "k", "v", "o"), **BB.MODEL)
  fcfg = FocusConfig(local_window=BF.LOCAL, chunk_stride=BF.STRIDE)
  return save_focus(tmp / "export", cfg, fcfg, init_params(cfg, seed=0))


def run_side(method: str, spec: dict, args, prompt: Path) -> dict:
  """One fresh process of one side; the row gets ``decode_ms_per_token`` either way."""
  timeout = 2 * args.budget + 180
  if method == LONGJAX:
    spec = dict(spec, mode="parallel", chunks=(spec["length"] - BF.LOCAL) // BF.STRIDE,
                impl="auto", loop="device", want_tokens=True)
    r = H.run_worker("bench.bench_focus", spec, timeout_s=timeout)
    if r.get("status") == "ok":
      r["decode_ms_per_token"] = r.get("decode_step_ms")
    return r
  spec = dict(spec, official_dir=str(Path(args.official_dir).resolve()), prompt=str(prompt))
  return H.run_worker("bench.official_focus_worker", spec, timeout_s=timeout,
                      python=args.official_python)


def logits_gap(tmp: Path, length: int):
  """max |Δ| between the two sides' prefill next-token logits (first round), and longjax's
  top-1 / top-2 margin (how much rounding it would take to flip the first greedy token)."""
  import numpy as np
  a, b = tmp / f"logits_{LONGJAX}_{length}.npy", tmp / f"logits_{OFFICIAL}_{length}.npy"
  if not (a.exists() and b.exists()):
    return None, None
  x, y = np.load(a), np.load(b)
  top = np.sort(x)[-2:]
  return float(np.max(np.abs(x - y))), float(top[1] - top[0])


def summarise(rows, gaps=None) -> list:
  """Per length: each side's median over rounds, the ratios, token agreement, load range."""
  gaps = gaps or {}
  out = []
  for length in sorted({r["length"] for r in rows}):
    pair = H.paired_sides(rows, length, LONGJAX, OFFICIAL)
    if pair is None:
      out.append(dict(length=length, status="incomplete"))
      continue
    gap, margin = gaps.get(length, (None, None))
    out.append(dict(length=length, chunks=(length - BF.LOCAL) // BF.STRIDE, **pair,
                    max_abs_dlogit=gap, longjax_top2_margin=margin))
  return out


COLUMNS = [
    ("length", "length"), ("chunks", "chunks"), ("rounds", "rounds"),
    ("prefill s longjax / official",
     lambda r: f"{H.fmt(r.get('longjax_prefill_s'))} / {H.fmt(r.get('official_prefill_s'))}"),
    ("prefill speed-up", "prefill_speedup"),
    ("decode ms/token longjax / official",
     lambda r: f"{H.fmt(r.get('longjax_decode_ms'))} / {H.fmt(r.get('official_decode_ms'))}"),
    ("decode speed-up", "decode_speedup"),
    ("greedy tokens identical", "tokens_identical"),
    ("max abs Δ prefill logits", "max_abs_dlogit"),
    ("load (1 min) range", "load_1min")]


def render(payload) -> str:
  """The markdown table, with the official side's software (the machine line names the
  driver's, whose transformers is longjax's)."""
  off = next((r for r in payload["rows"] if r.get("method") == OFFICIAL
              and r.get("status") == "ok"), {})
  side = (f"Official side: transformers {off.get('transformers')}, torch {off.get('torch')} "
          f"({off.get('torch_threads')} threads), attention {off.get('attn_implementation')}, "
          f"CPU shim for `.cuda()` {off.get('cuda_shim')}. Per side and length: the median over "
          f"rounds of each process's median of {payload['args']['runs']} runs after a warm-up; "
          f"decode = {payload['args']['decode']} greedy tokens.")
  return (f"# longjax vs the official FocusLLM code\n\n{H.machine_md(payload['machine'])}\n\n"
          f"{side}\n\n" + H.markdown_table(payload["summary"], COLUMNS) + "\n")


def parse_args(argv):
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  ap.add_argument("--official-dir", default=os.environ.get(ENV_DIR))
  ap.add_argument("--official-python", default=os.environ.get(ENV_PYTHON))
  ap.add_argument("--lengths", default="4096,16384")
  ap.add_argument("--rounds", type=int, default=2)
  ap.add_argument("--runs", type=int, default=3)
  ap.add_argument("--decode", type=int, default=8)
  ap.add_argument("--budget", type=float, default=300.0,
                  help="seconds per process (warm-up + runs)")
  ap.add_argument("--out", default=str(H.RESULTS_DIR))
  ap.add_argument("--name", default="official_focus")
  return ap.parse_args(argv)


def main(argv=None):
  args = parse_args(argv)
  lengths = [int(x) for x in args.lengths.split(",")]
  why = missing_setup(args.official_dir, args.official_python) or check_lengths(lengths)
  if why:
    print(f"bench_official_focus: skipped, {why}. Nothing measured. docs/performance.md "
          "('Against the official FocusLLM code') says how to build the official environment.")
    return 0
  machine = H.machine_info()
  H.log("machine:", json.dumps(machine))
  tmp = Path(tempfile.mkdtemp(prefix="longjax-official-focus-"))
  ckpt = export_checkpoint(tmp, max(lengths) + args.decode)
  rows, gaps = [], {}
  import numpy as np
  for length in lengths:
    prompt = tmp / f"prompt_{length}.npy"
    np.save(prompt, BB.prompt_tokens(length, BB.MODEL["vocab_size"]))  # bench_focus's prompt
    for rnd in range(args.rounds):
      order = (LONGJAX, OFFICIAL) if rnd % 2 == 0 else (OFFICIAL, LONGJAX)
      for method in order:
        spec = dict(method=method, length=length, decode=args.decode, runs=args.runs,
                    budget=args.budget, ckpt=str(ckpt), round=rnd)
        if rnd == 0:
          spec["logits_out"] = str(tmp / f"logits_{method}_{length}.npy")
        r = run_side(method, spec, args, prompt)
        rows.append(r)
        if r.get("status") == "ok":
          H.log(f"{method} @ {length} round {rnd}: prefill {r['prefill_s']:.3f}s decode "
                f"{r['decode_ms_per_token']:.1f} ms/tok tokens {r['tokens']} "
                f"load {r.get('load_average')}")
        else:
          H.log(f"{method} @ {length} round {rnd}: {r.get('status')}: "
                f"{r.get('stderr_tail', '')[-800:]}")
    gaps[length] = logits_gap(tmp, length)
  for r in rows:  # committed results name no machine's paths
    if "official_dir" in r:
      r["official_dir"] = "<official dir>"
  table = summarise(rows, gaps)
  for t in table:
    if t.get("tokens_identical") is False:
      H.log(f"greedy tokens differ at {t['length']}: {t['tokens']}")
  shutil.rmtree(tmp, ignore_errors=True)  # the export (~0.3 GB), prompts and logits
  machine["load_average_end"] = H.load_average()
  payload = dict(machine=machine, model=dict(BB.MODEL, family="llama"),
                 focus=dict(local_window=BF.LOCAL, chunk_stride=BF.STRIDE, prompt_cap=512),
                 args=vars(args) | dict(official_dir="<official dir>",
                                        official_python="<official python>"),
                 summary=table, rows=rows)
  md = render(payload)
  path = H.write_results(args.name, payload, md, Path(args.out))
  print(md)
  H.log(f"wrote {path}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
