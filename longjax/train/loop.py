"""The training loop: config -> model, data, mesh, optimizer, checkpoints -> steps -> export.

The config is the run's typed ``RunConfig`` (``longjax.run_config``; train.py builds it once).

Only the method's parameters are trained (Activation Beacon: ``alt_*`` = official ``beacon_*``
tensors; FocusLLM: the candidate projections); the base model is frozen: it is an *argument* of
the jitted step, never differentiated, and the optimizer state exists only for the trainable
subtree. Trainable parameters are fp32 master weights; the frozen ones are stored in
``model.param_dtype`` and every matmul runs in ``model.dtype`` (bf16 on accelerators).
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import sys
import time
from pathlib import Path
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import traverse_util

from longjax.data import pipeline
from longjax.run_config import curriculum
from longjax.data.tokenizers import (TokenizerChoiceError, choose_tokenizer, get_tokenizer,
                                     save_with_model)
from longjax.train import distributed, lock, map_count
from longjax.train import sharding as shd
from longjax.train.checkpointing import Checkpointer, fingerprint
from longjax.train.metrics import MetricsWriter
from longjax import methods
from longjax.ckpts import layout
from longjax.errors import LongjaxError
from longjax.models.config import remat_mode
from longjax.run_config import RunConfig, to_dict
from longjax.train.errors import TrainingError

log = logging.getLogger("longjax.train")


# --------------------------------------------------------------------------------------------
# parameters
def split_params(params, method: "methods.Method"):
  """``(trainable, frozen)`` subtrees of ``params`` by ``method``'s trainable set."""
  tr, fr = layout.split_trainable(params, method.is_trainable)
  if not tr:
    raise TrainingError(f"no trainable parameters for method {method.name!r} in this model")
  return tr, fr


def make_optimizer(tc, total_steps: int):
  """``tc``: the ``train`` section (``run_config.TrainSection``)."""
  warm = tc.warmup_steps
  decay = max(1, total_steps - warm)
  sched = optax.linear_schedule(tc.lr, tc.end_lr, decay)
  if warm:
    sched = optax.join_schedules([optax.linear_schedule(0.0, tc.lr, warm), sched], [warm])
  parts = []
  if tc.max_grad_norm:
    parts.append(optax.clip_by_global_norm(tc.max_grad_norm))
  parts.append(optax.adamw(sched, b1=tc.b1, b2=tc.b2, eps=tc.eps,
                           weight_decay=tc.weight_decay))
  return optax.chain(*parts), sched


# --------------------------------------------------------------------------------------------
# model + task
def checkpoint_dir(c) -> str:
  """``config.model.checkpoint``, the name ``smollm2`` resolved to its cached HF directory."""
  from longjax.ckpts import smollm2
  try:
    return smollm2.resolve(c.model.checkpoint or "")
  except smollm2.FetchError as e:
    raise TrainingError(str(e)) from None


def load_base(c, tokenizer, workdir: Path):
  """``(cfg, params numpy)``: the checkpoint's model (or the tiny base, pretrained and cached in
  ``workdir/base`` on first use) with the method's extra parameters."""
  from longjax.ckpts import checkpoint as ckpt
  mc = c.model
  method = methods.get(c.method)
  path = checkpoint_dir(c)
  if path:
    p = Path(path)
    if not p.is_dir():
      raise TrainingError(f"--config.model.checkpoint={path}: no such directory")
    cfg, params, _ = methods.load(method, p, c, param_dtype=mc.param_dtype or None)
  else:
    cfg = methods.base_config(c, tokenizer)
    base_dir = workdir / "base"
    # what the base is built from besides its shape (recorded with it, compared on reuse)
    recipe = json.loads(json.dumps(dict(pretrain=to_dict(mc.pretrain), seed=c.seed),
                                   default=str))
    have = ckpt.is_longjax_checkpoint(base_dir)
    # every process has looked before process 0 may write it: they all take the same branch
    distributed.sync("longjax tiny base looked up")
    if have:
      try:
        cached, params, extra = ckpt.load(base_dir)
      except LongjaxError as e:  # a killed or damaged write of the cache
        raise TrainingError(f"the cached tiny base {base_dir} cannot be read ({e}); delete "
                            f"{base_dir} and {base_dir.parent / 'base_run'} to build it again") \
            from None
      _check_tiny_base(base_dir, cfg, cached, extra.get("recipe"), recipe)
      cfg = cached
    else:
      params = _new_tiny_base(c, cfg, tokenizer, workdir, base_dir, recipe)
    cfg, params = methods.with_extra_params(method, cfg, params,
                                            method.settings(c, cfg.bos_token_id))
  cfg = cfg.replace(dtype=mc.dtype, remat=remat_mode(mc.remat))
  if mc.param_dtype:
    cfg = cfg.replace(param_dtype=mc.param_dtype)
  return cfg, jax.tree.map(np.asarray, params)


