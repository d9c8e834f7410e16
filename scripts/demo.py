"""Convert-and-generate demo on the embedded tiny default (no downloads, a few seconds on CPU).

Builds a tiny random Qwen2-shaped model with the built-in byte tokenizer, saves it as a longjax
checkpoint, exports it to a HF directory (safetensors + config.json), imports that directory
back, checks the round trip is bit-exact, and generates from a prompt with a KV cache.
Real checkpoints are a flag away:  --hf_dir /path/to/hf-model (uses that model instead).

  python scripts/demo.py [--workdir runs/demo] [--hf_dir DIR --prompt "..."]
"""
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import numpy as np  # noqa: E402

import longjax  # noqa: E402
from longjax.ckpts import load_hf, save_hf  # noqa: E402
from longjax.data.tokenizers import ByteTokenizer  # noqa: E402


PROG = "scripts/demo.py"


def build_parser():
  from longjax.runtime import cli
  ap = cli.parser(PROG, __doc__)
  ap.add_argument("--workdir", default="runs/demo",
                  help="where the tiny checkpoint and its HF export are written")
  ap.add_argument("--hf_dir", metavar="DIR",
                  help="a real HF model directory (needs its tokenizer files) instead of the tiny "
                       "random model")
  ap.add_argument("--prompt", default="The pass key is 12345. Remember it. What is the pass key?",
                  help="the text to continue")
  ap.add_argument("--max_new_tokens", type=int, default=24, help="tokens to generate")
  ap.add_argument("--debug", action="store_true", help="show the traceback of an error")
  return ap


def main(argv=None):
  ap = build_parser()
  args = ap.parse_args(argv)
  from longjax.runtime import cli  # a bad --hf_dir or the like: one line, not a traceback
  return cli.run(PROG, lambda: _demo(args), debug=args.debug, compile_cache="off")


def _demo(args):
  work = Path(args.workdir)

  if args.hf_dir:
    if not Path(args.hf_dir).is_dir():
      from longjax.errors import PathNotFound
      raise PathNotFound(f"--hf_dir {args.hf_dir}: no such directory")
    cfg, params = load_hf(args.hf_dir)
    from longjax.data.tokenizers import check_tokenizer_dir
    check_tokenizer_dir(args.hf_dir)
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(args.hf_dir, trust_remote_code=False)
    params = jax.tree.map(jax.numpy.asarray, params)
  else:
    tokenizer = ByteTokenizer()
    cfg = longjax.ModelConfig(family="qwen2", vocab_size=tokenizer.vocab_size, hidden_size=64,
                              intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2,
                              head_dim=16, attention_bias=True, bos_token_id=1, eos_token_id=2)
    params = longjax.init_params(cfg, seed=0)
    t0 = time.time()
    longjax.save(work / "tiny_longjax", cfg, params, overwrite=True)
    save_hf(work / "tiny_hf", cfg, params, overwrite=True)
    cfg2, params2 = load_hf(work / "tiny_hf")
    same = all(np.array_equal(a, b)
               for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(params2)))
    print(f"saved {work / 'tiny_longjax'} and exported {work / 'tiny_hf'}; HF re-import bit-exact: "
          f"{same} ({time.time() - t0:.1f}s, "
          f"{longjax.models.decoder.count_params(params):,} params)")
    if not same:
      sys.exit("round trip mismatch")

  t0 = time.time()
  out = longjax.generate(longjax.PlainLM(cfg), params, args.prompt,
                         max_new_tokens=args.max_new_tokens, tokenizer=tokenizer)
  print(f"prompt: {args.prompt!r}")
  print(f"generated {len(out.tokens[0])} tokens in {time.time() - t0:.1f}s (incl. compile): "
        f"{out.text[0]!r}" + ("" if args.hf_dir else "  (random weights: gibberish is expected)"))


if __name__ == "__main__":
  sys.exit(main())
