"""The one mask description shared by every attention path.

Every attention longjax runs (plain causal decoding, Activation Beacon windows over a memory prefix,
FocusLLM chunk condensing and its candidate-prefixed local forward, sliding-window Mistral) is
described by per-token integer metadata on the query side and on the key side, plus a pure
predicate ``allowed(q, k)``. The dense reference, the blockwise fallback and the Pallas kernels all
evaluate the same predicate, so a mask is defined exactly once.

Metadata fields (all ``int32``/``bool`` arrays of shape ``[batch, length]``):

* ``order``   causal order of the token. A query sees a key only when ``k.order <= q.order``. This
  is *not* the RoPE position: beacon memory and FocusLLM candidates are re-positioned on every
  call, while the causal order is a property of the layout.
* ``segment`` tokens only see keys of the same segment (packed sequences, padded rows). Default 0.
* ``valid``   keys with ``valid == False`` are never seen (padding, unused capacity of a
  fixed-size cache). Queries with ``valid == False`` produce zeros.
* ``kind``    optional small int (``None`` = all 0): the token's kind, e.g. raw vs beacon. Only
  used when the rule has a ``kind_sees`` table (see :class:`MaskRule`); this expresses masks that
  order/segment cannot, such as Activation Beacon's step-expansion in append mode (raw tokens of the
  window must not see the window's beacons, while beacons see the raw tokens before them).
* ``bias``    optional float (``None`` = no bias), key side only: added to every score of that
  key before the softmax (its weight is multiplied by ``exp(bias)``). FocusLLM's optional
  candidate gate uses it (docs/focusllm.md). Every attention path adds it: the dense and
  chunked paths directly, the blockwise path and the Pallas kernels through ``KernelMeta.k_bias``.

Kernels do not evaluate :func:`allowed` on ``TokenMeta`` directly: :func:`kernel_meta` folds the
rule, the window and validity into an equivalent per-token form (query ``lo``/``hi`` bounds on the
key order, a segment id, a kind) which is cheap to test inside a kernel and to summarise per block
(:func:`block_visits`) for block skipping. ``tests/test_kernels.py`` checks the two forms agree.

The per-call rule (:class:`MaskRule`) adds the causal flag and an optional sliding window, measured
in ``order`` units (Mistral: a query sees keys with ``q.order - k.order < window``). The window is a
traced scalar so that layers with and without a window share one compiled layer body under
``nn.scan``.
"""
from __future__ import annotations

import dataclasses
from typing import Optional, Tuple

import jax
import jax.numpy as jnp

# A window this large never excludes anything: "no sliding window" as a traced value.
NO_WINDOW = 2**30


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class TokenMeta:
  """Per-token metadata for one side (queries or keys) of an attention call."""
  order: jax.Array  # [B, T] int32
  segment: jax.Array  # [B, T] int32
  valid: jax.Array  # [B, T] bool
  kind: Optional[jax.Array] = None  # [B, T] int32 or None (= all zeros)
  bias: Optional[jax.Array] = None  # [B, T] float32 or None (= all zeros); keys only

  @classmethod
  def causal(cls, order: jax.Array, valid: Optional[jax.Array] = None,
             segment: Optional[jax.Array] = None, kind: Optional[jax.Array] = None,
             bias: Optional[jax.Array] = None) -> "TokenMeta":
    order = jnp.asarray(order, jnp.int32)
    if valid is None:
      valid = jnp.ones(order.shape, bool)
    if segment is None:
      segment = jnp.zeros(order.shape, jnp.int32)
    if kind is not None:
      kind = jnp.asarray(kind, jnp.int32)
    if bias is not None:
      bias = jnp.asarray(bias, jnp.float32)
    return cls(order=order, segment=jnp.asarray(segment, jnp.int32), valid=jnp.asarray(valid, bool),
               kind=kind, bias=bias)

  @property
  def length(self) -> int:
    return self.order.shape[-1]

  def kind_or_zeros(self) -> jax.Array:
    return jnp.zeros(self.order.shape, jnp.int32) if self.kind is None else self.kind

  def bias_or_zeros(self) -> jax.Array:
    return jnp.zeros(self.order.shape, jnp.float32) if self.bias is None else self.bias

  def concat(self, other: "TokenMeta") -> "TokenMeta":
    """Keys of ``self`` followed by keys of ``other`` along the sequence axis."""
    cat = lambda a, b: jnp.concatenate([a, b], axis=-1)
    kind = bias = None
    if self.kind is not None or other.kind is not None:
      kind = cat(self.kind_or_zeros(), other.kind_or_zeros())
    if self.bias is not None or other.bias is not None:
      bias = cat(self.bias_or_zeros(), other.bias_or_zeros())
    return TokenMeta(order=cat(self.order, other.order), segment=cat(self.segment, other.segment),
                     valid=cat(self.valid, other.valid), kind=kind, bias=bias)


