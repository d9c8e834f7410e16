"""The decode loop on device: sampling, stop ids and the method's step inside one
``lax.while_loop``.

A method opts in by exposing ``device_plan(state, n_feeds) -> DevicePlan`` (host side, after
``prefill``): the fixed-shape device state to carry (``carry``), and segments of feeds, each
with the pure step function that feeds one token per row and optional per-feed inputs planned on
the host (``xs``; e.g. beacon window plans, whose layout depends only on positions, never on token
values).
``run`` then samples every token on device; it returns to the host only

* at the end of a ``Segment`` of the plan (a method switching step programs, e.g. a beacon
  memory-size bucket), or
* every ``chunk`` tokens when streaming (the callback then sees that chunk's tokens),

so a generation with one segment and no callback is one device call. The host loop in
``generate.py`` stays the reference: same sampling keys (``fold_in(key, t)``), same stop rule
(a row is done after emitting a stop id; the loop ends when every row is done), and every row is
fed its sample until then, as there.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from longjax.errors import LongjaxError
from longjax.inference.sampling import SamplingConfig, select_next
from longjax.models.protocol import DevicePlan, Segment  # noqa: F401  (the loop's input types)
from longjax.runtime.rounding import round_up


class DevicePlanError(LongjaxError, ValueError):
  """A method's :class:`DevicePlan` whose segments do not cover its feeds in order (a method of
  ``longjax.generate``'s protocol planned them wrongly)."""


# Token buffers are sized in multiples of this, so nearby max_new_tokens share one program.
BUFFER_MULTIPLE = 32


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class LoopState:
  n: jax.Array  # [] int32: tokens sampled so far (token n - 1 is sampled but not yet fed)
  tokens: jax.Array  # [B, N] int32: every sample, stop ids and samples of done rows included
  logits: Optional[jax.Array]  # [B, N, V]: the logits each token was sampled from (or None)
  done: jax.Array  # [B] bool: the row has emitted a stop id
  carry: Any  # the method's device state after n - 1 fed tokens


def step_params(step, params):
  """``params`` in the layout ``step`` runs with: through its ``prepare_params`` when it has one
  (``Decoder.prepare_params``: per-layer weights for an unrolled layer loop). Called on the host,
  before a loop over the step, so that no step inside it converts anything."""
  prepare = getattr(step, "prepare_params", None)
  return params if prepare is None else prepare(params)


def check_segment(g: Segment, end: int, n_feeds: int):
  """A plan's next segment must end at or after the previous one (``end``) and by ``n_feeds``."""
  if g.end < end or g.end > n_feeds:
    raise DevicePlanError(f"a device plan segment ends at feed {g.end} (after {end}, of "
                          f"{n_feeds})")


def check_covered(end: int, n_feeds: int):
  """The plan's segments, run to ``end``, must cover every one of the ``n_feeds`` feeds."""
  if end != n_feeds:
    raise DevicePlanError(f"the device plan's segments end at feed {end}, not {n_feeds}")


def _is_stop(tokens, stops):
  # ``stops`` is padded with -1, which no sampled id equals.
  return jnp.any(tokens[:, None] == stops[None, :], axis=-1)


@functools.partial(jax.jit, static_argnames=("sampling", "buffer", "want_logits"))
def _start(logits, carry, key, stops, *, sampling: SamplingConfig, buffer: int,
           want_logits: bool) -> LoopState:
  """Sample token 0 from the prefill logits; allocate the output buffers on device."""
  b = logits.shape[0]
  nxt = select_next(logits, jax.random.fold_in(key, 0), sampling)
  tokens = jnp.zeros((b, buffer), jnp.int32).at[:, 0].set(nxt)
  buf = None
  if want_logits:
    buf = jnp.zeros((b, buffer) + logits.shape[1:], logits.dtype).at[:, 0].set(logits)
  return LoopState(jnp.ones((), jnp.int32), tokens, buf, _is_stop(nxt, stops), carry)


