"""A training campaign that outlives machines: what an asset has been trained on, cumulatively.

A run that starts from a committed asset (``train.init_from``) continues that asset's campaign;
the asset it exports then records the sum of both runs' steps and tokens and every run's recipe
(``beacon.json`` / ``focus.json`` → ``campaign``), so the repository alone says how an asset was
made.
"""
from __future__ import annotations

import json
from pathlib import Path

from longjax.method_names import BEACON, FOCUS

# The settings JSON of each method's asset (longjax/beacon/asset.py, longjax/focus/asset.py).
METAS = ("beacon.json", "focus.json")
# The method section fields that say how the tensors were trained.
SECTION_FIELDS = {
    BEACON.name: ("window", "stride", "ratios", "ratio_mix", "pos", "attn", "param", "sink_size",
                  "embed_init"),
    FOCUS.name: ("local_window", "stride", "strides", "prompt_cap", "param", "objective",
                 "steps"),
}


def _recipe(c: dict) -> dict:
  """The fields of a train.py config that say how the tensors were trained (no machine paths)."""
  t, d = c.get("train", {}), c.get("data", {})
  sources = [s.strip() for s in str(d.get("sources", "")).split(",") if s.strip()]
  method = c.get("method", BEACON.name)
  return dict(
      **{method: {k: c.get(method, {}).get(k) for k in SECTION_FIELDS.get(method, ())}},
      data=[Path(s.split(":", 1)[-1]).name for s in sources], loss_on=d.get("loss_on"),
      max_length=d.get("max_length"), curriculum=d.get("curriculum") or None,
      layout=t.get("layout", "official"),
      distill=t.get("distill"), lr=t.get("lr"), warmup_steps=t.get("warmup_steps"),
      num_steps=t.get("num_steps"), global_batch=t.get("global_batch"))


def tokens_until(metrics: Path, step: int) -> int:
  """Training tokens of the logged steps ``<= step`` (``metrics.jsonl`` of a run)."""
  total = 0
  if metrics.exists():
    for line in metrics.read_text().splitlines():
      try:
        m = json.loads(line)
      except json.JSONDecodeError:  # a line cut by a kill: the steps before it still count
        continue
      if int(m.get("step", 0)) <= step:
        total += int(m.get("tokens", 0))
  return total


def record(workdir, step: int) -> dict:
  """The ``campaign`` entry of an asset exported from ``workdir`` at ``step``: this run plus the
  campaign of the asset it started from (``train.init_from``), if any."""
  workdir = Path(workdir)
  c = json.loads((workdir / "config.json").read_text())
  prior = dict(steps=0, tokens=0, runs=[])
  src = c.get("train", {}).get("init_from")
  metas = [Path(src) / m for m in METAS] if src else []
  for meta in metas:
    if meta.exists():
      prior = json.loads(meta.read_text()).get("campaign") or prior
  tokens = tokens_until(workdir / "metrics.jsonl", step)
  runs = list(prior.get("runs", [])) + [dict(steps=int(step), tokens=tokens, recipe=_recipe(c))]
  return dict(steps=int(prior.get("steps", 0)) + int(step),
              tokens=int(prior.get("tokens", 0)) + tokens, runs=runs)
