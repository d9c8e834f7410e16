"""Answers kept as they come, so that a stopped evaluation resumes request by request.

One long-context cell can run for hours on a CPU (FocusLLM re-reads every chunk at each decode
step: minutes a sample at 32K), and a cell saved only when it ends loses all of it to one
interruption. An :class:`AnswerLog` is a JSON-lines file: its first line names what produced the
answers (the model arguments and the weights' fingerprint), each later line one answer under the
SHA-256 of its request. A rerun with the same identity reuses every logged answer; a log written
by another model is set aside, never mixed in.

JSON only: lm-eval's own ``use_cache`` stores answers with ``sqlitedict``, which unpickles what
it reads, and this project never unpickles.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Optional


def request_key(kind: str, args) -> str:
  """The SHA-256 of a request (``kind``: the lm-eval request type; ``args``: its arguments)."""
  text = json.dumps([kind, args], sort_keys=True, default=repr, ensure_ascii=False)
  return hashlib.sha256(text.encode("utf-8")).hexdigest()


def files_fingerprint(path: Path) -> str:
  """The SHA-256 over a directory's files (names and bytes), so that an asset retrained under the
  same name does not reuse its predecessor's answers; ``""`` when ``path`` is no directory."""
  path = Path(path)
  if not path.is_dir():
    return ""
  h = hashlib.sha256()
  for f in sorted(p for p in path.rglob("*") if p.is_file()):
    h.update(str(f.relative_to(path)).encode() + b"\0")
    with open(f, "rb") as fh:
      for block in iter(lambda: fh.read(1 << 20), b""):
        h.update(block)
  return h.hexdigest()


class AnswerLog:
  """``get`` / ``add`` answers of one run; ``identity``: what must match for a rerun to reuse
  them (a string)."""

  def __init__(self, path: Path, identity: str):
    self.path, self.identity = Path(path), identity
    self.answers: dict = {}
    self.stale = None  # where a log of another identity was set aside
    good = self._read()
    if good is None:  # no log yet, or one written by another model
      self._start()
    else:  # drop a line torn by a kill mid-write, so that appends start on a line of their own
      with open(self.path, "r+b") as f:
        f.truncate(good)

  def _read(self) -> Optional[int]:
    """Loads a matching log; returns the byte length of its whole lines, or None."""
    if not self.path.is_file():
      return None
    data = self.path.read_bytes()
    lines = data.split(b"\n")
    try:
      head = json.loads(lines[0])
    except ValueError:
      head = None
    if (len(lines) < 2 or not isinstance(head, dict)
        or head.get("identity") != self.identity):
      self.stale = self.path.with_name(self.path.name + ".stale")
      os.replace(self.path, self.stale)
      return None
    good = len(lines[0]) + 1
    for line in lines[1:-1]:  # whole lines only: the last piece is b"" or a line cut by a kill
      try:
        rec = json.loads(line)
        key, text = rec["key"], rec["text"]
      except (ValueError, KeyError, TypeError):
        break
      self.answers[key] = text
      good += len(line) + 1
    return good

  def _start(self):
    self.path.parent.mkdir(parents=True, exist_ok=True)
    tmp = self.path.with_name(self.path.name + ".tmp")
    tmp.write_text(json.dumps({"identity": self.identity}) + "\n", encoding="utf-8")
    os.replace(tmp, self.path)

  def __len__(self) -> int:
    return len(self.answers)

  def get(self, kind: str, args) -> Optional[str]:
    return self.answers.get(request_key(kind, args))

  def add(self, kind: str, args, text: str):
    key = request_key(kind, args)
    self.answers[key] = text
    with open(self.path, "a", encoding="utf-8") as f:
      f.write(json.dumps({"key": key, "text": text}, ensure_ascii=False) + "\n")
      f.flush()
      os.fsync(f.fileno())

  def discard(self):
    """The run finished and its result is saved: the log has done its work."""
    self.path.unlink(missing_ok=True)
