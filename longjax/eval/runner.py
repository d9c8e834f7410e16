"""Running evaluation tasks: output files, resuming, progress, the human table.

For each task ``T`` and tag ``G`` (default: the method name) under ``output_dir`` (default
``{workdir}/eval``):

* ``G_T.samples.jsonl``: one line per scored sample (first line: the settings it was run with);
  a rerun with the same output path skips the samples already there (``eval.resume``); results of
  other settings are never mixed in: such a file is moved aside (``.stale-N``) and the task
  starts afresh;
* ``G_T.json``: the task summary (metrics, per-cell / per-task tables, settings, time);
* ``G_T.png``: figures (passkey / needle heatmaps);
* ``G_results.json``: every task summary of this tag, updated after each task.
"""
from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Callable, Optional

from longjax.run_config.eval_sections import TASKS
from longjax.eval.errors import EvalError


def _task_module(name: str):
  import importlib
  return importlib.import_module(f"longjax.eval.{name}")


def parse_tasks(spec) -> list:
  """``"passkey"``, ``"passkey,needle"`` or ``"all"`` -> task names (error lists the valid ones)."""
  if isinstance(spec, (list, tuple)):
    names = [str(s).strip() for s in spec]
  else:
    names = [s.strip() for s in str(spec or "").split(",")]
  names = [n for n in names if n]
  if names == ["all"]:
    return list(TASKS)
  bad = [n for n in names if n not in TASKS]
  if bad or not names:
    raise EvalError(f"unknown evaluation task {', '.join(map(repr, bad)) or repr(spec)}; valid "
                    f"tasks: {', '.join(TASKS)} (several: comma-separated, or 'all')")
  return list(dict.fromkeys(names))


