"""Running evaluation tasks: output files, resuming, progress, the human table.

For each task ``T`` and tag ``G`` (default: the method name) under ``output_dir`` (default
``{workdir}/eval``):

* ``G_T.samples.jsonl``: one line per scored sample (first line: the settings it was run with);
  a rerun with the same output path skips the samples already there (``eval.resume``); results of
  other settings or other weights (the model is matched by a hash of its weights, not by its
  path) are never mixed in: such a file is moved aside (``.stale-N``) and the task starts afresh;
  lines that are not sample records are dropped and those samples scored again;
* ``G_T.json``: the task summary (metrics, per-cell / per-task tables, settings, time);
* ``G_T.png``: figures (passkey / needle heatmaps);
* ``G_results.json``: every task summary of this tag and these weights, updated (whole, never
  cut) after each task; see :func:`load_results`.

``G`` must be a plain name (no path); sizes, names and the output directory are checked before
the model loads (``longjax.eval.inputs``).
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
      lines = [ln for ln in self.path.read_text(encoding="utf-8", errors="replace").splitlines()
               if ln.strip()]
      head = _json_object(lines[0]) if lines else None
      have = head.get("_settings") if head is not None else None
      if lines and have != self.settings:
        # Never mix results of different settings or weights: keep the old file aside, start afresh.
        self.stale = _aside(self.path, "stale")
        log(f"{self.path} held results of {_settings_diff(have, self.settings)}: moved to "
            f"{self.stale.name}, starting afresh")
        lines = []
      skipped = 0
      for ln in lines[1:]:
        rec = _json_object(ln)
        if rec is None or not isinstance(rec.get("key"), str):
          skipped += 1  # a line cut by an interrupted run, or not a record of this store
          continue
        self.records[rec["key"]] = rec
      if skipped:
        log(f"{self.path}: {skipped} line(s) that are not sample records (cut or edited) dropped; "
            "those samples are scored again")
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


def _json_object(line: str):
  """``line`` as a JSON object, or None (not JSON, or JSON of another kind)."""
  try:
    v = json.loads(line)
  except ValueError:
    return None
  return v if isinstance(v, dict) else None


def _aside(path: Path, why: str) -> Path:
  """Rename ``path`` to the first free ``NAME.<why>-N`` next to it (kept, never deleted)."""
  n = 1
  while path.with_name(f"{path.name}.{why}-{n}").exists():
    n += 1
  dst = path.with_name(f"{path.name}.{why}-{n}")
  path.rename(dst)
  return dst


def _settings_diff(have, want: dict) -> str:
  """Which settings differ, for the one line that says why a file was set aside."""
  if not isinstance(have, dict):
    return "unknown settings (no settings line)"
  keys = sorted(k for k in set(have) | set(want) if have.get(k) != want.get(k))
  what = []
  for k in keys[:4]:
    if k == "weights":
      what.append(f"other weights (fingerprint {have.get(k)} -> {want.get(k)})")
    else:
      what.append(f"other {k}")
  return "other settings: " + ", ".join(what) if what else "other settings"


def _write_json(path: Path, obj) -> None:
  """Write ``path`` whole or not at all (a temporary sibling renamed over it): an interrupted run
  never leaves it cut."""
  import os
  tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
  try:
    tmp.write_text(json.dumps(obj, indent=2))
    os.replace(tmp, path)
  except BaseException:
    tmp.unlink(missing_ok=True)
    raise


def load_results(path: Path, tag: str, weights: str, log: Callable[[str], None] = print) -> dict:
  """The task summaries already in ``{tag}_results.json`` that this model (``weights``) wrote.

  A results file never mixes two models: summaries of other weights are dropped from it (each
  keeps its own ``{tag}_{task}.json`` until that task is run again), and said so. A file that is
  not a JSON object (cut by a kill, edited) is moved aside (``.damaged-N``) and the summaries are
  recovered from the tasks' ``{tag}_{task}.json`` files, never silently dropped."""
  results = {}
  if path.exists():
    try:
      results = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError):
      results = None
    if not isinstance(results, dict):
      aside = _aside(path, "damaged")
      results = {}
      for name in TASKS:
        f = path.with_name(f"{tag}_{name}.json")
        if f.exists():
          s = _json_object(f.read_text(encoding="utf-8", errors="replace"))
          if s is not None:
            results[name] = s
      log(f"{path} was not a JSON object (cut or edited): moved to {aside.name}; recovered "
          f"{len(results)} task summaries from the {tag}_<task>.json files")
  other = sorted(k for k, v in results.items()
                 if not isinstance(v, dict) or v.get("weights") != weights)
  if other:
    log(f"{path}: dropped the summaries of {', '.join(other)}: other weights than this model's "
        f"({weights}); rerun those tasks for this model")
  return {k: v for k, v in results.items() if k not in other}


@dataclasses.dataclass
class Context:
  """What a task gets: the model, its settings, where to write."""
  task: str
  built: object  # longjax.eval.models.EvalModel
  ecfg: object  # config.eval (run_config.EvalSection)
  tcfg: object  # config.eval.<task>
  out_prefix: Path  # {output_dir}/{tag}_{task}
  store: Optional[Store] = None
  log: Callable[[str], None] = print

  def open_store(self, settings: dict) -> Store:
    b = self.built
    full = dict(task=self.task, task_settings=self.tcfg, method=b.name, model=b.description,
                method_settings=b.extra, chat_template=self.ecfg.chat_template,
                truncate_to=b.truncation_limit, max_samples=self.ecfg.max_samples,
                weights=b.fingerprint, **settings)
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
  from longjax.eval import inputs
  from longjax.eval.models import build_method, method_name
  names = parse_tasks(tasks if tasks is not None else config.eval.task)
  method = built.name if built is not None else method_name(config)
  out = output_dir(config)
  tag = config.eval.tag or method
  inputs.check(config, names, out, tag, method)  # names, sizes: before any model or document
  validate(config, names)
  t0 = time.time()
  if built is None:
    built = build_method(config)
  log(f"model: {built.description} (built in {time.time() - t0:.1f}s)")
  results_path = out / f"{tag}_results.json"
  results = load_results(results_path, tag, built.fingerprint, log)
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
    summary["weights"] = built.fingerprint
    summary = _jsonable(summary)
    _write_json(Path(f"{ctx.out_prefix}.json"), summary)
    results[name] = summary
    results_path.parent.mkdir(parents=True, exist_ok=True)
    _write_json(results_path, results)
    log("")
    log(f"== {name} ({built.name}) -- {summary['seconds']:.1f}s; results: {ctx.out_prefix}.json"
        + "".join(f", {p}" for p in summary.get("figures", [])))
    log(mod.table(summary))
    done[name] = summary
  return done
