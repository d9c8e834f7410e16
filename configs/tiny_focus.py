"""Tiny FocusLLM run on CPU (byte tokenizer, no downloads).

With ``model.checkpoint=""`` a tiny LLaMA-shaped base LM is first pretrained on synthetic text
(each document: random words of its own small vocabulary) with a native window of 64 tokens
(cached under <workdir>/base), then frozen; only the candidate projections (q/k/v/o copies) are
trained with the official single-token continuation / repetition objectives (random strides,
random local spans). The loss falls because the candidates carry the document's vocabulary from
the memory chunks to the local context.

  python train.py --config=configs/tiny_focus.py [--config.workdir=runs/tiny_focus]
"""
import ml_collections

from configs import common


def get_config():
  c = ml_collections.ConfigDict()
  c.method = "focus"
  c.workdir = "runs/tiny_focus"
  c.seed = 0
  c.model = common.tiny_model("llama", num_kv_heads=4, pretrain_sources="synthetic:pattern")
  # local_window: training continuation region / local-span bound (official 3072) and the
  # inference local window; strides: the per-sample chunk sizes of training (official
  # {64..2048}); stride: the one inference stride.
  c.focus = ml_collections.ConfigDict(dict(local_window=64, stride=32, strides=(16, 32, 64),
                                           prompt_cap=32, param=("q", "k", "v", "o"),
                                           min_len_threshold=0, min_local=8, objective="random",
                                           steps=1, candidate_gate=0.0, gate_threshold=1.0,
                                           gate_gain=0.0, gate_peer_gain=0.0, gate_top_k=1,
                                           chunk_overlap=0))
  # no data.tokenizer: the tiny model's own (byte); a checkpoint brings its own
  c.data = common.data_defaults(sources="synthetic:pattern", min_length=128, max_length=256,
                                synthetic=dict(count=256, min_chars=128, max_chars=250, digits=5))
  c.train = common.train_defaults(num_steps=80, global_batch=16, lr=2e-3, warmup_steps=5,
                                  save_every=20, remat=False)
  from longjax.eval.config import eval_config  # noqa: E402 (the eval section: official
  c.eval = eval_config("focus", preset="tiny")   # protocols on CPU-sized grids)
  return c
