"""eval.py's checks that need neither the model nor a document: the output names, the method's
settings section, the chat-template mode and every size field, each refused in one line naming
the field, before anything is loaded, built or written.

A size is bounded by :data:`MAX_TOKENS` (:data:`MAX_CHARS` for FocusLLM's passkey garbage):
a length the host cannot even build a document for (``passkey.lengths=(10**9,)``: a list of
10^9 ids) is refused here; what a loaded model holds is checked again, exactly, before each
task builds its documents (``EvalModel.check_capacity``).
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from longjax import method_names
from longjax.eval.errors import EvalError

# No released model holds 16M tokens of context; a document of that many ids is already ~0.5 GB
# of Python ints on the host. FocusLLM's passkey is sized in characters (about 4 per token).
MAX_TOKENS = 1 << 24
MAX_CHARS = 1 << 26
CHAT_TEMPLATE_MODES = ("auto", "none")

# A tag prefixes file names inside output_dir: a plain name, never a path.
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]*")


def _is_int(v) -> bool:
  return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def check_int(field: str, v, lo: int, hi: int) -> None:
  if not _is_int(v) or not lo <= int(v) <= hi:
    raise EvalError(f"config.eval.{field}={v!r}: must be an integer in [{lo}, {hi}]")


def check_ints(field: str, vs, lo: int, hi: int) -> None:
  if isinstance(vs, (str, bytes)) or not hasattr(vs, "__len__"):
    raise EvalError(f"config.eval.{field}={vs!r}: must be a tuple of integers")
  for v in vs:
    if not _is_int(v) or not lo <= int(v) <= hi:
      raise EvalError(f"config.eval.{field}: {v!r} is not an integer in [{lo}, {hi}]"
                      + (f" (at most {hi} tokens on this host); shorten it" if _is_int(v)
                         and int(v) > hi else ""))


def check_tag(tag: str) -> None:
  if tag and (not _TAG.fullmatch(tag) or tag in (".", "..")):
    raise EvalError(f"config.eval.tag={tag!r}: must be a plain name (letters, digits, '_', '.', "
                    "'+', '-'; no '/' or '..'): it prefixes the file names inside output_dir; "
                    "choose the directory with config.eval.output_dir")


def check_output_dir(out: Path) -> None:
  from longjax.ckpts.atomic_dir import check_parent
  if out.exists() and not out.is_dir():
    raise EvalError(f"config.eval.output_dir {out} is a file, not a directory; choose a directory "
                    "(or set config.workdir: results go to {workdir}/eval)")
  try:
    check_parent(out / "x")
  except OSError as e:
    raise EvalError(f"config.eval.output_dir {out}: {e}") from None


def check_method_section(config, name: str) -> None:
  section = method_names.entry(name).section
  if section is not None and getattr(config, section, None) is None:
    raise EvalError(f"config.eval.method={name!r} needs the config's {section!r} settings section, "
                    f"which this {config.method!r} config has not; use a {name} config (e.g. "
                    f"configs/tiny_{name}.py) or leave config.eval.method empty")


def check(config, tasks, out: Path, tag: str, method: str) -> None:
  """Everything above, for the run of ``tasks`` (config: the typed ``RunConfig``)."""
  e = config.eval
  check_tag(tag)
  check_output_dir(out)
  check_method_section(config, method)
  if e.chat_template not in CHAT_TEMPLATE_MODES:
    raise EvalError(f"config.eval.chat_template={e.chat_template!r}: use 'auto' (the tokenizer's "
                    "template where the protocol uses one) or 'none'")
  check_int("max_samples", e.max_samples, 0, 2**31 - 1)
  check_int("truncate_to", e.truncate_to, 0, MAX_TOKENS)
  check_int("model_max_length", e.model_max_length, 0, MAX_TOKENS)
  if "passkey" in tasks:
    p = e.passkey
    if p.protocol == method_names.BEACON.name:
      check_ints("passkey.lengths", p.lengths, 1, MAX_TOKENS)
      check_int("passkey.max_new_tokens", p.max_new_tokens, 1, MAX_TOKENS)
      check_int("passkey.seed", p.seed, 0, 2**63 - 1)
    else:
      check_ints("passkey.n_garbage", p.n_garbage, 1, MAX_CHARS)
      check_ints("passkey.seeds", p.seeds, 0, 2**32 - 1)  # numpy RandomState's seed range
  if "needle" in tasks:
    check_ints("needle.lengths", e.needle.lengths, 1, MAX_TOKENS)
    check_int("needle.max_new_tokens", e.needle.max_new_tokens, 1, MAX_TOKENS)
  if "perplexity" in tasks:
    pp = e.perplexity
    check_int("perplexity.max_length", pp.max_length, 2, MAX_TOKENS)
    check_int("perplexity.stride", pp.stride, 1, MAX_TOKENS)
    check_int("perplexity.last_n", pp.last_n, 1, MAX_TOKENS)
    check_int("perplexity.max_docs", pp.max_docs, 0, 2**31 - 1)
  if "longbench" in tasks:
    check_int("longbench.max_length", e.longbench.max_length, 0, MAX_TOKENS)
  if "infbench" in tasks:
    check_int("infbench.max_length", e.infbench.max_length, 0, MAX_TOKENS)
