"""The plain decoder's training task (train.py's ``lm`` runs, which pretrain the tiny bases): next
tokens over random crops of ``length`` tokens, every parameter trained. Like the method tasks
(``beacon/task.py``, ``focus/task.py``), a host ``prepare`` and a device ``loss`` giving per-sample
``(loss_sum, loss_count)``."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from longjax.data import pipeline
from longjax.models.config import ModelConfig
from longjax.models.decoder import CAUSAL_PREFILL, Decoder
from longjax.models.head import token_nll


class LMTask:
  """Plain next-token LM over random crops (pretraining the tiny base of the proof)."""

  def __init__(self, cfg: ModelConfig, *, length: int, seed: int, answer_only: bool = False):
    self.cfg, self.length, self.seed = cfg, int(length), int(seed)
    self.answer_only = answer_only
    self.model = Decoder(cfg, rule=CAUSAL_PREFILL)

  def group_key(self, length: int):
    return None

  def prepare(self, ds, idx, step: int, row_offset: int = 0) -> dict:
    T = self.length
    toks = np.zeros((len(idx), T), np.int32)
    mask = np.zeros((len(idx), T), bool)
    for row, i in enumerate(idx):
      ids = ds.ids[int(i)]
      rng = pipeline.row_rng(self.seed, step, row_offset + row, salt=3)
      start = int(rng.integers(0, max(1, len(ids) - T) + 1))
      piece = ids[start:start + T]
      toks[row, :len(piece)] = piece
      ans = ds.answer[int(i)]
      if self.answer_only:
        if ans is not None:
          mask[row, :len(piece)] = ans[start:start + T]
      else:
        mask[row, :len(piece)] = True
    filled = sum(min(len(ds.ids[int(i)]), T) for i in idx)
    return dict(plans=dict(tokens=toks, mask=mask), tokens=int(mask.sum()),
                occupancy=(int(filled), int(toks.size)))

  def loss(self, params, plans):
    toks, mask = plans["tokens"], plans["mask"]
    pos = jnp.broadcast_to(jnp.arange(toks.shape[1]), toks.shape)
    logits, _ = self.model.apply({"params": params}, toks, pos)
    nll = token_nll(logits[:, :-1], toks[:, 1:])
    ok = mask[:, 1:] & (toks[:, 1:] != 0) if self.answer_only else mask[:, 1:]
    return jnp.sum(jnp.where(ok, nll, 0.0), axis=1), jnp.sum(ok, axis=1, dtype=jnp.int32)
