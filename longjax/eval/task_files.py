"""Reading benchmark task files (LongBench, InfiniteBench): ``{data_dir}/{task}.jsonl``.

Both benchmarks ship one JSON object per line; a record missing a field the task needs is an
error naming the file, the line, the missing fields and the expected ones.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Optional

from longjax.eval.errors import EvalError


def task_list(spec, tasks, benchmark: str) -> list:
  """The task names a comma-separated ``spec`` selects from ``tasks`` (``all`` or empty: every
  task); an unknown name is an error listing the valid ones."""
  names = [s.strip() for s in str(spec).split(",") if s.strip()]
  if names in (["all"], []):
    return list(tasks)
  bad = [n for n in names if n not in tasks]
  if bad:
    raise EvalError(f"unknown {benchmark} task(s) {bad}; valid: {', '.join(tasks)} (or 'all')")
  return names


def read_records(path: Path, need, benchmark: str, limit: int = 0,
                 check: Optional[Callable[[dict, str], None]] = None) -> list:
  """Records of one ``.jsonl`` file; ``check(rec, where)`` validates/extends each record."""
  out = []
  with open(path, encoding="utf-8") as f:
    for i, line in enumerate(f, 1):
      if not line.strip():
        continue
      where = f"{path}:{i}"
      try:
        rec = json.loads(line)
      except json.JSONDecodeError as e:
        raise EvalError(f"{where}: not a JSON line ({e.msg})") from None
      missing = [k for k in need if not isinstance(rec, dict) or k not in rec]
      if missing:
        raise EvalError(f"{where}: missing field(s) {missing}; {benchmark} records need "
                        f"{list(need)} (found {sorted(rec) if isinstance(rec, dict) else rec!r})")
      if check is not None:
        check(rec, where)
      out.append(rec)
      if limit and len(out) >= limit:
        break
  return out


def read_task(data_dir, task: str, need, benchmark: str, id_field: str, limit: int = 0,
              check: Optional[Callable[[dict, str], None]] = None) -> list:
  """The records of ``{data_dir}/{task}.jsonl`` (``read_records``), each keyed for results and
  resumption: ``_key = "{task}/{rec[id_field]}"`` (the line's index when the record has no id)."""
  recs = read_records(Path(data_dir) / f"{task}.jsonl", need, benchmark, limit, check)
  for i, rec in enumerate(recs):
    rec["_key"] = f"{task}/{rec.get(id_field, i)}"
  return recs


def validate_dir(section: str, data_dir: str, tasks, load_task, max_samples: int):
  """Check ``data_dir`` holds every task's file and that each file parses, before any model runs."""
  if not data_dir or not Path(data_dir).is_dir():
    raise EvalError(f"{section}.data_dir {data_dir!r} is not a directory; set "
                    f"--config.eval.{section}.data_dir=DIR holding {{task}}.jsonl files")
  missing = [t for t in tasks if not (Path(data_dir) / f"{t}.jsonl").exists()]
  if missing:
    raise EvalError(f"{section}.data_dir {data_dir!r} lacks {[m + '.jsonl' for m in missing]}; "
                    f"choose tasks with --config.eval.{section}.tasks=a,b,...")
  for t in tasks:
    load_task(data_dir, t, max_samples)
