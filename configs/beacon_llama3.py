"""Activation Beacon recipe on Llama-3-8B-Instruct (docs/beacon.md §7: W = S = 1024 and an
attention sink of 1 -- "Llama-3 requires attention sink"; otherwise as the Qwen-2 pretrain, so
this config is ``beacon_qwen2.py`` with those fields changed).

  python train.py --config=configs/beacon_llama3.py \
      --config.model.checkpoint=/path/to/Meta-Llama-3-8B-Instruct \
      --config.data.sources=jsonl:/path/activation-beacon/redpajama/train.json

Topology: a TPU v5p-8 (4 chips, mesh fsdp = 4). Compiled, not run (docs/kernels.md): 89.8 GiB per
chip of 95 at the full 20 000-token samples (W = 1024 doubles the windows of beacon_qwen2): it fits
with 5 GiB to spare; a larger slice or --config.train.mesh.tensor=2 gives room.
"""
from configs import beacon_qwen2 as _qwen2


def get_config():
  c = _qwen2.get_config()
  c.workdir = "runs/beacon_llama3"
  c.model.name = "meta-llama/Meta-Llama-3-8B-Instruct"
  c.beacon.window = c.beacon.stride = 1024
  c.beacon.sink_size = 1
  return c
