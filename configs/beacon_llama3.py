"""Activation Beacon recipe on Llama-3-8B-Instruct (spec beacon.md §7: W = S = 1024 and an
attention sink of 1 -- "Llama-3 requires attention sink"; otherwise as the Qwen-2 pretrain).

  python train.py --config=configs/beacon_llama3.py \
      --config.model.checkpoint=/path/to/Meta-Llama-3-8B-Instruct \
      --config.data.sources=jsonl:/path/activation-beacon/redpajama/train.json
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
  c.workdir = "runs/beacon_llama3"
  c.seed = 0
  c.model = common.real_model("meta-llama/Meta-Llama-3-8B-Instruct")
  c.beacon = ml_collections.ConfigDict(dict(window=1024, stride=1024, ratios=(2, 4, 8, 16, 32),
                                            ratio_mix="step-random", pos="interleave",
                                            attn="full-coverage", param=("q", "k", "v"),
                                            sink_size=1, embed_init="eos", attend_prev=True))
  c.data = common.data_defaults(min_length=2400, max_length=20000)
  c.train = common.train_defaults(global_batch=8, lr=5e-5, save_every=1000,
                                  mesh=dict(data=1, fsdp=-1, tensor=1))
  c.debug = common.debug_defaults()
  from longjax.eval.config import eval_config  # noqa: E402 (official eval protocols)
  c.eval = eval_config(c.method)
  return c
