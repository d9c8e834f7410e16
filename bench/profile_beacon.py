"""Where does a beacon window's time go on CPU? (profile for the performance issues)

    JAX_PLATFORMS=cpu python -m bench.profile_beacon [--fills 0,1024,2048,4096]

Times one decoder call with the shapes of BeaconLM's window step (Q = 1152 query slots: 1024 raw
tokens + 128 beacons, ratio 8) over a memory of ``fill`` entries (all valid: the memory-size
bucket BeaconLM attends over), for each attention ``impl`` (dense ``xla``, ``chunked``,
``blockwise``) and both ways of running the beacon projections (``slots``: only the 128 beacon
slots are projected with them, as BeaconLM does; ``mask``: every token projected both ways, then
selected), plus the attention op alone (one layer). Median of ``--reps`` after a warm-up.
Writes ``bench/results/profile_beacon.{json,md}``.
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
  ap.add_argument("--fills", default="0,1024,2048,4096")
  ap.add_argument("--impls", default="xla,chunked,blockwise")
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
  q_len = 1152
  fills = [int(x) for x in args.fills.split(",")]
  peak = H.matmul_peak_jax("float32")
  rng = np.random.default_rng(0)
  tokens = jnp.asarray(rng.integers(3, cfg.vocab_size, (1, q_len)), jnp.int32)
  is_beacon = (np.arange(q_len) % 9) == 8
  alts = dict(mask=jnp.asarray(is_beacon)[None],
              slots=jnp.asarray(np.flatnonzero(is_beacon), jnp.int32)[None])
  mk = jnp.asarray(rng.standard_normal((cfg.num_layers, 1, max(fills), cfg.num_kv_heads,
                                        cfg.head_dim)), jnp.float32)

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
  for impl in args.impls.split(","):
    model = Decoder(cfg, impl=impl)
    for alt_name, alt in alts.items():
      for fill in fills:
        def call(p, toks, mk, fill=fill, model=model, alt=alt):
          pos = fill + jnp.arange(q_len)[None]
          mem = None
          if fill:
            j = jnp.arange(fill)[None]
            mem = KVPrefix(mk[:, :, :fill], mk[:, :, :fill], j, TokenMeta.causal(j - fill))
          h, _ = model.apply({"params": p}, toks, pos, q_meta=TokenMeta.causal(pos), alt=alt,
                             memory=mem, head=False)
          return h
        t = bench(call, params, tokens, mk)
        fl = H.linear_flops_per_token(cfg) * q_len + H.attention_flops(
            cfg, H.causal_pairs(q_len, fill))
        rows.append(dict(what="window forward", impl=impl, beacon_proj=alt_name, memory=fill,
                         ms=1e3 * t, gflop=fl / 1e9, gflop_s=fl / t / 1e9,
                         mfu=fl / t / peak["best_flops"]))
        H.log(rows[-1])
    for fill in fills:  # the attention op alone, one layer
      tk = fill + q_len
      q = jnp.asarray(rng.standard_normal((1, q_len, cfg.num_heads, cfg.head_dim)), jnp.float32)
      k = jnp.asarray(rng.standard_normal((1, tk, cfg.num_kv_heads, cfg.head_dim)), jnp.float32)
      j = jnp.arange(tk)[None]
      k_meta = TokenMeta.causal(j - fill)
      q_meta = TokenMeta.causal(jnp.arange(q_len)[None])
      t = bench(lambda q, k, impl=impl, k_meta=k_meta: attention(
          q, k, k, q_meta, k_meta, MaskRule(causal=True), impl=impl), q, k)
      fl = H.attention_flops(dict(num_layers=1, num_heads=cfg.num_heads, head_dim=cfg.head_dim),
                             H.causal_pairs(q_len, fill))
      rows.append(dict(what="attention op (1 layer)", impl=impl, beacon_proj="-", memory=fill,
                       ms=1e3 * t, gflop=fl / 1e9, gflop_s=fl / t / 1e9,
                       mfu=fl / t / peak["best_flops"]))
      H.log(rows[-1])
  peak = H.merge_peaks(peak, H.matmul_peak_jax("float32"))
  cols = [("what", "what"), ("impl", "impl"), ("beacon projections", "beacon_proj"),
          ("memory", "memory"), ("ms (median)", "ms"), ("model GFLOP", "gflop"),
          ("GFLOP/s", "gflop_s"), ("MFU %", lambda r: round(100 * r["mfu"], 1))]
  md = (f"### Beacon window step profile (CPU)\n\nQ = {q_len} slots, model as bench_beacon; "
        f"matmul peak {peak['best_flops'] / 1e9:.0f} GFLOP/s (measured {peak['all_best']}); "
        f"load average {H.load_average()}.\n\n" + H.markdown_table(rows, cols))
  H.write_results("profile_beacon", dict(machine=H.machine_info(), rows=rows, peak=peak), md)
  print(md)


if __name__ == "__main__":
  main()
