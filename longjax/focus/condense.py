"""Device side of FocusLLM: batched (and chunk-sharded) condensing, the local forward, the cached
2-token chunk step, the output head.

Shapes: ``L`` layers, ``N`` chunk rows (every chunk of every prompt, padded to a multiple of the
devices on the chunk axis), ``T`` chunk-row length, ``B`` prompts, ``Cmax`` candidate slots per
prompt, ``U`` local-context capacity.

* :func:`condense` runs the chunk rows ``c_i ⊕ d`` through the model ``batch_size`` rows at a time
  (a device-side loop writing into preallocated caches; ``None``: all rows in one forward), so its
  workspace is that of ``batch_size`` rows whatever the number of chunks. Row ``n``'s candidate is
  its last real token (index ``lengths[n]-1``) and uses the candidate projections; padding is
  invalid (never seen), so every row equals its unpadded single-chunk run.
* :func:`chunk_step` is the cached decode step (docs/focusllm.md §4.2): ``[y, g]`` over each row's
  cached KV, ``y`` with base weights (appended to the cache), ``g`` the new candidate.
* :func:`local_hidden` is the local forward: the prompt's candidates (pre-RoPE) at positions
  ``0..C-1`` as a KV prefix, the local tokens from position ``C`` on, all with base weights;
  :func:`local_next_logits` adds the head on each prompt's last row.

On a chunk mesh the ``*_sharded`` wrappers run the chunk functions under ``jax.shard_map`` over the
named axis (chunk rows are independent, so the result is the single-device one); the local forward
splits the local context by position over the same devices; :func:`replicate` places the
parameters on every device once, instead of at every call.
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

from longjax.focus.config import FocusError
from longjax.kernels import CAUSAL_PREFILL, TokenMeta
from longjax.models.decoder import Decoder, KVPrefix, caches_rotated, rotate_kv
from longjax.models.kv_cache import write_entries
from longjax.models.head import lm_head, vocab_slice
from longjax.runtime.tree_cache import TreeCache, live_arrays


# Chunk rows per condensing forward when the user does not choose (FocusLLM(chunk_batch_size=...)).
# CPU: 1. One chunk row (chunk_stride + prompt, >= ~1K tokens at the official sizes) already keeps
# every core busy: on 2 cores the one-row loop takes the time of the official one-chunk-at-a-time
# loop (paired runs: 0.91x at 8 chunks, 1.03x at 64) while all rows in one forward needs 1.5-1.8x
# its peak memory at 8-16 chunks, growing with the chunks, for no speed-up
# (bench/results/focus_bounded.md). GPU/TPU: 8 (a design choice, not yet measured on one). The
# accelerator needs large matmuls (8 rows x >= 1K tokens = >= 8K tokens per forward: the linear
# layers, most of the FLOPs, are then compute-bound) and few loop iterations, while the workspace
# stays that of 8 rows (Qwen2-7B shapes, 2.5K-token rows: ~2-3 GB of bf16 MLP activations),
# small next to a long prompt's chunk caches (~146 MB per row, ~29 GB at 400K tokens) and
# independent of the chunk count.
DEFAULT_BATCH_SIZE = {"cpu": 1}
ACCELERATOR_BATCH_SIZE = 8


def default_batch_size(platform: str) -> int:
  """Default chunk rows per condensing forward on a JAX ``platform`` (``"cpu"``, ``"gpu"``, ...)."""
  return DEFAULT_BATCH_SIZE.get(str(platform).lower(), ACCELERATOR_BATCH_SIZE)


class GateSignal(NamedTuple):
  """The frozen base's own reading at each chunk row's candidate slot: the candidate gate's
  signal (docs/focusllm.md §4.5). Leading axes ``[N]`` (or ``[N, J]`` with decode steps)."""
  log_conf: jax.Array  # log max_y p(y | row), fp32, <= 0
  token: jax.Array  # that top token y (int32)
  hidden: jax.Array  # the final hidden state the head read [..., H]: a reference row's whole
  # distribution, for the probability it gives each chunk's top token (``gate_gain``)


def _no_rows(tokens):
  """``head_rows`` for a call that keeps only the keys and values (no row's output)."""
  return jnp.zeros((tokens.shape[0], 0), jnp.int32)


def row_decoder(model: Decoder) -> Decoder:
  """The decoder that condenses chunk rows: the same weights and mask, with the promise that a
  row's tokens are its own keys in order (positions ``0..T-1``, padding after them), so each token
  sees no key after itself (``CAUSAL_PREFILL``). The attention may then skip those keys; a fresh
  1K-token row does ~9/16 of the score work (``longjax.kernels.chunked``)."""
  return model.clone(rule=CAUSAL_PREFILL)


def _condense_rows(model: Decoder, params, tokens, positions, valid, lengths):
  """One forward over the rows given: ``(cand_k, cand_v, k, v)`` (see :func:`condense`)."""
  t = tokens.shape[1]
  last = jnp.maximum(lengths - 1, 0)
  # The candidate slot of each row (t = none: an empty row): only it gets the candidate q/k/v/o.
  alt = jnp.where(lengths > 0, last, t)[:, None].astype(jnp.int32)
  _, (k, v) = model.apply({"params": params}, tokens, positions,
                          q_meta=TokenMeta.causal(positions, valid=valid), alt=alt, head=False,
                          head_rows=_no_rows(tokens))
  pick = lambda a: jnp.take_along_axis(a, last[None, :, None, None, None], axis=2)[:, :, 0]
  # the candidates stay pre-RoPE (the local forward places them at 0..C-1); the cache entries
  # keep their positions for good: rotated once here instead of at every decode step
  cache_k = rotate_kv(model.cfg, k, positions) if caches_rotated(model.cfg) else k
  return pick(k), pick(v), cache_k, v


def condense(model: Decoder, params, tokens, positions, valid, lengths, *, batch_size=None,
             capacity=None):
  """Condense every chunk row, ``batch_size`` rows per forward (``None``: all in one).

  Returns ``(cand_k, cand_v [L, N, Hkv, D], k, v [L, N, capacity, Hkv, D])``: the candidates'
  pre-RoPE K/V (from the candidate k/v projections) and every token's K/V (the chunk caches, zero
  beyond each row's ``T`` tokens; ``capacity`` defaults to ``T``), keys rotated at their positions
  where ``caches_rotated`` (pre-RoPE for dynamic NTK), as :func:`chunk_step` reads them.

  With ``batch_size < N`` a device loop (``fori_loop``, differentiable) runs batches of
  ``batch_size`` consecutive rows and writes them in place into the preallocated outputs, so the
  workspace is that of one batch. When ``N`` is not a multiple of ``batch_size`` the last batch is
  shifted back to end at row ``N`` (a few rows are computed twice, identically) rather than padded.
  A batch whose rows are all padding (``lengths == 0``) is skipped (``lax.cond``): its outputs
  stay zero, which nothing reads (padding rows have no valid cache entries and no candidate slot).
  Rows are independent, so each row's result is the all-at-once one up to float summation order.
  """
  n, t = tokens.shape
  cap = t if capacity is None else int(capacity)
  if cap < t:
    raise FocusError(f"capacity {cap} is shorter than the chunk rows ({t} tokens)")
  b = n if batch_size is None else max(1, min(int(batch_size), n))
  if b >= n:  # one forward over every row
    ck, cv, k, v = _condense_rows(model, params, tokens, positions, valid, lengths)
    if cap > t:
      pad = [(0, 0), (0, 0), (0, cap - t), (0, 0), (0, 0)]
      k, v = jnp.pad(k, pad), jnp.pad(v, pad)
    return ck, cv, k, v

  def rows(s, a):
    return jax.lax.dynamic_slice_in_dim(a, s, b, axis=0)

  def forward(tok, pos, val, lens):
    return _condense_rows(model, params, tok, pos, val, lens)

  shapes = jax.eval_shape(forward, *(rows(0, a) for a in (tokens, positions, valid, lengths)))
  skip = lambda *_: tuple(jnp.zeros(x.shape, x.dtype) for x in shapes)
  ck, cv, k, v = shapes
  init = (jnp.zeros(ck.shape[:1] + (n,) + ck.shape[2:], ck.dtype),
          jnp.zeros(cv.shape[:1] + (n,) + cv.shape[2:], cv.dtype),
          jnp.zeros(k.shape[:1] + (n, cap) + k.shape[3:], k.dtype),
          jnp.zeros(v.shape[:1] + (n, cap) + v.shape[3:], v.dtype))

  def body(i, out):
    s = jnp.minimum(i * b, n - b)
    args = tuple(rows(s, a) for a in (tokens, positions, valid, lengths))
    new = jax.lax.cond(jnp.any(args[3] > 0), forward, skip, *args)
    zero = jnp.zeros((), jnp.int32)
    return tuple(jax.lax.dynamic_update_slice(buf, x.astype(buf.dtype),
                                              (zero, s) + (zero,) * (buf.ndim - 2))
                 for buf, x in zip(out, new))

  return jax.lax.fori_loop(0, -(-n // b), body, init)


def condense_candidates(model: Decoder, params, tokens, positions, valid, lengths, steps: int = 1,
                        confidence: bool = False):
  """The candidates' pre-RoPE K/V ``[L, N, Hkv, D]`` only, split so that training pays for a
  backward pass through one token per chunk row instead of the whole row.

  Every token before the candidate uses the frozen base weights and does not see the candidate
  (causal), so their KV does not depend on the trained projections: they run as one forward under
  ``stop_gradient`` (no backward), then each candidate runs as a one-token step over that cache
  (the cached decode path, :func:`chunk_step`). Equal to :func:`condense`'s candidates up to float
  summation order; in :func:`condense` the candidate is a scattered slot of the whole-row forward,
  so autodiff carries a tangent for every token of the row (``T`` x the backward work).

  ``steps = J > 1`` (teacher-forced decode steps, docs/focusllm.md §5.1): each row ends with the
  J - 1 forced tokens, and step ``j``'s candidate is the token at ``lengths - J + j`` over the
  ordinary KV of every token before it (the earlier candidates read as ordinary tokens, as the
  cached decode step re-encodes them): ``[L, N, J, Hkv, D]``, one shared forward for all steps.

  ``confidence``: also return the candidate gate's signal at each candidate slot (a
  :class:`GateSignal` of ``[N]``, or ``[N, J]`` with steps; :func:`slot_gate_signal`), read over
  the same cache.
  """
  n, t = tokens.shape
  last = jnp.maximum(lengths - 1, 0)
  slots = jnp.arange(t, dtype=jnp.int32)[None]
  before = valid & (slots < last[:, None])
  _, (k, v) = model.apply({"params": params}, tokens, positions,
                          q_meta=TokenMeta.causal(positions, valid=before),
                          alt=jnp.full((n, 1), t, jnp.int32), head=False,
                          head_rows=_no_rows(tokens))
  k, v = jax.lax.stop_gradient(k), jax.lax.stop_gradient(v)

  def candidate(slot):  # slot [N]: each row's candidate, over the ordinary KV before it
    memory = KVPrefix(k, v, positions, TokenMeta.causal(positions,
                                                        valid=before & (slots < slot[:, None])))
    cand_tok = jnp.take_along_axis(tokens, slot[:, None], axis=1)
    cand_pos = jnp.take_along_axis(positions, slot[:, None], axis=1)
    _, (ck, cv) = model.apply({"params": params}, cand_tok, cand_pos,
                              q_meta=TokenMeta.causal(cand_pos, valid=lengths[:, None] > 0),
                              alt=jnp.zeros((n, 1), jnp.int32), memory=memory, head=False,
                              head_rows=_no_rows(cand_tok))
    if not confidence:
      return ck[:, :, 0], cv[:, :, 0]
    return ck[:, :, 0], cv[:, :, 0], _base_reading(model, params, cand_tok[:, 0],
                                                   cand_pos[:, 0], memory)

  if steps == 1:
    return candidate(last)
  first = jnp.maximum(lengths - steps, 0)
  # one step at a time (lax.map): the workspace and the compiled program are one step's
  out = jax.lax.map(lambda j: candidate(jnp.minimum(first + j, last)),
                    jnp.arange(steps, dtype=jnp.int32))
  ck, cv = jnp.moveaxis(out[0], 0, 2), jnp.moveaxis(out[1], 0, 2)
  if not confidence:
    return ck, cv
  return ck, cv, jax.tree.map(lambda a: jnp.moveaxis(a, 0, 1), out[2])


def chunk_step(model: Decoder, params, cache_k, cache_v, cache_len, prev, new, row_valid):
  """One decode step on every chunk row (docs/focusllm.md §4.2, cached path).

  ``cache_k/v [L, N, cap, Hkv, D]`` hold each row's KV (everything but its candidate; keys as
  :func:`condense` stores them), ``cache_len [N]``; ``prev [N]`` the previous candidate token,
  ``new [N]`` the new token. Returns ``(cache_k, cache_v, cache_len, cand_k, cand_v)``.
  """
  n, cap = cache_len.shape[0], cache_k.shape[2]
  rotated = caches_rotated(model.cfg)
  slots = jnp.broadcast_to(jnp.arange(cap, dtype=jnp.int32), (n, cap))
  memory = KVPrefix(cache_k, cache_v, slots,
                    TokenMeta.causal(slots, valid=slots < cache_len[:, None]), rotated=rotated)
  tokens = jnp.stack([prev, new], axis=1).astype(jnp.int32)
  positions = cache_len[:, None] + jnp.arange(2, dtype=jnp.int32)[None]
  alt = jnp.ones((n, 1), jnp.int32)  # slot 1 (the new candidate) uses the candidate projections
  valid = jnp.broadcast_to(row_valid[:, None], (n, 2))
  _, (k, v) = model.apply({"params": params}, tokens, positions,
                          q_meta=TokenMeta.causal(positions, valid=valid), alt=alt,
                          memory=memory, head=False, head_rows=_no_rows(tokens))

  # the re-encoded previous token (not a candidate any more) joins each row's cache
  prev_k = rotate_kv(model.cfg, k[:, :, :1], positions[:, :1]) if rotated else k[:, :, :1]
  cache_k = write_entries(cache_k, prev_k, cache_len)
  cache_v = write_entries(cache_v, v[:, :, :1], cache_len)
  return cache_k, cache_v, cache_len + row_valid.astype(jnp.int32), k[:, :, 1], v[:, :, 1]


def slot_gate_signal(model: Decoder, params, cache_k, cache_v, cache_len, tokens) -> GateSignal:
  """The frozen base's own reading at each chunk row's candidate slot (:class:`GateSignal`,
  ``[N]``), where ``tokens [N]`` is the candidate token, read with the base weights at position
  ``cache_len`` over the row's first ``cache_len`` cache entries (everything before the
  candidate; the caches as :func:`condense` / :func:`chunk_step` leave them).

  The candidate gate's signal (docs/focusllm.md §4.5): the base model reading a chunk together
  with the question is sure of its next token where the chunk holds the answer, and unsure
  elsewhere. One token per row through every layer, then the head on that row."""
  n, cap = cache_len.shape[0], cache_k.shape[2]
  slots = jnp.broadcast_to(jnp.arange(cap, dtype=jnp.int32), (n, cap))
  memory = KVPrefix(cache_k, cache_v, slots,
                    TokenMeta.causal(slots, valid=slots < cache_len[:, None]),
                    rotated=caches_rotated(model.cfg))
  return _base_reading(model, params, tokens, cache_len, memory)


def _base_reading(model: Decoder, params, tokens, positions, memory: KVPrefix) -> GateSignal:
  """:class:`GateSignal` ``[N]`` after one token per row (``tokens``, ``positions`` ``[N]``)
  read with the base weights over ``memory``."""
  n = tokens.shape[0]
  base = jax.lax.stop_gradient(params)
  h, _ = model.apply({"params": base}, tokens[:, None].astype(jnp.int32), positions[:, None],
                     memory=memory, head=False,
                     head_rows=jnp.zeros((n, 1), jnp.int32))  # no alt: base weights only
  logp = jax.nn.log_softmax(lm_head(model.cfg, base, h[:, 0]), axis=-1)
  return GateSignal(jnp.max(logp, axis=-1), jnp.argmax(logp, axis=-1).astype(jnp.int32), h[:, 0])


def gate_bias(signal: GateSignal, gather, cand_valid, strength: float, threshold: float = 1.0,
              gain: float = 0.0, ref_row=None, head=None, peer_gain: float = 0.0,
              top_k: int = 1):
  """Each prompt's candidate score biases ``[B, Cmax]``: ``strength * min(0, log p_i - level)``
  with ``p_i`` the base's confidence at the candidate slot of the chunk row in slot i
  (``signal`` from :func:`slot_gate_signal`), 0 in empty slots. At strength 0 the bias is 0 (the
  official method); as it grows the local model reads less of the chunks where the base is
  unsure. The level is ``log threshold`` (chunks at least ``threshold`` sure keep their full
  weight; 1: none does), raised by two optional references of chunk i's token ``y``
  (docs/focusllm.md §4.5), ``head`` mapping hidden states ``[..., H]`` to logits ``[..., V]``:

  * ``gain`` kappa > 0: to ``log kappa + log r(y)``, ``r`` the probability that the prompt's
    reference row ``ref_row [B]`` (the dynamic prompt without a chunk) gives ``y``. Only chunks
    that make the base kappa times surer of their token than it is without them keep their
    weight.
  * ``peer_gain`` kappa_p > 0: to ``log kappa_p + log m_i(y)``, ``m_i`` the lower median over
    the prompt's other chunks j of ``p_j(y)`` (:func:`peer_log_reference`). A token every chunk
    predicts comes from any text before the prompt, not from what chunk i holds.

  ``top_k`` K: ``y`` ranges over chunk i's K most likely tokens, and the chunk is weighed by the
  one that clears its level by most (K = 1: its top token). A chunk whose first choice is what
  the prompt itself expects may hold the answer as its second. A later token's ``m_i`` is the
  other chunks' *largest* probability of it: a runner-up counts only where no other chunk is as
  sure of it (a continuation several chunks expect, the prompt not, is the document's, not a
  fact one chunk holds)."""
  signal = jax.lax.stop_gradient(signal)
  if (gain or peer_gain or top_k > 1) and head is None:
    raise FocusError("gate_bias: a gain, a peer gain or top_k > 1 needs the head")
  if gain and ref_row is None:
    raise FocusError("gate_bias: a gain needs the reference rows (ref_row)")
  row_logp = lambda h: jax.nn.log_softmax(  # noqa: E731
      jax.lax.stop_gradient(head(h)).astype(jnp.float32), axis=-1)
  # the peers and the top K read every row's distribution [N, V]; the reference rows' are in it
  every = row_logp(signal.hidden) if (peer_gain or top_k > 1) else None
  if top_k > 1:
    row_conf, row_tok = jax.lax.top_k(every, top_k)  # [N, K]
  else:
    row_conf, row_tok = signal.log_conf[:, None], signal.token[:, None]
  tokens = jnp.take(row_tok, gather, axis=0)  # [B, Cmax, K] each slot's candidate tokens y
  level = jnp.full(tokens.shape, jnp.log(jnp.float32(threshold)))
  if gain:
    ref = jnp.maximum(ref_row, 0)
    ref_logp = (jnp.take(every, ref, axis=0) if every is not None
                else row_logp(jnp.take(signal.hidden, ref, axis=0)))  # [B, V]
    same = jax.vmap(lambda lp, t: lp[t])(ref_logp, tokens)
    level = jnp.maximum(level, jnp.log(jnp.float32(gain)) + same)
  if peer_gain:
    peer = peer_log_reference(every, tokens[..., :1], gather, cand_valid)  # the top token
    if top_k > 1:  # the runner-ups
      peer = jnp.concatenate(
          [peer, peer_log_reference(every, tokens[..., 1:], gather, cand_valid, "max")], axis=-1)
    level = jnp.maximum(level, jnp.log(jnp.float32(peer_gain)) + peer)
  margin = jnp.max(jnp.take(row_conf, gather, axis=0) - level, axis=-1)  # the best of the K
  return jnp.where(cand_valid, jnp.float32(strength) * jnp.minimum(margin, 0.0), 0.0)


def chunk_vote(logits, signal: GateSignal, gather, cand_valid, head, weight: float,
               min_conf: float = 0.0, eligible=None):
  """``[B, V]`` next-token log-probabilities: the local model's ``logits [B, V]`` times the surest
  chunk's own distribution to the power ``weight``, renormalised (docs/focusllm.md, "Chunk vote").

  A chunk's own distribution is the frozen base's at its candidate slot (``signal.hidden``, read
  by ``head``); the surest of a prompt's valid chunks is the one with the largest top-token
  probability (``signal.log_conf``). Where it is below ``min_conf``, or the prompt has no chunk,
  the local distribution stands alone. ``eligible [B, Cmax]``: only these chunks may vote
  (default: every valid one)."""
  signal = jax.lax.stop_gradient(signal)
  may = cand_valid if eligible is None else cand_valid & eligible
  conf = jnp.where(may, jnp.take(signal.log_conf, gather, axis=0), -jnp.inf)  # [B, Cmax]
  best = jnp.argmax(conf, axis=-1)
  rows = jnp.take_along_axis(gather, best[:, None], axis=1)[:, 0]  # [B] the surest chunk's row
  votes = jnp.max(conf, axis=-1) >= jnp.log(jnp.float32(min_conf))
  votes &= jnp.any(may, axis=-1)
  own = jax.nn.log_softmax(head(jnp.take(signal.hidden, rows, axis=0)).astype(jnp.float32), -1)
  local = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  return jax.nn.log_softmax(local + jnp.where(votes[:, None], jnp.float32(weight) * own, 0.0),
                            axis=-1)


def peer_log_reference(row_logp, tokens, gather, cand_valid, statistic: str = "median"):
  """``[B, Cmax]`` (``[B, Cmax, K]``): for the chunk in slot i, the log of the lower median
  (``statistic="max"``: the largest) over the prompt's other valid chunks j of ``p_j(y)``, the
  base's probability at chunk j's candidate slot of chunk i's token ``y``; ``-inf`` where the
  prompt has no other chunk. ``row_logp [N, V]``: every row's log-probabilities at its
  candidate slot (the head on :class:`GateSignal`'s hidden states); ``tokens [B, Cmax]`` (or
  ``[B, Cmax, K]``): each slot's tokens. The ``[B, Cmax, Cmax(, K)]`` probabilities are
  gathered from ``row_logp``."""
  squeeze = tokens.ndim == 2
  tokens = tokens[..., None] if squeeze else tokens
  pair = row_logp[gather[:, :, None, None], tokens[:, None]]  # [B, j, i, K] = log p_j(y_ik)
  c = gather.shape[1]
  other = (cand_valid[:, :, None] & ~jnp.eye(c, dtype=bool)[None])[..., None]  # [B, j, i, 1]
  count = jnp.sum(other, axis=1)  # [B, i, 1]
  if statistic == "max":
    stat = jnp.max(jnp.where(other, pair, -jnp.inf), axis=1)
  else:
    ranked = jnp.sort(jnp.where(other, pair, jnp.inf), axis=1)
    stat = jnp.take_along_axis(ranked, ((jnp.maximum(count, 1) - 1) // 2)[:, None], axis=1)[:, 0]
  out = jnp.where(count > 0, stat, -jnp.inf)
  return out[..., 0] if squeeze else out


def gather_candidates(cand, gather):
  """``cand [L, N, Hkv, D]`` -> per-prompt prefix ``[L, B, Cmax, Hkv, D]``."""
  return jnp.take(cand, gather, axis=1)


def local_hidden(model: Decoder, params, cand_k, cand_v, gather, cand_valid, tokens, lengths,
                 n_chunks, mesh=None, axis: str = "chunks", cand_bias=None):
  """Local forward: final hidden states ``[B, U, H]`` of ``tokens [B, U]`` (right-padded to
  ``lengths``), with each prompt's candidates as a prefix at positions ``0..n_chunks-1``.

  With a chunk ``mesh``, the local tokens are split over ``mesh[axis]`` by position (``U`` a
  multiple of its size) under ``jax.shard_map``: each device runs its slice through every layer
  and the layers all-gather the slices' keys and values (``Decoder(seq_axis=...)``). The local
  context is one sequence per prompt: left whole, every device would run all of it, once per
  device (FocusLLM recomputes it at every decode step), and left to XLA's partitioner the split
  took a dozen small collectives per layer instead of one."""
  mem_k, mem_v = gather_candidates(cand_k, gather), gather_candidates(cand_v, gather)
  if mesh is None:
    return _local_slice(model, params, mem_k, mem_v, cand_valid, tokens, lengths, n_chunks, 0,
                        cand_bias=cand_bias)
  seq = _sequence_split(model, mesh, axis, tokens)

  def fn(params, mem_k, mem_v, cand_valid, tokens, lengths, n_chunks, cand_bias):
    start = jax.lax.axis_index(axis) * tokens.shape[1]
    return _local_slice(seq, params, mem_k, mem_v, cand_valid, tokens, lengths, n_chunks, start,
                        cand_bias=cand_bias)

  return jax.shard_map(fn, mesh=mesh, in_specs=(P(), P(), P(), P(), P(None, axis), P(), P(), P()),
                       out_specs=P(None, axis, None), check_vma=False)(
                           params, mem_k, mem_v, cand_valid, tokens, lengths, n_chunks, cand_bias)


def local_last_hidden(model: Decoder, params, cand_k, cand_v, gather, cand_valid, tokens,
                      lengths, n_chunks, mesh=None, axis: str = "chunks", cand_bias=None):
  """:func:`local_hidden` at each prompt's last real row only (``[B, H]``). Without a mesh the
  last layer runs only that row (``Decoder``'s ``head_rows``); on a chunk mesh the sequence-split
  forward computes every row and the last one is taken."""
  if mesh is not None:
    return last_hidden(local_hidden(model, params, cand_k, cand_v, gather, cand_valid, tokens,
                                    lengths, n_chunks, mesh, axis, cand_bias), lengths)
  mem_k, mem_v = gather_candidates(cand_k, gather), gather_candidates(cand_v, gather)
  hidden = _local_slice(model, params, mem_k, mem_v, cand_valid, tokens, lengths, n_chunks, 0,
                        rows=jnp.maximum(lengths - 1, 0)[:, None], cand_bias=cand_bias)
  return hidden[:, 0]


def local_next_logits(model: Decoder, params, cand_k, cand_v, gather, cand_valid, tokens,
                      lengths, n_chunks, mesh=None, axis: str = "chunks", cand_bias=None):
  """Next-token logits ``[B, V]`` (fp32) after each prompt's local context: the head on
  :func:`local_hidden`'s last real row.

  On a chunk mesh it stays in the sequence-split ``shard_map``: the device holding a prompt's last
  row contributes it (one ``psum`` of ``[B, H]``) and each device computes the logits of its slice
  of the vocabulary (the whole head when the vocabulary does not split evenly), instead of every
  device reading the whole output projection for the same row."""
  cfg = model.cfg
  if mesh is None:
    return lm_head(cfg, params, local_last_hidden(model, params, cand_k, cand_v, gather,
                                                  cand_valid, tokens, lengths, n_chunks,
                                                  cand_bias=cand_bias))
  mem_k, mem_v = gather_candidates(cand_k, gather), gather_candidates(cand_v, gather)
  seq = _sequence_split(model, mesh, axis, tokens)
  n = int(mesh.shape[axis])
  split_vocab = cfg.vocab_size % n == 0

  def fn(params, mem_k, mem_v, cand_valid, tokens, lengths, n_chunks, cand_bias):
    u = tokens.shape[1]
    i = jax.lax.axis_index(axis)
    hidden = _local_slice(seq, params, mem_k, mem_v, cand_valid, tokens, lengths, n_chunks, i * u,
                          cand_bias=cand_bias)
    row = jnp.maximum(lengths - 1, 0) - i * u  # the last real row, in this device's slice
    mine = (row >= 0) & (row < u)
    h = jnp.take_along_axis(hidden, jnp.clip(row, 0, u - 1)[:, None, None], axis=1)[:, 0]
    h = jax.lax.psum(jnp.where(mine[:, None], h, jnp.zeros_like(h)), axis)
    if not split_vocab:
      return lm_head(cfg, params, h)
    return lm_head(cfg, vocab_slice(cfg, params, i, cfg.vocab_size // n), h)

  return jax.shard_map(fn, mesh=mesh, in_specs=(P(), P(), P(), P(), P(None, axis), P(), P(), P()),
                       out_specs=P(None, axis) if split_vocab else P(), check_vma=False)(
                           params, mem_k, mem_v, cand_valid, tokens, lengths, n_chunks, cand_bias)


def _sequence_split(model: Decoder, mesh, axis: str, tokens) -> Decoder:
  """``model`` gathering keys over ``mesh[axis]``, after checking that the tokens split evenly."""
  n = int(mesh.shape[axis])
  if tokens.shape[1] % n:
    raise FocusError(f"the local context's capacity {tokens.shape[1]} must be a multiple of the "
                     f"{n} devices on mesh axis {axis!r} (pack it with that length multiple)")
  return model.clone(seq_axis=axis)


def _local_slice(model: Decoder, params, mem_k, mem_v, cand_valid, tokens, lengths, n_chunks,
                 start, rows=None, cand_bias=None):
  """The local forward of the tokens at local indices ``start .. start+U'-1`` (all of them on one
  device; one device's slice under a sequence-split mesh); ``rows [B, R]``: only those rows'
  hidden states (``Decoder``'s ``head_rows``); ``cand_bias [B, Cmax]``: added to every score of
  each candidate (the optional candidate gate, :func:`gate_bias`; ``None``: none)."""
  b, u = tokens.shape
  cmax = mem_k.shape[2]
  slots = jnp.broadcast_to(jnp.arange(cmax, dtype=jnp.int32), (b, cmax))
  memory = KVPrefix(mem_k, mem_v, slots, TokenMeta.causal(slots, valid=cand_valid,
                                                          bias=cand_bias))
  j = start + jnp.arange(u, dtype=jnp.int32)[None]
  positions = n_chunks[:, None] + j
  q_meta = TokenMeta.causal(positions, valid=j < lengths[:, None])
  hidden, _ = model.apply({"params": params}, tokens, positions, q_meta=q_meta, memory=memory,
                          head=False, head_rows=rows)
  return hidden


def last_hidden(hidden, lengths):
  """``hidden [B, U, H]`` at each row's last real position -> ``[B, H]``."""
  idx = jnp.maximum(lengths - 1, 0)
  return jnp.take_along_axis(hidden, idx[:, None, None], axis=1)[:, 0]


# ---------------------------------------------------------------------------------------------
# Chunk-axis sharding.
def chunk_mesh(n_devices=None, axis: str = "chunks", devices=None):
  """A 1-D mesh over ``n_devices`` (default: all) with one named axis for chunk rows."""
  from jax.sharding import AxisType
  devices = list(devices if devices is not None else jax.devices())
  n = len(devices) if n_devices is None else int(n_devices)
  return jax.make_mesh((n,), (axis,), axis_types=(AxisType.Auto,), devices=devices[:n])


def replicate(params, mesh):
  """``params`` replicated over every device of ``mesh`` (what the sharded programs read).

  A jitted call on a mesh copies every parameter that is not already replicated onto every
  device, at every call: for a decode loop stepping from the host, the whole model per token. The
  copy is made once per parameter tree of jax arrays and kept while every leaf of ``params``
  lives (a tree already replicated comes back as is, so callers may keep only the copy and drop
  the original, which would otherwise stay resident beside it); numpy leaves are copied each call.
  """
  sharding = NamedSharding(mesh, P())
  leaves = jax.tree.leaves(params)
  if live_arrays(leaves) and all(x.sharding.is_equivalent_to(sharding, x.ndim) for x in leaves):
    return params
  return _REPLICATED.get(params, lambda tree: jax.device_put(tree, sharding), mesh)


_REPLICATED = TreeCache()


def condense_sharded(model: Decoder, mesh, axis: str, *, batch_size=None, capacity=None):
  """:func:`condense` with the chunk-row axis split over ``mesh[axis]`` (``jax.shard_map``); each
  device runs its own rows ``batch_size`` at a time."""
  fn = lambda params, tokens, positions, valid, lengths: condense(
      model, params, tokens, positions, valid, lengths, batch_size=batch_size, capacity=capacity)
  row, kv = P(axis), P(None, axis)
  return jax.shard_map(fn, mesh=mesh, in_specs=(P(), row, row, row, row),
                       out_specs=(kv, kv, kv, kv), check_vma=False)


def condense_candidates_sharded(model: Decoder, mesh, axis: str):
  """:func:`condense_candidates` with the chunk-row axis split over ``mesh[axis]`` (the gate's
  signal, with ``confidence``, split by row like the tokens)."""
  row, kv = P(axis), P(None, axis)

  def sharded(params, tokens, positions, valid, lengths, steps: int = 1,
              confidence: bool = False):
    fn = lambda params, tokens, positions, valid, lengths: condense_candidates(
        model, params, tokens, positions, valid, lengths, steps=steps, confidence=confidence)
    return jax.shard_map(fn, mesh=mesh, in_specs=(P(), row, row, row, row),
                         out_specs=(kv, kv) + ((row,) if confidence else ()),
                         check_vma=False)(params, tokens, positions, valid, lengths)

  return sharded


def slot_gate_signal_sharded(model: Decoder, mesh, axis: str):
  """:func:`slot_gate_signal` on chunk caches sharded along the chunk rows (each device reads
  its own rows; the signal comes back split the same way)."""
  fn = lambda params, ck, cv, cl, tokens: slot_gate_signal(model, params, ck, cv, cl, tokens)
  row, kv = P(axis), P(None, axis)
  return jax.shard_map(fn, mesh=mesh, in_specs=(P(), kv, kv, row, row), out_specs=row,
                       check_vma=False)


def chunk_step_sharded(model: Decoder, mesh, axis: str):
  """:func:`chunk_step` with the chunk caches sharded along chunk rows."""
  fn = lambda params, ck, cv, cl, prev, new, rv: chunk_step(
      model, params, ck, cv, cl, prev, new, rv)
  row, kv = P(axis), P(None, axis)
  return jax.shard_map(fn, mesh=mesh, in_specs=(P(), kv, kv, row, row, row, row),
                       out_specs=(kv, kv, row, kv, kv), check_vma=False)
