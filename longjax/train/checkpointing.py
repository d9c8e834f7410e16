"""Training checkpoints with orbax: trainable params + optimizer state + step (one pytree),
the data iterator state and a model fingerprint (JSON), keep-N, async where available.

Restoring tries the newest step first; a step that cannot be read (truncated/corrupt files) is
reported and the previous one is used. A checkpoint written for a different model or method is
an error, never silently loaded.
"""
from __future__ import annotations

import dataclasses
import gc
import hashlib
import json
import logging
from pathlib import Path
from typing import Optional

import jax

from longjax.errors import LongjaxError
from longjax.ckpts.fingerprint import weights_hash, weights_hash_full  # noqa: F401 (re-exported)
from longjax.ckpts.orbax_noise import quiet_unraisable, short_error
from longjax.train.errors import TrainingError

log = logging.getLogger("longjax.train")


class CheckpointMismatch(LongjaxError, ValueError):
  """The checkpoint directory belongs to a different model / method / trainable set."""


_LEGACY_MODEL_KEYS = ("family", "vocab_size", "hidden_size", "num_layers", "num_heads",
                      "num_kv_heads", "head_dim", "intermediate_size")
_RUNTIME_KEYS = ("dtype", "remat", "hf_extra")  # may change on resume; hf_extra repeats the rest


def fingerprint(method: str, cfg, trainable, *, method_config=None, frozen=None) -> dict:
  """What defines a run: method, model config, the method's config, the trainable shapes and a
  content hash of the frozen base weights. Resuming compares them field by field."""
  shapes = {"/".join(str(getattr(k, "key", k)) for k in path): list(leaf.shape)
            for path, leaf in jax.tree_util.tree_leaves_with_path(trainable)}
  model = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)
           if f.name not in _RUNTIME_KEYS}
  legacy = {k: model[k] for k in _LEGACY_MODEL_KEYS}
  # the digest stays the old shapes-only one, so that older code still resumes these checkpoints
  digest = hashlib.sha256(json.dumps([method, legacy, shapes], sort_keys=True).encode()).hexdigest()
  meta = {"method": method, "model": model, "method_config": dict(method_config or {}),
          "base_weights": weights_hash(frozen) if frozen is not None else None,
          "base_weights_full": weights_hash_full(frozen) if frozen is not None else None,
          "trainable_shapes": shapes, "digest": digest[:16]}
  return json.loads(json.dumps(meta, default=str))  # as it reads back (tuples -> lists)


class _HoldOrbaxErrors(logging.Filter):
  """Keeps orbax's own error records (each failed background write thread logs its exception
  with a traceback: dozens for one full disk) off the console while a Checkpointer lives; the
  failure itself reaches the trainer as one :class:`TrainingError` line
  (:meth:`Checkpointer._failed`)."""

  def __init__(self):
    super().__init__()
    self.held = []

  def filter(self, record):
    if record.levelno >= logging.ERROR and "orbax" in (record.pathname or ""):
      self.held.append(record.getMessage().split("\n", 1)[0][:200])
      return False
    return True


