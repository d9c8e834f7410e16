"""Activation Beacon's training task over the frozen decoder, as host ``prepare`` + device ``loss``.

:class:`BeaconTask` plans a global batch with ``Schedule.plan`` (host) and runs the window scan of
``BeaconLM.loss`` (``beacon.step.scan_windows``: memory-size buckets, each window under
``jax.checkpoint``) inside the jitted train step, so the whole optimizer step is one XLA program
with full backpropagation through the memory (as the official training does); one compile per
bucket schedule. ``distill`` targets come from the frozen base reading the whole document.

``loss`` returns per-sample ``(loss_sum, loss_count)``; the train step averages per-sample means
(the official per-device batch of 1, averaged over devices).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from longjax.beacon.config import BeaconConfig
from longjax.beacon.model import BeaconLM
from longjax.beacon.planner import IGNORE, RowState, WindowPlan
from longjax.beacon.step import loss_terms
from longjax.data import pipeline
from longjax.models.config import ModelConfig
from longjax.models.decoder import CAUSAL_PREFILL, Decoder
from longjax.models.head import token_nll
# train.layout (LAYOUTS) and train.distill (DistillSettings) are run config sections
from longjax.run_config.sections import LAYOUTS, DistillSettings
from longjax.runtime.rounding import round_up


def beacon_windows(length: int, window: int, stride: int) -> int:
  """Windows of a sample (official ``group_by_stride``): ceil((len - W) / S) + 1."""
  return 1 if length <= window else math.ceil((length - window) / stride) + 1


class BeaconTask:

  def __init__(self, cfg: ModelConfig, bcfg: BeaconConfig, *, max_length: int, seed: int,
               remat: bool = True, step_bucket: int = 1, impl: str = "auto",
               answer_only: bool = False, layout: str = "official",
               distill: Optional[DistillSettings] = None,
               default_objective: Optional[str] = None):
    self.cfg, self.bcfg, self.seed = cfg, bcfg, int(seed)
    self.answer_only = answer_only  # loss on the answer spans only (data.loss_on="answer")
    # "official": the last window of a sample gets no beacons (the official training layout);
    # "inference": every window is planned as at inference, beacons in the last window too, so
    # the tokens scored there (a question's answer) see what they will see in generation.
    assert layout in LAYOUTS, layout  # train.py's config check (from_config) refuses others
    self.layout = layout
    self.lm = BeaconLM(cfg, bcfg, max_length=max_length, training=True, impl=impl, remat=remat)
    self.remat = remat
    self.step_bucket = max(1, int(step_bucket))
    self.distill = distill or DistillSettings()
    self.default_objective = default_objective or ("answer" if answer_only else "lm")
    # the frozen base attending to the whole document
    self.teacher = Decoder(cfg, rule=CAUSAL_PREFILL, impl=impl)
    if self.distill.alpha:  # the base reading only the last W tokens: what the memory must add
      self.truncated = Decoder(cfg.replace(sliding_windows=(bcfg.window,) * cfg.num_layers),
                               rule=CAUSAL_PREFILL, impl=impl)

  def group_key(self, length: int) -> int:
    return beacon_windows(length, self.bcfg.window, self.bcfg.stride)

  def prepare(self, ds, idx, step: int, row_offset: int = 0) -> dict:
    """Host side: plan every row's official calls: a stacked ``WindowPlan``
    ``[n_steps, B, ...]``."""
    rows_ids, rows_labels, starts = [], [], []
    objectives = [self._objective(ds, int(i)) for i in idx]
    for row, i in enumerate(idx):
      ids = ds.ids[int(i)]
      ans = ds.answer[int(i)]
      labels = ids.astype(np.int64)
      # the sample's own objective (its source's "@answer", else the run's data.loss_on)
      if ans is not None and objectives[row] == "answer":
        labels = np.where(ans, labels, IGNORE)
      rows_ids.append(ids)
      rows_labels.append(labels)
      # Ratio RNG: the official one is a single default_rng(42) running over the whole training;
      # here each (seed, step, row) gets its own, so a resumed run draws the same ratios.
      starts.append(RowState.seeded(pipeline.row_rng(self.seed, step, row_offset + row, salt=1)))
    training = self.layout == "official"
    # a source's "@ratio=N" fixes its samples' ratio; the others draw by beacon.ratio_mix
    fixed = getattr(ds, "ratio", None)
    ratios = [fixed[int(i)] for i in idx] if fixed else None
    if "distill" not in objectives:
      plan = self.lm.schedule.plan(rows_ids, rows_labels, rows=starts, training=training,
                                   ratio=ratios, steps_multiple=self.step_bucket)
      return dict(plans=plan, tokens=int(sum(len(r) for r in rows_ids)),
                  occupancy=_occupancy(plan))
    # Distillation: plan with each label holding its target's position, so that the device can
    # gather the teacher's distribution for it; then put the token ids back as labels.
    positions = [np.arange(len(r), dtype=np.int64) for r in rows_ids]
    plan = self.lm.schedule.plan(rows_ids, positions, rows=starts, training=training,
                                 ratio=ratios, steps_multiple=self.step_bucket)
    tpos = np.asarray(plan.labels)  # [n, B, L] target positions, IGNORE where unlabelled
    labels = np.full(tpos.shape, IGNORE, np.int32)
    soft = np.zeros(tpos.shape, bool)
    scale = np.ones(tpos.shape, np.float32)  # distill.answer_weight on the answer spans
    for b, (i, ids, lab, obj) in enumerate(zip(idx, rows_ids, rows_labels, objectives)):
      t = tpos[:, b]
      ok = t >= 0
      tok = np.where(ok, lab[np.clip(t, 0, None)], IGNORE)
      if obj == "distill":  # the first window sees what the teacher sees: nothing to learn
        ok &= t >= self.bcfg.window
        tok = np.where(ok, ids[np.clip(t, 0, None)], IGNORE)
        soft[:, b] = ok
        ans = ds.answer[int(i)]
        if ans is not None:
          scale[:, b] = np.where(ok & ans[np.clip(t, 0, None)], self.distill.answer_weight, 1.0)
      labels[:, b] = np.where(ok, tok, IGNORE)
    # whole windows: one teacher width per window count (batches hold one count), one compile
    width = round_up(max(len(r) for r in rows_ids), self.bcfg.window)
    teacher_ids = np.zeros((1, len(rows_ids), width), np.int32)
    for b, r in enumerate(rows_ids):
      teacher_ids[0, b, :len(r)] = r
    plan = dataclasses.replace(plan, labels=labels)
    filled, slots = _occupancy(plan)
    plans = dict(plan=plan, teacher_ids=teacher_ids, target_pos=tpos.astype(np.int32), soft=soft)
    if self.distill.answer_weight != 1.0:  # (absent at 1: the default step's inputs unchanged)
      plans["scale"] = scale
    return dict(plans=plans,
                tokens=int(sum(len(r) for r in rows_ids)),
                occupancy=(filled + int(sum(len(r) for r in rows_ids)),
                           slots + int(teacher_ids.size)))

  def _objective(self, ds, i: int) -> str:
    obj = ds.objective[i] if getattr(ds, "objective", None) else None
    return obj or self.default_objective

  def loss(self, params, plans):
    """Per-row ``(loss_sum, loss_count)``: the window scan over the prepared plan from empty
    memory, the LM head frozen (the base is frozen: only ``alt_*`` is trained)."""
    plan, const = plans, None
    if not isinstance(plans, WindowPlan):
      plan, const = distill_targets(self, jax.lax.stop_gradient(params), plans)
    loss_sum, loss_count = loss_terms(params, plan, model=self.lm.model, sink_cap=self.lm.sink_cap,
                                      frozen_head=True)
    if const is None:
      return loss_sum, loss_count
    return loss_sum + const, loss_count


def token_weights(logp_full, logp_trunc, alpha: float, base: float = 1.0):
  """Per-token distillation weight ``base + alpha * clip(log p_full - log p_trunc, 0, 2)``."""
  return base + alpha * jnp.clip(logp_full - logp_trunc, 0.0, 2.0)


def distill_targets(task: "BeaconTask", base, plans):
  """On device: the teacher's soft targets for every label of ``plans["plan"]`` and the
  per-row constant that turns the soft cross-entropy into KL(teacher || student).

  Returns ``(plan with soft_idx / soft_p [n, B, L, K] (and soft_rest [n, B, L] with
  distill.rest="bucket"), const [B])``."""
  plan, ids = plans["plan"], plans["teacher_ids"][0]  # [B, T]
  b, t = ids.shape
  pos = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
  logits, _ = task.teacher.apply({"params": base}, ids, pos)
  logp = jax.nn.log_softmax(logits, axis=-1)  # [B, T, V]: row j predicts token j + 1
  vals, top = jax.lax.top_k(logp, task.distill.top_k)
  bucket = task.distill.rest == "bucket"
  # the teacher's probabilities of its top k, and (bucket) its mass outside them
  p = jnp.exp(vals) if bucket else jax.nn.softmax(vals, axis=-1)
  tpos = plans["target_pos"]  # [n, B, L]
  row = jnp.clip(tpos - 1, 0, t - 1)
  bi = jnp.arange(b)[None, :, None]
  soft_idx, soft_p = top[bi, row], p[bi, row]  # [n, B, L, K]
  rest = jnp.maximum(1.0 - jnp.sum(soft_p, axis=-1), 0.0)  # [n, B, L]
  if task.distill.alpha:
    lt, _ = task.truncated.apply({"params": base}, ids, pos)
    nxt = jnp.concatenate([ids[:, 1:], ids[:, -1:]], axis=1)
    lp_full = jnp.take_along_axis(logp, nxt[..., None], -1)[..., 0]  # from the top-k table above
    lp_trunc = -token_nll(lt, nxt)
    weight = token_weights(lp_full, lp_trunc, task.distill.alpha,
                           task.distill.base_weight)[bi, row]
  else:
    weight = jnp.ones(rest.shape, jnp.float32)
  if "scale" in plans:  # distill.answer_weight on the answer spans
    weight = weight * plans["scale"]
  soft = plans["soft"]
  labels = plan.labels
  k = task.distill.top_k
  hard_idx = jnp.concatenate([jnp.maximum(labels, 0)[..., None],
                              jnp.zeros(labels.shape + (k - 1,), jnp.int32)], axis=-1)
  hard_p = jnp.concatenate([(labels != IGNORE)[..., None].astype(jnp.float32),
                            jnp.zeros(labels.shape + (k - 1,), jnp.float32)], axis=-1)
  idx = jnp.where(soft[..., None], soft_idx, hard_idx).astype(jnp.int32)
  mass = jnp.where(soft[..., None], soft_p * weight[..., None], hard_p)
  # KL = CE + sum_k mass_k log p_k (+ rest log rest: the teacher's negative entropy over the
  # classes, weighted): a constant
  plogp = jnp.sum(soft_p * jnp.log(jnp.maximum(soft_p, 1e-30)), axis=-1)
  soft_rest = None
  if bucket:
    plogp = plogp + rest * jnp.log(jnp.maximum(rest, 1e-30))
    soft_rest = jnp.where(soft, rest * weight, 0.0)
  const = jnp.sum(jnp.where(soft, weight * plogp, 0.0), axis=(0, 2))
  return dataclasses.replace(plan, soft_idx=idx, soft_p=mass, soft_rest=soft_rest), const


def _occupancy(plan) -> tuple:
  """``(real, computed)`` query slots of a stacked plan: each scan segment runs its steps with
  its first ``width`` slots (``stack``), so padding slots and padding steps within that width
  cost a full slot each (the training loop reports the share they take)."""
  valid = np.asarray(plan.valid)
  batch = valid.shape[1]
  computed = sum(int(n) * batch * int(width) for n, _, width, _ in plan.segments)
  return int(valid.sum()), computed
