"""The two training tasks over the frozen decoder, as host ``prepare`` + device ``loss``.

* :class:`BeaconTask` plans a global batch with ``BeaconLM.plan`` (host) and runs
  ``BeaconLM.loss_terms`` (the window scan of ``BeaconLM.loss``: memory-size buckets, each window
  under ``jax.checkpoint``) inside the jitted train step, so the whole optimizer step is a single
  XLA program with full BPTT through the memory (official); one compile per bucket schedule.
* :class:`FocusTask` uses ``longjax.focus`` (``spans`` indices via ``longjax.data.pipeline``,
  ``planner.split_training`` / ``pack_*``, ``FocusLoss.per_sample``) with shapes padded to
  power-of-two buckets (few compiles across random strides and spans).

Both return per-sample ``(loss_sum, loss_count)``; the step averages per-sample means (the
official per-device batch of 1, averaged over devices).
"""
from __future__ import annotations

import dataclasses
import jax
import jax.numpy as jnp
import numpy as np

from longjax.beacon.config import BeaconConfig
from longjax.beacon.model import BeaconLM
from longjax.beacon.planner import IGNORE, RowState
from longjax.data import pipeline
from longjax.focus.config import FocusConfig
from longjax.focus.losses import FocusLoss
from longjax.focus.planner import pack_chunks, pack_local, split_training
from longjax.models.config import ModelConfig
from longjax.sizes import round_up


# --------------------------------------------------------------------------------------------
class BeaconTask:
  method = "beacon"

  def __init__(self, cfg: ModelConfig, bcfg: BeaconConfig, *, max_length: int, seed: int,
               remat: bool = True, step_bucket: int = 1, impl: str = "auto",
               answer_only: bool = False):
    self.cfg, self.bcfg, self.seed = cfg, bcfg, int(seed)
    self.answer_only = answer_only  # loss on the answer spans only (data.loss_on="answer")
    self.lm = BeaconLM(cfg, bcfg, max_length=max_length, training=True, impl=impl, remat=remat)
    self.remat = remat
    self.step_bucket = max(1, int(step_bucket))

  def group_key(self, length: int) -> int:
    return pipeline.beacon_windows(length, self.bcfg.window, self.bcfg.stride)

  def prepare(self, ds, idx, step: int, row_offset: int = 0) -> dict:
    """Host side: plan every row's official calls: a stacked ``WindowPlan`` ``[n_steps, B, ...]``."""
    rows_ids, rows_labels, starts = [], [], []
    for row, i in enumerate(idx):
      ids = ds.ids[int(i)]
      ans = ds.answer[int(i)]
      labels = ids.astype(np.int64)
      if ans is not None and self.answer_only:
        labels = np.where(ans, labels, IGNORE)
      rows_ids.append(ids)
      rows_labels.append(labels)
      # Ratio RNG: the official one is a single default_rng(42) running over the whole training;
      # here each (seed, step, row) gets its own, so a resumed run draws the same ratios.
      starts.append(RowState.seeded(pipeline.row_rng(self.seed, step, row_offset + row, salt=1)))
    plan = self.lm.plan(rows_ids, rows_labels, rows=starts, training=True,
                        steps_multiple=self.step_bucket)
    return dict(plans=plan, tokens=int(sum(len(r) for r in rows_ids)))

  def loss(self, params, plans):
    return self.lm.loss_terms(params, plans)


