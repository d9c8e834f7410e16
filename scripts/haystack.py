"""Write the needle-in-a-haystack training and held-out documents, or score answers to them
(``longjax.data.haystack``: what the documents are, which sources and phrasings are held out).

  # training mix (SmolLM2's tokenizer, chat-wrapped): 1K-8K needle/content documents, prose windows
  python scripts/haystack.py --split train --count 4000 --tokens 1024-8192 --seed 11 \\
      --out runs/haystack/train.jsonl
  python scripts/haystack.py --split train --kind prose --count 2000 --tokens 2048-8192 \\
      --seed 12 --out runs/haystack/prose.jsonl
  # the fixed held-out evaluation set (seed 1000, 100 documents at each length)
  for n in 1024 4096 16384; do python scripts/haystack.py --split heldout --count 100 \\
      --tokens $n --seed 1000 --out results/heldout/haystack_$n.jsonl; done
  # score a model's answers (jsonl of {"id": ..., "answer": ...})
  python scripts/haystack.py --score answers.jsonl --data results/heldout/haystack_4096.jsonl
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from longjax.data.errors import DataError  # noqa: E402
from longjax.data.haystack import (HELDOUT_HAYSTACKS, NEEDLE_KINDS, SPLITS,  # noqa: E402
                                   allowed_haystacks, check_haystacks, check_needle_kinds,
                                   generate, parse_tokens, score_files, write_jsonl)


def load_tokenizer(spec: str):
  from longjax.ckpts import smollm2
  from longjax.data.tokenizers import get_tokenizer
  tok = get_tokenizer(str(smollm2.get()) if spec == smollm2.NAME else spec)
  if tok.hf is not None:
    # documents past the model's context are wanted here (16K, 32K): no warning per count
    tok.hf.model_max_length = 1 << 30
  return tok


PROG = "scripts/haystack.py"


def build_parser():
  from longjax.runtime import cli
  ap = cli.parser(PROG, __doc__)
  ap.add_argument("--split", choices=SPLITS, help="which documents to write (none: --score)")
  ap.add_argument("--out", metavar="FILE", help="jsonl file to write (refused if it exists)")
  ap.add_argument("--overwrite", action="store_true", help="replace an existing --out")
  ap.add_argument("--count", type=int, default=1000, help="documents to write")
  ap.add_argument("--tokens", default="1024-8192",
                  help="token budget of each document: N, or LO-HI drawn per document")
  ap.add_argument("--seed", type=int, default=0, help="the file is a function of the seed")
  ap.add_argument("--kind", choices=("qa", "prose"), default="qa",
                  help="qa: instruction, haystack and question; prose: windows of real prose")
  ap.add_argument("--haystacks", default="",
                  help="comma-separated subset (default: all of the split's; train: "
                       f"{','.join(allowed_haystacks('train'))}; heldout: "
                       f"{','.join(HELDOUT_HAYSTACKS)})")
  ap.add_argument("--tokenizer", default="smollm2",
                  help="'smollm2' (fetched and cached once), 'byte' or a HF tokenizer directory")
  ap.add_argument("--needle_kinds", default="",
                  help="qa documents plant needles of these kinds only, no content questions "
                       f"(comma-separated subset of {','.join(NEEDLE_KINDS)}; default: all)")
  ap.add_argument("--no_chat", action="store_true",
                  help="leave the prompt unwrapped (else the tokenizer's chat template, if any)")
  ap.add_argument("--allow_missing", action="store_true",
                  help="skip a missing prose source with a warning instead of failing")
  ap.add_argument("--score", metavar="ANSWERS",
                  help="score a jsonl of {id, answer} against --data instead of writing")
  ap.add_argument("--data", metavar="FILE", help="the documents --score refers to")
  ap.add_argument("--debug", action="store_true", help="show the traceback of an error")
  return ap


def _main(args) -> int:
  if args.score:
    if not args.data:
      raise DataError("--score needs --data (the jsonl the answers are for)")
    print(json.dumps(score_files(args.score, args.data), indent=1))
    return 0
  if not args.split or not args.out:
    raise DataError("give --split train|heldout and --out FILE (or --score with --data)")
  if args.count < 1:
    raise DataError(f"--count {args.count}: give at least 1")
  hs = [h.strip() for h in args.haystacks.split(",") if h.strip()] or None
  if hs:
    check_haystacks(args.split, hs)
  kinds = None
  if args.needle_kinds:
    if args.kind != "qa":
      raise DataError("--needle_kinds applies to --kind qa documents; leave it out with --kind "
                      "prose")
    kinds = check_needle_kinds(args.needle_kinds)
  tokens = parse_tokens(args.tokens)
  tok = load_tokenizer(args.tokenizer)
  n = write_jsonl(args.out, generate(tok, args.split, args.count, tokens, args.seed, hs,
                                     not args.no_chat, args.kind, args.allow_missing, kinds),
                  args.overwrite)
  print(f"wrote {n} {args.split} {args.kind} records to {args.out}")
  return 0


def main(argv=None) -> int:
  args = build_parser().parse_args(argv)
  from longjax.runtime import cli
  # host-side only: no JAX, so no compilation cache
  return cli.run(PROG, lambda: _main(args), debug=args.debug, compile_cache="off")


if __name__ == "__main__":
  sys.exit(main())
