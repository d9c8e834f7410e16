"""The method protocol: what ``longjax.generate`` (``longjax.inference``) drives, defined below
the methods so that a method implements it without importing the inference package.

A *method* is any object with

* ``cfg``: its ``ModelConfig``;
* ``prefill(params, tokens [B, T] int32 right-padded, lengths [B], max_new_tokens)``
  ``-> (next_logits [B, V], state)``;
* ``step(params, state, tokens [B]) -> (next_logits [B, V], state)``;
* optionally ``device_plan(state, n_feeds) -> DevicePlan``: the decode loop then runs on device
  (``longjax.inference.decode_loop``), sampling and stop ids included.

``state`` is a pytree owned by the method (KV cache, beacon memory, chunk caches).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional, Sequence


@dataclasses.dataclass
class Segment:
  """Feeds ``[previous segment's end, end)`` run ``step(params, carry, x, tokens [B]) ->
  (logits [B, V], carry)``: a pure jittable function, hashable by value (a static argument: equal
  steps share one compiled loop). Feed ``f`` reads ``x = xs[f - first]`` (``None`` without xs).
  A step with a ``prepare_params(params)`` method gets the parameters through it (on the host,
  before its loop)."""
  end: int
  step: Callable
  xs: Any = None  # leaves [n, ...]: per-feed inputs planned on the host
  first: int = 0  # the feed xs[0] belongs to


@dataclasses.dataclass
class DevicePlan:
  """What a method hands the device loop for ``n_feeds`` fed tokens (host side): the device
  state to carry, the segments covering feeds ``[0, n_feeds)`` in order, and ``finish(carry,
  feeds)``, which turns the carry after ``feeds`` fed tokens back into the method's state
  (default: the carry itself). ``segments`` may be a generator: the loop draws the next one when
  it reaches it, so a method can plan lazily (a generation that stops early plans no further).
  Shapes of ``xs`` key the compiled loop: keep them independent of ``max_new_tokens``."""
  carry: Any
  segments: Sequence[Segment]
  finish: Optional[Callable[[Any, int], Any]] = None
