"""FocusLLM as a generation method: prefill / cached decode step / closed-form recompute.

``FocusLLM(cfg, fcfg)`` plugs into :func:`longjax.inference.generate.generate` (``cfg``,
``prefill``, ``step``). Its state (:class:`FocusState`) is a pytree of fixed-capacity device
buffers:

* the per-chunk KV caches ``[L, N, cap, Hkv, D]`` (pre-RoPE, everything but each row's current
  candidate) with lengths ``[N]``; on a mesh they are sharded along the chunk rows ``N``;
* the current candidates' K/V ``[L, N, Hkv, D]`` and each row's current candidate token;
* each prompt's local context ``[B, U]`` (``bos(x[L-W:L])`` then the generated tokens) with lengths.

A batch of prompts is planned per prompt on the host (its own chunk count, prompt, local context);
all chunks of all prompts are rows of one chunk batch and each prompt's local forward gathers its
own rows, so every prompt gets exactly what it gets alone (up to float summation order).

Each decode step (docs/focusllm.md §4.2): one batched 2-token forward ``[previous candidate, new
token]`` over all chunk caches, then the local forward recomputed with the fresh candidates.
:meth:`recompute` is the closed form (every chunk re-run as ``c_i ⊕ d ⊕ g_1..g_t`` from scratch);
the two agree.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from longjax.focus import condense as C
from longjax.focus.config import FocusConfig, FocusError, check_model
from longjax.focus.planner import (ChunkBatch, LocalBatch, RowPlan, pack_chunks, pack_local,
                                   split_prompt)
from longjax.models.protocol import DevicePlan, Segment
from longjax.models.inputs import (check_kv_fits, check_max_new_tokens, check_room,
                                   check_token_ids)
from longjax.models.config import ModelConfig
from longjax.models.decoder import Decoder, decode_decoder
from longjax.models.head import lm_head


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class FocusState:
  cache_k: jax.Array  # [L, N, cap, Hkv, D] chunk KV caches (pre-RoPE)
  cache_v: jax.Array
  cache_len: jax.Array  # [N]
  prev: jax.Array  # [N] current candidate token of each chunk row
  owner: jax.Array  # [N] prompt of each chunk row (-1: padding row)
  row_valid: jax.Array  # [N]
  cand_k: jax.Array  # [L, N, Hkv, D] current candidates (pre-RoPE)
  cand_v: jax.Array
  gather: jax.Array  # [B, Cmax] chunk row of each prompt's j-th chunk
  cand_valid: jax.Array  # [B, Cmax]
  local_tokens: jax.Array  # [B, U]
  local_len: jax.Array  # [B]
  n_chunks: jax.Array  # [B]
  # the base's reading at each row's candidate slot, [N] (None: no candidate gate)
  gate_signal: Optional[C.GateSignal] = None
  # [B] each prompt's reference row (the gate's ``gate_gain``; None: no reference rows)
  ref_row: Optional[jax.Array] = None

  @property
  def cache_capacity(self) -> int:
    return self.cache_k.shape[2]

  @property
  def local_capacity(self) -> int:
    return self.local_tokens.shape[1]


@dataclasses.dataclass
class FocusOutput:
  """Result of :meth:`FocusLLM.forward` for one prompt."""
  logits: np.ndarray  # [|u|, V] local-forward logits (row -1: next-token distribution)
  cand_k: np.ndarray  # [L, C, Hkv, D] candidate keys, pre-RoPE, chunk order
  cand_v: np.ndarray
  plan: RowPlan


def check_chunk_batch_size(value) -> int:
  """``value`` as an int >= 1, else one :class:`FocusError` saying what is wrong and what to
  pass."""
  if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
    raise FocusError(f"chunk_batch_size must be a positive integer (chunk rows condensed per "
                     f"forward), got {value!r} of type {type(value).__name__}; pass e.g. "
                     "chunk_batch_size=1, or None for the device default")
  if int(value) < 1:
    raise FocusError(f"chunk_batch_size must be a positive integer (chunk rows condensed per "
                     f"forward), got {int(value)}; pass e.g. chunk_batch_size=1, or None for the "
                     "device default")
  return int(value)


class FocusLLM:
  """FocusLLM inference on a decoder with candidate projections (``cfg.alt_projections``).

  Args:
    mesh / axis: optional mesh whose ``axis`` splits the chunk rows (condensing and the chunk
      caches) and, by position, the local context (padded to a multiple of its devices); the
      parameters are replicated on its devices once per tree (:meth:`place_params`). ``None``
      runs on one device. See :func:`longjax.focus.chunk_mesh`.
    bucket: chunk-row and local-context lengths are padded to multiples of this, so prompts of
      similar size share one compiled program.
    chunk_bucket: how the number of chunk rows (and each prompt's candidate slots) is padded.
      ``"pow2"`` (default): to ``devices * 2^k`` (the devices on the chunk axis; 1 without a
      mesh), i.e. powers of two on one device: padding rows (decoded every step; condensed only
      where they share a ``chunk_batch_size`` batch with real rows) stay below 2x of the real
      rows and a 2-chunk prompt condenses 2 rows, while the number of compiled shapes stays
      logarithmic. An int ``m``: to multiples of ``lcm(m, devices)``.
    chunk_batch_size: chunk rows condensed per forward (on each device of a mesh): bounds the
      prefill workspace to that of this many rows whatever the number of chunks (the chunk caches
      themselves, which decoding needs, still grow with it). ``None`` (default): from the device
      kind, 1 on CPU and 8 on GPU/TPU (:func:`longjax.focus.condense.default_batch_size`). Any
      value gives the same outputs; batches made only of padding rows are skipped.
  """

  def __init__(self, cfg: ModelConfig, fcfg: FocusConfig, *, mesh=None, axis: str = "chunks",
               impl: str = "auto", bucket: int = 64, chunk_bucket="pow2", chunk_batch_size=None):
    check_model(cfg, fcfg)
    self.cfg, self.fcfg, self.mesh, self.axis = cfg, fcfg, mesh, axis
    self.model = Decoder(cfg, impl=impl)
    # Condensing keeps only each layer's K/V of the chunk rows. As a Python loop over the layers
    # (on CPU, as decode loops run) XLA drops the work nothing reads: the last layer's queries,
    # attention, o projection and MLP, 1/L of the condensing; a scanned loop computes them.
    self.row_model = C.row_decoder(self.model)
    self.condense_model = decode_decoder(self.row_model)
    if chunk_bucket != "pow2" and not (isinstance(chunk_bucket, (int, np.integer))
                                       and int(chunk_bucket) >= 1):
      raise FocusError(f"chunk_bucket must be 'pow2' or an int >= 1, got {chunk_bucket!r}")
    self.bucket = int(bucket)
    self.chunk_bucket = chunk_bucket if chunk_bucket == "pow2" else int(chunk_bucket)
    if mesh is not None:
      if axis not in mesh.axis_names:
        raise FocusError(f"mesh has axes {mesh.axis_names}, no chunk axis {axis!r}")
      self.n_shards = int(mesh.shape[axis])
      platform = mesh.devices.flat[0].platform
      self._chunk_step = C.chunk_step_sharded(self.model, mesh, axis)
      self._slot_signal = C.slot_gate_signal_sharded(self.model, mesh, axis)
    else:
      self.n_shards = 1
      platform = jax.devices()[0].platform
      self._chunk_step = functools.partial(C.chunk_step, self.model)
      self._slot_signal = functools.partial(C.slot_gate_signal, self.model)
    self.chunk_batch_size = (C.default_batch_size(platform) if chunk_batch_size is None
                             else check_chunk_batch_size(chunk_batch_size))
    self._prefill_jit = jax.jit(self._prefill_impl, static_argnames=("cache_cap", "all_logits"))
    self._step_jit = jax.jit(self._step_impl)

  def place_params(self, params):
    """``params`` where this model's programs read them: replicated over the mesh's devices (made
    once per parameter tree, ``condense.replicate``), as is without a mesh. Every entry point
    places them; keep the returned tree to hold a single copy."""
    return params if self.mesh is None else C.replicate(params, self.mesh)

  # -------------------------------------------------------------------------------------------
  # Host-side planning.
  def plan(self, prompt, generated: Sequence[int] = ()) -> RowPlan:
    # Every public entry (prefill, forward, recompute) plans here: out-of-range ids would be
    # clipped silently by the embedding lookup under jit.
    check_token_ids([prompt], self.cfg.vocab_size)
    check_token_ids([generated], self.cfg.vocab_size, what="generated ids")
    return split_prompt(prompt, self.fcfg, generated)

  def _pack(self, rows, extra: int):
    if self.chunk_bucket == "pow2":
      cb = pack_chunks(rows, row_multiple=self.n_shards, length_multiple=self.bucket, pow2=True,
                       reference=self.fcfg.reference_rows)
    else:
      cb = pack_chunks(rows, row_multiple=math.lcm(self.n_shards, self.chunk_bucket),
                       length_multiple=self.bucket, cmax_multiple=self.chunk_bucket,
                       reference=self.fcfg.reference_rows)
    # A mesh splits the local context by position over its devices: a multiple of their number.
    lb = pack_local(rows, capacity=max(len(r.local) for r in rows) + extra,
                    length_multiple=math.lcm(self.bucket, self.n_shards))
    return cb, lb, cb.tokens.shape[1] + extra

  # -------------------------------------------------------------------------------------------
  # Device code.
  def _condense(self, params, cb: ChunkBatch, capacity: int):
    """Chunk caches ``[L, N, capacity, Hkv, D]`` and candidates, ``chunk_batch_size`` rows per
    forward (per device on a mesh), written in place into the capacity-sized buffers."""
    kw = dict(batch_size=self.chunk_batch_size, capacity=capacity)
    if self.mesh is None:
      model = self.condense_model
      fn, params = functools.partial(C.condense, model, **kw), model.prepare_params(params)
    else:
      fn = C.condense_sharded(self.row_model, self.mesh, self.axis, **kw)
    return fn(params, cb.tokens, cb.positions, cb.valid, cb.lengths)

  def _prefill_impl(self, params, cb: ChunkBatch, lb: LocalBatch, *, cache_cap: int,
                    all_logits: bool):
    cand_k, cand_v, k, v = self._condense(params, cb, cache_cap)
    last = jnp.maximum(cb.lengths - 1, 0)
    cand_tok = jnp.take_along_axis(cb.tokens, last[:, None], axis=1)[:, 0]
    signal = (self._slot_signal(params, k, v, last, cand_tok) if self.fcfg.slot_signal
              else None)
    state = FocusState(
        cache_k=k, cache_v=v, cache_len=last,
        prev=cand_tok, owner=cb.owner,
        row_valid=cb.owner >= 0, cand_k=cand_k, cand_v=cand_v, gather=cb.gather,
        cand_valid=cb.cand_valid, local_tokens=lb.tokens, local_len=lb.lengths,
        n_chunks=lb.n_chunks, gate_signal=signal,
        ref_row=cb.ref_row if self.fcfg.reference_rows else None)
    return self._local_logits(params, state, all_logits), state

  def _local_logits(self, params, s: FocusState, all_logits: bool, model=None):
    args = (self.model if model is None else model, params, s.cand_k, s.cand_v, s.gather,
            s.cand_valid, s.local_tokens, s.local_len, s.n_chunks)
    head = functools.partial(lm_head, self.cfg, params)
    bias = (C.gate_bias(s.gate_signal, s.gather, s.cand_valid, ref_row=s.ref_row, head=head,
                        **self.fcfg.gate_reading) if self.fcfg.candidate_gate else None)
    kw = dict(mesh=self.mesh, axis=self.axis, cand_bias=bias)
    vote = functools.partial(C.chunk_vote, signal=s.gate_signal, gather=s.gather,
                             cand_valid=s.cand_valid, head=head, weight=self.fcfg.chunk_vote,
                             min_conf=self.fcfg.vote_min,
                             # the chunks the gate reads at full weight (its bias is exactly 0)
                             eligible=bias >= 0 if self.fcfg.vote_open else None)
    if all_logits:
      logits = lm_head(self.cfg, params, C.local_hidden(*args, **kw))
      if not self.fcfg.chunk_vote:
        return logits
      # the chunks' slots predict the token after the whole local context: its last real row
      last = jnp.maximum(s.local_len - 1, 0)
      b = jnp.arange(logits.shape[0])
      logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
      return logp.at[b, last].set(vote(logp[b, last]))
    logits = C.local_next_logits(*args, **kw)
    return vote(logits) if self.fcfg.chunk_vote else logits

  def _step_impl(self, params, s: FocusState, tokens, model=None):
    """One cached decode step. ``model``: the decoder to step with, ``params`` in its layout
    (default: ``self.model``, stacked); only without a mesh (the sharded chunk step is built
    for ``self.model``)."""
    tokens = tokens.astype(jnp.int32)
    new = tokens[jnp.maximum(s.owner, 0)]
    chunk_step, slot_signal = ((self._chunk_step, self._slot_signal) if model is None
                             else (functools.partial(C.chunk_step, model),
                                   functools.partial(C.slot_gate_signal, model)))
    ck, cv, cl, cand_k, cand_v = chunk_step(params, s.cache_k, s.cache_v, s.cache_len, s.prev,
                                            new, s.row_valid)
    if s.gate_signal is not None:  # the new candidate's slot follows the re-encoded previous one
      s = dataclasses.replace(s, gate_signal=slot_signal(params, ck, cv, cl, new))
    b = tokens.shape[0]
    local_tokens = s.local_tokens.at[jnp.arange(b), s.local_len].set(tokens, mode="drop")
    s = dataclasses.replace(s, cache_k=ck, cache_v=cv, cache_len=cl, prev=new, cand_k=cand_k,
                            cand_v=cand_v, local_tokens=local_tokens, local_len=s.local_len + 1)
    return self._local_logits(params, s, False, model), s

  # -------------------------------------------------------------------------------------------
  # Method interface (longjax.generate).
  def prefill(self, params, tokens, lengths, max_new_tokens: int):
    """``tokens [B, T]`` right-padded, ``lengths [B]`` -> ``(next_logits [B, V], FocusState)``."""
    tokens, lengths = np.asarray(tokens), np.asarray(lengths)
    if tokens.ndim != 2 or lengths.shape != (tokens.shape[0],):
      raise FocusError(f"prefill expects tokens [B, T] and lengths [B], got {tokens.shape} and "
                       f"{lengths.shape}")
    check_max_new_tokens(max_new_tokens, minimum=0)  # token ids: checked by plan
    # the local cache alone holds every row's prompt + max_new_tokens: checked before packing
    check_kv_fits(self.cfg, tokens.shape[0], tokens.shape[1] + int(max_new_tokens),
                  max_new_tokens)
    rows = [self.plan(tokens[b, :int(lengths[b])]) for b in range(tokens.shape[0])]
    cb, lb, cap = self._pack(rows, int(max_new_tokens))
    return self._prefill_jit(self.place_params(params), cb, lb, cache_cap=cap, all_logits=False)

  def step(self, params, state: FocusState, tokens):
    """Feed one token per prompt ``[B]`` -> ``(next_logits [B, V], state)`` (cached path)."""
    self._check_decode_room(state, 1)
    return self._step_jit(self.place_params(params), state, jnp.asarray(tokens, jnp.int32))

  @staticmethod
  def _check_decode_room(state: FocusState, n_feeds: int):
    """The local context and the chunk caches must hold ``n_feeds`` more tokens (prefill sized
    them for its ``max_new_tokens``)."""
    fail = lambda need: FocusError(  # noqa: E731
        f"FocusLLM decode buffers are full: they hold {state.local_capacity} local tokens, too "
        f"few for {n_feeds} more; prefill with a larger max_new_tokens")
    check_room(state.local_len, n_feeds, state.local_capacity, fail)
    check_room(state.cache_len, n_feeds, state.cache_capacity, fail)

  def device_plan(self, state: FocusState, n_feeds: int) -> DevicePlan:
    """The cached decode step for ``longjax.generate``'s device loop: the state already has fixed
    shapes (prefill sized the local context and chunk caches for max_new_tokens)."""
    self._check_decode_room(state, n_feeds)  # the host step's check, for the last of n_feeds
    decoder = decode_decoder(self.model) if self.mesh is None else self.model
    return DevicePlan(state, [Segment(n_feeds, FocusStep(self, decoder))])

  # -------------------------------------------------------------------------------------------
  # Whole-prompt forwards (tests, fixtures, the closed-form decode path).
  def forward(self, params, prompt, generated: Sequence[int] = ()) -> FocusOutput:
    """Closed form (docs/focusllm.md §4.2): chunks ``c_i ⊕ d ⊕ generated`` and the local context
    ``u ⊕ generated`` computed from scratch; returns every local logit and the candidates."""
    row = self.plan(prompt, generated)
    cb, lb, cap = self._pack([row], 0)
    logits, s = self._prefill_jit(self.place_params(params), cb, lb, cache_cap=cap,
                                  all_logits=True)
    rows = np.asarray(cb.gather[0][cb.cand_valid[0]])
    return FocusOutput(logits=np.asarray(logits[0, :len(row.local)]),
                       cand_k=np.asarray(s.cand_k)[:, rows], cand_v=np.asarray(s.cand_v)[:, rows],
                       plan=row)

  def recompute(self, params, prompts, generated) -> np.ndarray:
    """Next-token logits ``[B, V]`` after ``prompts[b] ⊕ generated[b]`` by the closed form (no
    caches): the reference the cached :meth:`step` is tested against."""
    rows = [self.plan(p, g) for p, g in zip(prompts, generated)]
    cb, lb, cap = self._pack(rows, 0)
    logits, _ = self._prefill_jit(self.place_params(params), cb, lb, cache_cap=cap,
                                  all_logits=False)
    return np.asarray(logits)


@dataclasses.dataclass(frozen=True)
class FocusStep:
  """``FocusLLM``'s cached decode step as a static argument of the device loop (hashed by the
  model object and the decoder it steps with: one compiled loop per FocusLLM, as its jitted step).

  ``model``: the decoder of the chunk rows' step and of the local forward. On CPU, without a mesh,
  the per-layer one (``decode_decoder``): a step reads every weight once, and the layer scan's
  per-layer slices copied each weight and each layer's chunk caches first (a tenth of a SmolLM2
  step at 8K)."""
  focus: FocusLLM
  model: Decoder

  def prepare_params(self, params):  # on the host, before the loop (decode_loop.step_params)
    return self.model.prepare_params(self.focus.place_params(params))

  def __call__(self, params, state: FocusState, x, tokens):
    model = None if self.model is self.focus.model else self.model
    return self.focus._step_impl(params, state, tokens, model)