# --------------------------------------------------------------------------------------------
class FocusTask:
  method = "focus"

  def __init__(self, cfg: ModelConfig, fcfg: FocusConfig, train_cfg: dict, *, seed: int,
               impl: str = "auto", remat: bool = False):
    self.cfg, self.fcfg, self.seed = cfg, fcfg, int(seed)
    self.fc = dict(train_cfg)
    self.fl = FocusLoss(cfg, fcfg, impl=impl)
    self.remat = remat

  def group_key(self, length: int):
    return None

  def static_shapes(self, batch: int, stride: int, max_len: int):
    """Fixed chunk-batch / local shapes for one stride: one compile per stride."""
    w = int(self.fc["window"])
    p = min(self.fcfg.prompt_cap, stride, w)
    cmax = -(-max_len // stride)
    return dict(rows=batch * cmax, length=round_up(stride + p + 1, 16), cmax=cmax,
                local=round_up(w + 1, 16))

  def prepare(self, ds, idx, step: int, row_offset: int = 0) -> dict:
    """Host side: draw each sample's indices, split into chunks + local context, pad to the
    stride's static shapes. The chunk size is drawn once per global batch (official: per
    sample; the marginal distribution per sample is the same) so that each batch has one
    static shape per stride."""
    strides = tuple(int(x) for x in self.fc["strides"])
    stride = strides[int(pipeline.row_rng(self.seed, step, 0, salt=4).integers(len(strides)))]
    fc = dict(self.fc, strides=(stride,))
    rows, recs = [], []
    for row, i in enumerate(idx):
      ids, ans = ds.ids[int(i)], ds.answer[int(i)]
      ix = pipeline.focus_indices(pipeline.row_rng(self.seed, step, row_offset + row, salt=2),
                                  len(ids), ans,
                                  fc)
      recs.append(ix)
      rows.append(split_training(ids, memory_len=ix["memory_len"], local_start=ix["local_start"],
                                 local_size=ix["local_size"], stride=ix["stride"],
                                 prompt_cap=self.fcfg.prompt_cap, bos_id=self.fcfg.bos_id))
    shp = self.static_shapes(len(rows), stride, int(ds.lengths.max()))
    cb = pack_chunks(rows, row_multiple=shp["rows"], length_multiple=shp["length"],
                     cmax_multiple=shp["cmax"])
    lb = pack_local(rows, length_multiple=shp["local"])
    batch = dict(chunks=dataclasses.asdict(cb), local=dataclasses.asdict(lb),
                 targets=np.asarray([r.target for r in rows], np.int32))
    return dict(plans=batch, tokens=int(sum(ix["memory_len"] + ix["local_size"] for ix in recs)),
                indices=recs)

  def loss(self, params, plans):
    from longjax.focus.losses import TrainBatch
    from longjax.focus.planner import ChunkBatch, LocalBatch
    batch = TrainBatch(ChunkBatch(**plans["chunks"]), LocalBatch(**plans["local"]),
                       plans["targets"])
    fn = self.fl.per_sample
    if self.remat:
      fn = jax.checkpoint(fn)
    nll = fn(params, batch)
    return nll, jnp.ones_like(nll, dtype=jnp.int32)


# --------------------------------------------------------------------------------------------
class LMTask:
  """Plain next-token LM over random crops (pretraining the tiny base of the proof)."""
  method = "lm"

  def __init__(self, cfg: ModelConfig, *, length: int, seed: int, answer_only: bool = False):
    from longjax.models.decoder import Decoder
    self.cfg, self.length, self.seed = cfg, int(length), int(seed)
    self.answer_only = answer_only
    self.model = Decoder(cfg)

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
    return dict(plans=dict(tokens=toks, mask=mask), tokens=int(mask.sum()))

  def loss(self, params, plans):
    toks, mask = plans["tokens"], plans["mask"]
    pos = jnp.broadcast_to(jnp.arange(toks.shape[1]), toks.shape)
    logits, _ = self.model.apply({"params": params}, toks, pos)
    logp = jax.nn.log_softmax(logits[:, :-1], axis=-1)
    nll = -jnp.take_along_axis(logp, toks[:, 1:, None], axis=-1)[..., 0]
    ok = mask[:, 1:] & (toks[:, 1:] != 0) if self.answer_only else mask[:, 1:]
    return jnp.sum(jnp.where(ok, nll, 0.0), axis=1), jnp.sum(ok, axis=1, dtype=jnp.int32)
