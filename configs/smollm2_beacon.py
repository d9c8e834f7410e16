"""Activation Beacon on frozen SmolLM2-135M-Instruct (the real-model learning proof, CPU-sized).

W = S = 256 (1/32 of SmolLM2's 8K context), ratio 2, interleave + full-coverage, beacon q/k/v +
embedding trained (official init: copies, embedding from EOS; adding o, as v1 of the paper did,
would make the bf16 asset 53 MB, over the 40 MB budget), fp32. Data: passkey documents in the
official prompt format through the chat template, 400-1100 tokens (2-5 windows: a beacon
compresses one window at a time, so short documents teach the same skill at a fraction of the step
time), keys of 5-16 digits (each digit is one SmolLM2 token, so a
longer key is more retrieval targets per step), 90 % of keys outside the beacon-free last training
window, loss on the answer ("The pass key is K.") only; written by scripts/passkey_data.py.
The README ("Does it learn? On SmolLM2") lists the recipes tried and what they reached.

  python scripts/passkey_data.py --out runs/smollm2_beacon_data/train.jsonl --count 3000 \
      --min 400 --max 1100 --digits 5-16 --before_last 0.9 --seed 11
  python train.py --config=configs/smollm2_beacon.py     # rerun the same command to resume
"""
import ml_collections

from configs import common


def get_config():
  c = ml_collections.ConfigDict()
  c.method = "beacon"
  c.workdir = "runs/smollm2_beacon"
  c.seed = 0
  c.model = common.real_model("HuggingFaceTB/SmolLM2-135M-Instruct", checkpoint="smollm2",
                              dtype="float32", param_dtype="float32")
  c.beacon = ml_collections.ConfigDict(dict(window=256, stride=256, ratios=(2,),
                                            ratio_mix="step-random", pos="interleave",
                                            attn="full-coverage", param=("q", "k", "v"),
                                            sink_size=0, embed_init="eos", attend_prev=True))
  c.data = common.data_defaults(sources="jsonl:runs/smollm2_beacon_data/train.jsonl",
                                min_length=0, max_length=1400, loss_on="answer")
  c.train = common.train_defaults(num_steps=600, global_batch=1, lr=2e-4, warmup_steps=10,
                                  save_every=25, keep=40, log_every=1, progress=False,
                                  remat="dots")  # 2.8 GB and 12 % faster than True (bench)
  c.debug = common.debug_defaults()
  from longjax.eval.config import eval_config  # noqa: E402
  c.eval = eval_config("beacon", preset="tiny")
  c.eval.passkey.lengths = (1024, 2048)
  c.eval.passkey.depths = (0, 25, 50, 75, 100)
  c.eval.passkey.max_new_tokens = 16
  c.eval.passkey.seed = 2024
  return c
