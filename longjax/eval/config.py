"""The ``config.eval`` section of the config files: ``c.eval = eval_config(method, preset)``.

Its defaults (the papers' protocols, docs/beacon.md §8 and docs/focusllm.md §6, on official or
CPU-sized grids) live in :mod:`longjax.run_config.eval_sections`; this turns them into the
ml_collections section a config file holds, so that every field can be overridden on the command
line (``--config.eval.passkey.lengths="(300,600)"``). Importing this module is cheap (ml_collections
and the method registry, which imports its methods lazily).
"""
from __future__ import annotations

from typing import Optional

import ml_collections

from longjax import methods
from longjax.eval.errors import EvalError
from longjax.run_config import to_dict
from longjax.run_config.eval_sections import (NEEDLE, NEEDLE_QUESTION, PRESETS, TASKS,
                                              eval_defaults)

__all__ = ["TASKS", "NEEDLE", "NEEDLE_QUESTION", "eval_config"]


def eval_config(method: Optional[str] = None, preset: str = "official", task: str = "passkey"
                ) -> ml_collections.ConfigDict:
  """``method``: a method's name (``longjax.methods``): its paper's protocol defaults
  (``Method.eval_protocols``; None: Activation Beacon's); ``preset``: ``official`` (the papers'
  grids) or ``tiny`` (CPU-sized grids for the tiny models)."""
  if preset not in PRESETS:
    raise EvalError(f"preset must be 'official' or 'tiny', got {preset!r}")
  paper = methods.get(method or methods.Beacon.name).eval_protocols
  return ml_collections.ConfigDict(to_dict(eval_defaults(paper, preset, task)))
