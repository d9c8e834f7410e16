"""Activation Beacon on frozen SmolLM2-135M-Instruct (the real-model learning proof, CPU-sized).

W = S = 256 (1/32 of SmolLM2's 8K context), ratio 2, interleave + full-coverage, beacon q/k/v +
embedding trained (official init: copies, embedding from EOS), fp32. Data: passkey documents in
the official prompt format through the chat template, 700-1400 tokens (3-6 windows), loss on the
answer ("The pass key is K.") only; written by scripts/passkey_data.py.

  python scripts/passkey_data.py --out runs/smollm2_beacon_data/train.jsonl --count 3000 --min 700 --max 1400
  python train.py --config=configs/smollm2_beacon.py     # rerun the same command to resume
"""
import ml_collections

try:
  from configs import common
except ImportError:  # loaded by path
  import importlib.util, pathlib  # noqa: E401
  _s = importlib.util.spec_from_file_location("common", pathlib.Path(__file__).with_name("common.py"))
  common = importlib.util.module_from_spec(_s)
  _s.loader.exec_module(common)


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
                                min_length=0, max_length=1600, loss_on="answer")
  c.train = common.train_defaults(num_steps=3000, global_batch=1, lr=1e-4, warmup_steps=20,
                                  save_every=20, keep=2, log_every=1, progress=False)
  c.debug = common.debug_defaults()
  from longjax.eval.config import eval_config  # noqa: E402
  c.eval = eval_config("beacon", preset="tiny")
  c.eval.passkey.lengths = (1024, 2048)
  c.eval.passkey.depths = (0, 25, 50, 75, 100)
  c.eval.passkey.max_new_tokens = 16
  c.eval.passkey.seed = 2024
  return c
