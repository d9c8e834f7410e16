"""The one base class of longjax's own exceptions."""
from __future__ import annotations


class LongjaxError(Exception):
  """A known failure of the project: a bad input, config, checkpoint or run state, with a message
  that names the problem and what to do about it.

  Every longjax exception class derives from it (keeping its older base, e.g. ``ValueError``, so
  existing ``except`` clauses still match). The CLIs (train.py, eval.py, convert_weights.py,
  ``python -m longjax.beacon``, ``python -m longjax.models.smollm2``) print these as one line on
  stderr and exit non-zero; ``--debug`` shows the traceback instead.
  """


def one_line(e: BaseException) -> str:
  """The message of ``e`` on one line (whitespace runs collapsed). An OSError with a filename
  (e.g. FileNotFoundError from open()) reads "<strerror>: <filename>"."""
  if isinstance(e, OSError) and e.filename is not None and e.strerror:
    msg = f"{e.strerror}: {e.filename}"
  else:
    msg = str(e) or type(e).__name__
  return " ".join(msg.split())


# A path argument that does not fit (a CLI flag, an output directory, a checkpoint directory).
# Each is also the OSError it replaces, so ``except FileNotFoundError`` and the like still match.
class PathNotFound(LongjaxError, FileNotFoundError):
  """An input path that does not exist (or is not what it must be)."""


class PathExists(LongjaxError, FileExistsError):
  """An output path that exists and may not be replaced."""


class NotADirectory(LongjaxError, NotADirectoryError):
  """A path that must be a directory and is not."""


class CheckpointWriteError(LongjaxError, OSError):
  """A checkpoint (or export) could not be written (disk full, I/O error); nothing of it is left."""


def write_failed(path, e: BaseException) -> CheckpointWriteError:
  """One line for a failed write of ``path``: orbax, tensorstore and safetensors report a full
  disk each in their own words and types (not always an OSError)."""
  msg = " ".join(str(e).split())[:300] or type(e).__name__
  return CheckpointWriteError(f"cannot write {path} ({type(e).__name__}: {msg}); nothing was "
                              "written: free some space (or choose another output) and run again")
