"""One timed configuration of the official FocusLLM code (run by ``bench.bench_official_focus``).

Runs in the official code's own environment (transformers 4.36.2 + torch; not longjax's), with
the official ``src`` directory on ``sys.path`` so that ``activation_beacon_llama`` (the FocusLLM
model package) imports without the repository's training and data modules; it imports nothing
from longjax, only the standard-library ``bench.harness`` helpers. The checkpoint is a longjax
export (official tensor names, ``local_window`` / ``memory_stride`` / ``beacon_param`` in
config.json), so both sides run the same weights and settings.

Protocol (the official generation path, as ``eval_passkey.py`` drives it through ``generate``):
``memory.reset()``, one forward over the prompt (``inference_forward``: the chunks one after
another, then the local forward), then one forward per fed token (every chunk steps over its
cache, the local context is recomputed); greedy tokens. ``generate`` passes only the newest token
once a past exists and the model ignores the past it is given, so this loop is what it runs.

CPU shim: the official inference path calls ``.cuda()`` on the chunk caches and on the BOS it
prepends (it was written for GPUs). Where torch has no CUDA, ``Tensor.cuda`` is made the identity,
so every tensor stays where it is; nothing else changes.

Warm-up on a 4,096-token prompt (the shortest the official code chunks; torch has no
compilation), then the median of ``runs``.
"""
from __future__ import annotations

import json
import os
import sys
import time

from bench import harness as H

OFFICIAL_MIN_LEN = 4096  # below this the official code runs the plain model


def cpu_shim(torch) -> bool:
  """Make ``Tensor.cuda`` the identity where torch has no CUDA (True: applied)."""
  if torch.cuda.is_available():
    return False
  torch.Tensor.cuda = lambda self, *a, **k: self
  return True


def check_weights(model, ckpt: str) -> dict:
  """Every tensor of the export loaded unchanged (the official ``from_pretrained`` re-initialises
  candidate projections it finds missing, which would hide a naming error)."""
  import torch
  from safetensors.torch import load_file
  files = sorted(f for f in os.listdir(ckpt) if f.endswith(".safetensors"))
  want = {}
  for f in files:
    want.update(load_file(os.path.join(ckpt, f)))
  have = model.state_dict()
  missing = sorted(set(have) - set(want))
  unused = sorted(set(want) - set(have))
  differ = sorted(k for k in set(want) & set(have) if not torch.equal(want[k], have[k]))
  return dict(missing=missing, unused=unused, differ=differ,
              ok=not (missing or unused or differ))


def main(spec: dict) -> dict:
  sys.path.insert(0, os.path.join(spec["official_dir"], "src"))
  import numpy as np
  import torch
  import transformers
  shim = cpu_shim(torch)
  from activation_beacon_llama.modeling_llama import LlamaForCausalLM  # the official code

  torch.set_num_threads(len(os.sched_getaffinity(0)))
  t_len, n_dec = spec["length"], spec["decode"]
  model = LlamaForCausalLM.from_pretrained(spec["ckpt"], torch_dtype=torch.float32).eval()
  weights = check_weights(model, spec["ckpt"])
  if not weights["ok"]:
    raise SystemExit(f"the export did not load as written: {weights}")
  ids = torch.from_numpy(np.load(spec["prompt"]).astype(np.int64))
  box = {}

  def run(ids=ids):
    with torch.no_grad():
      model.memory.reset()
      t0 = time.perf_counter()
      logits = model(input_ids=ids).logits[:, -1]
      t1 = time.perf_counter()
      first = logits[0].clone()
      tokens = [int(logits.argmax(-1)[0])]
      for _ in range(n_dec):
        logits = model(input_ids=torch.tensor([[tokens[-1]]])).logits[:, -1]
        tokens.append(int(logits.argmax(-1)[0]))
      t2 = time.perf_counter()
    box.update(tokens=tokens, logits=first, chunks=model.memory.chunk_number)
    return {"prefill": t1 - t0, "decode": t2 - t1}

  res = H.timed_runs(run, runs=spec["runs"], budget_s=spec["budget"],
                     warmup=lambda: run(ids[:, :min(t_len, OFFICIAL_MIN_LEN)]))
  if spec.get("logits_out"):
    np.save(spec["logits_out"], box["logits"].numpy().astype(np.float32))
  tp, td = res["median"].get("prefill"), res["median"].get("decode")
  return dict(spec, prefill_s=tp, decode_ms_per_token=None if not td else 1e3 * td / n_dec,
              prefill_times_s=res["times"]["prefill"], decode_times_s=res["times"]["decode"],
              warmup_input=min(t_len, OFFICIAL_MIN_LEN), n_runs=res["n_runs"], note=res["note"],
              tokens=box["tokens"], chunks=box["chunks"], cuda_shim=shim,
              weights_loaded_unchanged=weights["ok"],
              attn_implementation=getattr(model.config, "_attn_implementation", None),
              transformers=transformers.__version__, torch=torch.__version__,
              torch_threads=torch.get_num_threads(), peak_rss_mib=H.peak_rss_mib(),
              load_average=H.load_average())


if __name__ == "__main__":
  H.emit(main(json.loads(sys.argv[sys.argv.index("--worker") + 1])))
