"""What the command-line entry points share: a known failure (:class:`LongjaxError`, the OSError
of a bad path, or a Python package that is not installed) ends as one line on stderr and exit
status 1; ``--debug`` shows the traceback instead. :func:`parser` gives every argparse entry point
the same help layout (its ``python ...`` name, example lines kept as written, every option's
default shown).

train.py and eval.py take ml_collections configs through absl flags; :func:`absl_flags_parser`
checks the ``--config`` file and every ``--config.a.b=...`` override against the config's keys
before absl parses them, so an unknown key reads "unknown key train.learning_rate; did you mean
train.lr?" instead of a 50-line KeyError traceback from inside the flag parser.
"""
from __future__ import annotations

import argparse
import difflib
import sys
from pathlib import Path
from typing import Callable, Iterable, List, Optional

from longjax.errors import LongjaxError, missing_dependency, one_line

KNOWN = (LongjaxError, OSError)


def debug_requested(argv: Iterable[str]) -> bool:
  """``--debug`` (or ``--debug=true``) among the arguments (before any flag parser ran)."""
  return any(a in ("--debug", "--debug=true", "--debug=True", "--debug=1") for a in argv)


def error_line(prog: str, e: BaseException) -> str:
  return f"{prog}: error: {one_line(e)}"


COMPILE_CACHE_HELP = ("JAX's persistent compilation cache: a directory, 'auto' "
                      "($LONGJAX_COMPILE_CACHE or <cache home>/jax_compile) or 'off'")


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
  """The description as written (its example commands stay one per line) and every option's
  default after its help: ``(default: X)``, ``off`` for a flag, ``none`` for an option that is
  unset unless given; a help that already says its default (the word "default") is left as it is."""

  def _get_help_string(self, action):
    text = action.help or ""
    if (action.default is argparse.SUPPRESS or action.required or not action.option_strings
        or "default" in text.lower()):
      return text
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
      shown = "on" if action.default else "off"
    elif action.default is None or action.default == "":
      shown = "none"
    else:
      shown = "%(default)s"
    return f"{text} (default: {shown})" if text else f"(default: {shown})"


def parser(prog: str, doc: Optional[str]) -> argparse.ArgumentParser:
  """An entry point's argument parser: ``prog`` as the user types it (``python -m
  longjax.beacon``: argparse would otherwise show ``__main__.py``), ``doc`` as its description."""
  return argparse.ArgumentParser(prog=prog, description=doc, formatter_class=HelpFormatter)


def run(prog: str, fn: Callable[[], Optional[int]], *, debug: bool = False,
        errors=KNOWN, compile_cache: Optional[str] = "auto") -> int:
  """``fn()`` (its return value, ``None`` = 0) with the persistent compilation cache at
  ``compile_cache`` (``longjax.runtime.compile_cache``); a known failure prints one line and gives
  1, or re-raises when ``debug``."""
  try:
    from longjax.runtime import compile_cache as cc
    cc.enable(compile_cache)
    return fn() or 0
  except errors as e:
    if debug:
      raise
    print(error_line(prog, e), file=sys.stderr)
    return 1
  except ModuleNotFoundError as e:  # a package not installed: name it and the install command
    missing = missing_dependency(e)
    if debug or missing is None:  # one of longjax's own modules: a bug, with its traceback
      raise
    print(error_line(prog, missing), file=sys.stderr)
    return 1


# ------------------------------------------------------------------------------------------------
# absl / ml_collections config flags
def _flag_value(argv: List[str], name: str) -> Optional[str]:
  for i, a in enumerate(argv):
    if a.startswith(f"--{name}="):
      return a.split("=", 1)[1]
    if a == f"--{name}" and i + 1 < len(argv):
      return argv[i + 1]
  return None


def _overrides(argv: List[str], name: str) -> List[str]:
  out = []
  for a in argv:
    for pre in (f"--{name}.", f"--no{name}."):
      if a.startswith(pre):
        out.append(a[len(pre):].split("=", 1)[0])
  return out


def _initials(name: str) -> str:
  return "".join(w[0] for w in name.split("_") if w)


