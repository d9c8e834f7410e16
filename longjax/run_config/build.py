"""The run config, typed: :func:`from_config` turns a config file's ml_collections ConfigDict (or
the dict of a run's ``config.json``) into one frozen :class:`RunConfig`, once, at the entry points
(train.py, eval.py, the asset exporters). Everything below them reads its typed sections.

Unknown keys and impossible values are refused here, each with one line that names the key (and
the nearest known one); ml_collections already refuses unknown keys given on the command line.
"""
from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from typing import Any, Optional

from longjax import method_names
from longjax.run_config import curriculum, source_options
from longjax.errors import LongjaxError
from longjax.run_config.eval_sections import EvalSection, eval_defaults
from longjax.run_config.sections import (LAYOUTS, LOSS_ON, BeaconSection, DataSection,
                                         FocusSection, ModelSection, TrainSection)


class ConfigError(LongjaxError, ValueError):
  pass


# each method's settings section, by the section name the method's entry in method_names gives
METHOD_SECTIONS = {method_names.BEACON.section: BeaconSection,
                   method_names.FOCUS.section: FocusSection}


@dataclasses.dataclass(frozen=True)
class RunConfig:
  """One run: its method, where it writes, and one typed section per concern."""
  method: str
  model: ModelSection
  data: DataSection
  train: TrainSection
  workdir: str = ""
  seed: int = 0
  beacon: Optional[BeaconSection] = None
  focus: Optional[FocusSection] = None
  eval: Optional[EvalSection] = None  # from_config always sets it

  def method_section(self):
    """The settings section of this run's method (None: a method without settings)."""
    section = method_names.entry(self.method).section
    return getattr(self, section) if section else None

  def replace(self, **kw) -> "RunConfig":
    return dataclasses.replace(self, **kw)


def to_dict(section) -> dict:
  """A section (or the RunConfig) as a plain dict, as ``config.json`` holds it; keys holding None
  (unset) are left out."""
  out = {}
  for f in dataclasses.fields(section):
    v = getattr(section, f.name)
    if v is None:
      continue
    out[f.name] = to_dict(v) if dataclasses.is_dataclass(v) else v
  return out


# --------------------------------------------------------------------------------------------
def from_config(config) -> RunConfig:
  """The typed, validated run config of ``config`` (a ConfigDict or a plain dict)."""
  d = config.to_dict() if hasattr(config, "to_dict") else dict(config)
  method = d.get("method")
  entry = method_names.entry(method)
  _check_keys(d)
  for sec in ("model", "data", "train"):
    if sec not in d:
      raise ConfigError(f"config has no {sec!r} section")
  if entry.section is not None and entry.section not in d:
    raise ConfigError(f"config.method is {method!r} but the config has no {entry.section!r} "
                      "section")
  eval_base = eval_defaults(entry if entry is not method_names.PLAIN else method_names.BEACON)
  rc = _build(RunConfig, {k: v for k, v in d.items() if k != "eval"}, "")
  # the eval section's keys not given (or all of it) take the protocols of the run's method
  rc = rc.replace(eval=_build(EvalSection, d.get("eval") or {}, "eval", eval_base))
  _check_values(rc, entry)
  return rc


def stored_config(path) -> dict:
  """The run config a train.py run stored in its workdir (``config.json``), as written."""
  import json
  from pathlib import Path
  try:
    stored = json.loads(Path(path).read_text(encoding="utf-8"))
  except (OSError, ValueError) as e:
    raise ConfigError(f"{path}: {e}") from None
  if not isinstance(stored, dict):
    raise ConfigError(f"{path} holds a {type(stored).__name__}, not a config")
  # an older run's config.json may carry a ``debug`` section (failure-injection switches, now the
  # tests' own fixtures, never part of a run's config): it is dropped
  stored.pop("debug", None)
  return stored


def _check_keys(d):
  """Refuse the first unknown key, naming its nearest known neighbour."""
  def walk(cls, node, prefix):
    allowed = [f.name for f in dataclasses.fields(cls)]
    hints = typing.get_type_hints(cls)
    for k, v in node.items():
      where = f"{prefix}.{k}" if prefix else k
      if k not in allowed:
        near = difflib.get_close_matches(k, sorted(allowed), n=1)
        raise ConfigError(f"unknown config key {where!r}"
                          + (f" (did you mean {near[0]!r}?)" if near else "")
                          + f"; known keys{' of ' + prefix if prefix else ''}: {sorted(allowed)}")
      sub = _section_type(hints[k])
      if sub is not None and isinstance(v, dict):
        walk(sub, v, where)
  walk(RunConfig, d, "")


