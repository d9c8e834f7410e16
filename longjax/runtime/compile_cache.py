"""JAX's persistent compilation cache, on by default for the command-line entry points.

A beacon prefill compiles one program per memory-size bucket: 11-16 s at 8K-16K tokens on CPU,
about half of a one-off run. With the cache a second process loads those programs from disk.

Where: ``--compile_cache=<dir>`` on the CLIs, else ``$LONGJAX_COMPILE_CACHE``, else
``<cache home>/jax_compile`` (cache home: ``$LONGJAX_CACHE``, ``$XDG_CACHE_HOME/longjax`` or
``~/.cache/longjax``). ``off`` (flag or variable) turns it off. Library users call
:func:`enable` themselves; importing longjax changes no JAX setting.

The compilation cache still leaves tracing and lowering to every process; :func:`enable` also
turns on :mod:`longjax.runtime.program_cache`, which keeps the Beacon window programs already
lowered.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Optional

ENV = "LONGJAX_COMPILE_CACHE"
OFF = ("off", "0", "false", "none", "no")


def cache_home() -> Path:
  """``$LONGJAX_CACHE`` or ``$XDG_CACHE_HOME/longjax`` or ``~/.cache/longjax``: where longjax
  keeps what it downloads or compiles once."""
  root = os.environ.get("LONGJAX_CACHE")
  if root:
    return Path(root)
  return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "longjax"


def resolve(where: Optional[str] = None) -> Optional[Path]:
  """The cache directory ``where`` asks for (``None``/``"auto"``: the variable, else the
  default), or ``None`` when it is turned off."""
  if where in (None, "", "auto"):
    where = os.environ.get(ENV) or "auto"
  if str(where).lower() in OFF:
    return None
  return cache_home() / "jax_compile" if where == "auto" else Path(where).expanduser()


def _unusable(path: Path) -> Optional[str]:
  """Why ``path`` cannot hold the cache (a file, not creatable, not writable), or ``None``."""
  import tempfile
  try:
    path.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryFile(dir=path):
      pass
    (path / "programs").mkdir(exist_ok=True)
  except OSError as e:
    return f"{e.strerror or type(e).__name__}" + (f": {e.filename}" if e.filename else "")
  return None


def enable(where: Optional[str] = None, min_compile_s: float = 0.2) -> Optional[Path]:
  """Point JAX's persistent compilation cache at :func:`resolve` ``(where)``, for programs that
  take at least ``min_compile_s`` to compile; returns the directory (``None``: left off). Call
  before the first compile."""
  path = resolve(where)
  if path is None:
    return None
  import jax
  problem = _unusable(path)
  if problem:  # a cache is an optimisation: never a reason to stop the run
    print(f"warning: compilation cache off: {path} ({problem}); running without it (set "
          f"--compile_cache or ${ENV} to a writable directory, or 'off')", file=sys.stderr)
    return None
  jax.config.update("jax_compilation_cache_dir", str(path))
  # JAX's defaults skip programs that compile in under a second; a beacon run has many
  # programs of 0.2-1 s each (decode steps, small buckets), which add up.
  jax.config.update("jax_persistent_cache_min_compile_time_secs", float(min_compile_s))
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
  from longjax.runtime import program_cache
  program_cache.enable(path / "programs")  # traced programs too: see program_cache
  return path
