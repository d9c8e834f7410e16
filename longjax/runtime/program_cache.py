"""Traced programs kept across processes (``jax.export``), next to the compilation cache.

JAX's persistent compilation cache (:mod:`longjax.runtime.compile_cache`) skips XLA's compile,
but every process still traces and lowers each program first: for a Beacon prefill that is ~1 s per
memory-size bucket (the layer stack under ``nn.scan``, the window scan), about as long as loading
the compiled programs. This module keeps the lowered program itself: the first process exports it
(``jax.export``: StableHLO, no pickle) to ``<compile cache>/programs``; later processes
deserialize it and call it, so neither tracing nor lowering is repeated, and the call's XLA
program is the same in every process, hence found in the compilation cache.

A program is stored under a key of everything that can change it: the function's name and
static arguments, the argument tree and every leaf's shape / dtype / sharding, the source of
every longjax module, the jax version, the platform and devices, ``XLA_FLAGS`` and the JAX
settings that change tracing. Calls under a transformation (tracers: ``jax.grad``, ``vmap``, an
enclosing ``jit``) and processes without the cache run the function as usual.

On by default wherever the compilation cache is (``compile_cache.enable``).
"""
from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Callable, Optional

import jax
import numpy as np

_log = logging.getLogger("longjax.runtime.program_cache")
_DIR: Optional[Path] = None
_LOADED: dict = {}  # key -> jitted call of the deserialized program
SUFFIX = ".jaxexport"


def enable(directory: Optional[Path]):
  """Keep exported programs in ``directory`` (``None``: stop)."""
  global _DIR
  if directory is not None:
    import importlib.util
    if importlib.util.find_spec("flatbuffers") is None:  # jax.export's serializer needs it
      _log.warning("program cache off: jax.export serialization needs the 'flatbuffers' package "
                   "(pip install flatbuffers); programs are traced in every process")
      directory = None
  _DIR = None if directory is None else Path(directory)
  if _DIR is not None:
    _DIR.mkdir(parents=True, exist_ok=True)


def directory() -> Optional[Path]:
  return _DIR


@functools.lru_cache(maxsize=1)
def _code_version() -> str:
  """Hash of every longjax source file: a changed module never reuses an old program."""
  h = hashlib.sha256()
  root = Path(__file__).resolve().parents[1]  # the whole longjax package
  for p in sorted(root.rglob("*.py")):
    h.update(str(p.relative_to(root)).encode())
    h.update(p.read_bytes())
  return h.hexdigest()


def _environment() -> list:
  devs = jax.devices()
  from importlib import metadata
  return [jax.__version__, metadata.version("jaxlib"), jax.default_backend(), len(devs),
          sorted({d.device_kind for d in devs}),
          os.environ.get("XLA_FLAGS", ""), jax.config.jax_enable_x64,
          str(jax.config.jax_default_matmul_precision), _code_version()]


def _key(name: str, static: dict, treedef, leaves) -> str:
  parts = [name, sorted((k, repr(v)) for k, v in static.items()), str(treedef),
           [(tuple(np.shape(x)), str(x.dtype), bool(getattr(x, "weak_type", False)),
             _sharding(x)) for x in leaves], _environment()]
  return hashlib.sha256(json.dumps(parts, default=repr).encode()).hexdigest()


def _sharding(x) -> Optional[str]:
  """Only a multi-device layout changes the program: a host array and an array on the one
  device are the same input."""
  sh = getattr(x, "sharding", None)
  return repr(sh) if sh is not None and len(sh.device_set) > 1 else None


_TYPES: dict = {}  # pytree type -> serialized name, told by the modules that own the types
_registered: set = set()


def register_pytree(cls, serialized_name: str):
  """Tell the cache about a pytree type that appears in exported signatures (the type's owner
  calls this where it defines it): ``jax.export`` needs a serialized name for it (no pickle). A
  named tuple is serialized as one; a registered dataclass with its static fields as JSON.
  Registration with ``jax.export`` waits until a program is first exported or loaded."""
  _TYPES[cls] = serialized_name


def _tupled(x):  # JSON turns the static fields' tuples into lists
  return tuple(_tupled(i) for i in x) if isinstance(x, list) else x


def _register_types():
  for cls, name in _TYPES.items():
    if cls in _registered:
      continue
    _registered.add(cls)
    if issubclass(cls, tuple) and hasattr(cls, "_fields"):
      jax.export.register_namedtuple_serialization(cls, serialized_name=name)
    else:  # a registered dataclass: its auxiliary data is the tuple of its static fields
      jax.export.register_pytree_node_serialization(
          cls, serialized_name=name, serialize_auxdata=lambda aux: json.dumps(aux).encode(),
          deserialize_auxdata=lambda b: _tupled(json.loads(b.decode())))


def call(name: str, fn: Callable, static: dict, *args):
  """``fn(*args, **static)`` (``fn`` jitted, ``static`` its static keyword arguments) through the
  program cache when it is enabled and no argument is a tracer."""
  leaves, treedef = jax.tree.flatten(args)
  if _DIR is None or any(isinstance(x, jax.core.Tracer) for x in leaves):
    return fn(*args, **static)
  key = _key(name, static, treedef, leaves)
  run = _LOADED.get(key)
  if run is None:
    _register_types()
    path = _DIR / f"{name}-{key[:40]}{SUFFIX}"
    exported = _load(path)
    if exported is not None:
      run = jax.jit(exported.call)
      try:
        out = run(*args)
      except Exception as e:  # noqa: BLE001 -- a valid program of another signature (a file
        # copied or renamed into the cache): discarded and exported afresh
        _log.warning("discarding cached program %s: it does not fit this call (%s: %s)", path,
                     type(e).__name__, " ".join(str(e).split())[:200])
        exported = None
      else:
        _LOADED[key] = run
        return out
    exported = jax.export.export(jax.jit(functools.partial(fn, **static)))(*args)
    _save(path, exported.serialize())
    run = _LOADED[key] = jax.jit(exported.call)
  return run(*args)


def memo(name: str, key: str, compute: Callable[[], object]):
  """A small JSON value that takes a trace to compute (e.g. a config's parameter shapes), kept
  beside the programs under ``key`` (plus the environment); ``compute()`` when the cache is off."""
  if _DIR is None:
    return compute()
  digest = hashlib.sha256(json.dumps([name, key, _environment()], default=repr).encode())
  path = _DIR / f"{name}-{digest.hexdigest()[:40]}.json"
  try:
    return json.loads(path.read_text())
  except (OSError, ValueError):  # absent or unreadable: compute and keep
    pass
  value = compute()
  _save(path, json.dumps(value).encode())
  return value


def _load(path: Path):
  if not path.exists():
    return None
  try:
    return jax.export.deserialize(bytearray(path.read_bytes()))
  except Exception as e:  # a truncated or foreign file: export afresh and overwrite it
    _log.warning("ignoring unreadable cached program %s (%s)", path, e)
    return None


def _save(path: Path, data: bytes):
  """Atomically (write + rename): a crashed process never leaves a half-written program."""
  tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
  try:
    tmp.write_bytes(bytes(data))
    os.replace(tmp, path)
  except OSError as e:  # a read-only cache still runs, it just does not keep the program
    _log.warning("could not keep the exported program in %s (%s)", path.parent, e)
    tmp.unlink(missing_ok=True)
