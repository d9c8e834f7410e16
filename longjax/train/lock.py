"""One training run per workdir: ``<workdir>/train.lock``, created with O_EXCL, holds the owner's
pid, host and start time. A lock whose pid is dead on this host (kill -9, a crash) is stale and
taken over; anything else refuses the second run with the holder named. Judging and taking the
lock happen under an ``flock`` of the workdir, so two processes never both take over one stale
lock."""
from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import time
from pathlib import Path

from longjax.errors import LongjaxError

log = logging.getLogger("longjax.train")

LOCK_FILE = "train.lock"


class WorkdirLocked(LongjaxError, RuntimeError):
  pass


def _proc_start(pid: int):
  """The process's start time in clock ticks since boot (Linux), to tell a reused pid apart."""
  try:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
  except (OSError, IndexError):
    return None


def _alive(pid: int, proc_start) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # exists, owned by someone else
    pass
  now = _proc_start(pid)
  return proc_start is None or now is None or now == proc_start


@contextlib.contextmanager
def _serialized(workdir: Path):
  """Hold an exclusive ``flock`` on the workdir itself while the lock file is judged and taken: a
  stale lock is then taken over by one process only (without it, two that read the same stale
  lock within milliseconds could each delete the other's fresh one and both win). The kernel
  drops it when the holder dies; a filesystem without flock falls back to the unguarded path."""
  try:
    import fcntl
    fd = os.open(workdir, os.O_RDONLY)
  except (ImportError, OSError):
    yield
    return
  try:
    try:
      fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError:
      pass
    yield
  finally:
    os.close(fd)  # releases the flock


def acquire(workdir) -> Path:
  """Take the workdir's lock (``WorkdirLocked`` if another live run holds it); returns its path."""
  with _serialized(Path(workdir)):
    return _acquire(workdir)


def _acquire(workdir) -> Path:
  path = Path(workdir) / LOCK_FILE
  me = dict(pid=os.getpid(), host=socket.gethostname(), proc_start=_proc_start(os.getpid()),
            started=time.strftime("%Y-%m-%d %H:%M:%S"))
  for _ in range(3):
    try:
      fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
      try:
        held = json.loads(path.read_text())
        pid, host = int(held["pid"]), str(held["host"])
      except FileNotFoundError:  # released meanwhile: try again
        continue
      except (OSError, ValueError, KeyError, TypeError):
        # empty or garbled: possibly a run that is still writing it, so never taken over
        raise WorkdirLocked(f"{path.parent} is locked by {path} (unreadable); if no training run "
                            f"uses this workdir, delete {path}") from None
      if host == me["host"] and not _alive(pid, held.get("proc_start")):
        log.warning("taking over the stale lock %s of pid %d (no longer running)", path, pid)
        with contextlib.suppress(FileNotFoundError):
          path.unlink()
        continue
      raise WorkdirLocked(
          f"{path.parent} is in use by another training run (pid {pid} on host {host}, started "
          f"{held.get('started', '?')}): wait for it or use another --config.workdir; if that run "
          f"is gone (another host cannot be checked from here), delete {path}") from None
    with os.fdopen(fd, "w") as f:
      json.dump(me, f)
    return path
  raise WorkdirLocked(f"could not take the lock {path} (other runs keep taking it)")


def release(path: Path):
  """Remove the lock if it is still ours (never another run's, taken over after ours)."""
  with contextlib.suppress(OSError, ValueError, KeyError):
    if int(json.loads(path.read_text())["pid"]) == os.getpid():
      path.unlink()
