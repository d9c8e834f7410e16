"""The LM head on final hidden states, and the next-token NLL: the one place that reads the
output projection and the one place that scores a target token.

The decoder computes the head inside its own call; the methods (Activation Beacon's loss, FocusLLM's
chosen rows, eval's blockwise NLL) apply it outside, to rows they pick, so the head must be a
plain function of the parameter tree. Casts follow HF: a tied embedding is used in the hidden
states' dtype; an untied ``lm_head`` multiplies in the compute dtype; logits are always fp32.
Every loss and score of a target token (beacon, FocusLLM, the plain LM task, perplexity, the
distillation targets) is :func:`token_nll` of logits or :func:`head_nll` of hidden states; only
the beacon step's fused-gradient variant (``beacon/step._nll(with_grad=True)``) writes its own.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from longjax.models.config import ModelConfig


def lm_head(cfg: ModelConfig, params, h):
  """fp32 logits ``[..., V]`` of hidden states ``h [..., H]`` (``params``: the decoder's tree)."""
  if cfg.tie_word_embeddings:
    table = params["embedding"].astype(h.dtype)
    return jnp.einsum("...h,vh->...v", h, table).astype(jnp.float32)
  kernel = params["lm_head"]["kernel"].astype(cfg.compute_dtype)
  return jnp.einsum("...h,hv->...v", h.astype(cfg.compute_dtype), kernel).astype(jnp.float32)


def vocab_slice(cfg: ModelConfig, params, i, size: int):
  """The parameters :func:`lm_head` reads, cut to vocabulary rows ``i*size .. (i+1)*size-1``
  (``i`` may be traced): a vocabulary-split head applies :func:`lm_head` to its own slice."""
  if cfg.tie_word_embeddings:
    return {"embedding": jax.lax.dynamic_slice_in_dim(params["embedding"], i * size, size, 0)}
  kernel = jax.lax.dynamic_slice_in_dim(params["lm_head"]["kernel"], i * size, size, 1)
  return {"lm_head": {"kernel": kernel}}


def token_nll(logits, targets):
  """``-log softmax(logits)[target]``: the NLL ``[...]`` of ids ``targets [...]`` under
  ``logits [..., V]`` (a row predicts its target; shift by one for next-token targets)."""
  logp = jax.nn.log_softmax(logits, axis=-1)
  return -jnp.take_along_axis(logp, jnp.asarray(targets)[..., None], axis=-1)[..., 0]


def head_nll(cfg: ModelConfig, params, h, targets):
  """:func:`token_nll` of the LM head's logits of hidden states ``h [..., H]``."""
  return token_nll(lm_head(cfg, params, h), targets)