@dataclasses.dataclass(frozen=True)
class MaskRule:
  """Static part of the mask.

  * ``causal``: a query sees only keys with ``k.order <= q.order``.
  * ``kind_sees``: optional tuple; ``kind_sees[a]`` is a bitmask of the key kinds a query of kind
    ``a`` may see (bit ``b`` set: may see keys of kind ``b``). Kinds outside the table see nothing.
    ``None`` (default): kinds are ignored. Example, beacon append-mode step-expansion with raw=0,
    beacon=1: ``kind_sees=(0b01, 0b11)`` (raw sees raw only, beacons see raw and beacons).
  * ``suffix_queries``: a promise that the ``Tq`` queries are the last ``Tq`` keys, in order,
    and that query ``i`` sees no key after its own (index ``Tk - Tq + i``): a causal prefill,
    fresh or after cached entries. Kernels may then skip those keys without reading the
    metadata (the chunked path does); the mask above still decides what is seen.
  """
  causal: bool = True
  kind_sees: Optional[Tuple[int, ...]] = None
  suffix_queries: bool = False


# A plain causal decoder's calls (prefill, fresh or after a cache; scoring; a teacher): the
# queries are the last keys, in order, so kernels may skip the keys after each query.
CAUSAL_PREFILL = MaskRule(causal=True, suffix_queries=True)


def kind_bits(q_kind: jax.Array, kind_sees: Tuple[int, ...]) -> jax.Array:
  """Bitmask of visible key kinds for each query kind (a select chain: works inside kernels)."""
  bits = jnp.zeros(q_kind.shape, jnp.int32)
  for a, b in enumerate(kind_sees):
    bits = jnp.where(q_kind == a, jnp.int32(b), bits)
  return bits


def allowed(q: TokenMeta, k: TokenMeta, rule: MaskRule = MaskRule(), window=NO_WINDOW) -> jax.Array:
  """``[B, Tq, Tk]`` boolean: may query i see key j.

  Written with broadcasting only, so kernels can call it on blocks of metadata.
  """
  qo, ko = q.order[..., :, None], k.order[..., None, :]
  ok = (q.segment[..., :, None] == k.segment[..., None, :]) & k.valid[..., None, :]
  ok &= q.valid[..., :, None]
  if rule.causal:
    ok &= ko <= qo
  ok &= (qo - ko) < window
  if rule.kind_sees is not None:
    bits = kind_bits(q.kind_or_zeros(), rule.kind_sees)[..., :, None]
    ok &= ((bits >> k.kind_or_zeros()[..., None, :]) & 1) == 1
  return ok


# --------------------------------------------------------------------------------------------
# Kernel form of the mask.
# --------------------------------------------------------------------------------------------
INT_MAX = 2**31 - 1
INT_MIN = -(2**31)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class KernelMeta:
  """The mask folded into per-token int32 arrays (all ``[B, T]``).

  A query ``i`` may see key ``j`` iff ``q_lo[i] <= k_order[j] <= q_hi[i]`` and
  ``q_seg[i] == k_seg[j]`` (and, with a ``kind_sees`` rule, the kind test). Folded in:
  causality (``q_hi = order`` else ``INT_MAX - 1``), the window (``q_lo = order - window + 1``),
  invalid queries (``q_lo = INT_MAX``: sees nothing) and invalid keys (``k_order = INT_MAX``: above
  every ``q_hi``). Orders must lie in ``(-2**30, 2**30)``.

  ``k_bias``: the keys' score bias (``TokenMeta.bias``, float32 ``[B, Tk]``), or ``None`` for
  none; kernels add it to every score of the key before the softmax. It is the one field with a
  gradient (``blockwise.attention_with_vjp`` returns it).
  """
  q_lo: jax.Array
  q_hi: jax.Array
  q_seg: jax.Array
  q_kind: jax.Array
  k_order: jax.Array
  k_seg: jax.Array
  k_kind: jax.Array
  k_bias: Optional[jax.Array] = None


def kernel_meta(q: TokenMeta, k: TokenMeta, rule: MaskRule = MaskRule(),
                window=NO_WINDOW) -> KernelMeta:
  qo = q.order.astype(jnp.int32)
  window = jnp.asarray(window, jnp.int32)
  lo = jnp.where(window >= NO_WINDOW, jnp.int32(INT_MIN), qo - window + 1)
  hi = qo if rule.causal else jnp.full_like(qo, INT_MAX - 1)
  lo = jnp.where(q.valid, lo, jnp.int32(INT_MAX))
  ko = jnp.where(k.valid, k.order.astype(jnp.int32), jnp.int32(INT_MAX))
  return KernelMeta(q_lo=lo, q_hi=hi, q_seg=q.segment.astype(jnp.int32), q_kind=q.kind_or_zeros(),
                    k_order=ko, k_seg=k.segment.astype(jnp.int32), k_kind=k.kind_or_zeros(),
                    k_bias=k.bias)


