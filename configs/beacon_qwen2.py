"""Activation Beacon pretraining recipe on Qwen2-7B-Instruct (docs/beacon.md §7, "Qwen-2 pretrain").

W = S = 2048, ratios [2,4,8,16,32] step-random, interleave + full-coverage, beacon q/k/v, sink 0,
lr 5e-5 linear decay to 0 (HF default), no warmup, no weight decay, grad-norm clip 1.0, global
batch 8, 1 epoch, bf16, windows rematerialised, group_by_stride strict, 2400-20000 tokens with
EOS appended (RedPajama sample).

  python train.py --config=configs/beacon_qwen2.py \
      --config.model.checkpoint=/path/to/Qwen2-7B-Instruct \
      --config.data.sources=jsonl:/path/activation-beacon/redpajama/train.json

Finetune stage: --config.beacon.ratios="(2,4,8)" --config.train.lr=1e-5
--config.data.min_length=7200 --config.model.checkpoint=<pretrain export_hf> and the finetune data.

Topology: a TPU v5p-8 (4 chips, mesh fsdp = 4). Compiled, not run (docs/kernels.md, compile-only
TPU): 58.1 GiB per chip of 95 at the full 20 000-token samples. On v5e-16 (16 GiB per chip) it
needs --config.train.mesh.fsdp=8 --config.train.mesh.tensor=2 and samples of at most 8192 tokens
(--config.data.max_length=8192: 13.7 GiB); its 20 000-token samples need 20.7 GiB there.
"""
import ml_collections

from configs import common


def get_config():
  c = ml_collections.ConfigDict()
  c.method = "beacon"
  c.workdir = "runs/beacon_qwen2"
  c.seed = 0
  c.model = common.real_model("Qwen/Qwen2-7B-Instruct")
  c.beacon = ml_collections.ConfigDict(dict(window=2048, stride=2048, ratios=(2, 4, 8, 16, 32),
                                            ratio_mix="step-random", pos="interleave",
                                            attn="full-coverage", param=("q", "k", "v"),
                                            sink_size=0, embed_init="eos", attend_prev=True))
  c.data = common.data_defaults(min_length=2400, max_length=20000)
  c.train = common.train_defaults(global_batch=8, lr=5e-5, save_every=1000,
                                  mesh=dict(data=1, fsdp=-1, tensor=1))
  from longjax.eval.config import eval_config  # noqa: E402 (official eval protocols)
  c.eval = eval_config(c.method)
  return c