def _check_values(rc: RunConfig, entry: method_names.MethodName):
  if int(rc.train.global_batch) < 1:
    raise ConfigError("train.global_batch must be >= 1")
  loss_on = rc.data.loss_on
  if loss_on not in LOSS_ON:
    raise ConfigError(f"data.loss_on={loss_on!r}: use 'all' (every token), 'answer' (the answer "
                      "spans) or 'distill' (KL to the full-attention base)")
  section = METHOD_SECTIONS.get(entry.section)
  if loss_on == "distill" and not (section is not None and section.distills):
    raise ConfigError(f"data.loss_on='distill' is not for method {rc.method!r} (it does not "
                      "distill)")
  d = rc.train.distill
  if int(d.top_k) < 1 or float(d.alpha) < 0 or float(d.answer_weight) <= 0:
    raise ConfigError("train.distill needs top_k >= 1, alpha >= 0 and answer_weight > 0")
  if float(d.base_weight) < 0 or (float(d.base_weight) != 1 and float(d.alpha) == 0):
    raise ConfigError(f"train.distill.base_weight={d.base_weight} with alpha={d.alpha}: the base "
                      "weight is the floor of alpha's per-token weights (>= 0), so it needs "
                      "alpha > 0; without alpha every distilled token weighs 1")
  if d.rest not in ("bucket", "renormalise"):
    raise ConfigError(f"train.distill.rest must be 'bucket' (the teacher's mass outside its top_k "
                      f"is one more class) or 'renormalise' (the top_k renormalised to sum to "
                      f"1), got {d.rest!r}")
  _check_sources(rc, section)
  try:
    stages = curriculum.parse(rc.data.curriculum)
  except curriculum.CurriculumError as e:
    raise ConfigError(str(e)) from None
  if stages and not (section is not None and getattr(section, "windowed", False)):
    raise ConfigError(f"data.curriculum is for methods that cut documents into windows (beacon); "
                      f"method {rc.method!r} does not: leave data.curriculum empty")
  if rc.train.layout not in LAYOUTS:
    raise ConfigError(f"train.layout={rc.train.layout!r}: use one of {LAYOUTS} (official: the "
                      "last window without beacons; inference: every window as generation plans "
                      "it)")


def _check_sources(rc: RunConfig, section):
  """Source suffixes (``@OBJECTIVE``, ``@ratio=N``) that name nothing, or a ratio the run cannot
  train at, are refused here, before anything loads."""
  srcs = rc.data.sources
  specs = [x.strip() for x in srcs.split(",")] if isinstance(srcs, str) else list(srcs or ())
  try:
    opts = source_options.parse_all([x for x in specs if x])
  except source_options.SourceSpecError as e:
    raise ConfigError(str(e)) from None
  for o in opts:
    if o.objective == "distill" and not (section is not None and section.distills):
      raise ConfigError(f"data source {o.source!r}@distill: method {rc.method!r} does not "
                        "distill; drop the suffix")
    if o.ratio is None:
      continue
    if not (section is not None and getattr(section, "windowed", False)):
      raise ConfigError(f"data source {o.source!r}@ratio={o.ratio}: a compression ratio is for "
                        f"methods that compress windows (beacon), not {rc.method!r}; drop it")
    ratios = tuple(int(r) for r in rc.method_section().ratios)
    if o.ratio not in ratios:
      raise ConfigError(f"data source {o.source!r}@ratio={o.ratio}: not one of beacon.ratios "
                        f"{ratios}; add it there or fix the suffix")


# --------------------------------------------------------------------------------------------
def _section_type(hint) -> Optional[type]:
  """The dataclass a field holds (``Optional[X]`` -> X), or None for a plain value."""
  for t in (hint, *typing.get_args(hint)):
    if dataclasses.is_dataclass(t):
      return t
  return None


_SCALARS = (bool, int, float, str)


def _typed(hint, v, where: str):
  """``v`` as the scalar type its field declares (``int``, ``float``, ``bool``, ``str``, or
  ``Optional`` of one), so that the code reading the RunConfig uses fields as typed: a command
  line's ``--config.train.lr=1`` becomes 1.0; ``2.0`` for an int field becomes 2; anything that
  would change its value (``2.5`` for an int, ``1`` for a bool, a string for a number) is refused.
  Other field types (tuples, sections, unions of several types) are kept as given."""
  args = [a for a in typing.get_args(hint) if a is not type(None)]
  optional = typing.get_origin(hint) in (typing.Union, types.UnionType) and len(args) == 1
  want = args[0] if optional else hint
  if want not in _SCALARS or (v is None and optional):
    return v
  ok = (isinstance(v, bool) if want is bool else
        isinstance(v, str) if want is str else
        isinstance(v, (int, float)) and not isinstance(v, bool)
        and (want is float or float(v).is_integer()))
  if not ok:
    raise ConfigError(f"config field {where} must be {want.__name__}, got "
                      f"{type(v).__name__} {v!r}")
  return want(v)


def _build(cls, node: dict, prefix: str, base: Any = None):
  """``cls`` from the keys of ``node`` (already checked); the others keep ``base``'s values (a
  default instance of ``cls``), else the class defaults."""
  hints = typing.get_type_hints(cls)
  kw = {}
  for k, v in node.items():
    sub = _section_type(hints[k])
    where = f"{prefix}.{k}" if prefix else k
    if sub is not None and isinstance(v, dict):
      kw[k] = _build(sub, v, where, getattr(base, k, None) if base is not None else None)
    else:
      kw[k] = _typed(hints[k], tuple(v) if isinstance(v, list) else v, where)
  if base is not None:
    return dataclasses.replace(base, **kw)
  try:
    return cls(**kw)
  except TypeError as e:  # a required field missing
    raise ConfigError(f"config{' section ' + repr(prefix) if prefix else ''}: {e}") from None
