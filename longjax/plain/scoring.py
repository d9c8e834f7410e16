"""The plain decoder's score of a suffix: one forward, the LM head applied block by block."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from longjax.models.config import ModelConfig
from longjax.models.decoder import CAUSAL_PREFILL, Decoder
from longjax.models.head import head_nll
from longjax.runtime.rounding import round_up

BLOCK = 256


def suffix_nll(cfg: ModelConfig, params, ids, n: int):
  """Summed NLL of the last ``n`` tokens of ``ids`` and ``n``: one forward over ``ids`` (padded
  to 256-token blocks), the LM head applied block by block so that the [T, vocab] logits never
  exist at once."""
  t = len(ids)
  tp = round_up(t, BLOCK)
  tokens = np.zeros((1, tp), np.int32)
  tokens[0, :t] = ids
  targets = np.zeros((1, tp), np.int32)
  targets[0, :t - 1] = ids[1:]
  weights = np.zeros((1, tp), np.float32)
  weights[0, t - 1 - n:t - 1] = 1.0
  fn = _nll_fn(cfg, BLOCK)
  return float(fn(params, jnp.asarray(tokens), jnp.asarray(targets), jnp.asarray(weights))), n


@functools.lru_cache(maxsize=8)
def _nll_fn(cfg: ModelConfig, block: int):
  model = Decoder(cfg, rule=CAUSAL_PREFILL)

  def f(params, tokens, targets, weights):
    # tokens/targets/weights [1, T] with T a multiple of block; returns summed weighted NLL.
    t = tokens.shape[1]
    hidden, _ = model.apply({"params": params}, tokens, jnp.arange(t)[None], head=False)
    hb = hidden[0].reshape(t // block, block, -1)
    tb = targets[0].reshape(t // block, block)
    wb = weights[0].reshape(t // block, block)

    def one(xs):
      h, y, w = xs
      return jnp.sum(head_nll(cfg, params, h, y) * w)

    return jnp.sum(jax.lax.map(one, (hb, tb, wb)))

  return jax.jit(f)
