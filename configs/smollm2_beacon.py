"""Activation Beacon on frozen SmolLM2-135M-Instruct: the real-model learning campaign (round 9).

W = 256 (1/32 of SmolLM2's 8K context), stride S = 128 since round 5 (256 before). The start point
was chosen by measurement (experiments/learn_diagnostics.py start: untrained perplexity on held-out
prose after the first window; results/learn_smollm2.json "start_point"): append + step-expansion,
ratio 8, sink 1 (19.7; truncation 12.8) instead of interleave + full-coverage ratio 2 (508.6), whose
untrained beacons sit between the raw tokens of every window. Beacon q/k/v/o + embedding trained
from the official init (copies, embedding from EOS), fp32. The o projection is what opened the
memory: on the twin overfit set (experiments/learn_diagnostics.py overfit; results "overfit_o") the
answer loss with q/k/v alone never made the memory matter (delta +0.002 after 150 steps), with
q/k/v/o it did.

This is the stage that made the committed asset (docs/learning.md, round 9: round 6's campaign11,
25 steps from the round-4 asset): prose of two lengths distilled from the full-attention base on
every raw token after the first window (the teacher's top 32 plus one class for the rest of its
mass: train.distill.rest="bucket", no far-context weight), overlapping windows (stride 128 = W/2,
a longjax extension of the official append layout), three compression ratios (8, 32 and 128, one
per document: instance-random), in the inference layout (train.layout="inference"). Its export
reads keys at stride 256, ratio 8 (`python -m longjax.beacon.asset ... --stride 256 --ratios 8`)
and prose at stride 128, ratio 128. Passkey documents can join the mix on the answer loss at a
fixed ratio (SOURCE@answer@ratio=8; round 7, which did not lift the keys at stride 128). Data
(offline; README "Does it learn?"): long prose (King James Bible, Debian Administrator's
Handbook), passkey documents. Held-out evaluation text: pydoc_data.topics, never trained on.
data.curriculum can grow the windows per document by step within one run (e.g. "0:2,300:4,600:8");
the committed asset's stages were separate runs chained by init_from (docs/learning.md).

  python experiments/long_text_data.py --kind prose --out runs/campaign/prose.jsonl --count 3000 --min 500 --max 1100
  python experiments/long_text_data.py --kind copy --out runs/campaign/copy.jsonl --count 1500 --min 500 --max 1100 --seed 4
  head -n 2000 runs/campaign/prose.jsonl > runs/campaign/prose_2k.jsonl
  head -n 1000 runs/campaign/copy.jsonl > runs/campaign/copy_1k.jsonl
  python experiments/long_text_data.py --kind prose --out runs/campaign/prose_long.jsonl --count 1000 --min 1400 --max 3100 --seed 8
  python experiments/passkey_data.py --out runs/campaign/pk5_short.jsonl --count 1000 --min 500 --max 1400 \
      --digits 5 --before_last 1.0 --seed 71
  python experiments/passkey_data.py --out runs/campaign/pk5_long.jsonl --count 1500 --min 1400 --max 4100 \
      --digits 5 --before_last 1.0 --seed 81
  # continue from the committed asset on a fresh machine (fresh optimizer; rerun to resume), then
  # export a checkpoint to read keys as the asset does:
  python train.py --config=configs/smollm2_beacon.py --config.train.init_from=assets/smollm2_beacon
  python -m longjax.beacon.asset --workdir runs/campaign19/run --out runs/candidate19 --stride 256 --ratios 8
"""
import ml_collections

from configs import common


def get_config():
  c = ml_collections.ConfigDict()
  c.method = "beacon"
  c.workdir = "runs/campaign19/run"  # round 9 (campaigns 8-18: docs/learning.md)
  c.seed = 0
  c.model = common.real_model("HuggingFaceTB/SmolLM2-135M-Instruct", checkpoint="smollm2",
                              dtype="float32", param_dtype="float32")
  # stride 128 < W (round 5): windows overlap by half, so every token reads W/2..W-1 raw tokens,
  # as truncation's, besides the memory (round 4 and the assets before it: stride 256)
  # ratios 8 / 32 / 128, one per document (round 6; round 4's asset trained at 8 alone)
  c.beacon = ml_collections.ConfigDict(dict(window=256, stride=128, ratios=(8, 32, 128),
                                            ratio_mix="instance-random", pos="append",
                                            attn="step-expansion", param=("q", "k", "v", "o"),
                                            sink_size=1, embed_init="eos", attend_prev=True))
  c.data = common.data_defaults(sources="jsonl:runs/campaign/prose_2k.jsonl@distill,"
                                        "jsonl:runs/campaign/prose_long.jsonl@distill",
                                min_length=0, max_length=4200, loss_on="distill")
  # round 6 (docs/learning.md): prose distilled with the teacher's tail as one class, lr 1e-4
  c.train = common.train_defaults(num_steps=1000, global_batch=1, lr=1e-4, warmup_steps=20,
                                  save_every=25, keep=40, log_every=1, progress=False,
                                  remat="dots",  # 2.8 GB and 12 % faster than True (bench)
                                  layout="inference",
                                  distill=dict(top_k=32, alpha=0.0, rest="bucket"))
  c.debug = common.debug_defaults()
  from longjax.eval.config import eval_config  # noqa: E402
  c.eval = eval_config("beacon", preset="tiny")
  c.eval.passkey.lengths = (1024, 2048)
  c.eval.passkey.depths = (0, 25, 50, 75, 100)
  c.eval.passkey.max_new_tokens = 16
  c.eval.passkey.seed = 2024
  return c
