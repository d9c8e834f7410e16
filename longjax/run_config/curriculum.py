"""``data.curriculum``: the longest documents (in beacon windows) a run trains on, by step.

``"0:2,300:4,600:8"`` trains the steps before 300 on documents of at most 2 windows, steps 300-599
on at most 4, and from step 600 on at most 8 (RMT's curriculum on the number of segments; the
official recipe has none). Documents longer than the current stage allows are skipped where the
epoch's order meets them, so the order stays a function of ``(seed, epoch)`` and a resumed run
skips the same ones.
"""
from __future__ import annotations

from typing import Optional, Tuple

from longjax.errors import LongjaxError

Stages = Tuple[Tuple[int, int], ...]  # (first step, most windows per document), steps increasing


class CurriculumError(LongjaxError, ValueError):
  pass


def parse(text: str) -> Stages:
  """``"STEP:WINDOWS,..."`` -> stages; ``""`` -> ``()`` (no curriculum)."""
  text = (text or "").strip()
  if not text:
    return ()
  stages = []
  for part in text.split(","):
    step, colon, windows = part.strip().partition(":")
    try:
      stage = (int(step), int(windows))
    except ValueError:
      stage = None
    if not colon or stage is None:
      raise CurriculumError(f"data.curriculum={text!r}: {part.strip()!r} is not STEP:WINDOWS "
                            "(e.g. '0:2,300:4,600:8')")
    stages.append(stage)
  steps = [s for s, _ in stages]
  if steps[0] != 0:
    raise CurriculumError(f"data.curriculum={text!r}: the first stage must start at step 0 "
                          f"(got {steps[0]})")
  if any(b <= a for a, b in zip(steps, steps[1:])):
    raise CurriculumError(f"data.curriculum={text!r}: stage steps must increase")
  if any(w < 1 for _, w in stages):
    raise CurriculumError(f"data.curriculum={text!r}: every stage needs at least 1 window")
  return tuple(stages)


def max_windows(stages: Stages, step: int) -> Optional[int]:
  """The most windows per document at ``step`` (``None``: no curriculum, any length)."""
  out = None
  for first, windows in stages:
    if step >= first:
      out = windows
  return out
