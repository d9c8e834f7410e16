"""Ask a question about a long text file with Activation Beacon.

  python -m longjax.beacon --hf_dir /path/to/beacon-qwen-2-7b-instruct --text book.txt \
      --question "Who is the narrator?" --max_new_tokens 128 [--dtype bfloat16] [--chat]

``--hf_dir smollm2`` uses SmolLM2-135M-Instruct (fetched and converted once; see
longjax.models.smollm2). A plain checkpoint (no beacon_* tensors) needs --init_official (beacon tensors initialised as the
official from_pretrained does; untrained beacons give poor compression). The prompt is encoded
window by window (progress bar), then the answer is generated; generated tokens are compressed like
the context.

A bad input (missing --text file or --hf_dir directory, a checkpoint without beacon tensors...)
ends with one line on stderr and exit status 1; --debug shows the traceback instead.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--hf_dir", required=True, help="HF directory, or 'smollm2'")
  ap.add_argument("--text", required=True, help="a (long) UTF-8 text file")
  ap.add_argument("--question", default="Summarise the text above.")
  ap.add_argument("--max_new_tokens", type=int, default=128)
  ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="bfloat16")
  ap.add_argument("--ratio", type=int, default=None, help="force one of the configured ratios")
  ap.add_argument("--ratio_mix", default=None, help="override, e.g. adapt-1024 (official evals)")
  ap.add_argument("--max_length", type=int, default=None, help="memory capacity in tokens")
  ap.add_argument("--init_official", action="store_true",
                  help="initialise missing beacon tensors (official from_pretrained rule)")
  ap.add_argument("--chat", action="store_true", help="wrap in the tokenizer's chat template")
  ap.add_argument("--debug", action="store_true", help="show the traceback of an error")
  from longjax import cli
  ap.add_argument("--compile_cache", default="auto", help=cli.COMPILE_CACHE_HELP)
  args = ap.parse_args(argv)
  return cli.run("python -m longjax.beacon", lambda: _main(args), debug=args.debug,
                 compile_cache=args.compile_cache)


def _check_inputs(args) -> str:
  """The cheap checks, before the model loads; gives the text."""
  from longjax.errors import LongjaxError, PathNotFound
  from longjax.models.smollm2 import NAME
  text = Path(args.text)
  if not text.is_file():
    raise PathNotFound(f"--text {args.text}: no such file" if not text.exists() else
                       f"--text {args.text}: not a file")
  if str(args.hf_dir).lower() != NAME and not Path(args.hf_dir).is_dir():
    raise PathNotFound(f"--hf_dir {args.hf_dir}: no such directory")
  if args.max_new_tokens < 1:  # generate() needs one; checked before the model loads
    raise LongjaxError(f"--max_new_tokens must be >= 1, got {args.max_new_tokens}")
  try:
    return text.read_text(encoding="utf-8")
  except UnicodeDecodeError as e:
    raise LongjaxError(f"--text {args.text} is not UTF-8 text ({e.reason} at byte {e.start})") \
        from None


def _main(args):
  text = _check_inputs(args) + "\n\n" + args.question
  from longjax.generate import generate
  from longjax.beacon import BeaconLM, load_beacon
  from transformers import AutoTokenizer

  from longjax.models.smollm2 import resolve
  args.hf_dir = resolve(args.hf_dir)
  over = {"ratio_mix": args.ratio_mix} if args.ratio_mix else {}
  cfg, bcfg, params = load_beacon(args.hf_dir, init="official" if args.init_official else None,
                                  param_dtype=args.dtype, **over)
  cfg = cfg.replace(dtype=args.dtype)
  tok = AutoTokenizer.from_pretrained(args.hf_dir, trust_remote_code=False)
  if args.chat:
    ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
    ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)  # transformers 5: a BatchEncoding
  else:
    ids = tok.encode(text)
  max_length = args.max_length or (len(ids) + args.max_new_tokens + bcfg.window)
  lm = BeaconLM(cfg, bcfg, max_length=max_length, ratio=args.ratio, progress=True)
  print(f"{len(ids)} prompt tokens, window {bcfg.window}, ratios {bcfg.ratios} ({bcfg.ratio_mix})")
  t0 = time.time()
  stops = cfg.eos_token_id if isinstance(cfg.eos_token_id, (list, tuple)) else [cfg.eos_token_id]
  stops = [int(s) for s in stops if s is not None]
  out = generate(lm, params, [ids], max_new_tokens=args.max_new_tokens, stop_ids=stops,
                         tokenizer=tok)
  print(out.text[0])
  print(f"[{time.time() - t0:.1f}s: {out.timings.summary()}; memory (sink, beacon, raw) = "
        f"{out.state.sizes()[0].tolist()}]")


if __name__ == "__main__":
  sys.exit(main())
