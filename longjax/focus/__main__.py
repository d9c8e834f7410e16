r"""Ask a question about a long text file with FocusLLM.

  python -m longjax.focus --asset smollm2_focus --text book.txt --question "Who is the narrator?"
  python -m longjax.focus --asset assets/smollm2_focus --text notes.txt \
      --question "What is the pass key?"

--asset takes a trained FocusLLM asset: a directory, or the name of one in the repository's
assets/ (smollm2_focus: candidate projections trained on SmolLM2-135M-Instruct). The text before
the local window is cut into chunks that are condensed in parallel, each into one candidate per
layer, which the local window and the answer then attend to. Text and question go in as one user
turn of the base model's chat template; the answer is streamed to stdout until the model ends its
turn. The prompt size, the time (prefill, decode, tokens/s) and the peak memory go to stderr.

A bad input (missing --text file, unknown asset, an asset of Activation Beacon...) ends with one
line on stderr and exit status 1; --debug shows the traceback instead.
"""
from __future__ import annotations

import sys

PROG = "python -m longjax.focus"


def build_parser():
  from longjax.ckpts import assets
  from longjax.inference import ask
  from longjax.method_names import FOCUS
  return ask.ask_parser(PROG, __doc__, FOCUS, assets.known_names(FOCUS), assets.ASSETS_ENV)


def main(argv=None):
  from longjax.runtime import cli
  args = build_parser().parse_args(argv)
  return cli.run(PROG, lambda: _main(args), debug=args.debug, compile_cache=args.compile_cache)


def _main(args):
  from longjax.ckpts.assets import asset_base, find_asset
  from longjax.data.tokenizers import tokenizer_of
  from longjax.inference import ask
  from longjax.focus import FocusLLM
  from longjax.focus.asset import load_focus_asset
  from longjax.method_names import FOCUS
  ask.check_ask_args(args)  # the cheap checks before the model loads
  asset = find_asset(args.asset, FOCUS)
  text = ask.read_text(args)
  model_dir = asset_base(asset, FOCUS, args.base)
  cfg, fcfg, params = load_focus_asset(asset, args.base)
  dtype = "float32" if args.dtype == "auto" else args.dtype
  cfg, params = ask.with_dtype(cfg, params, dtype)
  tok = tokenizer_of(model_dir)
  ids, how = ask.prompt_ids(tok, text, args)
  ask.answer(FocusLLM(cfg, fcfg), params, ids, tok, cfg, args.max_new_tokens,
             f"FocusLLM, asset {asset}: local window {fcfg.local_window}, chunks of "
             f"{fcfg.chunk_stride}, {dtype}; prompt: {how}")


if __name__ == "__main__":
  sys.exit(main())
