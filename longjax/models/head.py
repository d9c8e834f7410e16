"""The LM head on final hidden states: the one place that reads the output projection.

The decoder computes it inside its own call; the methods (Activation Beacon's loss, FocusLLM's
chosen rows, eval's blockwise NLL) apply it outside, to rows they pick, so the head must be a
plain function of the parameter tree. Casts follow HF: a tied embedding is used in the hidden
states' dtype; an untied ``lm_head`` multiplies in the compute dtype; logits are always fp32.
"""
from __future__ import annotations

import jax.numpy as jnp

from longjax.models.config import ModelConfig


def lm_head(cfg: ModelConfig, params, h):
  """fp32 logits ``[..., V]`` of hidden states ``h [..., H]`` (``params``: the decoder's tree)."""
  if cfg.tie_word_embeddings:
    table = params["embedding"].astype(h.dtype)
    return jnp.einsum("...h,vh->...v", h, table).astype(jnp.float32)
  kernel = params["lm_head"]["kernel"].astype(cfg.compute_dtype)
  return jnp.einsum("...h,hv->...v", h.astype(cfg.compute_dtype), kernel).astype(jnp.float32)
