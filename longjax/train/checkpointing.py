"""Training checkpoints with orbax: trainable params + optimizer state + step (one pytree),
the data iterator state and a model fingerprint (JSON), keep-N, async where available.

Restoring tries the newest step first; a step that cannot be read (truncated/corrupt files) is
reported and the previous one is used. A checkpoint written for a different model or method is
an error, never silently loaded.
"""
from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Optional

import jax

log = logging.getLogger("longjax.train")


class CheckpointMismatch(ValueError):
  """The checkpoint directory belongs to a different model / method / trainable set."""


def fingerprint(method: str, cfg, trainable) -> dict:
  shapes = {"/".join(str(getattr(k, "key", k)) for k in path): list(leaf.shape)
            for path, leaf in jax.tree_util.tree_leaves_with_path(trainable)}
  model = {k: getattr(cfg, k) for k in ("family", "vocab_size", "hidden_size", "num_layers",
                                        "num_heads", "num_kv_heads", "head_dim",
                                        "intermediate_size")}
  digest = hashlib.sha256(json.dumps([method, model, shapes], sort_keys=True).encode()).hexdigest()
  return {"method": method, "model": model, "trainable_shapes": shapes, "digest": digest[:16]}


class Checkpointer:
  def __init__(self, directory, *, keep: int = 3, async_save: bool = True):
    import orbax.checkpoint as ocp
    self.ocp = ocp
    self.dir = Path(directory).absolute()
    self.dir.mkdir(parents=True, exist_ok=True)
    opts = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True,
                                        enable_async_checkpointing=async_save)
    self.mgr = ocp.CheckpointManager(self.dir, options=opts)

  def all_steps(self):
    return sorted(self.mgr.all_steps())

  def save(self, step: int, state, data_state: dict, meta: dict, force: bool = False):
    a = self.ocp.args
    self.mgr.save(step, args=a.Composite(state=a.StandardSave(state), data=a.JsonSave(data_state),
                                         meta=a.JsonSave(meta)), force=force)

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
    self.mgr.wait_until_finished()

  def close(self):
    self.mgr.wait_until_finished()
    self.mgr.close()

  def restore(self, abstract_state, expected_meta: dict) -> Optional[tuple]:
    """``(step, state, data_state)`` from the newest readable checkpoint, or ``None``."""
    a = self.ocp.args
    steps = self.all_steps()
    bad = []
    for step in reversed(steps):
      try:
        meta = self.mgr.restore(step, args=a.Composite(meta=a.JsonRestore())).meta
      except Exception as e:  # noqa: BLE001 - any read failure means "unreadable"
        log.warning("checkpoint step %d in %s is unreadable (%s: %s); falling back to the "
                    "previous one", step, self.dir, type(e).__name__, _short(e))
        bad.append(step)
        continue
      _check_meta(meta, expected_meta, self.dir, step)
      try:
        r = self.mgr.restore(step, args=a.Composite(state=a.StandardRestore(abstract_state),
                                                    data=a.JsonRestore()))
      except Exception as e:  # noqa: BLE001
        log.warning("checkpoint step %d in %s is truncated or corrupt (%s: %s); falling back to "
                    "the previous one", step, self.dir, type(e).__name__, _short(e))
        bad.append(step)
        continue
      self.set_aside(bad)
      return step, r.state, r.data
    if steps:
      raise RuntimeError(f"none of the checkpoints {steps} in {self.dir} could be read; remove "
                         "the directory (or use a new --config.workdir) to start afresh")
    return None


def _short(e, n=300):
  s = str(e).replace("\n", " ")
  return s[:n] + ("..." if len(s) > n else "")


def _check_meta(meta: dict, want: dict, where, step):
  if meta.get("method") != want["method"]:
    raise CheckpointMismatch(f"checkpoint {where} (step {step}) was written by a "
                             f"{meta.get('method')!r} run, this run trains {want['method']!r}; use "
                             "another --config.workdir")
  if meta.get("digest") != want["digest"]:
    diff = [k for k in want["model"] if meta.get("model", {}).get(k) != want["model"][k]]
    shapes_a, shapes_b = meta.get("trainable_shapes", {}), want["trainable_shapes"]
    sdiff = sorted(set(shapes_a) ^ set(shapes_b)) or sorted(
        k for k in shapes_b if shapes_a.get(k) != shapes_b[k])
    raise CheckpointMismatch(
        f"checkpoint {where} (step {step}) is from a different model: "
        + (f"model fields differ {[(k, meta.get('model', {}).get(k), want['model'][k]) for k in diff]}; "
           if diff else "")
        + (f"trainable parameters differ ({sdiff[:6]}); " if sdiff else "")
        + "use another --config.workdir for this model")
