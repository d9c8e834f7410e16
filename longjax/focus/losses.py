"""FocusLLM training objectives from explicit indices (docs/focusllm.md §5).

Both objectives (continuation: memory = the text before the local span; repetition: memory = the
whole sample) are one next-token cross-entropy at the last local position, given

    memory_len, local_start (a), local_size (ls), stride (S)   ->   target x[a + ls]

The random draws of these indices belong to the data pipeline (:mod:`longjax.focus.spans`),
not the model. Gradients reach only the candidate projections: every other parameter goes through
``stop_gradient`` (:func:`freeze_base`), as the official training freezes every non-``beacon``
parameter.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from longjax.ckpts import layout
from longjax.focus import condense as C
from longjax.focus.config import FocusConfig, check_model
from longjax.focus.planner import (ChunkBatch, LocalBatch, half_octave_bucket, pack_chunks,
                                   pack_local, split_training, step_locals)
from longjax.models.config import ModelConfig
from longjax.models.decoder import CAUSAL_PREFILL, Decoder
from longjax.models.head import head_nll, lm_head

INDEX_KEYS = ("memory_len", "local_start", "local_size", "stride")


def trainable_mask(params):
  """True for the candidate projections (``layers/attn/alt_*_proj``), False elsewhere: the
  parameters FocusLLM trains (``longjax.methods.Focus.is_trainable``)."""
  return layout.trainable_mask(params, layout.is_alt_projection)


def freeze_base(params):
  """``params`` with ``stop_gradient`` on everything but the candidate projections."""
  return layout.freeze(params, layout.is_alt_projection)


def row_targets(rows) -> np.ndarray:
  """The targets of planned training rows: ``[B]`` (one each) or ``[B, J]`` (J steps each)."""
  if rows[0].targets is None:
    return np.asarray([r.target for r in rows], np.int32)
  return np.stack([r.targets for r in rows]).astype(np.int32)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class TrainBatch:
  """``targets [B]``: one target per sample (the official objective), ``local`` one row per
  sample; or ``targets [B, J]``: J teacher-forced decode steps per sample (docs/focusllm.md §5.1),
  ``local`` one row per step (row ``b * J + j``, :func:`planner.step_locals`)."""
  chunks: ChunkBatch
  local: LocalBatch
  targets: jax.Array  # [B] or [B, J]


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class TeacherBatch:
  """What distillation reads (docs/focusllm.md §5.2): ``ids [B, T]`` each sample up to its last
  target (right-padded), ``rows [B, J]`` the row whose next-token distribution is step j's
  target, ``soft [B]`` whether the sample is distilled (else its targets' NLL)."""
  ids: jax.Array
  rows: jax.Array
  soft: jax.Array


def teacher_batch(tokens: Sequence, indices: Sequence[Mapping], soft: Sequence[bool],
                  steps: int = 1, multiple: int = 256) -> TeacherBatch:
  """The teacher's inputs for samples planned with ``indices`` and ``steps``: each distilled
  sample's tokens before its last target, padded to ``multiple x 2^k`` or ``multiple x 3 x 2^k``
  (few compiled widths, padding below 1.5x). A sample that is not distilled is scored on its
  targets alone: its teacher row stays empty and does not widen the batch (a long answer-loss
  document next to short distilled ones would otherwise make the teacher read it whole)."""
  ends = [int(ix["local_start"]) + int(ix["local_size"]) for ix in indices]
  read = [e + steps - 1 if s else 0 for e, s in zip(ends, soft)]
  ids = np.zeros((len(ends), half_octave_bucket(max(read), multiple)), np.int32)
  for b, (x, n) in enumerate(zip(tokens, read)):
    ids[b, :n] = np.asarray(x)[:n]
  rows = np.asarray([[e - 1 + j if s else 0 for j in range(steps)] for e, s in zip(ends, soft)],
                    np.int32)
  return TeacherBatch(ids, rows, np.asarray(soft, bool))


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class DenseBatch:
  """A dense batch (docs/focusllm.md §5.3): one chunk row set and one local row per sample;
  ``targets [B, U]`` the next token of every local row (-1: not scored)."""
  chunks: ChunkBatch
  local: LocalBatch
  targets: jax.Array


def pack_dense_targets(rows, width: int) -> np.ndarray:
  """The ``row_targets`` of dense rows, right-padded with -1 to ``width``."""
  out = np.full((len(rows), width), -1, np.int32)
  for b, r in enumerate(rows):
    out[b, :len(r.row_targets)] = r.row_targets
  return out


def dense_teacher_batch(tokens: Sequence, rows, soft: Sequence[bool], width: int,
                        memory_lens: Sequence[int], multiple: int = 256) -> TeacherBatch:
  """The teacher's inputs for dense rows (:func:`planner.split_dense`, memory ``x[0:a]`` with
  ``a = memory_lens[b]``, span ``x[a : a+ls]``): the sample's tokens ``x[0 : a+ls]``, padded to
  ``multiple x 2^k``, and for the local row of ``x[a+k]`` (predicting ``x[a+k+1]``) the teacher
  row ``a+k``; unscored rows point at row 0. ``a`` is given, not summed from the chunks: with
  ``chunk_overlap`` the chunks repeat tokens. A sample that is not distilled gets an empty row,
  as in :func:`teacher_batch`."""
  ends, rr = [], np.zeros((len(rows), width), np.int32)
  for b, (r, s, a) in enumerate(zip(rows, soft, memory_lens)):
    if not s:
      ends.append(0)
      continue
    t = r.row_targets
    first = int(np.argmax(t >= 0))
    a = int(a)
    ends.append(a + len(t) - first)
    rr[b, first:len(t)] = a + np.arange(len(t) - first)
  ids = np.zeros((len(rows), half_octave_bucket(max(ends), multiple)), np.int32)
  for b, (x, e) in enumerate(zip(tokens, ends)):
    ids[b, :e] = np.asarray(x)[:e]
  return TeacherBatch(ids, rr, np.asarray(soft, bool))


class FocusLoss:
  """Single-token FocusLLM loss over a batch of samples, each with its own explicit indices.

  ``loss(params, batch)`` is the mean over samples (the official per-device batch is 1);
  ``plan(samples)`` builds the padded batch on the host. With ``mesh`` the chunk axis is sharded
  like at inference.
  """

  def __init__(self, cfg: ModelConfig, fcfg: FocusConfig, *, mesh=None, axis: str = "chunks",
               impl: str = "auto", bucket: int = 64):
    check_model(cfg, fcfg)
    self.cfg, self.fcfg, self.bucket = cfg, fcfg, bucket
    self.model = Decoder(cfg, impl=impl)
    self.teacher = Decoder(cfg, rule=CAUSAL_PREFILL, impl=impl)  # the base on the whole sample
    if mesh is not None:
      self.n_shards = int(mesh.shape[axis])
      self._condense = C.condense_candidates_sharded(C.row_decoder(self.model), mesh, axis)
    else:
      self.n_shards = 1
      # Candidates only: the rest of each chunk row runs forward-only (no backward through it).
      self._condense = functools.partial(C.condense_candidates, C.row_decoder(self.model))
    self.loss = jax.jit(self._loss)
    self.value_and_grad = jax.jit(jax.value_and_grad(self._loss))

  def plan(self, tokens: Sequence, indices: Sequence[Mapping], steps: int = 1) -> TrainBatch:
    """``tokens[b]`` a sample's ids; ``indices[b]`` its
    ``memory_len/local_start/local_size/stride``; ``steps`` decode steps scored per sample."""
    rows = [split_training(x, prompt_cap=self.fcfg.prompt_cap, bos_id=self.fcfg.bos_id,
                           max_chunks=self.fcfg.max_chunks, steps=steps,
                           overlap=min(self.fcfg.chunk_overlap, int(ix["stride"]) - 1),
                           **{k: int(ix[k]) for k in INDEX_KEYS})
            for x, ix in zip(tokens, indices)]
    cb = pack_chunks(rows, row_multiple=self.n_shards, length_multiple=self.bucket,
                     reference=self.fcfg.reference_rows)
    return TrainBatch(cb, pack_local(step_locals(rows, steps), length_multiple=self.bucket),
                      row_targets(rows))

  def step_hidden(self, params, batch: TrainBatch):
    """The final hidden state of every scored step ``[B * J, H]`` (row ``b * J + j``; J = 1 with
    one target per sample)."""
    params = freeze_base(params)
    cb, lb = batch.chunks, batch.local
    if batch.targets.ndim == 1:
      cand_k, cand_v, *conf = self._condense(params, cb.tokens, cb.positions, cb.valid,
                                             cb.lengths, **self._gate_kw)
      gather, cand_valid, ref_row = cb.gather, cb.cand_valid, cb.ref_row
    else:  # step j of sample b reads candidate j of its chunk rows: flat index row * J + j
      b, j = batch.targets.shape
      cand_k, cand_v, *conf = self._condense(params, cb.tokens, cb.positions, cb.valid,
                                             cb.lengths, steps=j, **self._gate_kw)
      flat = lambda a: a.reshape(a.shape[:1] + (-1,) + a.shape[3:])
      cand_k, cand_v = flat(cand_k), flat(cand_v)
      # [N, J, ...] -> [N * J, ...], the flat index above
      conf = [jax.tree.map(lambda c: c.reshape((-1,) + c.shape[2:]), c) for c in conf]
      gather = (cb.gather[:, None, :] * j + jnp.arange(j, dtype=cb.gather.dtype)[None, :, None])
      gather = gather.reshape(b * j, -1)
      cand_valid = jnp.repeat(cb.cand_valid, j, axis=0)
      ref_row = (cb.ref_row[:, None] * j + jnp.arange(j, dtype=cb.ref_row.dtype)).reshape(-1)
    bias = self._bias(params, conf, gather, cand_valid, ref_row)
    return C.local_last_hidden(self.model, params, cand_k, cand_v, gather, cand_valid,
                               lb.tokens, lb.lengths, lb.n_chunks, cand_bias=bias)

  def _bias(self, params, conf, gather, cand_valid, ref_row):
    """The candidate gate's score biases (None: the gate is off)."""
    if not conf:
      return None
    return C.gate_bias(conf[0], gather, cand_valid, ref_row=ref_row,
                       head=functools.partial(lm_head, self.cfg, params), **self.fcfg.gate_reading)

  @property
  def _gate_kw(self) -> dict:
    """The candidate condensing's extra arguments: the gate's signal too when it is on."""
    return dict(confidence=True) if self.fcfg.candidate_gate else {}

  def per_sample(self, params, batch: TrainBatch):
    """Each sample's NLL ``[B]`` (with J decode steps: the mean over its steps)."""
    nll = head_nll(self.cfg, freeze_base(params), self.step_hidden(params, batch),
                   batch.targets.reshape(-1))
    return nll.reshape(batch.targets.shape[0], -1).mean(axis=1)

  def per_sample_distill(self, params, batch: TrainBatch, teacher: "TeacherBatch", *,
                         top_k: int, rest: str = "bucket"):
    """Each sample's mean over its steps of KL(teacher || student) where ``teacher.soft``, else
    the NLL of the target (docs/focusllm.md §5.2). The teacher is the frozen base reading the
    sample up to each step's target with full attention (``teacher.ids``; step j's distribution
    is its row ``teacher.rows[b, j]``), cut to its top ``top_k`` tokens plus, with
    ``rest="bucket"``, one class for the mass outside them (``"renormalise"``: the top ``top_k``
    renormalised)."""
    targets = batch.targets.reshape(batch.targets.shape[0], -1)  # [B, J]
    student = jax.nn.log_softmax(lm_head(self.cfg, freeze_base(params),
                                         self.step_hidden(params, batch)))
    logq = student.reshape(targets.shape + student.shape[-1:])  # [B, J, V]
    kl = self._teacher_kl(params, teacher, logq, top_k, rest)
    nll = -jnp.take_along_axis(logq, targets[..., None], axis=-1)[..., 0]
    return jnp.where(teacher.soft[:, None], kl, nll).mean(axis=1)

  def _teacher_kl(self, params, teacher: "TeacherBatch", logq, top_k: int, rest: str):
    """KL(teacher || student) ``[B, R]`` at the teacher's rows ``teacher.rows [B, R]`` against
    the student's log-probabilities ``logq [B, R, V]`` (see :meth:`per_sample_distill`)."""
    base = jax.lax.stop_gradient(params)
    pos = jnp.broadcast_to(jnp.arange(teacher.ids.shape[1], dtype=jnp.int32), teacher.ids.shape)
    h, _ = self.teacher.apply({"params": base}, teacher.ids, pos, head=False)
    h = jnp.take_along_axis(h, teacher.rows[..., None], axis=1)  # [B, R, H]
    logp = jax.nn.log_softmax(lm_head(self.cfg, base, h))
    vals, top = jax.lax.top_k(logp, top_k)
    q_top = jnp.take_along_axis(logq, top, axis=-1)
    if rest == "bucket":
      p = jnp.exp(vals)
      p_rest = jnp.maximum(1.0 - p.sum(-1), 0.0)
      q_rest = jnp.maximum(1.0 - jnp.exp(q_top).sum(-1), 1e-30)
      return (jnp.sum(p * (vals - q_top), -1)
              + p_rest * (jnp.log(jnp.maximum(p_rest, 1e-30)) - jnp.log(q_rest)))
    p = jax.nn.softmax(vals, axis=-1)
    return jnp.sum(p * (jnp.log(jnp.maximum(p, 1e-30)) - q_top), -1)

  def dense_logq(self, params, batch: "DenseBatch"):
    """The student's log-probabilities ``[B, U, V]`` at every local row of a dense batch
    (docs/focusllm.md §5.3): one chunk pass (candidates fixed before the local span), one local
    forward."""
    params = freeze_base(params)
    cb, lb = batch.chunks, batch.local
    cand_k, cand_v, *conf = self._condense(params, cb.tokens, cb.positions, cb.valid, cb.lengths,
                                           **self._gate_kw)
    bias = self._bias(params, conf, cb.gather, cb.cand_valid, cb.ref_row)
    h = C.local_hidden(self.model, params, cand_k, cand_v, cb.gather, cb.cand_valid, lb.tokens,
                       lb.lengths, lb.n_chunks, cand_bias=bias)
    return jax.nn.log_softmax(lm_head(self.cfg, params, h))

  def per_sample_dense(self, params, batch: "DenseBatch", teacher: "TeacherBatch" = None, *,
                       top_k: int = 32, rest: str = "bucket"):
    """Each sample's mean over its scored local rows (``batch.targets >= 0``) of the targets'
    NLL, or, where ``teacher.soft``, of KL(teacher || student) with the teacher reading the
    sample up to each row's target (``teacher.rows [B, U]``)."""
    logq = self.dense_logq(params, batch)
    scored = batch.targets >= 0
    per = -jnp.take_along_axis(logq, jnp.maximum(batch.targets, 0)[..., None], axis=-1)[..., 0]
    if teacher is not None:
      kl = self._teacher_kl(params, teacher, logq, top_k, rest)
      per = jnp.where(teacher.soft[:, None], kl, per)
    per = jnp.where(scored, per, 0.0)
    return per.sum(axis=1) / jnp.maximum(scored.sum(axis=1), 1)

  def _loss(self, params, batch: TrainBatch):
    return jnp.mean(self.per_sample(params, batch))
