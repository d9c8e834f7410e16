"""Write a directory all-or-nothing: build it in a hidden sibling, rename it into place at the end.

A crash or an exception midway leaves no directory that looks like a complete checkpoint; an
existing directory is replaced only after the new one is complete.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path


@contextlib.contextmanager
def atomic_dir(path, overwrite: bool = False):
  """Yield a temporary directory that becomes ``path`` when the block finishes without error."""
  path = Path(path).absolute()
  if path.exists() and not overwrite:
    raise FileExistsError(f"{path} exists; pass overwrite=True (--overwrite) to replace it")
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.partial-", dir=path.parent))
  try:
    yield tmp
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
