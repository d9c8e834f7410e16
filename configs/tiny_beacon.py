"""Tiny Activation Beacon run on CPU: the README's embedded default (byte tokenizer, no downloads).

With ``model.checkpoint=""`` a tiny Qwen2-shaped base LM is first pretrained on synthetic
passkey-style text with a native window of 64 tokens (cached under <workdir>/base), then frozen;
only the beacon parameters (q/k/v copies + the beacon embedding) are trained on 130-260-token
documents (2-4 windows), with the official loss (full BPTT through the memory).

  python train.py --config=configs/tiny_beacon.py [--config.workdir=runs/tiny_beacon]
"""
import ml_collections

from configs import common


def get_config():
  c = ml_collections.ConfigDict()
  c.method = "beacon"
  c.workdir = "runs/tiny_beacon"
  c.seed = 0
  c.model = common.tiny_model("qwen2", num_kv_heads=2, pretrain_sources="synthetic:passkey")
  c.beacon = ml_collections.ConfigDict(dict(window=64, stride=64, ratios=(2, 4),
                                            ratio_mix="step-random", pos="interleave",
                                            attn="full-coverage", param=("q", "k", "v"),
                                            sink_size=0, embed_init="eos", attend_prev=True))
  # no data.tokenizer: the tiny model's own (byte); a checkpoint brings its own
  c.data = common.data_defaults(sources="synthetic:passkey", min_length=128, max_length=256,
                                synthetic=dict(count=256, min_chars=128, max_chars=250, digits=5))
  c.train = common.train_defaults(num_steps=60, global_batch=4, lr=2e-3, warmup_steps=5,
                                  step_bucket=4, save_every=20)
  from longjax.eval.config import eval_config  # noqa: E402 (the eval section: official
  c.eval = eval_config("beacon", preset="tiny")   # protocols on CPU-sized grids)
  return c
