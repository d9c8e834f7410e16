"""Evaluation of long-context methods: passkey, needle, perplexity, LongBench, InfiniteBench.

Protocols follow docs/beacon.md §8 and docs/focusllm.md §6 (prompts, grids, truncation,
metrics). Entry point: ``eval.py`` / :func:`longjax.eval.runner.run`. Scorers are in
:mod:`longjax.eval.scorers`, defaults in :mod:`longjax.run_config.eval_sections` (the config
files' section: :func:`longjax.eval.config.eval_config`).
"""
from longjax.eval.config import TASKS, eval_config
from longjax.eval.errors import EvalError

__all__ = ["TASKS", "eval_config", "EvalError"]
