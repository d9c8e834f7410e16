"""FocusLLM's training task over the frozen decoder, as host ``prepare`` + device ``loss``.

:class:`FocusTask` draws each sample's indices (``longjax.focus.spans.focus_indices``), splits
them into chunks + local context (``planner.split_training``, ``pack_*``) and scores them with
``FocusLoss.per_sample``; shapes are padded to power-of-two buckets so that random strides and
spans compile few programs. ``loss`` returns per-sample ``(loss_sum, loss_count)``.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from longjax.data import pipeline
from longjax.data.errors import DataError
from longjax.focus.config import FocusConfig, FocusError
from longjax.focus.losses import (FocusLoss, TeacherBatch, dense_teacher_batch,
                                  pack_dense_targets, row_targets, teacher_batch)
from longjax.focus.planner import (pack_chunks, pack_local, split_dense, split_training,
                                   step_locals)
from longjax.focus.spans import dense_indices, focus_indices
from longjax.models.config import ModelConfig
# train.distill (DistillSettings) is a run config section
from longjax.run_config.sections import DistillSettings
from longjax.runtime.rounding import next_half_octave, round_up


class FocusTask:

  def __init__(self, cfg: ModelConfig, fcfg: FocusConfig, train_cfg: dict, *, seed: int,
               impl: str = "auto", remat: bool = False, default_objective: str = "all",
               distill: Optional[DistillSettings] = None):
    self.cfg, self.fcfg, self.seed = cfg, fcfg, int(seed)
    # the loss of a sample whose source names none (data.loss_on): "distill" (KL to the base
    # reading the whole sample, docs/focusllm.md §5.2), else the targets' NLL
    self.default_objective = default_objective
    self.distill = distill or DistillSettings()
    if self.distill.alpha:
      raise FocusError("train.distill.alpha weights beacon tokens by what the far context adds; "
                       "FocusLLM distills its scored steps unweighted: leave alpha at 0")
    if self.distill.base_weight != 1.0:
      raise FocusError("train.distill.base_weight is the floor of alpha's beacon token weights; "
                       "FocusLLM distills its scored steps unweighted: leave base_weight at 1")
    if self.distill.answer_weight != 1.0:
      raise FocusError("train.distill.answer_weight weights a beacon sample's answer span; "
                       "FocusLLM distills its scored steps unweighted: leave answer_weight at 1")
    self.fc = dict(train_cfg)
    # teacher-forced decode steps scored per sample (docs/focusllm.md §5.1; 1: the official one)
    self.steps = int(self.fc.get("steps", 1))
    if not 1 <= self.steps <= int(self.fc["window"]):
      raise FocusError(f"focus.steps={self.steps}: the decode steps scored per training sample "
                       f"must be 1 (the official single target) .. the local window "
                       f"({self.fc['window']})")
    # the share of optimizer steps scored densely (docs/focusllm.md §5.3; 0: none)
    self.dense_share = float(self.fc.get("dense_share", 0.0))
    if not 0.0 <= self.dense_share <= 1.0:
      raise FocusError(f"focus.dense_share={self.dense_share}: the share of training steps that "
                       "score every local token must be in [0, 1]")
    self.fl = FocusLoss(cfg, fcfg, impl=impl)
    self.remat = remat

  def group_key(self, length: int):
    return None

  def check_data(self, ds) -> None:
    """Every sample can be drawn (``focus_indices``), checked once before any step: a sample
    whose answer gives the draw no target needs the official draw's ``window + steps - 1``
    tokens, and otherwise the run would stop at the first batch that holds it."""
    w, min_local = int(self.fc["window"]), int(self.fc.get("min_local", 30))
    need = w + self.steps - 1
    short = []
    for i, n in enumerate(ds.lengths):
      n = int(n)
      if n >= need:
        continue
      ans = ds.answer[i] if self.fc.get("objective") == "answer" else None
      pos = np.flatnonzero(ans) if ans is not None else np.zeros(0, int)
      if not np.any(np.minimum(pos[pos > min_local], n - self.steps) > min_local):
        short.append(n)
    if short:
      raise DataError(
          f"{len(short)} training samples (the shortest {min(short)} tokens) are shorter than "
          f"the local window + focus.steps - 1 = {w} + {self.steps} - 1 = {need} tokens a "
          f"sample without an answer target needs: raise data.min_length to {need} or lower "
          "focus.steps")

  def static_shapes(self, batch: int, stride: int, max_len: int):
    """Fixed chunk-batch / local shapes for one stride: one compile per stride."""
    w, forced = int(self.fc["window"]), self.steps - 1
    p = min(self.fcfg.prompt_cap, stride, w)
    cmax = -(-max_len // stride)
    ref = self.fcfg.reference_rows  # + the gate's reference row per sample
    return dict(rows=batch * (cmax + ref), reference=ref,
                length=round_up(self._overlap(stride) + stride + p + 1 + forced, 16), cmax=cmax,
                local=round_up(w + 1 + forced, 16))

  def _overlap(self, stride: int) -> int:
    """The chunks' overlap at a drawn stride: ``chunk_overlap``, below the stride."""
    return min(self.fcfg.chunk_overlap, stride - 1)

  @staticmethod
  def row_bucket(rows, shp) -> int:
    """Chunk rows to compute this step: ``batch x 2^k`` or ``batch x 3 x 2^k`` (at most the
    ``batch x cmax`` of the longest document), the fewest that hold the batch's real chunks. Most
    samples have far fewer chunks than the longest document allows, and padding rows cost a full
    row forward each: the half-octave steps keep them below a third of the rows (powers of two
    alone: up to half), at ~2 log2(cmax) static shapes. The row count stays a multiple of the
    batch (what the mesh divides). The whole global batch is planned on every host, so all hosts
    agree. With the gate's reference rows (``FocusConfig.gate_gain``) every sample with chunks
    has one more row."""
    batch, ref = len(rows), bool(shp.get("reference"))
    need = -(-sum(r.n_chunks + int(ref and r.n_chunks > 0) for r in rows) // batch)
    return batch * min(next_half_octave(need), shp["cmax"] + ref)

  def prepare(self, ds, idx, step: int, row_offset: int = 0) -> dict:
    """Host side: draw each sample's indices, split into chunks + local context, pad to the
    stride's static shapes. The chunk size is drawn once per global batch (official: per
    sample; the marginal distribution per sample is the same) so that each batch has one
    static shape per stride."""
    strides = tuple(int(x) for x in self.fc["strides"])
    stride = strides[int(pipeline.row_rng(self.seed, step, 0, salt=4).integers(len(strides)))]
    fc = dict(self.fc, strides=(stride,))
    draw = pipeline.row_rng(self.seed, step, 0, salt=5).random()
    if draw < self.dense_share:  # never with a share of 0
      return self._prepare_dense(ds, idx, step, row_offset, fc)
    rows, recs, soft = [], [], []
    for row, i in enumerate(idx):
      obj = ds.objective[int(i)] if getattr(ds, "objective", None) else None
      soft.append((obj or self.default_objective) == "distill")
      ids, ans = ds.ids[int(i)], ds.answer[int(i)]
      ix = focus_indices(pipeline.row_rng(self.seed, step, row_offset + row, salt=2),
                                  len(ids), ans,
                                  fc)
      recs.append(ix)
      rows.append(split_training(ids, memory_len=ix["memory_len"], local_start=ix["local_start"],
                                 local_size=ix["local_size"], stride=ix["stride"],
                                 prompt_cap=self.fcfg.prompt_cap, bos_id=self.fcfg.bos_id,
                                 steps=self.steps, overlap=self._overlap(stride)))
    shp = self.static_shapes(len(rows), stride, int(ds.lengths.max()))
    cb = pack_chunks(rows, row_multiple=self.row_bucket(rows, shp), length_multiple=shp["length"],
                     cmax_multiple=shp["cmax"], reference=self.fcfg.reference_rows)
    lb = pack_local(step_locals(rows, self.steps), length_multiple=shp["local"])
    batch = dict(chunks=dataclasses.asdict(cb), local=dataclasses.asdict(lb),
                 targets=row_targets(rows))
    if any(soft):
      batch["teacher"] = dataclasses.asdict(teacher_batch([ds.ids[int(i)] for i in idx], recs,
                                                          soft, self.steps))
    forced = self.steps - 1
    return dict(plans=batch,
                tokens=int(sum(ix["memory_len"] + ix["local_size"] + forced for ix in recs)),
                occupancy=_occupancy(batch), indices=recs)

  def _prepare_dense(self, ds, idx, step: int, row_offset: int, fc: dict) -> dict:
    """:meth:`prepare` for a dense step (docs/focusllm.md §5.3): every local token scored, the
    candidates fixed from the memory before the local span."""
    rows, recs, soft = [], [], []
    for row, i in enumerate(idx):
      obj = ds.objective[int(i)] if getattr(ds, "objective", None) else None
      soft.append((obj or self.default_objective) == "distill")
      ids = ds.ids[int(i)]
      ix = dense_indices(pipeline.row_rng(self.seed, step, row_offset + row, salt=2), len(ids), fc)
      recs.append(ix)
      rows.append(split_dense(ids, memory_len=ix["memory_len"], local_size=ix["local_size"],
                              stride=ix["stride"], prompt_cap=self.fcfg.prompt_cap,
                              bos_id=self.fcfg.bos_id, overlap=self._overlap(ix["stride"])))
    shp = self.static_shapes(len(rows), ix["stride"], int(ds.lengths.max()))
    cb = pack_chunks(rows, row_multiple=self.row_bucket(rows, shp), length_multiple=shp["length"],
                     cmax_multiple=shp["cmax"], reference=self.fcfg.reference_rows)
    lb = pack_local(rows, length_multiple=shp["local"])
    width = lb.tokens.shape[1]
    batch = dict(chunks=dataclasses.asdict(cb), local=dataclasses.asdict(lb),
                 dense=pack_dense_targets(rows, width))
    if any(soft):
      batch["teacher"] = dataclasses.asdict(
          dense_teacher_batch([ds.ids[int(i)] for i in idx], rows, soft, width,
                              [ix["memory_len"] for ix in recs]))
    return dict(plans=batch, tokens=int(sum(ix["memory_len"] + ix["local_size"] for ix in recs)),
                occupancy=_occupancy(batch), indices=recs)

  def loss(self, params, plans):
    from longjax.focus.losses import DenseBatch, TrainBatch
    from longjax.focus.planner import ChunkBatch, LocalBatch
    chunks, local = ChunkBatch(**plans["chunks"]), LocalBatch(**plans["local"])
    teacher = TeacherBatch(**plans["teacher"]) if "teacher" in plans else None
    kw = dict(top_k=self.distill.top_k, rest=self.distill.rest)
    if "dense" in plans:  # every local row scored (docs/focusllm.md §5.3)
      batch = DenseBatch(chunks, local, plans["dense"])
      fn = lambda p, b: self.fl.per_sample_dense(p, b, teacher, **kw)  # noqa: E731
    else:
      batch = TrainBatch(chunks, local, plans["targets"])
      fn = (self.fl.per_sample if teacher is None else
            lambda p, b: self.fl.per_sample_distill(p, b, teacher, **kw))  # noqa: E731
    if self.remat:
      fn = jax.checkpoint(fn)
    nll = fn(params, batch)
    return nll, jnp.ones_like(nll, dtype=jnp.int32)


def _occupancy(batch: dict) -> tuple:
  """``(real, computed)`` token positions of a planned batch: chunk rows (chunk + dynamic prompt),
  the local rows and the teacher's rows, each padded to its static shape (the training loop
  reports the share the padding takes)."""
  chunks, local = batch["chunks"], batch["local"]
  real = int(np.asarray(chunks["valid"]).sum()) + int(np.asarray(local["lengths"]).sum())
  computed = int(np.asarray(chunks["valid"]).size) + int(np.asarray(local["tokens"]).size)
  if "teacher" in batch:
    ids = np.asarray(batch["teacher"]["ids"])
    real += int(np.asarray(batch["teacher"]["rows"]).max(axis=1).sum()) + ids.shape[0]
    computed += int(ids.size)
  return real, computed