def _jsonable(x):
  if dataclasses.is_dataclass(x) and not isinstance(x, type):
    x = dataclasses.asdict(x)
  if isinstance(x, dict):
    return {str(k): _jsonable(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [_jsonable(v) for v in x]
  if isinstance(x, (str, int, float, bool)) or x is None:
    return x
  try:
    import numpy as np
    if isinstance(x, np.generic):
      return x.item()
  except ImportError:  # pragma: no cover
    pass
  return str(x)


class Store:
  """Per-sample records of one task, appended as they are scored (resumable)."""

  def __init__(self, path: Path, settings: dict, resume: bool,
               log: Callable[[str], None] = print):
    self.path = Path(path)
    self.settings = _jsonable(settings)
    self.records: dict = {}
    self.stale = None
    self.path.parent.mkdir(parents=True, exist_ok=True)
    if self.path.exists() and resume:
      lines = [ln for ln in self.path.read_text().splitlines() if ln.strip()]
      head = {}
      if lines:
        try:
          head = json.loads(lines[0])
        except json.JSONDecodeError:
          pass
      if lines and head.get("_settings") != self.settings:
        # Never mix results of different settings: keep the old file aside, start afresh.
        n = 1
        while self.path.with_name(f"{self.path.name}.stale-{n}").exists():
          n += 1
        self.stale = self.path.with_name(f"{self.path.name}.stale-{n}")
        self.path.rename(self.stale)
        log(f"{self.path} held results of other settings: moved to {self.stale.name}, "
            "starting afresh")
        lines = []
      if lines:
        for ln in lines[1:]:
          try:
            rec = json.loads(ln)
          except json.JSONDecodeError:  # a line cut by an interrupted run
            continue
          self.records[rec["key"]] = rec
    self.resumed = len(self.records)
    with open(self.path, "w") as f:
      f.write(json.dumps({"_settings": self.settings}) + "\n")
      for rec in self.records.values():
        f.write(json.dumps(rec) + "\n")

  def __contains__(self, key) -> bool:
    return str(key) in self.records

  def add(self, key, record: dict) -> dict:
    rec = {"key": str(key), **_jsonable(record)}
    self.records[str(key)] = rec
    with open(self.path, "a") as f:
      f.write(json.dumps(rec) + "\n")
    return rec


@dataclasses.dataclass
class Context:
  """What a task gets: the model, its settings, where to write."""
  task: str
  built: object  # longjax.eval.models.Built
  ecfg: object  # config.eval (run_config.EvalSection)
  tcfg: object  # config.eval.<task>
  out_prefix: Path  # {output_dir}/{tag}_{task}
  store: Optional[Store] = None
  log: Callable[[str], None] = print

  def open_store(self, settings: dict) -> Store:
    b = self.built
    full = dict(task=self.task, task_settings=self.tcfg, method=b.name, model=b.description,
                method_settings=b.extra, chat_template=self.ecfg.chat_template,
                truncate_to=b.truncation_limit, max_samples=self.ecfg.max_samples, **settings)
    self.store = Store(Path(f"{self.out_prefix}.samples.jsonl"), full, bool(self.ecfg.resume),
                       self.log)
    if self.store.resumed:
      self.log(f"[{self.task}] resuming: {self.store.resumed} samples already scored in "
               f"{self.store.path}")
    return self.store

  def progress(self, total: int, desc: Optional[str] = None):
    from tqdm.auto import tqdm
    return tqdm(total=total, desc=desc or self.task, unit="sample", file=sys.stderr,
                mininterval=1.0, dynamic_ncols=True)


def format_table(header, rows) -> str:
  cells = [[str(h) for h in header]] + [[_fmt(c) for c in r] for r in rows]
  widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
  line = lambda r: "  ".join(c.rjust(w) if i else c.ljust(w)  # noqa: E731
                             for i, (c, w) in enumerate(zip(r, widths)))
  sep = "  ".join("-" * w for w in widths)
  return "\n".join([line(cells[0]), sep] + [line(r) for r in cells[1:]])


def _fmt(x) -> str:
  if isinstance(x, float):
    return f"{x:.2f}" if abs(x) >= 1 or x == 0 else f"{x:.3f}"
  return str(x)


def output_dir(config) -> Path:
  e = config.eval
  if e.output_dir:
    return Path(e.output_dir)
  return Path(config.workdir or "runs/eval") / "eval"


def validate(config, tasks) -> None:
  """Checks that need no model (data directories, dataset fields, grid shapes)."""
  for t in tasks:
    mod = _task_module(t)
    if hasattr(mod, "validate"):
      mod.validate(config.eval)


def run(config, tasks=None, *, built=None, log: Callable[[str], None] = print) -> dict:
  """Run ``tasks`` (default ``config.eval.task``) and return ``{task: summary}``; ``config``: the
  run's ``RunConfig``."""
  from longjax.eval.models import build_method
  names = parse_tasks(tasks if tasks is not None else config.eval.task)
  validate(config, names)
  t0 = time.time()
  if built is None:
    built = build_method(config)
  log(f"model: {built.description} (built in {time.time() - t0:.1f}s)")
  out = output_dir(config)
  tag = config.eval.tag or built.name
  results_path = out / f"{tag}_results.json"
  results = {}
  if results_path.exists():
    try:
      results = json.loads(results_path.read_text())
    except json.JSONDecodeError:
      results = {}
  done = {}
  for name in names:
    mod = _task_module(name)
    ctx = Context(task=name, built=built, ecfg=config.eval, tcfg=config.eval.task_section(name),
                  out_prefix=out / f"{tag}_{name}", log=log)
    t1 = time.time()
    summary = mod.run(ctx)
    summary["seconds"] = round(time.time() - t1, 2)
    summary["method"] = built.name
    summary["model"] = built.description
    summary = _jsonable(summary)
    Path(f"{ctx.out_prefix}.json").write_text(json.dumps(summary, indent=2))
    results[name] = summary
    results_path.parent.mkdir(parents=True, exist_ok=True)
    results_path.write_text(json.dumps(results, indent=2))
    log("")
    log(f"== {name} ({built.name}) -- {summary['seconds']:.1f}s; results: {ctx.out_prefix}.json"
        + "".join(f", {p}" for p in summary.get("figures", [])))
    log(mod.table(summary))
    done[name] = summary
  return done
