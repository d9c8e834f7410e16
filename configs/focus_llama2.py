"""FocusLLM training recipe (docs/focusllm.md §5, ``train.sh``) on Llama-2-7b-chat.

local_window W = 3072 (continuation region / local-span bounds), per-sample strides
{64,128,256,512,1024,2048}, candidate q/k/v/o, one of continuation / repetition per sample,
3072-8192 tokens, lr 5e-5 linear decay, no warmup, no weight decay, clip 1.0, global batch 8
(= 8 target tokens per step), 1 epoch. Inference settings for the exported config: stride 2048,
prompt cap 512, chunking threshold 4096.

  python train.py --config=configs/focus_llama2.py \
      --config.model.checkpoint=/path/to/Llama-2-7b-chat-hf \
      --config.data.sources=jsonl:/path/focusllm/redpajama-sample.json,jsonl:/path/focusllm/longalpaca.json

Topology: a TPU v5p-8 (4 chips; the packed chunk rows over every chip). Compiled, not run
(docs/kernels.md): 53.5 GiB per chip of 95 at its largest chunk layout (stride 64). 128K-token
inference fits v5p-8 (63.5 GiB) but not v5e-16 (the parameters are replicated on its chunk mesh).
"""
import ml_collections

from configs import common


def get_config():
  c = ml_collections.ConfigDict()
  c.method = "focus"
  c.workdir = "runs/focus_llama2"
  c.seed = 0
  c.model = common.real_model("meta-llama/Llama-2-7b-chat-hf")
  c.focus = ml_collections.ConfigDict(dict(local_window=3072, stride=2048,
                                           strides=(64, 128, 256, 512, 1024, 2048),
                                           prompt_cap=512, param=("q", "k", "v", "o"),
                                           min_len_threshold=4096, min_local=30,
                                           objective="random", steps=1))
  c.data = common.data_defaults(min_length=3072, max_length=8192, max_per_source=200000)
  c.train = common.train_defaults(global_batch=8, lr=5e-5, save_every=2000,
                                  mesh=dict(data=1, fsdp=-1, tensor=1))
  from longjax.eval.config import eval_config  # noqa: E402 (official eval protocols)
  c.eval = eval_config(c.method)
  return c
