"""Tiny Activation Beacon run on CPU: the README's embedded default (byte tokenizer, random base)."""
import ml_collections


def get_config():
  c = ml_collections.ConfigDict()
  c.method = "beacon"
  c.workdir = "runs/tiny_beacon"
  c.seed = 0
  c.model = ml_collections.ConfigDict(dict(
      checkpoint="",  # empty: a tiny random Qwen2-shaped model with the byte tokenizer
      family="qwen2", hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
      num_kv_heads=2, head_dim=16, dtype="float32"))
  c.beacon = ml_collections.ConfigDict(dict(window=64, stride=64, ratios=(4,), ratio_mix="step-random",
                                            pos="interleave", attn="full-coverage",
                                            param=("q", "k", "v"), sink_size=0))
  c.eval = ml_collections.ConfigDict(dict(task="passkey"))
  return c
