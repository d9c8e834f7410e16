"""Tiny FocusLLM run on CPU (byte tokenizer, random LLaMA-shaped base)."""
import ml_collections


def get_config():
  c = ml_collections.ConfigDict()
  c.method = "focus"
  c.workdir = "runs/tiny_focus"
  c.seed = 0
  c.model = ml_collections.ConfigDict(dict(
      checkpoint="", family="llama", hidden_size=64, intermediate_size=128, num_layers=2,
      num_heads=4, num_kv_heads=4, head_dim=16, dtype="float32"))
  c.focus = ml_collections.ConfigDict(dict(local_window=128, stride=64, prompt_cap=512,
                                           param=("q", "k", "v", "o"), min_len_threshold=0))
  c.eval = ml_collections.ConfigDict(dict(task="passkey"))
  return c
