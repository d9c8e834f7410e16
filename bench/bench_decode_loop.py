"""Decode loop on the host vs on device (``longjax.generate(loop=...)``), per method, in one run.

    JAX_PLATFORMS=cpu python -m bench.bench_decode_loop            # ~1-2 min on CPU
    python -m bench.bench_decode_loop --decode 256 --hidden 512     # bigger, e.g. on a GPU

For PlainLM, BeaconLM (window 64, ratio 4: the generation completes windows inside the loop) and
FocusLLM on one small random model: warm-up (compiles) then ``--runs`` alternating host / device
generations of ``--decode`` greedy tokens; prints each loop's median decode ms per step (a step
advances every row; ``Timings.decode_s / decode_steps``) and the host / device ratio, and checks
that both loops produced the same tokens. No timing assertions: the ratio is what the device loop
saves in per-step dispatch and host round trips, and it only means something on an idle machine.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

if __package__ in (None, ""):
  sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import numpy as np  # noqa: E402

import longjax  # noqa: E402
from longjax.beacon import BeaconConfig, BeaconLM  # noqa: E402
from longjax.focus import FocusConfig, FocusLLM  # noqa: E402
from longjax.methods import Beacon, Focus, Plain  # noqa: E402
from longjax.models.config import ModelConfig  # noqa: E402
from longjax.models.decoder import init_params  # noqa: E402


def model(hidden: int, layers: int, vocab: int):
  heads = max(hidden // 64, 2)
  cfg = ModelConfig(family="llama", vocab_size=vocab, hidden_size=hidden,
                    intermediate_size=3 * hidden, num_layers=layers, num_heads=heads,
                    num_kv_heads=max(heads // 2, 1), head_dim=hidden // heads,
                    alt_projections=("q", "k", "v", "o"), num_alt_embeddings=1,
                    bos_token_id=1, eos_token_id=2, max_position_embeddings=8192)
  return cfg, init_params(cfg, 0)


def methods(cfg, prompt_len: int, decode: int):
  total = prompt_len + decode
  return {  # by the registry's names
      Plain.name: longjax.PlainLM(cfg),
      Beacon.name: BeaconLM(cfg, BeaconConfig(window=64, stride=64, ratios=(4,), sink_size=1),
                            max_length=total + 64),
      Focus.name: FocusLLM(cfg, FocusConfig(local_window=256, chunk_stride=256, prompt_cap=64,
                                            min_len_threshold=0)),
  }


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--methods", default="plain,beacon,focus")
  ap.add_argument("--prompt", type=int, default=512)
  ap.add_argument("--batch", type=int, default=2)
  ap.add_argument("--decode", type=int, default=64)
  ap.add_argument("--runs", type=int, default=3)
  ap.add_argument("--hidden", type=int, default=128)
  ap.add_argument("--layers", type=int, default=2)
  ap.add_argument("--vocab", type=int, default=4096)
  args = ap.parse_args(argv)
  cfg, params = model(args.hidden, args.layers, args.vocab)
  rng = np.random.default_rng(0)
  prompts = [rng.integers(3, args.vocab, args.prompt - 7 * i).tolist() for i in range(args.batch)]
  print(f"backend {jax.default_backend()}, batch {args.batch}, prompt ~{args.prompt}, "
        f"decode {args.decode}, hidden {args.hidden}, layers {args.layers}")
  print(f"{'method':8} {'host ms/step':>13} {'device ms/step':>15} {'host/device':>12}  "
        "same tokens")
  all_methods = methods(cfg, args.prompt, args.decode)
  for name in args.methods.split(","):
    m = all_methods[name]
    per = {"host": [], "device": []}
    tokens = {}
    for r in range(args.runs + 1):  # run 0: warm-up (compiles)
      for loop in ("host", "device"):
        out = longjax.generate(m, params, prompts, max_new_tokens=args.decode, loop=loop)
        tokens[loop] = out.tokens
        if r:
          per[loop].append(1e3 * out.timings.decode_s / max(out.timings.decode_steps, 1))
    host, dev = statistics.median(per["host"]), statistics.median(per["device"])
    print(f"{name:8} {host:13.2f} {dev:15.2f} {host / dev:12.2f}  "
          f"{tokens['host'] == tokens['device']}")


if __name__ == "__main__":
  main()
