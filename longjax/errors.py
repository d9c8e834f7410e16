"""The one base class of longjax's own exceptions."""
from __future__ import annotations


class LongjaxError(Exception):
  """A known failure of the project: a bad input, config, checkpoint or run state, with a message
  that names the problem and what to do about it.

  Every longjax exception class derives from it (keeping its older base, e.g. ``ValueError``, so
  existing ``except`` clauses still match). The CLIs (train.py, eval.py, convert_weights.py,
  ``python -m longjax.beacon``, ``python -m longjax.ckpts.smollm2``) print these as one line on
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


class MissingDependency(LongjaxError, ImportError):
  """A Python package a feature needs is not installed (the message names it and how to get it)."""


# import name -> (pip package, the requirements file that pins it). Runtime packages are all in
# requirements.txt; torch and accelerate are test-only references, libtpu the compile-only TPU
# extra.
PACKAGES = {
    "torch": ("torch", "requirements-test.txt"),
    "accelerate": ("accelerate", "requirements-test.txt"),
    "pytest": ("pytest", "requirements-test.txt"),
    "libtpu": ("libtpu", "requirements-tpu.txt"),
    "tensorflow_datasets": ("tensorflow-datasets", "requirements.txt"),
    "array_record": ("array-record", "requirements.txt"),
    "ml_collections": ("ml-collections", "requirements.txt"),
    "absl": ("absl-py", "requirements.txt"),
    "orbax": ("orbax-checkpoint", "requirements.txt"),
    "huggingface_hub": ("huggingface-hub", "requirements.txt"),
    **{m: (m, "requirements.txt") for m in (
        "jax", "jaxlib", "flax", "optax", "chex", "safetensors", "numpy", "transformers",
        "tokenizers", "grain", "gguf", "flatbuffers", "jinja2", "tqdm", "matplotlib")},
}


def missing_dependency(e: ModuleNotFoundError, what: str = "") -> MissingDependency | None:
  """The one-line error for a package that is not installed: its pip name and the install
  command (the requirements file that pins it). None when ``e`` is about longjax's own modules
  (a bug, not a missing package)."""
  top = (getattr(e, "name", None) or "").split(".")[0]
  if not top or top == "longjax":
    return None
  package, pinned_in = PACKAGES.get(top, (top.replace("_", "-"), None))
  how = (f"pip install -r {pinned_in} (it pins {package})" if pinned_in
         else f"pip install {package}")
  need = f" ({what} needs it)" if what else ""
  return MissingDependency(f"the Python package '{package}' is not installed{need}: {how}")