def _check_tiny_base(base_dir: Path, want, cached, cached_recipe, recipe):
  """The cached tiny base must be the one this config asks for: a changed model (or pretraining)
  config would otherwise resume on the old base and export it. Refused, not rebuilt: the
  workdir's checkpoints (and base_run/) belong to the old base."""
  skip = ("dtype", "param_dtype", "remat", "hf_extra")
  diff = [f"model.{k} {getattr(cached, k)!r} -> {getattr(want, k)!r}"
          for k in (f.name for f in dataclasses.fields(want))
          if k not in skip and getattr(cached, k) != getattr(want, k)]
  if cached_recipe is None:  # a base saved before the recipe was recorded
    log.info("%s predates the record of its pretraining settings: they are not checked", base_dir)
  else:
    a = traverse_util.flatten_dict(cached_recipe, sep=".")
    b = traverse_util.flatten_dict(recipe, sep=".")
    diff += [f"{'' if k == 'seed' else 'model.'}{k} {a.get(k)!r} -> {b.get(k)!r}"
             for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
  if diff:
    raise TrainingError(
        f"{base_dir} holds a tiny base model built for another config ({', '.join(diff)}; cached "
        f"-> this run): use another --config.workdir, or delete {base_dir} and "
        f"{base_dir.parent / 'base_run'} to pretrain it again")


def _new_tiny_base(c, cfg, tokenizer, workdir: Path, base_dir: Path, recipe):
  """Build the tiny base and cache it in ``base_dir``. With several processes, process 0 alone
  writes it (the others' writes would race it on the shared workdir) and every process reads it
  back (the same bytes everywhere); an untrained base is only built there (eager initialization
  is slow, and the others would build the same thing), a pretrained one by all (the pretraining
  is one run over them)."""
  from longjax.ckpts import checkpoint as ckpt
  params = None
  if jax.process_index() == 0 or c.model.pretrain.steps > 0:
    params = pretrain_tiny_base(c, cfg, tokenizer, workdir)
  if jax.process_index() == 0:
    ckpt.save(base_dir, cfg, params, extra=dict(recipe=recipe), overwrite=True)
    log.info("tiny base model saved to %s", base_dir)
  if jax.process_count() > 1:
    distributed.sync("longjax tiny base saved")
    _, params, _ = ckpt.load(base_dir)  # by every process: orbax reads with a barrier
  return params


def pretrain_tiny_base(c, cfg, tokenizer, workdir: Path):
  """The tiny configs' base LM: trained from scratch as a plain LM with contexts of
  ``model.pretrain.length`` tokens (its native window), all parameters trainable."""
  from longjax.models.decoder import init_params
  pc = c.model.pretrain
  params = jax.tree.map(np.asarray, init_params(cfg, seed=c.seed))
  if int(pc.steps) <= 0:
    return params
  sub = _pretrain_config(c, workdir)
  log.info("pretraining the tiny base LM: %d steps of %d x %d tokens", pc.steps, pc.batch,
           pc.length)
  out = Trainer(sub, resume=True, base=(cfg.replace(dtype="float32"), params),
                lm_length=int(pc.length)).run()
  return out["params"]


def _pretrain_config(c: RunConfig, workdir: Path) -> RunConfig:
  """The run config of the tiny base's pretraining: a plain LM run under ``workdir/base_run``
  on ``model.pretrain``'s data and optimizer settings, exporting nothing."""
  pc = c.model.pretrain
  data = dataclasses.replace(
      c.data, sources=pc.sources if pc.sources is not None else c.data.sources,
      min_length=int(pc.min_length), max_length=int(pc.max_length),
      loss_on=pc.loss_on or "all", synthetic=pc.synthetic or c.data.synthetic)
  train = dataclasses.replace(
      c.train, num_steps=int(pc.steps), global_batch=int(pc.batch), grad_accum=1,
      lr=float(pc.lr), warmup_steps=int(pc.warmup_steps), weight_decay=float(pc.weight_decay),
      save_every=int(pc.save_every) or int(pc.steps), export=False,
      init_from="")  # the asset is for the method run on top of this base, not the base's
  return c.replace(method=methods.PRETRAIN, workdir=str(workdir / "base_run"), data=data,
                   train=train)


def params_from_asset(c, settings, params, base_dir):
  """``params`` with the trained tensors of the asset ``train.init_from`` (a campaign continues
  from a committed asset: its tensors, a fresh optimizer; a checkpoint in the workdir still wins
  on resume). The asset's settings must equal this run's, except that a run may train more
  projections than the asset holds (``param`` a superset, e.g. q/k/v -> q/k/v/o): those start
  from this run's initialisation (the official copies of the base's)."""
  method = methods.get(c.method)
  src = Path(c.train.init_from)
  meta = check_asset(c)
  try:
    _, loaded_settings, loaded = method.load_asset(src, base_dir or None)
  except LongjaxError:
    raise
  except Exception as e:  # noqa: BLE001 -- a damaged asset fails in the reader's own words
    raise _unreadable(src, e) from None
  _check_asset_base(src, meta, params)
  diff = {k: (getattr(loaded_settings, k), getattr(settings, k))
          for k in settings.__dataclass_fields__
          if getattr(loaded_settings, k) != getattr(settings, k)}
  relaid = {k: diff.pop(k) for k in method.layout_only_fields if k in diff}
  widened = _widened_projections(diff)
  if diff and widened is None:
    raise TrainingError(f"train.init_from={src}: its {c.method} settings differ from this run's "
                        f"(asset vs config: {diff}); set the config's {method.section} fields to "
                        "the asset's (only the projections may grow: q/k/v -> q/k/v/o)")
  flat = traverse_util.flatten_dict(jax.tree.map(np.asarray, params), sep="/")
  new = traverse_util.flatten_dict(loaded, sep="/")
  fresh = []
  for k in flat:
    if method.is_trainable(k):
      if widened and any(f"alt_{p}_proj/" in k for p in widened):
        fresh.append(k)  # a projection the asset does not train: keep this run's initial copy
        continue
      if np.shape(new[k]) != np.shape(flat[k]):
        raise TrainingError(f"train.init_from={src}: {k} has shape {np.shape(new[k])}, this "
                            f"model needs {np.shape(flat[k])}")
      flat[k] = np.asarray(new[k], np.float32)
  log.info("train.init_from: trained %s tensors from %s%s%s", c.method, src,
           f"; new projections {sorted(widened)} from their initial copies ({len(fresh)} tensors)"
           if widened else "", f"; trained with other layout or reading settings (asset vs "
           f"run: {relaid})"
           if relaid else "")
  return traverse_util.unflatten_dict(flat, sep="/")


def _unreadable(src, e) -> TrainingError:
  return TrainingError(f"train.init_from={src}: the asset cannot be read ({type(e).__name__}: "
                       f"{' '.join(str(e).split())[:200]}): truncated or damaged; export it again")


def check_asset(c) -> dict:
  """The cheap part of ``train.init_from``, before the base is loaded (or a tiny one
  pretrained): the asset directory, its JSON and its tensors readable. Returns its JSON."""
  import json
  from longjax.ckpts import assets
  method = methods.get(c.method)
  if not method.assets:
    raise TrainingError(f"train.init_from is for methods that ship trained-tensor assets; "
                        f"this run is {c.method!r}")
  src = Path(c.train.init_from)
  if not src.is_dir():
    raise TrainingError(f"train.init_from={src}: no such asset directory")
  meta_path = src / f"{method.name}.json"
  if not meta_path.is_file() or not assets.has_tensors(src, method.name):
    raise TrainingError(f"train.init_from={src}: not a {method.name} asset (needs {meta_path.name} "
                        f"and {method.name}.safetensors or its shards)")
  try:
    meta = json.loads(meta_path.read_text(encoding="utf-8"))
    if not isinstance(meta, dict):
      raise TrainingError(f"train.init_from={src}: the asset cannot be read ({meta_path.name} "
                          f"holds a JSON {type(meta).__name__}, not an object); export it again")
    assets.read_tensors(src, method.name)
  except TrainingError:
    raise
  except LongjaxError as e:  # the asset checks' own line (a cut shard, NaN, a file outside it)
    raise TrainingError(f"train.init_from={src}: {e}") from None
  except Exception as e:  # noqa: BLE001 -- a cut JSON, a truncated shard, in their own words
    raise _unreadable(src, e) from None
  return meta


def _check_asset_base(src, meta: dict, params):
  """The asset's tensors were trained on this run's base (the fingerprint its export recorded);
  an asset written before the fingerprint was recorded is taken with a note."""
  from longjax.ckpts import assets
  want = meta.get(assets.BASE_WEIGHTS_KEY)
  if want is None:
    log.warning("train.init_from=%s records no fingerprint of its base (exported by an older "
                "version): not checked that it was trained on this run's base", src)
    return
  have = assets.base_fingerprint(params)
  if have != want:
    raise TrainingError(f"train.init_from={src} was trained on another base model (base weights "
                        f"fingerprint {want}, this run's base {have}); start from an asset of "
                        "this base, or set model.checkpoint to the asset's base")


def _widened_projections(diff):
  """The projections a run adds to its asset's (``diff`` differs only in ``param``, the asset's
  a subset of the run's), or None when the difference is anything else; empty without one."""
  if not diff:
    return set()
  if len(diff) != 1 or not set(diff) <= PROJECTION_FIELDS:
    return None
  had, want = (set(x) for x in next(iter(diff.values())))
  return (want - had) if had < want else None


# the settings field naming a method's trained projections (beacon, FocusLLM)
PROJECTION_FIELDS = {"param", "candidate_projections"}


# --------------------------------------------------------------------------------------------
def step_functions(task, opt):
  """``(grad_fn, apply, fused)``: the training step's pure functions (jitted by the Trainer; the
  compile-only TPU report lowers the same ``fused``). ``task.loss(params, plans)`` gives per-sample
  ``(loss_sum, loss_count)``; ``opt`` is the optax optimizer."""

  def loss_fn(trainable, frozen, plans):
    params = layout.merge_trainable(trainable, frozen)
    ls, lc = task.loss(params, plans)
    valid = lc > 0
    per = ls / jnp.maximum(lc, 1).astype(jnp.float32)
    loss = jnp.sum(jnp.where(valid, per, 0.0)) / jnp.maximum(jnp.sum(valid), 1)
    return loss, jnp.sum(lc)

  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

  def apply(trainable, opt_state, grads, loss):
    # The guard runs here, before anything is applied or saved: a non-finite loss or gradient
    # (finite_in) or an update that leaves non-finite weights (finite_out) keeps the old state
    # (the inputs are donated, so the host could not get it back) and the host stops the run.
    updates, new_opt = opt.update(grads, opt_state, trainable)
    new = optax.apply_updates(trainable, updates)
    finite_in = jnp.isfinite(loss) & jnp.isfinite(optax.tree.norm(grads))
    finite_out = jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(new)]))
    ok = finite_in & finite_out
    keep = lambda n, o: jnp.where(ok, n, o)
    return (jax.tree.map(keep, new, trainable), jax.tree.map(keep, new_opt, opt_state),
            dict(finite_in=finite_in, finite_out=finite_out))

  def fused(trainable, opt_state, frozen, plans):
    (loss, ntok), grads = grad_fn(trainable, frozen, plans)
    gnorm = optax.tree.norm(grads)
    trainable, opt_state, flags = apply(trainable, opt_state, grads, loss)
    return trainable, opt_state, dict(loss=loss, grad_norm=gnorm, label_tokens=ntok, **flags)

  return grad_fn, apply, fused


