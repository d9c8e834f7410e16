"""Config validation: unknown keys and impossible values are errors with a clear message
(ml_collections already refuses unknown keys given on the command line)."""
from __future__ import annotations

import difflib

from longjax import methods
from longjax.errors import LongjaxError
from longjax.tasks import LAYOUTS

# each method's section and its keys come from the method's object (longjax.methods)
_SECTIONS = {m.section: set(m.section_keys) for m in methods.ALL if m.section is not None}
SCHEMA = {
    "": {"method", "workdir", "seed", "model", "data", "train", "debug", "eval", *_SECTIONS},
    **_SECTIONS,
    "model": {"name", "checkpoint", "family", "hidden_size", "intermediate_size", "num_layers", "num_heads",
              "num_kv_heads", "head_dim", "dtype", "param_dtype", "remat", "pretrain",
              "max_position_embeddings", "rope_theta"},
    "model.pretrain": {"steps", "batch", "lr", "length", "warmup_steps", "weight_decay",
                       "save_every", "sources", "min_length", "max_length", "synthetic", "loss_on"},
    "data": {"sources", "tokenizer", "text_field", "tfds_data_dir", "tfds_split", "min_length",
             "max_length", "append_eos", "add_bos", "max_per_source", "loss_on", "synthetic"},
    "data.synthetic": {"count", "min_chars", "max_chars", "digits", "style"},
    "model.pretrain.synthetic": {"count", "min_chars", "max_chars", "digits", "style"},
    "train": {"num_steps", "num_epochs", "global_batch", "grad_accum", "lr", "end_lr",
              "warmup_steps", "weight_decay", "b1", "b2", "eps", "max_grad_norm", "remat",
              "step_bucket", "log_every", "save_every", "keep", "async_checkpoint", "export",
              "mesh", "distributed", "cluster", "impl", "tensorboard", "progress", "layout", "init_from", "distill"},
    "train.mesh": {"data", "fsdp", "tensor"},
    "train.distill": {"top_k", "alpha"},
    "train.cluster": {"coordinator_address", "num_processes", "process_id"},
    "debug": {"kill_after_step", "nan_at_step"},
}


class ConfigError(LongjaxError, ValueError):
  pass


def _keys(d):
  return list(d.keys()) if hasattr(d, "keys") else []


def validate(c, method):
  """Refuse a run config with unknown keys or impossible values. ``method`` is the method object
  of ``c.method`` (``longjax.methods.get``): it names its config section and whether it distills."""
  def walk(d, prefix):
    allowed = SCHEMA.get(prefix)
    if allowed is None:
      return
    for k in _keys(d):
      if k not in allowed:
        near = difflib.get_close_matches(k, sorted(allowed), n=1)
        where = f"{prefix}.{k}" if prefix else k
        raise ConfigError(f"unknown config key {where!r}"
                          + (f" (did you mean {near[0]!r}?)" if near else "")
                          + f"; known keys{' of ' + prefix if prefix else ''}: {sorted(allowed)}")
      v = d[k]
      sub = f"{prefix}.{k}" if prefix else k
      if hasattr(v, "keys") and sub in SCHEMA:
        walk(v, sub)
  walk(c, "")
  for sec in ("model", "data", "train"):
    if sec not in c:
      raise ConfigError(f"config has no {sec!r} section")
  if method.section is not None and method.section not in c:
    raise ConfigError(f"config.method is {c.method!r} but the config has no {method.section!r} "
                      "section")
  if int(c.train.global_batch) < 1:
    raise ConfigError("train.global_batch must be >= 1")
  loss_on = c.data.get("loss_on", "all")
  if loss_on not in ("all", "answer", "distill"):
    raise ConfigError(f"data.loss_on={loss_on!r}: use 'all' (every token), 'answer' (the answer "
                      "spans) or 'distill' (beacon: KL to the full-attention base)")
  if loss_on == "distill" and not method.distills:
    raise ConfigError(f"data.loss_on='distill' is not for method {c.method!r} (it does not "
                      "distill)")
  d = c.train.get("distill", None)
  if d is not None and (int(d.get("top_k", 32)) < 1 or float(d.get("alpha", 0.0)) < 0):
    raise ConfigError("train.distill needs top_k >= 1 and alpha >= 0")
  layout = c.train.get("layout", "official")
  if layout not in LAYOUTS:
    raise ConfigError(f"train.layout={layout!r}: use one of {LAYOUTS} (official: the last window "
                      "without beacons; inference: every window as generation plans it)")
