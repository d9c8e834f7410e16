"""The decoder shared by every longjax method: LLaMA-2/3, Qwen2 and Mistral in Flax Linen.

One call runs ``T`` new tokens through all layers. Besides the tokens it takes

* ``positions``  RoPE positions of the new tokens (never assumed to be ``arange``);
* ``alt``        which tokens use the alternative q/k/v(/o) projections (Activation Beacon's
                 beacon tokens, FocusLLM's candidate tokens): either a boolean mask ``[B, T]``
                 (every token is projected both ways) or int slot indices ``[B, A]`` with ``A``
                 static and padding ``>= T`` (only those ``A`` tokens get the alternative
                 projections: what the planned callers pass);
* ``q_meta``     mask metadata of the new tokens (order / segment / validity);
* ``memory``     an optional per-layer KV prefix (pre-RoPE keys, with their own positions and
                 metadata) that the new tokens attend to: a KV cache, beacon memory, or FocusLLM
                 candidate KV.

and returns the logits (or final hidden states) plus the new tokens' **pre-RoPE** keys and values
per layer, so that callers decide what to keep. Keys are rotated at use, with the positions the
caller gives: that is what lets Beacon re-position its memory on every call.

``seq_axis`` names a mesh axis that splits the new tokens by position, for a call made inside
``jax.shard_map`` (FocusLLM's local forward over a chunk mesh): each device runs its own slice of
the sequence and every layer all-gathers the slices' keys and values (one collective per layer),
so no device repeats another's work and the attention sees the whole sequence.

Layers are stacked with ``nn.scan`` (one compiled layer body; parameters carry a leading layer
axis) and optionally rematerialised with ``nn.remat``. ``layer_loop="unrolled"`` runs the same
layers as a Python loop over per-layer parameters (``unstack_layers``): for decode steps on CPU,
where the scan's per-layer ``dynamic_slice`` of every weight is a copy that costs as much memory
traffic as the step's matmuls themselves (profile in docs/performance.md).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

# CAUSAL_PREFILL: the rule of a plain causal decoder's calls, for the methods that build one
from longjax.kernels import CAUSAL_PREFILL, NO_WINDOW, MaskRule, TokenMeta, attention  # noqa
from longjax.models.config import ModelConfig, ModelConfigError
from longjax.models.head import lm_head
from longjax.models.rope import apply_rope, rope_tables
from longjax.runtime.tree_cache import TreeCache


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class KVPrefix:
  """Keys/values the new tokens attend to before themselves, stacked over layers.

  ``k``/``v``: ``[L, B, M, Hkv, D]`` pre-RoPE; ``positions``: ``[B, M]`` RoPE positions to rotate
  the keys with in this call; ``meta``: mask metadata of these keys (``valid`` marks the filled
  part of a fixed-capacity buffer). ``position_bound`` (static, optional): every position is
  known to lie in ``[0, position_bound)``; the rotation tables are then gathered from one table of
  ``arange(position_bound)``, which depends on no step input: a decode loop computes it once
  instead of the sin/cos of all ``M`` positions at every step.

  ``rotated`` (static): the keys are already rotated at ``positions`` (:func:`rotate_kv`), for
  caches whose entries never move (a KV cache, FocusLLM's chunk caches) and whose RoPE does not
  depend on the call (not dynamic NTK): a decode step then reads them as they are instead of
  rotating the whole cache again at every token (a pass over every cached key per layer, most of
  a long context's decode step on CPU).
  """
  k: jax.Array
  v: jax.Array
  positions: jax.Array
  meta: TokenMeta
  position_bound: Optional[int] = dataclasses.field(default=None, metadata=dict(static=True))
  rotated: bool = dataclasses.field(default=False, metadata=dict(static=True))


def caches_rotated(cfg: ModelConfig) -> bool:
  """Whether a cache of this model may hold rotated keys (``KVPrefix.rotated``): dynamic NTK
  rotates with a scale that depends on the call's longest position, so its keys are rotated at
  use, as the whole sequence run at once would rotate them."""
  return cfg.rope_type != "dynamic"


def rotate_kv(cfg: ModelConfig, k, positions):
  """Keys ``[L, B, T, Hkv, D]`` (pre-RoPE, as the decoder returns them) rotated at ``positions
  [B, T]``: exactly what the decoder computes from them at use."""
  cos, sin = rope_tables(cfg, positions)
  return jax.vmap(apply_rope, in_axes=(0, None, None))(k, cos, sin)


class RMSNorm(nn.Module):
  eps: float
  param_dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x):
    scale = self.param("scale", nn.initializers.ones, (x.shape[-1],), self.param_dtype)
    # Normalise in fp32, cast back, then scale in the input dtype: HF's order of rounding.
    xf = x.astype(jnp.float32)
    xf = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + self.eps)
    return scale.astype(x.dtype) * xf.astype(x.dtype)


def _dense(cfg: ModelConfig, features, name, axis=-1, bias=False):
  return nn.DenseGeneral(features=features, axis=axis, use_bias=bias, dtype=cfg.compute_dtype,
                         param_dtype=cfg.params_dtype, name=name,
                         kernel_init=nn.initializers.normal(0.02))


class Attention(nn.Module):
  cfg: ModelConfig
  rule: MaskRule
  impl: str
  seq_axis: Optional[str] = None

  def _project(self, which, x, alt, features, axis=-1, bias=False):
    base = _dense(self.cfg, features, f"{which}_proj", axis, bias)(x)
    if which not in self.cfg.alt_projections or (alt is None and not self.is_initializing()):
      return base
    proj = _dense(self.cfg, features, f"alt_{which}_proj", axis, bias)
    if alt is None:  # init: declare the alternative kernel
      proj(x)
      return base
    if alt.dtype == jnp.bool_:  # a mask: both projections for every token, then select
      sel = alt.reshape(alt.shape + (1,) * (base.ndim - alt.ndim))
      return jnp.where(sel, proj(x), base)
    # Slot indices [B, A]: project only those A tokens and scatter them over the base outputs
    # (beacons are 1/(r+1) of a window, FocusLLM has one candidate per row). Padding indices
    # (>= T) gather a clipped row and are dropped by the scatter.
    rows = jnp.arange(x.shape[0])[:, None]
    other = proj(x[rows, jnp.minimum(alt, x.shape[1] - 1)])
    return base.at[rows, alt].set(other.astype(base.dtype), mode="drop")

  @nn.compact
  def __call__(self, x, alt, rope_q, rope_mem, mem_k, mem_v, q_meta, k_meta, window, rows=None):
    """``rows [B, R]``: only those tokens' outputs are computed (``[B, R, H]``); every token's
    keys and values still are. ``R = 0``: keys and values only (output ``None``)."""
    cfg = self.cfg
    bias = cfg.attention_bias
    k = self._project("k", x, alt, (cfg.num_kv_heads, cfg.head_dim), bias=bias)
    v = self._project("v", x, alt, (cfg.num_kv_heads, cfg.head_dim), bias=bias)
    new_kv = (k, v)
    k_rot = apply_rope(k, *rope_q)
    rule = self.rule
    if rows is not None:
      if rows.shape[1] == 0:
        return None, new_kv
      # the queries are some tokens, not the call's last ones in order: no suffix promise
      x, alt, rope_q, q_meta = _take_rows(rows, x, alt, rope_q, q_meta)
      rule = dataclasses.replace(rule, suffix_queries=False)
    q = self._project("q", x, alt, (cfg.num_heads, cfg.head_dim), bias=bias)
    q = apply_rope(q, *rope_q)
    if self.seq_axis is not None:  # every device's slice of the sequence, in one collective
      kv = jax.lax.all_gather(jnp.stack([k_rot, v.astype(k_rot.dtype)]), self.seq_axis, axis=2,
                              tiled=True)
      k_rot, v = kv[0], kv[1].astype(v.dtype)
    if mem_k is not None:  # rope_mem None: the memory's keys are rotated already
      mem_rot = (mem_k.astype(k.dtype) if rope_mem is None
                 else apply_rope(mem_k.astype(k.dtype), *rope_mem))
      k_rot = jnp.concatenate([mem_rot, k_rot], axis=1)
      v = jnp.concatenate([mem_v.astype(v.dtype), v], axis=1)
    out = attention(q, k_rot, v, q_meta, k_meta, rule, window=window, impl=self.impl)
    out = self._project("o", out, alt, cfg.hidden_size, axis=(-2, -1))
    return out, new_kv


def _take_rows(rows, x, alt, rope_q, q_meta):
  """The query side of a call restricted to ``rows [B, R]``: ``x``, ``alt`` (as a ``[B, R]``
  mask: which of those rows use the alternative projections), the rotation tables and
  ``q_meta``."""
  take = lambda a: jnp.take_along_axis(a, rows.reshape(rows.shape + (1,) * (a.ndim - 2)), axis=1)
  if alt is not None:
    alt = (take(alt) if alt.dtype == jnp.bool_
           else jnp.any(rows[:, :, None] == alt[:, None, :], axis=-1))
  return take(x), alt, tuple(take(t) for t in rope_q), jax.tree.map(take, q_meta)


# On CPU, XLA's dot over many rows at once runs well below its peak: SmolLM2's MLP maps at 16K
# rows 140-150 GFLOP/s as one dot, 160-175 in 1-2K-row blocks (bench/results/shapes.md: 69 %
# of the square peak at 8K rows, 92 % at 1K). From MLP_BLOCKED_MIN_ROWS rows the MLP runs in
# MLP_ROW_BLOCK-row blocks there (``lax.map``): the same arithmetic row by row.
MLP_ROW_BLOCK = 2048
MLP_BLOCKED_MIN_ROWS = 8192


def mlp_row_blocks(rows: int) -> Optional[int]:
  """Rows per block for an MLP over ``rows`` rows on this backend (``None``: all at once)."""
  if jax.default_backend() != "cpu" or rows < MLP_BLOCKED_MIN_ROWS:
    return None
  return MLP_ROW_BLOCK


class MLP(nn.Module):
  cfg: ModelConfig

  @nn.compact
  def __call__(self, x):
    cfg = self.cfg
    gate = _dense(cfg, cfg.intermediate_size, "gate_proj")
    up = _dense(cfg, cfg.intermediate_size, "up_proj")
    down = _dense(cfg, cfg.hidden_size, "down_proj")
    block = mlp_row_blocks(int(np.prod(x.shape[:-1])))
    if block is None or self.is_initializing():
      return down(nn.silu(gate(x)) * up(x))
    # the same maps as the Dense modules (no bias, inputs and kernels in the compute dtype)
    kg, ku, kd = (m.variables["params"]["kernel"] for m in (gate, up, down))
    dt = cfg.compute_dtype

    def rows(xb):
      xb = xb.astype(dt)
      h = nn.silu(jnp.dot(xb, kg.astype(dt))) * jnp.dot(xb, ku.astype(dt))
      return jnp.dot(h, kd.astype(dt))

    # blocks along the tokens, the leading (batch) axes kept whole: a batch-sharded call stays
    # sharded the same way in every block
    lead, t = x.shape[:-2], x.shape[-2]
    bt = max(1, block // max(1, int(np.prod(lead))))
    nb = -(-t // bt)
    xs = jnp.pad(x, [(0, 0)] * len(lead) + [(0, nb * bt - t), (0, 0)])  # padding: cut below
    xs = jnp.moveaxis(xs.reshape(lead + (nb, bt, x.shape[-1])), len(lead), 0)
    out = jnp.moveaxis(jax.lax.map(rows, xs), 0, len(lead))
    return out.reshape(lead + (nb * bt, cfg.hidden_size))[..., :t, :]


class Block(nn.Module):
  """One decoder layer; ``nn.scan`` carries ``x`` and maps over per-layer inputs."""
  cfg: ModelConfig
  rule: MaskRule
  impl: str
  seq_axis: Optional[str] = None

  @nn.compact
  def __call__(self, x, layer_in, shared, rows=None):
    """``rows [B, R]`` (the last layer of a call whose caller needs only those rows): returns
    ``x`` at those rows only (``[B, R, H]``), with every token's keys and values."""
    cfg = self.cfg
    mem_k, mem_v, window = layer_in
    alt, rope_q, rope_mem, q_meta, k_meta = shared
    h = RMSNorm(cfg.rms_norm_eps, cfg.params_dtype, name="input_norm")(x)
    a, new_kv = Attention(cfg, self.rule, self.impl, self.seq_axis, name="attn")(
        h, alt, rope_q, rope_mem, mem_k, mem_v, q_meta, k_meta, window, rows)
    if rows is not None:
      x = jnp.take_along_axis(x, rows[..., None], axis=1)
      if a is None:  # R = 0
        return x, new_kv
    x = x + a
    h = RMSNorm(cfg.rms_norm_eps, cfg.params_dtype, name="post_attention_norm")(x)
    x = x + MLP(cfg, name="mlp")(h)
    return x, new_kv


LAYER_LOOPS = ("scan", "unrolled")


def unstack_layers(params):
  """The stacked ``params["layers"]`` (leading layer axis) as ``layers_0 .. layers_{L-1}``: the
  parameter layout of ``Decoder(layer_loop="unrolled")``. It is a copy of the layer weights, made
  once per parameter tree of jax arrays (``_UNSTACKED``, a
  :class:`~longjax.runtime.tree_cache.TreeCache`), so repeated generations do not copy (and page
  in) the weights again. Other leaves (numpy arrays, which may change in place; tracers) are
  copied at every call."""
  if "layers" not in params:
    return params  # already unstacked
  return _UNSTACKED.get(params, _unstack_jit)


def _unstack(params):
  out = {k: v for k, v in params.items() if k != "layers"}
  n = jax.tree.leaves(params["layers"])[0].shape[0]
  for i in range(n):
    out[f"layers_{i}"] = jax.tree.map(lambda a, i=i: a[i], params["layers"])
  return out


_unstack_jit = jax.jit(_unstack)
_UNSTACKED = TreeCache()


class Decoder(nn.Module):
  """Decoder-only LM. See the module docstring for the call contract."""
  cfg: ModelConfig
  rule: MaskRule = MaskRule(causal=True)
  impl: str = "auto"
  layer_loop: str = "scan"  # or "unrolled": parameters from ``unstack_layers``
  seq_axis: Optional[str] = None  # a shard_map axis splitting the tokens (module docstring)

  def prepare_params(self, params):
    """``params`` in this decoder's layout (stacked checkpoints in, unstacked for ``unrolled``)."""
    return unstack_layers(params) if self.layer_loop == "unrolled" else params

  def layer_windows(self) -> jax.Array:
    ws = self.cfg.sliding_windows or (None,) * self.cfg.num_layers
    return jnp.asarray([NO_WINDOW if w is None else w for w in ws], jnp.int32)

  @nn.compact
  def __call__(self, tokens, positions, *, q_meta: Optional[TokenMeta] = None, alt=None,
               memory: Optional[KVPrefix] = None, head: bool = True, head_rows=None):
    """Run ``tokens [B, T]`` at ``positions [B, T]``.

    ``head_rows [B, R]`` (int): the only rows whose outputs the caller needs: logits
    ``[B, R, V]`` (or final hidden ``[B, R, H]`` with ``head=False``). Prefill needs the last row
    only, and full-vocabulary logits for every prompt token are the largest tensor of a long
    forward; the last layer then also computes only the keys and values of the other tokens.
    ``R = 0`` (FocusLLM's chunk rows): keys and values only.

    Returns ``(logits [B, T, V] fp32 — or final hidden [B, T, H] when head=False, (k, v))`` with
    ``k``/``v`` the new tokens' pre-RoPE keys/values, ``[L, B, T, Hkv, D]``.
    """
    cfg = self.cfg
    positions = jnp.asarray(positions, jnp.int32)
    if q_meta is None:
      q_meta = TokenMeta.causal(positions)
    x = self._embed(tokens)
    # Dynamic NTK needs the call's largest position; other rope types ignore it.
    seq_len = jnp.max(positions) + 1
    if self.seq_axis is not None:
      seq_len = jax.lax.pmax(seq_len, self.seq_axis)
    if memory is not None:
      seq_len = jnp.maximum(seq_len, jnp.max(jnp.where(memory.meta.valid, memory.positions, 0)) + 1)
    # The keys' metadata: the whole sequence when each device holds a slice of it.
    self_meta = q_meta if self.seq_axis is None else jax.tree.map(
        lambda a: jax.lax.all_gather(a, self.seq_axis, axis=1, tiled=True), q_meta)
    rope_q = rope_tables(cfg, positions, seq_len)
    if memory is None:
      mem_k = mem_v = rope_mem = None
      k_meta = self_meta
    else:
      mem_k, mem_v = memory.k, memory.v
      if memory.rotated:
        if not caches_rotated(cfg):
          raise ModelConfigError(f"KVPrefix(rotated=True) with {cfg.rope_type} RoPE: its keys "
                                 "must be rotated at use (caches_rotated)")
        rope_mem = None
      elif memory.position_bound is None:
        rope_mem = rope_tables(cfg, memory.positions, seq_len)
      else:
        table = rope_tables(cfg, jnp.arange(memory.position_bound, dtype=jnp.int32), seq_len)
        rope_mem = tuple(t[memory.positions] for t in table)
      k_meta = memory.meta.concat(self_meta)
    block = Block
    if cfg.remat:
      policy = (jax.checkpoint_policies.dots_with_no_batch_dims_saveable if cfg.remat == "dots"
                else jax.checkpoint_policies.nothing_saveable)
      block = nn.remat(block, prevent_cse=False, policy=policy)
    shared = (alt, rope_q, rope_mem, q_meta, k_meta)
    rows = None if head_rows is None else jnp.asarray(head_rows, jnp.int32)
    # Only ``rows`` leave the last layer: the other tokens need its keys and values (the
    # caller's cache) but not its queries, attention, output projection and MLP, ~1/L of a long
    # prefill. A sequence-split call keeps the plain path (its rows are global positions).
    last_rows = rows if (self.seq_axis is None and not self.is_initializing()) else None
    if self.layer_loop not in LAYER_LOOPS:
      raise ModelConfigError(f"Decoder.layer_loop must be one of {LAYER_LOOPS}, "
                             f"got {self.layer_loop!r}")
    if self.layer_loop == "unrolled":
      windows, kvs = self.layer_windows(), []
      for i in range(cfg.num_layers):
        layer_in = (None if mem_k is None else mem_k[i], None if mem_v is None else mem_v[i],
                    windows[i])
        x, kv = block(cfg, self.rule, self.impl, self.seq_axis, name=f"layers_{i}")(
            x, layer_in, shared, last_rows if i == cfg.num_layers - 1 else None)
        kvs.append(kv)
      new_kv = jax.tree.map(lambda *a: jnp.stack(a), *kvs)
    elif last_rows is not None:
      x, new_kv = self._split_scan(block, x, mem_k, mem_v, shared, last_rows)
    else:
      stack = nn.scan(block, variable_axes={"params": 0}, split_rngs={"params": True},
                      in_axes=(0, nn.broadcast), length=cfg.num_layers)
      x, new_kv = stack(cfg, self.rule, self.impl, self.seq_axis, name="layers")(
          x, (mem_k, mem_v, self.layer_windows()), shared)
    if rows is not None and last_rows is None:
      x = jnp.take_along_axis(x, rows[..., None], axis=1)
    x = RMSNorm(cfg.rms_norm_eps, cfg.params_dtype, name="final_norm")(x)
    if not head:
      return x, new_kv
    return self._logits(x), new_kv

  def _split_scan(self, block, x, mem_k, mem_v, shared, rows):
    """The stacked layers as a scan over the first ``L - 1`` and the last one alone, which
    computes only ``rows``' outputs (and every token's keys and values)."""
    cfg = self.cfg
    stacked = self.variables["params"]["layers"]
    first = lambda a: None if a is None else jax.tree.map(lambda b: b[:-1], a)
    last = lambda a: None if a is None else jax.tree.map(lambda b: b[-1], a)
    windows = self.layer_windows()
    kv_first = None
    if cfg.num_layers > 1:
      stack = nn.scan(block, variable_axes={"params": 0}, split_rngs={"params": True},
                      in_axes=(0, nn.broadcast), length=cfg.num_layers - 1)
      x, kv_first = stack(cfg, self.rule, self.impl, parent=None).apply(
          {"params": first(stacked)}, x, (first(mem_k), first(mem_v), windows[:-1]), shared)
    x, kv_last = block(cfg, self.rule, self.impl, parent=None).apply(
        {"params": last(stacked)}, x, (last(mem_k), last(mem_v), windows[-1]), shared, rows)
    if kv_first is None:
      return x, jax.tree.map(lambda b: b[None], kv_last)
    return x, jax.tree.map(lambda a, b: jnp.concatenate([a, b[None]]), kv_first, kv_last)

  def _embed(self, tokens):
    cfg = self.cfg
    table = self.param("embedding", nn.initializers.normal(1.0),
                       (cfg.vocab_size, cfg.hidden_size), cfg.params_dtype)
    x = jnp.take(table, jnp.clip(tokens, 0, cfg.vocab_size - 1), axis=0)
    if cfg.num_alt_embeddings:
      alt_table = self.param("alt_embedding", nn.initializers.normal(1.0),
                             (cfg.num_alt_embeddings, cfg.hidden_size), cfg.params_dtype)
      alt_ids = jnp.clip(tokens - cfg.vocab_size, 0, cfg.num_alt_embeddings - 1)
      x = jnp.where((tokens >= cfg.vocab_size)[..., None], jnp.take(alt_table, alt_ids, axis=0), x)
    return x.astype(cfg.compute_dtype)

  def _logits(self, x):
    cfg = self.cfg
    if not cfg.tie_word_embeddings and self.is_initializing():
      _dense(cfg, cfg.vocab_size, "lm_head")(x)  # declares the untied head kernel only (init)
    return lm_head(cfg, self.variables["params"], x)


def init_params(cfg: ModelConfig, seed: int = 0):
  """Random parameters (a plain pytree) with the layout the converters produce."""
  model = Decoder(cfg)
  tokens = jnp.zeros((1, 2), jnp.int32)
  alt = jnp.zeros((1, 2), bool) if cfg.alt_projections else None
  return model.init(jax.random.PRNGKey(seed), tokens, jnp.arange(2)[None], alt=alt)["params"]


@functools.lru_cache(maxsize=32)
def param_shapes(cfg: ModelConfig):
  """Abstract parameter tree (``ShapeDtypeStruct`` leaves) without allocating anything."""
  return jax.eval_shape(lambda: init_params(cfg))


# Decode loops on CPU step with per-layer weight copies while the layers' weights stay under this
# size (a copy lives as long as the parameters it was made from: at most this much extra memory
# per parameter tree).
UNROLL_MAX_LAYER_BYTES = 2 * 2**30


def decode_decoder(model: Decoder) -> Decoder:
  """The decoder a decode loop steps with: ``layer_loop="unrolled"`` on CPU for layer weights up
  to ``UNROLL_MAX_LAYER_BYTES`` (a step of a few tokens reads every weight once, and the scan's
  per-layer slices would copy each of them first), the scan elsewhere (accelerators fuse the
  slice into the matmul, and a copy of a large model's weights would not fit beside them)."""
  if model.layer_loop != "scan" or jax.default_backend() != "cpu":
    return model
  layer_bytes = sum(int(np.prod(x.shape)) * jnp.dtype(x.dtype).itemsize
                    for x in jax.tree.leaves(param_shapes(model.cfg)["layers"]))
  return model.clone(layer_loop="unrolled") if layer_bytes <= UNROLL_MAX_LAYER_BYTES else model


def count_params(params) -> int:
  return int(sum(np.prod(x.shape) for x in jax.tree.leaves(params)))
