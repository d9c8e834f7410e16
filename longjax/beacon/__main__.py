r"""Ask a question about a long text file with Activation Beacon.

  python -m longjax.beacon --asset smollm2_beacon --text book.txt --question "Who is the narrator?"
  python -m longjax.beacon --asset assets/smollm2_beacon --text notes.txt \
      --question "What is the pass key?"
  python -m longjax.beacon --hf_dir /path/to/beacon-qwen-2-7b-instruct --text book.txt \
      --question "Who is the narrator?" --max_new_tokens 256

--asset takes a trained beacon asset (a directory, or the name of one in the repository's
assets/: smollm2_beacon, trained on SmolLM2-135M-Instruct); --hf_dir takes a HF checkpoint with
its beacon tensors (the official Activation Beacon models), or a plain one with --init_official
(beacon tensors initialised as the official from_pretrained does: untrained, they give poor
answers). Text and question go in as one user turn of the base model's chat template; the text is
encoded window by window (progress bar), then the answer is streamed to stdout until the model
ends its turn. The prompt size, the time (prefill, decode, tokens/s) and the peak memory go to
stderr.

A bad input (missing --text file, unknown asset, an asset of FocusLLM, a checkpoint without beacon
tensors...) ends with one line on stderr and exit status 1; --debug shows the traceback instead.
"""
from __future__ import annotations

import sys
from pathlib import Path

PROG = "python -m longjax.beacon"


def build_parser():
  from longjax.ckpts import assets
  from longjax.inference import ask
  from longjax.method_names import BEACON
  ap = ask.ask_parser(PROG, __doc__, BEACON, assets.known_names(BEACON), assets.ASSETS_ENV,
                      asset_required=False)  # or --hf_dir
  ap.add_argument("--hf_dir", metavar="DIR",
                  help="instead of --asset: a HF checkpoint with beacon tensors, or 'smollm2' / a "
                       "plain one with --init_official")
  ap.add_argument("--init_official", action="store_true",
                  help="with --hf_dir: initialise missing beacon tensors (official "
                       "from_pretrained rule; untrained)")
  ap.add_argument("--ratio", type=int,
                  help="run at this one of the configured compression ratios (default: the "
                       "asset's / checkpoint's ratio mix)")
  ap.add_argument("--ratio_mix",
                  help="override the ratio mix, e.g. adapt-1024 (official evals) (default: the "
                       "asset's / checkpoint's)")
  ap.add_argument("--max_length", type=int,
                  help="memory capacity in tokens (default: the prompt + --max_new_tokens + one "
                       "window)")
  return ap


def main(argv=None):
  from longjax.runtime import cli
  args = build_parser().parse_args(argv)
  return cli.run(PROG, lambda: _main(args), debug=args.debug, compile_cache=args.compile_cache)


def _check_inputs(args):
  """The cheap checks, before the model loads: gives ``(text, asset dir or None)``."""
  from longjax.inference import ask
  from longjax.ckpts.assets import find_asset
  from longjax.errors import LongjaxError, PathNotFound
  from longjax.method_names import BEACON
  from longjax.ckpts.smollm2 import NAME
  ask.check_ask_args(args)
  if (args.asset is None) == (args.hf_dir is None):
    raise LongjaxError("give one of --asset (trained beacon tensors, e.g. smollm2_beacon) or "
                       "--hf_dir (a HF checkpoint)")
  if args.asset is not None and args.init_official:
    raise LongjaxError("--init_official applies to --hf_dir only: an asset holds trained beacon "
                       "tensors")
  if args.hf_dir is not None and args.base is not None:
    raise LongjaxError("--base applies to --asset only: --hf_dir is the whole model")
  if args.hf_dir is not None and str(args.hf_dir).lower() != NAME \
      and not Path(args.hf_dir).is_dir():
    raise PathNotFound(f"--hf_dir {args.hf_dir}: no such directory")
  asset = find_asset(args.asset, BEACON) if args.asset is not None else None
  return ask.read_text(args), asset


def _main(args):
  import dataclasses
  from longjax.beacon import BeaconLM, load_beacon
  from longjax.beacon.asset import load_beacon_asset
  from longjax.ckpts.assets import asset_base
  from longjax.data.tokenizers import tokenizer_of
  from longjax.inference import ask
  from longjax.method_names import BEACON
  from longjax.ckpts.smollm2 import resolve
  text, asset = _check_inputs(args)
  if asset is not None:
    model_dir = asset_base(asset, BEACON, args.base)
    cfg, bcfg, params = load_beacon_asset(asset, args.base)
    if args.ratio_mix:
      bcfg = dataclasses.replace(bcfg, ratio_mix=args.ratio_mix)
    dtype = "float32" if args.dtype == "auto" else args.dtype
    source = f"asset {asset}"
  else:
    model_dir = resolve(args.hf_dir)
    over = {"ratio_mix": args.ratio_mix} if args.ratio_mix else {}
    dtype = "bfloat16" if args.dtype == "auto" else args.dtype
    cfg, bcfg, params = load_beacon(model_dir, init="official" if args.init_official else None,
                                    param_dtype=dtype, **over)
    source = f"{model_dir}" + (" (untrained beacons: official init)" if args.init_official else "")
  cfg, params = ask.with_dtype(cfg, params, dtype)  # the asset's fp32 tensors; compute dtype
  tok = tokenizer_of(model_dir)
  ids, how = ask.prompt_ids(tok, text, args)
  max_length = args.max_length or (len(ids) + args.max_new_tokens + bcfg.window)
  lm = BeaconLM(cfg, bcfg, max_length=max_length, ratio=args.ratio, progress=True)
  ratios = "/".join(map(str, (args.ratio,) if args.ratio else bcfg.ratios))
  ask.answer(lm, params, ids, tok, cfg, args.max_new_tokens,
             f"Activation Beacon, {source}: window {bcfg.window}, stride {bcfg.stride}, ratio "
             f"{ratios} ({bcfg.ratio_mix}), {dtype}; prompt: {how}",
             after=lambda out: f"memory (sink, beacon, raw) = {out.state.sizes()[0].tolist()}")


if __name__ == "__main__":
  sys.exit(main())