class Trainer:
  def __init__(self, c: RunConfig, *, resume: bool = True, base=None,
               lm_length: Optional[int] = None):
    if not isinstance(c, RunConfig):  # a ConfigDict: it is typed and checked once, at the edge
      raise TrainingError(f"Trainer takes a RunConfig (longjax.run_config.from_config(config)), "
                          f"not a {type(c).__name__}")
    self.c = c
    self.resume = resume
    self.workdir = Path(c.workdir).absolute()
    self.primary = jax.process_index() == 0
    self.base = base
    self.lm_length = lm_length

  # ------------------------------------------------------------------------------------------
  def setup(self):
    c, tc = self.c, self.c.train
    ckpt = checkpoint_dir(c)
    if not ckpt and c.model.name:
      raise TrainingError(f"this config trains {c.model.name}: pass --config.model.checkpoint="
                          "/path/to/its HF (or longjax) directory; nothing is downloaded")
    if ckpt and not Path(ckpt).is_dir():
      raise TrainingError(f"--config.model.checkpoint={c.model.checkpoint}: no such directory")
    self.workdir.mkdir(parents=True, exist_ok=True)
    try:  # the same rule as eval.py: the model's own tokenizer unless the config names one
      tok_spec = choose_tokenizer(c, ckpt)
    except TokenizerChoiceError as e:
      raise TrainingError(str(e)) from None
    self.tokenizer = get_tokenizer(tok_spec)
    if tc.init_from:  # a damaged asset is refused before a tiny base is pretrained for it
      check_asset(c)
    if self.base is not None:
      self.cfg, params = self.base
    else:
      self.cfg, params = load_base(c, self.tokenizer, self.workdir)
    if self.tokenizer.vocab_size > self.cfg.vocab_size:
      raise TrainingError(f"tokenizer {tok_spec} has {self.tokenizer.vocab_size} ids but the "
                          f"model's vocabulary is {self.cfg.vocab_size}")
    t0 = time.time()
    self.ds = pipeline.build_dataset(c.data, self.tokenizer, c.seed)
    log.info("data: %s (%.1fs)", self.ds.stats, time.time() - t0)
    self.method = methods.get(c.method)
    self.settings = self.method.settings(c, self.cfg.bos_token_id)
    self.task = self.method.make_task(c, self.cfg, self.settings,
                                      max_length=int(self.ds.lengths.max()),
                                      lm_length=self.lm_length)
    check_data = getattr(self.task, "check_data", None)
    if check_data is not None:  # data the task cannot draw from: one error before any compile
      check_data(self.ds)
    pipeline.check_teacher_context(self.ds, c.data.loss_on, self.cfg.max_position_embeddings)
    gb = tc.global_batch
    accum = tc.grad_accum
    if gb % accum:
      raise TrainingError(f"train.global_batch ({gb}) must be divisible by train.grad_accum "
                          f"({accum})")
    self.accum = accum
    self.batches = pipeline.GlobalBatches(self.ds.lengths, gb, c.seed,
                                          group_key=self.task.group_key
                                          if self.method.groups_by_windows else None)
    self.num_steps = tc.num_steps or self.batches.batches_per_epoch * tc.num_epochs
    # checked at from_config (a curriculum only for a windowed method); here: the data's windows
    self.curriculum = curriculum.parse(c.data.curriculum)
    for _, windows in self.curriculum:  # every stage must find batches, before any compile
      self.batches.check_max_key(windows)

    self.mesh = shd.make_mesh(dataclasses.asdict(tc.mesh))
    micro = gb // accum
    nb = self.mesh.shape["data"] * self.mesh.shape["fsdp"]
    if micro % nb and self.method.batch_divides_mesh:
      raise TrainingError(f"the micro-batch ({micro} = global_batch/grad_accum) must be divisible "
                          f"by the data*fsdp mesh size ({nb})")
    if tc.init_from:
      params = params_from_asset(c, self.settings, params, ckpt)
    tr, fr = split_params(params, self.method)
    tr = jax.tree.map(lambda x: np.asarray(x, np.float32), tr)  # fp32 master weights
    fr_dtype = self.cfg.params_dtype
    fr = jax.tree.map(lambda x: np.asarray(x).astype(fr_dtype), fr)
    self.tr_sh = shd.param_shardings(tr, self.mesh)
    self.fr_sh = shd.param_shardings(fr, self.mesh)
    self.frozen = jax.tree.map(shd.put_global, fr, self.fr_sh)
    trainable = jax.tree.map(shd.put_global, tr, self.tr_sh)
    self.n_trainable = int(sum(x.size for x in jax.tree.leaves(tr)))
    self.n_frozen = int(sum(x.size for x in jax.tree.leaves(fr)))
    self.optimizer, self.schedule = make_optimizer(tc, self.num_steps)
    opt_state = jax.jit(self.optimizer.init, out_shardings=None)(trainable)
    # Optimizer moments are laid out like their parameters.
    opt_state = _shard_like_params(opt_state, trainable, self.mesh)
    self.opt_sh = jax.tree.map(lambda x: x.sharding, opt_state)
    self.state = {"params": trainable, "opt_state": opt_state,
                  "step": shd.put_global(np.int32(0), shd.replicated(self.mesh))}
    section = c.method_section()
    self.meta = fingerprint(c.method, self.cfg, tr, frozen=fr,
                            method_config=to_dict(section) if section is not None else {})
    self._build_steps()

  # ------------------------------------------------------------------------------------------
  def _build_steps(self):
    grad_fn, apply, fused = step_functions(self.task, self.optimizer)
    self._fused = jax.jit(fused, donate_argnums=(0, 1),
                          out_shardings=(self.tr_sh, self.opt_sh, None))
    self._grad = jax.jit(grad_fn)
    self._apply = jax.jit(apply, donate_argnums=(0, 1),
                          out_shardings=(self.tr_sh, self.opt_sh, None))

  def _device_plans(self, plans):
    """Shard each plan leaf's batch axis over (data, fsdp). Leaves without one (scalars, the
    beacon scan's per-step ``active`` flags, ``[steps]``) are replicated. With several processes
    every one prepares the whole global batch (deterministic in the seed and step; the plans'
    padded shapes depend on all its rows) and puts only its own devices' rows on them."""
    ax = self.method.plan_batch_axis

    def put(x):
      x = np.asarray(x)
      if x.ndim <= ax:
        return shd.put_global(x, shd.replicated(self.mesh))
      return shd.put_global(x, shd.batch_sharding(self.mesh, x.ndim, ax, x.shape[ax]))

    return jax.tree.map(put, plans)

  # ------------------------------------------------------------------------------------------
  def run(self) -> dict:
    """Set up, train ``num_steps`` steps (resuming from the workdir's latest readable
    checkpoint), save and export: ``{start_step, final_step, last_saved, seconds}`` and
    ``export`` (the export's directory) or ``params`` (a method that exports nothing)."""
    with self._workdir_lock():
      tc = self.c.train
      self.setup()
      ck = Checkpointer(self.workdir / "checkpoints", keep=tc.keep,
                        async_save=tc.async_checkpoint)
      metrics = MetricsWriter(self.workdir, tensorboard=tc.tensorboard, primary=self.primary)
      start = self._resume(ck, metrics)
      trainable, opt_state = self.state["params"], self.state["opt_state"]
      save_every = tc.save_every
      bar = _progress(self.num_steps, start, self.primary and tc.progress, self.c.method)
      records = _StepRecords(metrics, bar, max(1, tc.log_every), self.num_steps)
      last_saved, step, t_start = start, start, time.time()
      programs = _ProgramCount()
      try:
        for step in range(start + 1, self.num_steps + 1):
          t0 = time.time()
          preps = self._prepare(step)
          if self.accum == 1:
            trainable, opt_state, m = self._fused(trainable, opt_state, self.frozen,
                                                  self._device_plans(preps[0]["plans"]))
          else:
            trainable, opt_state, m = self._accumulated_step(trainable, opt_state, preps)
          m = self._host_metrics(step, m)
          dt = time.time() - t0
          self._stop_on_nonfinite_update(ck, step, m, trainable, opt_state, preps)
          records.write(dict(step=step, loss=m["loss"], lr=m["lr"], grad_norm=m["grad_norm"],
                             label_tokens=int(m["label_tokens"]),
                             tokens=sum(p["tokens"] for p in preps), step_time_s=round(dt, 4),
                             epoch=self.batches.epoch, **programs.record(preps),
                             **({"max_windows": curriculum.max_windows(self.curriculum, step)}
                                if self.curriculum else {})), dt)
          if save_every and step % save_every == 0 or step == self.num_steps:
            self._save(ck, step, trainable, opt_state)
            last_saved = step
          if (step % map_count.CHECK_EVERY == 0 and step < self.num_steps
              and jax.process_count() == 1):
            why = map_count.near_limit()
            if why:  # stop with a checkpoint instead of an abort inside the next compile
              if last_saved != step:
                self._save(ck, step, trainable, opt_state)
              ck.wait()
              raise TrainingError(
                  f"stopped after step {step} (saved): {why}. Rerun the same command to resume "
                  "in a fresh process, or raise the limit first: sysctl -w "
                  "vm.max_map_count=262144")
        ck.wait()
      finally:
        records.close()
        with contextlib.suppress(Exception):
          ck.close()
      self.state = {"params": trainable, "opt_state": opt_state, "step": self.state["step"]}
      result = dict(start_step=start, final_step=step, last_saved=last_saved,
                    seconds=time.time() - t_start)
      return self._finish(trainable, result)

  @contextlib.contextmanager
  def _workdir_lock(self):
    """One run per workdir: two would interleave checkpoints, metrics and the export. Process 0
    takes it on behalf of all the processes of a multi-process run."""
    if self.workdir.exists() and not self.workdir.is_dir():
      raise TrainingError(f"--config.workdir={self.workdir} is a file, not a directory; choose "
                          "another --config.workdir")
    self.workdir.mkdir(parents=True, exist_ok=True)
    held, refused = None, None
    if self.primary:
      try:
        held = lock.acquire(self.workdir)
      except Exception as e:  # noqa: BLE001 - re-raised below, once the others know
        refused = e
    # The other processes learn process 0's outcome here instead of waiting for it at the first
    # collective until a timeout.
    if not distributed.agree(refused is None):
      raise refused or lock.WorkdirLocked(
          f"process 0 could not take the lock of {self.workdir} (its error says why)")
    try:
      yield
    finally:
      if held:
        lock.release(held)

  def _resume(self, ck, metrics) -> int:
    """The step to continue after: the latest readable checkpoint's (its state, data position
    and metrics restored), or 0 for a new run; the run's config is written beside them."""
    c, tc = self.c, self.c.train
    start = 0
    if ck.all_steps():
      if not self.resume:
        raise TrainingError(f"{ck.dir} already holds checkpoints {ck.all_steps()} and resuming "
                            "is off (--noresume): use a new --config.workdir or delete it")
      abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                              self.state)
      got = ck.restore(abstract, self.meta)
      if got is not None:
        start, restored, data_state = got
        self.state = restored
        self.batches.set_state(data_state)
        metrics.truncate_after(start)
        log.info("resumed from %s step %d", ck.dir, start)
    elif self.primary:
      metrics.reset()
    if self.primary:
      (self.workdir / "config.json").write_text(
          json.dumps(to_dict(c), indent=2, default=str, sort_keys=True))  # as ConfigDict wrote it
    log.info("%s: %d trainable / %d frozen parameters, %d steps, mesh %s, global batch %d",
             c.method, self.n_trainable, self.n_frozen, self.num_steps, dict(self.mesh.shape),
             tc.global_batch)
    return start

  def _prepare(self, step: int) -> list:
    """The next global batch, prepared on the host as ``grad_accum`` micro-batches."""
    idx = self.batches.take(curriculum.max_windows(self.curriculum, step))
    micro = np.array_split(np.asarray(idx), self.accum)
    offsets = np.cumsum([0] + [len(m) for m in micro])
    return [self.task.prepare(self.ds, m, step, row_offset=int(o))
            for m, o in zip(micro, offsets)]

  def _accumulated_step(self, trainable, opt_state, preps):
    """One update from the micro-batches' gradients, averaged (``grad_accum > 1``)."""
    gsum, lsum, lab = None, 0.0, 0
    for p in preps:
      (l, nt), g = self._grad(trainable, self.frozen, self._device_plans(p["plans"]))
      gsum = g if gsum is None else jax.tree.map(jnp.add, gsum, g)
      lsum, lab = lsum + l, lab + nt
    grads = jax.tree.map(lambda x: x / self.accum, gsum)
    trainable, opt_state, flags = self._apply(trainable, opt_state, grads, lsum / self.accum)
    m = dict(loss=lsum / self.accum, grad_norm=optax.tree.norm(grads), label_tokens=lab, **flags)
    return trainable, opt_state, m

  def _host_metrics(self, step: int, m: dict) -> dict:
    m = {k: float(v) for k, v in jax.device_get(m).items()}
    m["lr"] = float(self.schedule(step - 1))
    return m

  def _stop_on_nonfinite_update(self, ck, step, m, trainable, opt_state, preps):
    """Stop the run on a step whose update was not applied (non-finite), and judge the last
    step's weights (no next step will)."""
    finite_in = bool(m.pop("finite_in")) and math.isfinite(m["loss"])
    finite_out = bool(m.pop("finite_out"))
    if not (finite_in and finite_out):
      _stop_nonfinite(ck, step, m, finite_in)
    if step == self.num_steps:
      self._check_final(ck, step, trainable, opt_state, preps)

  def _save(self, ck, step, trainable, opt_state):
    self.state = {"params": trainable, "opt_state": opt_state,
                  "step": shd.put_global(np.int32(step), shd.replicated(self.mesh))}
    ck.save(step, self.state, self.batches.get_state(), self.meta)

  def _finish(self, trainable, result: dict) -> dict:
    if not self.method.exports:  # the tiny base's pretraining: its parameters are the result
      full = layout.merge_trainable(distributed.to_host(trainable),
                                    distributed.to_host(self.frozen))
      result["params"] = full
      return result
    if self.c.train.export:
      result["export"] = str(self.export())
    return result

  def _check_final(self, ck, step, trainable, opt_state, preps):
    """The last update's weights, before they are saved or exported: every other step's weights
    are judged by the next step's loss and gradient (a finite but poisoned update, e.g. ~1e38
    after a too-large lr, gives a non-finite one). Here the same check runs on copies, over the
    step's own batch, with the already compiled step functions."""
    plans = self._device_plans(preps[0]["plans"])
    if self.accum == 1:
      copy = lambda t: jax.tree.map(jnp.copy, t)  # noqa: E731 -- _fused donates its inputs
      _, _, m = self._fused(copy(trainable), copy(opt_state), self.frozen, plans)
      loss, gnorm = m["loss"], m["grad_norm"]
    else:
      (loss, _), grads = self._grad(trainable, self.frozen, plans)
      gnorm = optax.tree.norm(grads)
    loss, gnorm = float(loss), float(gnorm)
    if math.isfinite(loss) and math.isfinite(gnorm):
      return
    ck.wait()
    kept = ck.all_steps()
    kept = (f"the last good checkpoint (step {kept[-1]}) in {ck.dir} is kept" if kept else
            f"no checkpoint is left in {ck.dir}")
    raise TrainingError(
        f"the last update (step {step}) gave weights whose loss ({loss}) or gradient norm "
        f"({gnorm}) on its own batch is non-finite: they are neither saved nor exported; {kept}; "
        "lower train.lr or check the data before rerunning")

  # ------------------------------------------------------------------------------------------
  def trained_params(self):
    """Full parameter tree (numpy): the frozen base as loaded + the trained tensors."""
    tr = distributed.to_host(self.state["params"])
    _, base = load_base(self.c, self.tokenizer, self.workdir)
    flat = traverse_util.flatten_dict(base, sep="/")
    for k, v in traverse_util.flatten_dict(tr, sep="/").items():
      flat[k] = v.astype(np.asarray(flat[k]).dtype)
    return traverse_util.unflatten_dict(flat, sep="/")

  def export(self) -> Path:
    out = self.workdir / "export_hf"
    params = self.trained_params()
    if not self.primary:
      return out
    self.method.export(out, self.cfg.replace(dtype="float32", remat=False), self.settings, params)
    save_with_model(self.tokenizer, out)  # eval.py then finds the export's own tokenizer
    log.info("exported the trained model (HF format, official tensor names) to %s", out)
    return out


