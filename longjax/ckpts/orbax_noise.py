"""Reading a damaged orbax checkpoint quietly: orbax's abandoned asynchronous reads of a truncated
step print "Exception ignored ..." / "Task exception was never retrieved" tracebacks; the readers
(training resume, asset export) report one line of their own instead.
"""
from __future__ import annotations

import contextlib
import logging
import sys

log = logging.getLogger("longjax.train")  # the readers' logger: their records stay together


class _DropAsyncioNoise(logging.Filter):
  """Drops asyncio's "Task exception was never retrieved" (and "Exception in callback") records:
  orbax's abandoned reads of a truncated step, each with a traceback."""

  def __init__(self, seen):
    super().__init__()
    self.seen = seen

  def filter(self, record):
    msg = str(record.msg)
    if msg.startswith(("Task exception was never retrieved", "Exception in callback")):
      self.seen.append("asyncio")
      return False
    return True


@contextlib.contextmanager
def quiet_unraisable(what: str):
  """Collect what Python and asyncio would print as "Exception ignored in ..." (sys.unraisablehook)
  or "Task exception was never retrieved" while ``what`` runs; log their count at debug level
  instead of printing each with its traceback."""
  seen = []
  old = sys.unraisablehook
  sys.unraisablehook = lambda u: seen.append(u.exc_type.__name__ if u.exc_type else "?")
  drop = _DropAsyncioNoise(seen)
  logging.getLogger("asyncio").addFilter(drop)
  try:
    yield
  finally:
    sys.unraisablehook = old
    logging.getLogger("asyncio").removeFilter(drop)
    if seen:
      log.debug("%d background exceptions ignored while %s (%s)", len(seen), what,
                ", ".join(sorted(set(seen))))


def short_error(e, n=300):
  s = str(e).replace("\n", " ")
  return s[:n] + ("..." if len(s) > n else "")
