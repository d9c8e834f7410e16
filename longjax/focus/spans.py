"""Random FocusLLM training indices (docs/focusllm.md §5); host-side numpy only.
``FocusTask.prepare`` draws them per sample.

The model never draws anything: :class:`longjax.focus.losses.FocusLoss` takes the indices this
module samples (or any others, e.g. recorded ones).
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from longjax.data.errors import DataError

OFFICIAL_STRIDES = (64, 128, 256, 512, 1024, 2048)


def sample_indices(rng: np.random.Generator, length: int, *, window: int = 3072,
                   strides=OFFICIAL_STRIDES, min_local: int = 30,
                   objective: str = "random") -> dict:
  """Draw one sample's indices as the official training does (``train.sh``: W=3072).

  * objective: ``"continuation"`` / ``"repetition"`` / ``"random"`` (each with probability 1/2);
  * ``ls ~ U{min_local .. W-2}``, ``S ~ U(strides)``, ``N = floor(L / W)`` (needs ``L >= W``);
  * continuation: ``a = (N-1)W + U{1 .. W-ls-1}``, memory ``x[0:a]``;
  * repetition: ``a = U{0..N-1}W + U{0 .. W-ls-1}``, memory the whole sample.

  Returns ``dict(objective, memory_len, local_start, local_size, stride, target_index)``.
  """
  if length < window or window - 2 < min_local:
    raise DataError(f"a training sample needs length >= window ({window}) > min_local + 1; "
                     f"got length {length}, min_local {min_local}")
  if objective == "random":
    objective = ("continuation", "repetition")[int(rng.integers(2))]
  n = length // window
  ls = int(rng.integers(min_local, window - 1))
  stride = int(strides[int(rng.integers(len(strides)))])
  if objective == "continuation":
    a = (n - 1) * window + int(rng.integers(1, window - ls))
    memory_len = a
  elif objective == "repetition":
    a = int(rng.integers(n)) * window + int(rng.integers(0, window - ls))
    memory_len = length
  else:
    raise DataError(f"objective must be continuation, repetition or random, got {objective!r}")
  return dict(objective=objective, memory_len=memory_len, local_start=a, local_size=ls,
              stride=stride, target_index=a + ls)


def focus_indices(rng: np.random.Generator, length: int, answer: Optional[np.ndarray], fc) -> dict:
  """One FocusLLM training sample's indices (docs/focusllm.md §5).

  ``fc`` holds ``window``, ``strides``, ``min_local``, ``objective`` and optionally ``steps``
  (J teacher-forced decode steps scored from the drawn target on, §5.1: the draws leave room for
  the targets ``target_index .. target_index + J - 1``). ``objective="answer"`` targets a token of
  the answer span (a continuation sample whose target is an answer token: memory = everything
  before the local span; with J steps the first target moves back when the answer ends within J
  tokens of the sample's end) and falls back to the official draw when the sample has no answer.
  """
  window, strides = int(fc["window"]), tuple(int(s) for s in fc["strides"])
  min_local = int(fc.get("min_local", 30))
  objective = fc.get("objective", "random")
  steps = int(fc.get("steps", 1))
  last_start = length - steps  # the first target's largest index
  if objective == "answer":
    pos = np.flatnonzero(answer) if answer is not None else np.zeros(0, int)
    pos = np.minimum(pos[pos > min_local], last_start)
    pos = pos[pos > min_local]
    if pos.size:
      t = int(pos[int(rng.integers(pos.size))])
      ls = int(rng.integers(min_local, min(window - 2, t - 1) + 1))
      a = t - ls
      return dict(objective="answer", memory_len=a, local_start=a, local_size=ls,
                  stride=int(strides[int(rng.integers(len(strides)))]), target_index=t)
    objective = "random"
  return sample_indices(rng, last_start + 1, window=window, strides=strides, min_local=min_local,
                        objective=objective)


def dense_indices(rng: np.random.Generator, length: int, fc) -> dict:
  """One dense sample's indices (docs/focusllm.md §5.3): the local span ``x[a : a+ls]`` with
  ``ls = min(W, L - 2)`` and ``a ~ U{1 .. L-ls-1}`` (memory ``x[0:a]``, at least one token; the
  span's last target ``x[a+ls]`` inside the sample), and a stride drawn as for the other
  objectives. Every token of the span is a target."""
  window, strides = int(fc["window"]), tuple(int(s) for s in fc["strides"])
  if length < 3:
    raise DataError(f"a dense FocusLLM sample needs at least 3 tokens (memory, local, target); "
                    f"got {length}")
  ls = min(window, length - 2)
  a = int(rng.integers(1, length - ls))
  return dict(objective="dense", memory_len=a, local_start=a, local_size=ls,
              stride=int(strides[int(rng.integers(len(strides)))]), target_index=a + ls)