def _advance(params, s: LoopState, xs, first, key, stops, n_end, *, step,
             sampling: SamplingConfig):
  """Feed and sample until ``n_end`` tokens are sampled or every row is done."""
  def body(s: LoopState) -> LoopState:
    f = s.n - 1  # the feed index: token f goes in
    x = jax.tree.map(lambda a: jax.lax.dynamic_index_in_dim(a, f - first, keepdims=False), xs)
    prev = jax.lax.dynamic_index_in_dim(s.tokens, f, axis=1, keepdims=False)
    logits, carry = step(params, s.carry, x, prev)
    nxt = select_next(logits, jax.random.fold_in(key, s.n), sampling)
    tokens = jax.lax.dynamic_update_index_in_dim(s.tokens, nxt, s.n, axis=1)
    buf = s.logits
    if buf is not None:
      buf = jax.lax.dynamic_update_index_in_dim(buf, logits.astype(buf.dtype), s.n, axis=1)
    return LoopState(s.n + 1, tokens, buf, s.done | _is_stop(nxt, stops), carry)

  return jax.lax.while_loop(lambda s: (s.n < n_end) & ~jnp.all(s.done), body, s)


# The loop state is donated: its KV buffers are updated in place across calls (chunks, segments)
# instead of copied.
_advance_jit = jax.jit(_advance, static_argnames=("step", "sampling"), donate_argnums=(1,))


def run(plan: DevicePlan, params, logits, max_new_tokens: int, sampling: SamplingConfig, key,
        stop_ids: Sequence[int], *, return_logits: bool, callback=None,
        chunk: Optional[int] = None):
  """Sample up to ``max_new_tokens`` tokens after the prefill ``logits`` on device.

  Returns ``(samples [B, n] np.int32, logits [B, n, V] np.ndarray or None, state)``: every row's
  ``n`` samples (as the host loop produces them, rows that stopped early included), and the
  method's state after ``n - 1`` fed tokens.
  """
  n_feeds = max_new_tokens - 1
  buffer = round_up(max_new_tokens, BUFFER_MULTIPLE)
  xs_host, xs = None, None  # the last segment's xs and its device copy (segments share them)
  n_stops = round_up(max(len(stop_ids), 1), 8)
  stops = np.full(n_stops, -1, np.int32)
  stops[:len(stop_ids)] = np.asarray(stop_ids, np.int32)
  s = _start(logits, plan.carry, key, stops, sampling=sampling, buffer=buffer,
             want_logits=return_logits)
  seen = 0  # tokens already handed to the callback
  n, all_done = 1, bool(np.all(np.asarray(s.done)))

  def report(n):
    nonlocal seen
    if callback is not None and n > seen:
      new = np.asarray(s.tokens)[:, seen:n]  # whole buffer: a device slice compiles per range
      for t in range(new.shape[1]):
        callback(seen + t, new[:, t])
    seen = n

  report(1)
  end = 0
  segments = iter(plan.segments)  # may be a generator: drawn (planned) as the loop reaches them
  while not all_done:
    g = next(segments, None)
    if g is None:
      break
    check_segment(g, end, n_feeds)
    end = g.end
    if g.xs is not xs_host:
      xs_host, xs = g.xs, (None if g.xs is None else jax.device_put(g.xs))
    g_params = step_params(g.step, params)
    while not all_done and n - 1 < g.end:  # feeds n - 1 .. end - 1 run with this step
      n_end = g.end + 1 if chunk is None else min(g.end + 1, n + chunk)
      s = _advance_jit(g_params, s, xs, np.int32(g.first), key, stops, np.int32(n_end), step=g.step,
                  sampling=sampling)
      n, all_done = int(s.n), bool(np.all(np.asarray(s.done)))
      report(n)
  if not all_done:
    check_covered(end, n_feeds)
  samples = np.asarray(s.tokens)[:, :n]
  out_logits = None if s.logits is None else np.asarray(s.logits)[:, :n]
  state = s.carry if plan.finish is None else plan.finish(s.carry, n - 1)
  return samples, out_logits, state