def kernel_allowed(q_lo, q_hi, q_seg, q_kind, k_order, k_seg, k_kind, kind_sees=None):
  """The kernel-form predicate on broadcastable operands (query side ``[..., :, None]``-shaped,
  key side ``[..., None, :]``-shaped). Pure jnp: used inside kernels and the blockwise path."""
  ok = (k_order >= q_lo) & (k_order <= q_hi) & (q_seg == k_seg)
  if kind_sees is not None:
    ok &= ((kind_bits(q_kind, kind_sees) >> k_kind) & 1) == 1
  return ok


def pad_kernel_meta(km: KernelMeta, tq: int, tk: int) -> KernelMeta:
  """Pad queries to ``tq`` (padding sees nothing) and keys to ``tk`` (padding is never seen)."""
  def pad(x, t, value):
    n = t - x.shape[-1]
    return x if n == 0 else jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, n)], constant_values=value)
  return KernelMeta(q_lo=pad(km.q_lo, tq, INT_MAX), q_hi=pad(km.q_hi, tq, INT_MIN),
                    q_seg=pad(km.q_seg, tq, 0), q_kind=pad(km.q_kind, tq, 0),
                    k_order=pad(km.k_order, tk, INT_MAX), k_seg=pad(km.k_seg, tk, 0),
                    k_kind=pad(km.k_kind, tk, 0),
                    k_bias=None if km.k_bias is None else pad(km.k_bias, tk, 0.0))


def block_visits(km: KernelMeta, block_q: int, block_k: int) -> jax.Array:
  """``[B, nQ, nK]`` bool: may any query of block i see any key of block j (conservative).

  Works on traced metadata (pure jnp); lengths must already be padded to the block sizes. Uses
  per-block ranges of ``lo``/``hi``/order/segment; kinds are ignored (never skips wrongly).
  """
  b, tq = km.q_lo.shape
  tk = km.k_order.shape[-1]
  nq, nk = tq // block_q, tk // block_k
  q_ok = km.q_lo <= km.q_hi  # the query can see something at all
  rq = lambda x: x.reshape(b, nq, block_q)
  rk = lambda x: x.reshape(b, nk, block_k)
  lo_min = jnp.min(jnp.where(rq(q_ok), rq(km.q_lo), INT_MAX), -1)
  hi_max = jnp.max(jnp.where(rq(q_ok), rq(km.q_hi), INT_MIN), -1)
  qs_min = jnp.min(jnp.where(rq(q_ok), rq(km.q_seg), INT_MAX), -1)
  qs_max = jnp.max(jnp.where(rq(q_ok), rq(km.q_seg), INT_MIN), -1)
  k_ok = km.k_order < INT_MAX
  ko_min = jnp.min(jnp.where(rk(k_ok), rk(km.k_order), INT_MAX), -1)
  ko_max = jnp.max(jnp.where(rk(k_ok), rk(km.k_order), INT_MIN), -1)
  ks_min = jnp.min(jnp.where(rk(k_ok), rk(km.k_seg), INT_MAX), -1)
  ks_max = jnp.max(jnp.where(rk(k_ok), rk(km.k_seg), INT_MIN), -1)
  qa = lambda x: x[:, :, None]
  ka = lambda x: x[:, None, :]
  # Empty blocks have min=INT_MAX > max=INT_MIN, so every overlap test below fails for them.
  return ((ka(ko_min) <= qa(hi_max)) & (ka(ko_max) >= qa(lo_min)) & (ka(ko_min) <= ka(ko_max))
          & (ka(ks_min) <= qa(qs_max)) & (ka(ks_max) >= qa(qs_min)) & (qa(lo_min) <= qa(hi_max)))


def block_lists(visits: jax.Array):
  """Compact ``visits [B, nQ, nK]`` into ``(blocks [B, nQ, nK] int32, counts [B, nQ] int32)``.

  ``blocks[b, i, :counts[b, i]]`` are the visited KV block indices in increasing order; the tail
  repeats the last visited index (0 if none), so a pipelined kernel that keeps walking the list
  re-uses the block already in memory instead of fetching a new one.
  """
  nk = visits.shape[-1]
  idx = jnp.arange(nk, dtype=jnp.int32)
  key = jnp.where(visits, idx, nk + idx)
  blocks = jnp.sort(key, axis=-1)
  counts = jnp.sum(visits, axis=-1, dtype=jnp.int32)
  last = jnp.take_along_axis(blocks, jnp.maximum(counts - 1, 0)[..., None], axis=-1)
  blocks = jnp.where(idx < counts[..., None], blocks, last)
  blocks = jnp.where(blocks >= nk, 0, blocks)
  return blocks.astype(jnp.int32), counts


def _tracer_type():
  tracer = getattr(jax.core, "Tracer", None)
  if tracer is None:  # pragma: no cover - moved in some jax versions
    from jax._src.core import Tracer as tracer
  return tracer


def is_concrete(*xs) -> bool:
  """True when none of ``xs`` is a tracer (so block lists can be computed on the host)."""
  tracer = _tracer_type()
  return not any(isinstance(x, tracer) for x in jax.tree.leaves(xs))