class Checkpointer:
  def __init__(self, directory, *, keep: int = 3, async_save: bool = True):
    import orbax.checkpoint as ocp
    self.ocp = ocp
    self.dir = Path(directory).absolute()
    self.dir.mkdir(parents=True, exist_ok=True)
    opts = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True,
                                        enable_async_checkpointing=async_save)
    self.mgr = ocp.CheckpointManager(self.dir, options=opts)
    self._orbax_errors = _HoldOrbaxErrors()
    logging.getLogger("absl").addFilter(self._orbax_errors)

  def all_steps(self):
    return sorted(self.mgr.all_steps())

  def save(self, step: int, state, data_state: dict, meta: dict, force: bool = False):
    a = self.ocp.args
    try:
      self.mgr.save(step, args=a.Composite(state=a.StandardSave(state),
                                           data=a.JsonSave(data_state), meta=a.JsonSave(meta)),
                    force=force)
    except Exception as e:  # noqa: BLE001 -- this or the previous (async) save failed
      raise self._failed(step, e) from e

  def _failed(self, step, e) -> TrainingError:
    """One line for a save that failed (a full disk, an I/O error), its partial step removed; the
    newest complete step is what a rerun resumes from."""
    import shutil
    if jax.process_index() == 0:
      for partial in self.dir.glob("*.orbax-checkpoint-tmp*"):
        shutil.rmtree(partial, ignore_errors=True)
    if self._orbax_errors.held:
      log.debug("orbax reported %d errors while saving: %s", len(self._orbax_errors.held),
                self._orbax_errors.held[:3])
    text = " ".join(str(e).split())
    why = "No space left on device" if "No space left on device" in text else short_error(e, 200)
    done = [s for s in self.all_steps() if step is None or s < step]
    return TrainingError(f"cannot save a checkpoint in {self.dir}"
                         + (f" (step {step})" if step is not None else "")
                         + f": {type(e).__name__}: {why}; free space (or fix the disk), then rerun "
                         "the same command: it resumes from "
                         + (f"step {done[-1]}" if done else "the start (no step was saved)"))

  def set_aside(self, steps, why: str = "unreadable"):
    """Rename steps to ``<step>.<why>`` (kept for inspection, out of the way of resuming and of
    the steps this run will write again)."""
    if not steps or jax.process_index() != 0:
      return
    for step in steps:
      src = self.dir / str(step)
      if src.exists():
        dst = self.dir / f"{step}.{why}"
        n = 1
        while dst.exists():
          dst, n = self.dir / f"{step}.{why}.{n}", n + 1
        src.rename(dst)
        log.warning("moved the %s checkpoint %s to %s", why, src, dst)
    self.mgr.reload()

  def wait(self):
    try:
      self.mgr.wait_until_finished()
    except Exception as e:  # noqa: BLE001 -- the async save in flight failed
      raise self._failed(None, e) from e

  def close(self):
    try:
      self.wait()
    finally:
      self.mgr.close()
      logging.getLogger("absl").removeFilter(self._orbax_errors)

  def restore(self, abstract_state, expected_meta: dict) -> Optional[tuple]:
    """``(step, state, data_state)`` from the newest readable checkpoint, or ``None``."""
    a = self.ocp.args
    steps = self.all_steps()
    bad = []
    for step in reversed(steps):
      try:
        meta = self._restore(step, a.Composite(meta=a.JsonRestore())).meta
      except Exception as e:  # noqa: BLE001 - any read failure means "unreadable"
        log.warning("checkpoint step %d in %s is unreadable (%s: %s); falling back to the "
                    "previous one", step, self.dir, type(e).__name__, short_error(e))
        bad.append(step)
        continue
      _check_meta(meta, expected_meta, self.dir, step)
      try:
        r = self._restore(step, a.Composite(state=a.StandardRestore(abstract_state),
                                            data=a.JsonRestore()))
      except Exception as e:  # noqa: BLE001
        log.warning("checkpoint step %d in %s is truncated or corrupt (%s: %s); falling back to "
                    "the previous one", step, self.dir, type(e).__name__, short_error(e))
        bad.append(step)
        continue
      self.set_aside(bad)
      return step, r.state, r.data
    if steps:
      raise TrainingError(f"none of the checkpoints {steps} in {self.dir} could be read "
                          "(truncated or corrupt); remove the directory (or use a new "
                          "--config.workdir) to start afresh")
    return None

  def _restore(self, step, args):
    """``mgr.restore`` with orbax's and tensorstore's background noise about a truncated step
    (hundreds of "Exception ignored in ..." lines from their abandoned tasks) kept to one
    debug log line: the caller reports the failure itself."""
    with quiet_unraisable(f"reading checkpoint step {step}"):
      try:
        return self.mgr.restore(step, args=args)
      finally:
        gc.collect()  # abandoned coroutines/futures report here, inside the quiet block


def _check_meta(meta: dict, want: dict, where, step):
  if meta.get("method") != want["method"]:
    raise CheckpointMismatch(f"checkpoint {where} (step {step}) was written by a "
                             f"{meta.get('method')!r} run, this run trains {want['method']!r}; use "
                             "another --config.workdir")
  diff, unknown = [], []
  for sec, label in (("model", "model"), ("method_config", want["method"])):
    have = meta.get(sec)
    for k, v in want[sec].items():
      if have is None or k not in have:  # written before the field was recorded
        unknown.append(f"{label}.{k}")
      elif have[k] != v:
        diff.append(f"{label}.{k} {have[k]!r} -> {v!r}")
  shapes_a, shapes_b = meta.get("trainable_shapes", {}), want["trainable_shapes"]
  sdiff = sorted(set(shapes_a) ^ set(shapes_b)) or sorted(
      k for k in shapes_b if shapes_a.get(k) != shapes_b[k])
  if sdiff:
    diff.append(f"trainable parameters differ ({sdiff[:6]})")
  if meta.get("base_weights") is None:
    unknown.append("base_weights")
  elif meta["base_weights"] != want["base_weights"]:
    diff.append(f"base weights differ (content hash {meta['base_weights']} -> "
                f"{want['base_weights']})")
  elif (meta.get("base_weights_full") is not None  # older checkpoints: the sampled hash only
        and meta["base_weights_full"] != want.get("base_weights_full")):
    diff.append(f"base weights differ (full hash {meta['base_weights_full']} -> "
                f"{want.get('base_weights_full')})")
  if diff:
    raise CheckpointMismatch(f"checkpoint {where} (step {step}) is from a different model or "
                             f"method setup ({'; '.join(diff)}; checkpoint -> this run): use "
                             "another --config.workdir for this model")
  if unknown:
    log.warning("checkpoint %s (step %d) predates these fingerprint fields, not checked: %s",
                where, step, ", ".join(unknown))
