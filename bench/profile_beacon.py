"""Where does a beacon window's time go on CPU? (profile for issue 8's missed targets)

    JAX_PLATFORMS=cpu python -m bench.profile_beacon

Times one decoder call with the shapes of BeaconLM's window step (Q = 1152 query slots: 1024 raw
tokens + 128 beacons, ratio 8) over a fixed-capacity memory buffer of ``--capacity`` entries of
which ``fill`` are valid (the rest masked), for ``impl`` dense (``xla``) and ``blockwise``; plus the
same call without memory (linear layers + in-window attention only) and the attention op alone.
Median of 5 after a warm-up. Writes ``bench/results/profile_beacon.{json,md}``.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
  sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import harness as H  # noqa: E402
from bench.bench_beacon import MODEL  # noqa: E402


def main(argv=None):
  ap = argparse.ArgumentParser()
  ap.add_argument("--capacity", type=int, default=5376, help="memory buffer (32K BeaconLM: 5376)")
  ap.add_argument("--fills", default="0,1024,2048,4096")
  ap.add_argument("--reps", type=int, default=5)
  args = ap.parse_args(argv)
  import jax
  import jax.numpy as jnp
  import numpy as np
  from longjax.kernels import TokenMeta, attention
  from longjax.kernels.mask import MaskRule
  from longjax.models.config import ModelConfig
  from longjax.models.decoder import Decoder, KVPrefix, init_params

  cfg = ModelConfig(family="qwen2", attention_bias=True, rope_theta=1e6,
                    max_position_embeddings=65536, alt_projections=("q", "k", "v"),
                    num_alt_embeddings=1, **MODEL)
  params = jax.device_put(init_params(cfg, 0))
  q_len, cap = 1152, args.capacity
  peak = H.matmul_peak_jax("float32")
  rng = np.random.default_rng(0)
  tokens = jnp.asarray(rng.integers(3, cfg.vocab_size, (1, q_len)), jnp.int32)
  alt = jnp.asarray((np.arange(q_len) % 9) == 8)[None]
  mk = jnp.asarray(rng.standard_normal((cfg.num_layers, 1, cap, cfg.num_kv_heads, cfg.head_dim)),
                   jnp.float32)

  def bench(fn, *a):
    f = jax.jit(fn)
    jax.block_until_ready(f(*a))
    ts = []
    for _ in range(args.reps):
      t = time.perf_counter()
      jax.block_until_ready(f(*a))
      ts.append(time.perf_counter() - t)
    return H.median(ts)

  rows = []
  for impl in ("xla", "blockwise"):
    model = Decoder(cfg, impl=impl)
    for fill in [None] + [int(x) for x in args.fills.split(",")]:
      def call(p, toks, mk, fill=fill, model=model):
        pos = fill_pos = (0 if fill is None else fill) + jnp.arange(q_len)[None]
        q_meta = TokenMeta.causal(pos)
        mem = None
        if fill is not None:
          j = jnp.arange(cap)[None]
          mem = KVPrefix(mk, mk, j, TokenMeta.causal(j - cap, valid=j < fill))
        h, _ = model.apply({"params": p}, toks, fill_pos, q_meta=q_meta, alt=alt, memory=mem,
                           head=False)
        return h
      t = bench(call, params, tokens, mk)
      pairs = H.causal_pairs(q_len, fill or 0)
      fl = H.linear_flops_per_token(cfg) * q_len + H.attention_flops(cfg, pairs)
      rows.append(dict(what="window forward", impl=impl, capacity=0 if fill is None else cap,
                       valid_memory=fill or 0, ms=1e3 * t, gflop=fl / 1e9,
                       gflop_s=fl / t / 1e9, mfu=fl / t / peak["best_flops"]))
      H.log(rows[-1])
    # the attention op alone, one layer, memory fill = capacity - 1280
    for fill in [int(x) for x in args.fills.split(",")]:
      tk = cap + q_len
      q = jnp.asarray(rng.standard_normal((1, q_len, cfg.num_heads, cfg.head_dim)), jnp.float32)
      k = jnp.asarray(rng.standard_normal((1, tk, cfg.num_kv_heads, cfg.head_dim)), jnp.float32)
      j = jnp.arange(tk)[None]
      k_meta = TokenMeta.causal(jnp.where(j < cap, -1, j - cap), valid=(j < fill) | (j >= cap))
      q_meta = TokenMeta.causal(jnp.arange(q_len)[None])
      t = bench(lambda q, k, impl=impl, k_meta=k_meta: attention(
          q, k, k, q_meta, k_meta, MaskRule(causal=True), impl=impl), q, k)
      fl = H.attention_flops(dict(num_layers=1, num_heads=cfg.num_heads, head_dim=cfg.head_dim),
                             H.causal_pairs(q_len, fill))
      rows.append(dict(what="attention op (1 layer)", impl=impl, capacity=cap, valid_memory=fill,
                       ms=1e3 * t, gflop=fl / 1e9, gflop_s=fl / t / 1e9,
                       mfu=fl / t / peak["best_flops"]))
      H.log(rows[-1])
  peak = H.merge_peaks(peak, H.matmul_peak_jax("float32"))
  cols = [("what", "what"), ("impl", "impl"), ("memory buffer", "capacity"),
          ("valid memory", "valid_memory"), ("ms (median)", "ms"), ("model GFLOP", "gflop"),
          ("GFLOP/s", "gflop_s"), ("MFU %", lambda r: round(100 * r["mfu"], 1))]
  md = (f"### Beacon window step profile (CPU)\n\nQ = {q_len} slots, model as bench_beacon; "
        f"matmul peak {peak['best_flops'] / 1e9:.0f} GFLOP/s (measured {peak['all_best']}); "
        f"load average {H.load_average()}.\n\n" + H.markdown_table(rows, cols))
  H.write_results("profile_beacon", dict(machine=H.machine_info(), rows=rows, peak=peak), md)
  print(md)


if __name__ == "__main__":
  main()
