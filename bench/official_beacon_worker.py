"""One timed configuration of the official Activation Beacon code (run by ``bench.bench_official``).

Runs in the official code's own environment (transformers 4.39.3 + torch; not longjax's), with the
official ``activation_beacon`` directory on ``sys.path``; it imports nothing from longjax, only the
standard-library ``bench.harness`` helpers. The checkpoint is a longjax export (official tensor
names and ``beacon_*`` fields), so both sides run the same weights and settings.

Protocol (the official generation path, as ``model.generate`` drives it): ``memory.reset()``, one
forward over the prompt, then one forward per fed token (the memory appends it); greedy tokens.
Warm-up on a 1,024-token prompt (torch has no compilation), then the median of ``runs``.
"""
from __future__ import annotations

import json
import os
import sys
import time

from bench import harness as H


def main(spec: dict) -> dict:
  sys.path.insert(0, spec["official_dir"])
  import numpy as np
  import torch
  import transformers
  from src.qwen2 import Qwen2ForCausalLM  # the official code (FlagEmbedding, activation_beacon)

  torch.set_num_threads(len(os.sched_getaffinity(0)))
  t_len, n_dec = spec["length"], spec["decode"]
  model = Qwen2ForCausalLM.from_pretrained(spec["ckpt"], torch_dtype=torch.float32).eval()
  ids = torch.from_numpy(np.load(spec["prompt"]).astype(np.int64))
  box = {}

  def run(ids=ids):
    with torch.inference_mode():
      model.memory.reset()
      t0 = time.perf_counter()
      logits = model(input_ids=ids).logits[:, -1]
      t1 = time.perf_counter()
      tokens = [int(logits.argmax(-1)[0])]
      for _ in range(n_dec):
        logits = model(input_ids=torch.tensor([[tokens[-1]]])).logits[:, -1]
        tokens.append(int(logits.argmax(-1)[0]))
      t2 = time.perf_counter()
    box["tokens"] = tokens
    return {"prefill": t1 - t0, "decode": t2 - t1}

  res = H.timed_runs(run, runs=spec["runs"], budget_s=spec["budget"],
                     warmup=lambda: run(ids[:, :min(t_len, 1024)]))
  tp, td = res["median"].get("prefill"), res["median"].get("decode")
  return dict(spec, prefill_s=tp, decode_ms_per_token=None if not td else 1e3 * td / n_dec,
              prefill_times_s=res["times"]["prefill"], decode_times_s=res["times"]["decode"],
              n_runs=res["n_runs"], note=res["note"], tokens=box["tokens"],
              attn_implementation=getattr(model.config, "_attn_implementation", None),
              transformers=transformers.__version__, torch=torch.__version__,
              torch_threads=torch.get_num_threads(), peak_rss_mib=H.peak_rss_mib(),
              load_average=H.load_average())


if __name__ == "__main__":
  H.emit(main(json.loads(sys.argv[sys.argv.index("--worker") + 1])))
