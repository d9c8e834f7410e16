"""What a data source spec may say after its path: ``SOURCE[@OBJECTIVE][@ratio=N]``.

* ``@lm`` / ``@answer`` / ``@distill``: the training objective of that source's samples (else the
  run's ``data.loss_on``).
* ``@ratio=N``: the beacon compression ratio every sample of that source trains at (one of
  ``beacon.ratios``), whatever ``beacon.ratio_mix`` draws for the others. A campaign mixing ratios
  can so keep, e.g., its passkey documents at the ratio they are evaluated at.

Parsed here, below both the config check (``build``) and the data pipeline, so that a bad suffix
is refused before anything loads.
"""
from __future__ import annotations

import dataclasses
import re
from typing import List, Optional, Sequence

from longjax.errors import LongjaxError

OBJECTIVES = ("lm", "answer", "distill")
_RATIO = re.compile(r"ratio=(\d+)")


class SourceSpecError(LongjaxError, ValueError):
  """A source suffix that names no objective or ratio (callers rewrap it as their error)."""


@dataclasses.dataclass(frozen=True)
class SourceOptions:
  source: str  # the spec without its suffixes
  objective: Optional[str] = None  # None: the run's data.loss_on
  ratio: Optional[int] = None  # None: the run's beacon.ratio_mix draws


def parse(spec: str) -> SourceOptions:
  """Peels ``@ratio=N`` and ``@OBJECTIVE`` suffixes off ``spec`` (either order). An ``@`` inside
  a path (``text:/x/me@host.org/a``) is part of the path: a tail with ``/`` or ``.`` is no
  suffix."""
  head, objective, ratio = spec, None, None
  while True:
    h, at, tail = head.rpartition("@")
    if not at or "/" in tail or "." in tail:
      break
    m = _RATIO.fullmatch(tail)
    if m and ratio is None:
      ratio = int(m.group(1))
      if ratio < 1:
        raise SourceSpecError(f"data source {spec!r}: ratio={ratio}; give a positive ratio, one "
                              "of beacon.ratios (e.g. '@ratio=8')")
    elif tail in OBJECTIVES and objective is None:
      objective = tail
    else:
      what = "a second" if (m or tail in OBJECTIVES) else "an unknown"
      raise SourceSpecError(f"data source {spec!r}: {what} suffix {tail!r}; a source takes at "
                            f"most one objective {OBJECTIVES} and one 'ratio=N', each after '@'")
    head = h
  return SourceOptions(head, objective, ratio)


def parse_all(specs: Sequence[str]) -> List[SourceOptions]:
  return [parse(s) for s in specs]