class _ProgramCount:
  """What each step's record says about the compiled work: ``padding_share`` (positions the step
  computes that hold no token: padding rows, slots and scan steps, over all it computes) and
  ``programs`` (distinct step programs compiled so far in this process: one per distinct plan
  structure and leaf shapes, as jit keys them). Both are what host planning controls: a new
  program costs a compile, padding costs compute."""

  def __init__(self):
    self.seen = set()

  def record(self, preps) -> dict:
    for p in preps:
      leaves, treedef = jax.tree_util.tree_flatten(p["plans"])
      self.seen.add((treedef, tuple((np.shape(x), np.asarray(x).dtype.str) for x in leaves)))
    out = dict(programs=len(self.seen))
    occ = [p["occupancy"] for p in preps if "occupancy" in p]
    if occ:
      real, computed = (sum(x) for x in zip(*occ))
      out["padding_share"] = round(1.0 - real / max(computed, 1), 4)
    return out


class _StepRecords:
  """Each step's record: to the metrics (every ``log_every`` steps and the last, with the tokens
  per second since the previous record) and the progress bar."""

  def __init__(self, metrics: MetricsWriter, bar, log_every: int, last_step: int):
    self.metrics, self.bar, self.log_every, self.last_step = metrics, bar, log_every, last_step
    self.tokens, self.t_log = 0, time.time()

  def write(self, rec: dict, dt: float):
    self.tokens += rec["tokens"]
    if rec["step"] % self.log_every == 0 or rec["step"] == self.last_step:
      el = time.time() - self.t_log
      rec["tokens_per_s"] = round(self.tokens / max(el, 1e-9), 1)
      self.tokens, self.t_log = 0, time.time()
      self.metrics.write(rec)
    if self.bar is not None:
      self.bar.set_postfix(loss=f"{rec['loss']:.4f}", tok_s=f"{rec['tokens'] / max(dt, 1e-9):.0f}",
                           step_s=f"{dt:.2f}")
      self.bar.update(1)

  def close(self):
    if self.bar is not None:
      self.bar.close()
    self.metrics.close()


