"""Write a directory all-or-nothing: build it in a hidden sibling, rename it into place at the end.

A crash or an exception midway leaves no directory that looks like a complete checkpoint; an
existing directory is replaced only after the new one is complete.

The hidden sibling is ``.NAME.partial-PID@HOST.XXXXXXXX``: a run killed midway (kill -9, power
loss) leaves it behind, and the next write of the same target on the same host removes the ones
whose process is gone (never those of a live writer); a replacing write killed between its two
renames (the target moved aside, the new copy not yet in place) has the old copy put back by the
next write (or asset load) of the same target. The finished directory gets the mode a plain
``mkdir`` would give (0777 minus the umask), not mkdtemp's private 0700.
"""
from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import shutil
import socket
import tempfile
from pathlib import Path

from longjax.errors import LongjaxError, NotADirectory, PathExists

log = logging.getLogger("longjax")


class OutputOverlapsInput(LongjaxError, ValueError):
  """An output directory that is, lies inside, or contains an input (writing it would replace or
  delete the input)."""


def check_output_apart(out, out_flag: str, inputs) -> None:
  """Refuse an output that is, lies inside or contains one of ``inputs`` (``{flag: path}``), before
  anything is written: replacing the output (``--overwrite``) would delete that input, and files
  written inside an input mix with it. Symlinks are resolved."""
  o = _resolved(out, out_flag)
  for flag, p in inputs.items():
    if not p:
      continue
    i = _resolved(p, flag)
    how = ("is" if o == i else "contains" if o in i.parents else
           "is inside" if i in o.parents else None)
    if how:
      raise OutputOverlapsInput(f"{out_flag} {out} {how} the input {flag} {p}: writing it would "
                                f"replace or mix with that input; choose an {out_flag} outside it")


def _resolved(path, flag: str) -> Path:
  """``path`` with its symlinks resolved; a symlink loop is one line (Path.resolve raises a
  RuntimeError for it on Python 3.11, an OSError on later ones)."""
  try:
    return Path(path).expanduser().resolve()
  except (RuntimeError, OSError) as e:
    raise NotADirectory(f"{flag} {path}: cannot resolve its symlinks ({e}); a symlink loop? point "
                        "it at a real directory") from None


def current_umask() -> int:
  """The process umask, read without changing it where /proc allows."""
  try:
    for line in Path("/proc/self/status").read_text().splitlines():
      if line.startswith("Umask:"):
        return int(line.split()[1], 8)
  except (OSError, ValueError):
    pass
  mask = os.umask(0o022)  # no /proc: set and restore (not thread-safe, but brief)
  os.umask(mask)
  return mask


def pid_alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True  # exists, owned by someone else
  except OSError as e:
    return e.errno != errno.ESRCH
  return True


def host_name() -> str:
  return re.sub(r"[^A-Za-z0-9_.-]", "_", socket.gethostname()) or "localhost"


def _partial_prefix(name: str) -> str:
  return f".{name}.partial-"


def stale_partials(path) -> list:
  """The hidden partial (and replaced ``.old-PID``) siblings of ``path`` left by dead processes on
  this host."""
  path = Path(path).absolute()
  if not path.parent.is_dir():
    return []
  part = re.compile(re.escape(_partial_prefix(path.name)) + r"(\d+)@(.+)\.[a-z0-9_]{8}$")
  old = re.compile(re.escape(f".{path.name}.old-") + r"(\d+)$")
  host, out = host_name(), []
  for p in path.parent.iterdir():
    m = part.match(p.name)
    if m and m.group(2) == host and not pid_alive(int(m.group(1))):
      out.append(p)
      continue
    m = old.match(p.name)
    if m and not pid_alive(int(m.group(1))):
      out.append(p)
  return sorted(out)


def clean_stale_partials(path) -> list:
  """Remove :func:`stale_partials` of ``path``; returns what was removed."""
  gone = []
  for p in stale_partials(path):
    shutil.rmtree(p, ignore_errors=True)
    if not p.exists():
      gone.append(p)
      log.warning("removed %s, left by a killed write of %s", p, Path(path).name)
  return gone


def _readable_files(root: Path):
  """Give files the umask's permissions: some writers (safetensors' save_file) create theirs 0600,
  which would leave an export or asset unreadable to the other users of a shared machine."""
  mode = 0o666 & ~current_umask()
  for f in root.rglob("*"):
    if f.is_file() and not f.is_symlink():
      os.chmod(f, (f.stat().st_mode & 0o111) | mode)


def make_parent(path) -> None:
  """Create ``path``'s parent directories; a parent that is a file is one clear error (mkdir's
  own says "File exists", which reads as if the output existed)."""
  check_parent(path)
  Path(path).absolute().parent.mkdir(parents=True, exist_ok=True)


def check_parent(path) -> None:
  """Refuse an output under a file (``out.txt/model``), before any work is done."""
  path = Path(path).absolute()
  for p in reversed(path.parents):
    if p.exists() and not p.is_dir():
      raise NotADirectory(f"cannot write {path}: {p} is a file, not a directory; choose an "
                          "output whose parent is a directory")


def restore_interrupted_swap(path):
  """Put back the previous ``path`` when a replacing write was killed between its two renames
  (``path`` -> ``.NAME.old-PID``, new copy -> ``path``): ``path`` is missing and the hidden old
  copy of a dead writer is there. Without this, ``path`` would stay missing, and the next write's
  cleanup would delete the only copy. Returns the restored copy's former name, or None."""
  path = Path(path).absolute()
  if path.exists() or path.is_symlink() or not path.parent.is_dir():
    return None
  old = re.compile(re.escape(f".{path.name}.old-") + r"(\d+)$")
  found = [p for p in path.parent.iterdir()
           if (m := old.match(p.name)) and not pid_alive(int(m.group(1)))]
  if not found:
    return None
  newest = max(found, key=lambda p: p.stat().st_mtime)
  os.rename(newest, path)
  log.warning("restored %s from %s: a write that was replacing it was killed midway", path,
              newest.name)
  return newest


@contextlib.contextmanager
def atomic_dir(path, overwrite: bool = False):
  """Yield a temporary directory that becomes ``path`` when the block finishes without error."""
  path = Path(path).absolute()
  restore_interrupted_swap(path)
  if path.exists() and not overwrite:
    raise PathExists(f"{path} exists; pass overwrite=True (--overwrite) to replace it")
  make_parent(path)
  clean_stale_partials(path)
  tmp = Path(tempfile.mkdtemp(prefix=f"{_partial_prefix(path.name)}{os.getpid()}@{host_name()}.",
                              dir=path.parent))
  try:
    os.chmod(tmp, 0o777 & ~current_umask())
    yield tmp
    _readable_files(tmp)
    if path.exists():
      old = path.with_name(f".{path.name}.old-{os.getpid()}")
      os.rename(path, old)
      os.rename(tmp, path)
      shutil.rmtree(old, ignore_errors=True)
    else:
      os.rename(tmp, path)
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise
