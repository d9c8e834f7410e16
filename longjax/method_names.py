"""Who the methods are, as data: the bottom of the method registry.

:mod:`longjax.methods` hands out one object per method and is the only place that picks a method
by its name. Some code below it must still name a method without importing it (the registry sits
above the method packages): an export says in config.json which method wrote it and official
checkpoints show it by their fields (``ckpts/hf``), a train.py run config names its method and
the section of its settings (``beacon/asset``, ``focus/asset``, ``campaign``). Those marks are
written here, once per method; the registry's objects take their name and section from here too.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

from longjax.errors import LongjaxError


@dataclasses.dataclass(frozen=True)
class MethodName:
  name: str  # config.method, the registry's key, the longjax_method field of its exports
  section: Optional[str]  # the run config's section of its settings (None: it has none)
  title: str  # how messages call it
  loader: Optional[str] = None  # the function that loads its checkpoints
  # config.json fields that only its official checkpoints carry (they have no longjax_method)
  official_fields: tuple = ()


BEACON = MethodName("beacon", "beacon", "Activation Beacon", "longjax.beacon.load_beacon",
                    ("beacon_window",))
# FocusLLM's official checkpoints carry beacon_* fields too: local_window / memory_stride tell them
FOCUS = MethodName("focus", "focus", "FocusLLM", "longjax.focus.load_focus",
                   ("local_window", "memory_stride"))
PLAIN = MethodName("plain", None, "the plain decoder")
# train.py's config.method spells the plain decoder "lm" when it pretrains a tiny base; the name
# is part of those runs' fingerprints, so it stays
PLAIN_PRETRAIN = "lm"

ALL = (BEACON, FOCUS, PLAIN)


class UnknownMethodError(LongjaxError, ValueError):
  pass


def entry(name) -> MethodName:
  """The method called ``name`` (``lm``: the plain decoder, as train.py spells it when it
  pretrains a tiny base); :func:`longjax.methods.get` hands out its object."""
  key = str(name).lower()
  key = PLAIN.name if key == PLAIN_PRETRAIN else key
  for m in ALL:
    if m.name == key:
      return m
  raise UnknownMethodError(f"unknown method {name!r}; valid: {', '.join(m.name for m in ALL)} "
                           "(train.py also takes 'lm' for the plain decoder)")