def _stop_nonfinite(ck, step, m, finite_in: bool):
  """Stop the run on a step whose update was not applied (see ``apply``). A non-finite loss or
  gradient at ``step`` was computed from the weights of step-1: finite but poisoned ones (e.g.
  ~1e38 after a too-large lr) pass any finiteness check on the update that made them, so a
  checkpoint of step-1 is set aside and the one before it is the last good one."""
  ck.wait()
  moved = ""
  if not finite_in and step - 1 in ck.all_steps():
    ck.set_aside([step - 1], "nonfinite")
    moved = f"the checkpoint of step {step - 1}, whose weights gave it, is set aside; "
  what = (f"non-finite loss ({m['loss']})" if not math.isfinite(m["loss"]) else
          f"non-finite gradient norm ({m['grad_norm']})" if not finite_in else
          "an update to non-finite weights")
  kept = ck.all_steps()
  kept = (f"the last good checkpoint (step {kept[-1]}) in {ck.dir} is kept" if kept else
          f"no good checkpoint is left in {ck.dir}")
  raise TrainingError(f"{what} at step {step}: training stopped without applying it; {moved}"
                      f"{kept}; lower train.lr or check the data before rerunning")


def _shard_like_params(opt_state, params, mesh):
  """Put every optimizer leaf shaped like a parameter on that parameter's sharding."""
  shapes = {}
  for leaf in jax.tree.leaves(params):
    shapes.setdefault((leaf.shape, str(leaf.dtype)), leaf.sharding)

  def put(x):
    sh = shapes.get((x.shape, str(x.dtype)))
    return jax.device_put(x, sh if sh is not None else shd.replicated(mesh))
  return jax.tree.map(put, opt_state)


def _progress(total, start, enabled, desc):
  if not enabled:
    return None
  try:
    from tqdm.auto import tqdm
  except ImportError:
    return None
  return tqdm(total=total, initial=start, desc=f"train {desc}", unit="step", mininterval=1.0,
              file=sys.stderr, dynamic_ncols=True)
