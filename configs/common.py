"""Shared defaults of the training configs (each config file calls these and overrides)."""
import ml_collections

from longjax.run_config import sections, to_dict


def _section(cls, **kw) -> ml_collections.ConfigDict:
  """A config file's section: ``cls``'s defaults (longjax.run_config.sections, their one home)
  with ``kw`` over them."""
  return ml_collections.ConfigDict(to_dict(cls(**kw)))


def train_defaults(**kw):
  # mesh, cluster (a multi-process run), distill (data.loss_on="distill"): dicts over their defaults
  for name, cls in (("mesh", sections.MeshSection), ("cluster", sections.ClusterSection),
                    ("distill", sections.DistillSettings)):
    if name in kw:
      kw[name] = cls(**kw[name])
  return _section(sections.TrainSection, **kw)


def data_defaults(**kw):
  # synthetic: the sizes of generated documents, a dict over their defaults
  return _section(sections.DataSection,
                  **dict(kw, synthetic=sections.SyntheticSection(**kw.get("synthetic", {}))))


def real_model(name, **kw):
  """A released checkpoint: ``checkpoint`` must be given on the command line."""
  m = dict(name=name, checkpoint="", dtype="bfloat16", param_dtype="bfloat16", remat=True)
  m.update(kw)
  return ml_collections.ConfigDict(m)


def tiny_model(family, num_kv_heads, pretrain_sources):
  """The embedded default: a tiny random base (byte tokenizer) pretrained on generated text."""
  m = ml_collections.ConfigDict(dict(
      checkpoint="",  # empty: a tiny model with the byte tokenizer, pretrained as below
      family=family, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
      num_kv_heads=num_kv_heads, head_dim=16, dtype="float32", param_dtype="", remat=False))
  # PretrainSection's defaults (longjax.run_config.sections) with the tiny bases' own values
  m.pretrain = _section(sections.PretrainSection, warmup_steps=15, sources=pretrain_sources,
                        min_length=32, max_length=1 << 30,
                        synthetic=sections.SyntheticSection(count=512, min_chars=128,
                                                            max_chars=250, digits=5))
  return m