def _paths(config, prefix: str = "") -> List[str]:
  out = []
  for k in config.keys():
    p = f"{prefix}.{k}" if prefix else k
    out.append(p)
    v = config[k]
    if hasattr(v, "keys") and not isinstance(v, dict):
      out.extend(_paths(v, p))
  return out


def suggestions(name: str, keys: Iterable[str]) -> List[str]:
  """Keys the user may have meant by ``name``: close spellings (difflib), abbreviations
  (``learning_rate`` -> ``lr``) and prefixes."""
  keys = sorted(keys)
  near = difflib.get_close_matches(name, keys, n=3, cutoff=0.6)
  for k in keys:
    if k in near:
      continue
    if (len(k) > 1 and _initials(name) == k) or (len(name) > 1 and _initials(k) == name) or (
        min(len(k), len(name)) >= 3 and (k.startswith(name) or name.startswith(k))):
      near.append(k)
  return near[:3]


def unknown_key(config, dotted: str) -> Optional[str]:
  """The problem with the override path ``dotted`` on ``config`` (a ConfigDict), or ``None``
  when its keys exist (its value is then absl's to check)."""
  parts = dotted.split(".")
  node = config
  for i, part in enumerate(parts):
    if not hasattr(node, "keys"):
      return None  # a field holding None or a value: ml_collections decides
    if part in node.keys():
      node = node[part]
      continue
    prefix = ".".join(parts[:i])
    bad = ".".join(parts[:i + 1])
    near = [f"{prefix}.{k}" if prefix else k for k in suggestions(part, node.keys())]
    # the same name in another section (--config.lr for train.lr)
    near += [p for p in _paths(config) if p.split(".")[-1] == part and p not in near][:2]
    if near:
      return f"unknown key {bad}; did you mean {' or '.join(near)}?"
    where = f"of {prefix}" if prefix else "at the top"
    return f"unknown key {bad}; the config's keys {where}: {', '.join(sorted(node.keys()))}"
  return None


def config_problem(argv: List[str], name: str = "config") -> Optional[str]:
  """A missing ``--config`` file or an override of a key the config does not have, as one line;
  ``None`` if neither (absl then parses as usual)."""
  path = _flag_value(argv, name)
  if path is None:
    return None
  file = path.split(":", 1)[0]
  if not Path(file).is_file():
    return f"--{name}={path}: no such config file"
  overrides = _overrides(argv, name)
  from ml_collections.config_flags import config_flags
  try:
    config = config_flags.ConfigFileFlagParser(name=name).parse(path)
    keys = config.keys()  # an _ErrorConfig (the file failed to load) raises here
  except SyntaxError as e:  # absl would show a traceback through its flag parser
    return (f"--{name}={path}: the config file has a syntax error at line {e.lineno} "
            f"({e.msg}); fix {e.filename or file}")
  except Exception as e:  # noqa: BLE001 -- the file's own code failed
    return (f"--{name}={path}: the config file fails to load: {type(e).__name__}: {one_line(e)}; "
            "fix the file")
  del keys
  for o in overrides:
    problem = unknown_key(config, o)
    if problem:
      return problem
  return None


HELP_FLAGS = ("--help", "-help", "-?", "--helpshort", "--helpfull", "--helpxml")


def absl_flags_parser(prog: str, name: str = "config"):
  """A ``flags_parser`` for ``absl.app.run``: :func:`config_problem` first, then absl's own
  parsing, whose KeyError/AttributeError/OSError for a bad override also end as one line."""
  def parse(argv):
    from absl import app
    # absl knows --help / --helpfull but not -h, and ends a help it printed with status 1: a
    # help asked for is a success (0), as argparse entry points do.
    argv = [a if a != "-h" else "--help" for a in argv]
    asks_help = any(a.split("=", 1)[0] in HELP_FLAGS for a in argv[1:])
    debug = debug_requested(argv[1:])
    if not debug:
      problem = config_problem(argv[1:], name)
      if problem:
        print(f"{prog}: error: {problem}", file=sys.stderr)
        sys.exit(1)
    try:
      return app.parse_flags_with_usage(argv)
    except SystemExit as e:
      if asks_help and e.code == 1:
        sys.exit(0)
      raise
    except (KeyError, AttributeError, OSError, ValueError) as e:
      if debug:
        raise
      print(error_line(prog, e), file=sys.stderr)
      sys.exit(1)
  return parse
