"""Tiny random HF models (torch, no network) for parity tests."""
from __future__ import annotations

import numpy as np

FAMILY_CONFIGS = {
    # name -> (transformers config class name, kwargs)
    "llama2": ("LlamaConfig", dict(rms_norm_eps=1e-5)),
    "llama3": ("LlamaConfig", dict(rope_theta=500000.0, rms_norm_eps=1e-5, rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64})),
    "llama_linear": ("LlamaConfig", dict(rope_scaling={"rope_type": "linear", "factor": 2.0})),
    "llama_dynamic": ("LlamaConfig", dict(max_position_embeddings=64, rope_scaling={
        "rope_type": "dynamic", "factor": 2.0})),
    "qwen2": ("Qwen2Config", dict(rope_theta=1000000.0, tie_word_embeddings=False)),
    "qwen2_tied": ("Qwen2Config", dict(tie_word_embeddings=True)),
    "mistral": ("MistralConfig", dict(sliding_window=48)),
}


def tiny_hf_model(family: str, seed: int = 0, dtype="float32", **overrides):
  import torch
  import transformers
  cls_name, extra = FAMILY_CONFIGS[family]
  kw = dict(vocab_size=320, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
            bos_token_id=1, eos_token_id=2, tie_word_embeddings=False,
            attn_implementation="eager")
  kw.update(extra)
  kw.update(overrides)
  config = getattr(transformers, cls_name)(**kw)
  torch.manual_seed(seed)
  model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
  with torch.no_grad():  # HF init is tiny (std 0.02); make logits non-trivial
    for name, p in model.named_parameters():
      if "norm" in name:
        p.copy_(1.0 + 0.1 * torch.randn_like(p))
      elif p.ndim == 2:
        p.copy_(torch.randn_like(p) / np.sqrt(p.shape[-1]))
      else:
        p.copy_(0.1 * torch.randn_like(p))
  model = model.to(getattr(torch, dtype)).eval()
  return model


def save_tiny(tmp_path, family: str, **kw):
  model = tiny_hf_model(family, **kw)
  out = tmp_path / family
  model.save_pretrained(out, safe_serialization=True)
  return model, out


def hf_logits(model, ids) -> np.ndarray:
  import torch
  with torch.no_grad():
    return model(torch.as_tensor(np.asarray(ids))).logits.float().numpy()


def byte_level_tokenizer():
  """A byte-level HF tokenizer with 258 ids (<s>, </s>, 256 bytes; BOS added), built offline."""
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
  from transformers import PreTrainedTokenizerFast
  alphabet = pre_tokenizers.ByteLevel.alphabet()
  vocab = {"<s>": 0, "</s>": 1, **{ch: i + 2 for i, ch in enumerate(sorted(alphabet))}}
  t = Tokenizer(models.BPE(vocab, merges=[]))
  t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  t.decoder = decoders.ByteLevel()
  t.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
  return PreTrainedTokenizerFast(tokenizer_object=t, bos_token="<s>", eos_token="</s>")
