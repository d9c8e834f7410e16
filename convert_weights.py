"""Convert weights between HF checkpoints and longjax checkpoints.

HF -> longjax (reads safetensors shard by shard, tensor by tensor):
  python convert_weights.py --hf_dir /path/to/Qwen2-7B-Instruct --out /path/to/qwen2-longjax
  python convert_weights.py --hf_dir ... --out ... --dtype bfloat16

longjax -> HF (safetensors shards + index + config.json, loadable by
transformers.AutoModelForCausalLM.from_pretrained):
  python convert_weights.py --longjax_dir /path/to/qwen2-longjax --hf_out /path/to/hf-export

Supported families: LLaMA-2, LLaMA-3 (rope_scaling llama3/linear/dynamic), Qwen2, Mistral.
Official Activation Beacon / FocusLLM tensors (beacon_*) are carried in both directions.
"""
import argparse
import sys


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  src = parser.add_argument_group("HF -> longjax")
  src.add_argument("--hf_dir", help="HF model directory (config.json + *.safetensors)")
  src.add_argument("--out", help="output longjax checkpoint directory")
  src.add_argument("--dtype", choices=["float32", "bfloat16", "float16"],
                   help="parameter dtype (default: keep the checkpoint's)")
  src.add_argument("--init_beacon", choices=["q,k,v", "q,k,v,o"],
                   help="add beacon/candidate projections initialised as copies of the base ones "
                        "(and a beacon embedding from EOS) when the checkpoint has none")
  dst = parser.add_argument_group("longjax -> HF")
  dst.add_argument("--longjax_dir", help="longjax checkpoint directory")
  dst.add_argument("--hf_out", help="output HF directory")
  dst.add_argument("--max_shard_gb", type=float, default=5.0, help="largest safetensors shard")
  parser.add_argument("--overwrite", action="store_true", help="replace an existing output directory")
  args = parser.parse_args(argv)

  to_longjax = bool(args.hf_dir or args.out)
  to_hf = bool(args.longjax_dir or args.hf_out)
  if to_longjax == to_hf:
    parser.error("give either --hf_dir and --out (HF -> longjax) or --longjax_dir and --hf_out "
                 "(longjax -> HF)")
  from longjax import checkpoint
  from longjax.convert import load_hf, save_hf
  if to_longjax:
    if not (args.hf_dir and args.out):
      parser.error("HF -> longjax needs both --hf_dir and --out")
    kw = {}
    if args.init_beacon:
      kw = dict(alt_projections=tuple(args.init_beacon.split(",")), num_alt_embeddings=1,
                alt_init="copy", alt_embed_init="eos")
    cfg, params = load_hf(args.hf_dir, param_dtype=args.dtype, **kw)
    checkpoint.save(args.out, cfg, params, overwrite=args.overwrite)
    print(f"wrote longjax checkpoint {args.out} ({cfg.family}, {cfg.num_layers} layers, {cfg.param_dtype})")
  else:
    if not (args.longjax_dir and args.hf_out):
      parser.error("longjax -> HF needs both --longjax_dir and --hf_out")
    cfg, params, extra = checkpoint.load(args.longjax_dir)
    save_hf(args.hf_out, cfg, params, max_shard_bytes=int(args.max_shard_gb * 2**30),
            extra_config=extra.get("hf_config"), overwrite=args.overwrite)
    print(f"wrote HF checkpoint {args.hf_out}")


if __name__ == "__main__":
  sys.exit(main())
