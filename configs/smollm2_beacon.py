"""Activation Beacon on frozen SmolLM2-135M-Instruct: the real-model training config.

W = 256 (1/32 of SmolLM2's 8K context). Stride S = 128: windows overlap by half, so every token
reads W/2..W-1 raw tokens, as truncation does, besides the memory (at S = W a token deep in its
window sees fewer raw tokens than truncation's, which costs prose). Start point chosen by
measurement (experiments/learn_diagnostics.py start: untrained perplexity on held-out prose after
the first window; results/learn_smollm2.json "start_point"): append + step-expansion, ratio 8,
sink 1, whose untrained beacons cost least. Beacon q/k/v/o + embedding trained from the official
init (copies, embedding from EOS), fp32: the o projection is what makes the memory matter (with
q/k/v alone the answer loss never moved the memory-swap delta; experiments/learn_diagnostics.py
overfit, results "overfit_o").

The stage this config runs is the one that made the committed asset: prose of two lengths
distilled from the full-attention base on every raw token after the first window (the teacher's
top 32 plus one class for the rest of its mass: train.distill.rest="bucket"; renormalising the
top 32 teaches the student to starve the rest of the vocabulary), three compression ratios (8,
32 and 128, one per document: instance-random) so that one set of tensors serves both reading
settings, in the inference layout (train.layout="inference"). Its export reads keys at stride
256, ratio 8 (`python -m longjax.beacon.asset ... --stride 256 --ratios 8`) and prose at stride
128, ratio 128. Passkey documents can join the mix on the answer loss at a fixed ratio
(SOURCE@answer@ratio=8). data.curriculum can grow the windows per document by step within one run
(e.g. "0:2,300:4,600:8"). The history of the recipe, with each measurement: docs/learning.md.
Data (offline; README "Can it read farther than its window?"): long prose (King James Bible,
Debian Administrator's Handbook), passkey documents. Held-out evaluation text:
pydoc_data.topics, never trained on.

  python experiments/long_text_data.py --kind prose --out runs/campaign/prose.jsonl \
      --count 3000 --min 500 --max 1100
  python experiments/long_text_data.py --kind copy --out runs/campaign/copy.jsonl \
      --count 1500 --min 500 --max 1100 --seed 4
  head -n 2000 runs/campaign/prose.jsonl > runs/campaign/prose_2k.jsonl
  head -n 1000 runs/campaign/copy.jsonl > runs/campaign/copy_1k.jsonl
  python experiments/long_text_data.py --kind prose --out runs/campaign/prose_long.jsonl \
      --count 1000 --min 1400 --max 3100 --seed 8
  python experiments/passkey_data.py --out runs/campaign/pk5_short.jsonl --count 1000 \
      --min 500 --max 1400 --digits 5 --before_last 1.0 --seed 71
  python experiments/passkey_data.py --out runs/campaign/pk5_long.jsonl --count 1500 \
      --min 1400 --max 4100 --digits 5 --before_last 1.0 --seed 81
  # continue from the committed asset on a fresh machine (fresh optimizer; rerun to resume), then
  # export a checkpoint to read keys as the asset does:
  python train.py --config=configs/smollm2_beacon.py --config.train.init_from=assets/smollm2_beacon
  python -m longjax.beacon.asset --workdir runs/smollm2_beacon/run \
      --out runs/smollm2_beacon/candidate --stride 256 --ratios 8
"""
import ml_collections

from configs import common


def get_config():
  c = ml_collections.ConfigDict()
  c.method = "beacon"
  c.workdir = "runs/smollm2_beacon/run"
  c.seed = 0
  c.model = common.real_model("HuggingFaceTB/SmolLM2-135M-Instruct", checkpoint="smollm2",
                              dtype="float32", param_dtype="float32")
  # stride 128 < W: windows overlap by half, so every token reads W/2..W-1 raw tokens, as
  # truncation's, besides the memory; ratios 8 / 32 / 128, one per document, so that the same
  # tensors read keys at ratio 8 and prose at ratio 128
  c.beacon = ml_collections.ConfigDict(dict(window=256, stride=128, ratios=(8, 32, 128),
                                            ratio_mix="instance-random", pos="append",
                                            attn="step-expansion", param=("q", "k", "v", "o"),
                                            sink_size=1, embed_init="eos", attend_prev=True))
  c.data = common.data_defaults(sources="jsonl:runs/campaign/prose_2k.jsonl@distill,"
                                        "jsonl:runs/campaign/prose_long.jsonl@distill",
                                min_length=0, max_length=4200, loss_on="distill")
  # prose distilled with the teacher's tail as one class (keeps the rest of the vocabulary)
  c.train = common.train_defaults(num_steps=1000, global_batch=1, lr=1e-4, warmup_steps=20,
                                  save_every=25, keep=40, log_every=1, progress=False,
                                  remat="dots",  # 2.8 GB and 12 % faster than True (bench)
                                  layout="inference",
                                  distill=dict(top_k=32, alpha=0.0, rest="bucket"))
  from longjax.eval.config import eval_config  # noqa: E402
  c.eval = eval_config("beacon", preset="tiny")
  c.eval.passkey.lengths = (1024, 2048)
  c.eval.passkey.depths = (0, 25, 50, 75, 100)
  c.eval.passkey.max_new_tokens = 16
  c.eval.passkey.seed = 2024
  return c
