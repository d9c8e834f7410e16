"""HF tensor names <-> longjax parameter paths: one table, one transform per row.

Each row says where an HF tensor lives in the longjax parameter tree, how its layout changes and
which logical axes it is sharded on (:mod:`longjax.ckpts.layout` answers the other questions
about parameters from these rows).
Per-layer rows (``{i}`` in the name) map onto one stacked array with a leading layer axis (the
decoder's ``nn.scan``). The official Activation Beacon / FocusLLM extras (``beacon_*``) are rows in
the same table; in longjax they are the decoder's generic "alternative" projections/embeddings.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Optional

import numpy as np

from longjax.models.config import ModelConfig


@dataclasses.dataclass(frozen=True)
class Transform:
  """HF layout -> longjax layout and back; ``shape`` gives the longjax shape from the HF one."""
  name: str
  to_jax: Callable
  to_hf: Callable


def _heads(n_heads_attr):
  def to_jax(w, cfg):  # HF Linear [heads*hd, in] -> [in, heads, hd]
    return w.T.reshape(w.shape[1], getattr(cfg, n_heads_attr), cfg.head_dim)

  def to_hf(w, cfg):
    return w.reshape(w.shape[0], -1).T
  return to_jax, to_hf


IDENTITY = Transform("identity", lambda w, cfg: w, lambda w, cfg: w)
LINEAR = Transform("linear", lambda w, cfg: w.T, lambda w, cfg: w.T)
Q_HEADS = Transform("linear->[in,heads,hd]", *_heads("num_heads"))
KV_HEADS = Transform("linear->[in,kv_heads,hd]", *_heads("num_kv_heads"))
O_HEADS = Transform(  # HF o_proj [hidden, heads*hd] -> [heads, hd, hidden]
    "linear->[heads,hd,out]",
    lambda w, cfg: w.T.reshape(cfg.num_heads, cfg.head_dim, w.shape[0]),
    lambda w, cfg: w.reshape(-1, w.shape[-1]).T)
Q_BIAS = Transform("bias->[heads,hd]", lambda b, cfg: b.reshape(cfg.num_heads, cfg.head_dim),
                   lambda b, cfg: b.reshape(-1))
KV_BIAS = Transform("bias->[kv_heads,hd]",
                    lambda b, cfg: b.reshape(cfg.num_kv_heads, cfg.head_dim),
                    lambda b, cfg: b.reshape(-1))


@dataclasses.dataclass(frozen=True)
class Row:
  hf: str  # HF name; "{i}" marks a per-layer tensor
  path: tuple  # longjax parameter path (per-layer rows live under ("layers", ...))
  transform: Transform
  # Logical axes of the longjax tensor (of one layer's slice for per-layer rows), which
  # train/sharding.LOGICAL_RULES maps onto the mesh; None: replicated on every device.
  axes: Optional[tuple]
  when: Optional[Callable[[ModelConfig], bool]] = None

  @property
  def per_layer(self) -> bool:
    return "{i}" in self.hf

  @property
  def logical_axes(self) -> Optional[tuple]:
    """Axes of the whole stored tensor: per-layer rows are stacked on a leading layer axis."""
    if self.axes is None:
      return None
    return ("layers",) + self.axes if self.per_layer else self.axes


def _alt(p):
  return lambda cfg: p in cfg.alt_projections


def _alt_bias(p):
  return lambda cfg: p in cfg.alt_projections and cfg.attention_bias


_bias = lambda cfg: cfg.attention_bias  # noqa: E731
_L = "model.layers.{i}."
ALT_EMBEDDING_NAME = "model.beacon_embed_tokens.weight"  # official name of the beacon embedding

ROWS = (
    Row("model.embed_tokens.weight", ("embedding",), IDENTITY, ("vocab", "embed")),
    Row("model.norm.weight", ("final_norm", "scale"), IDENTITY, ("norm",)),
    Row("lm_head.weight", ("lm_head", "kernel"), LINEAR, ("embed", "vocab"),
        lambda cfg: not cfg.tie_word_embeddings),
    Row(ALT_EMBEDDING_NAME, ("alt_embedding",), IDENTITY, ("alt_rows", "embed"),
        lambda cfg: cfg.num_alt_embeddings > 0),
    Row(_L + "input_layernorm.weight", ("layers", "input_norm", "scale"), IDENTITY, ("norm",)),
    Row(_L + "post_attention_layernorm.weight", ("layers", "post_attention_norm", "scale"),
        IDENTITY, ("norm",)),
    Row(_L + "mlp.gate_proj.weight", ("layers", "mlp", "gate_proj", "kernel"), LINEAR,
        ("embed", "mlp")),
    Row(_L + "mlp.up_proj.weight", ("layers", "mlp", "up_proj", "kernel"), LINEAR,
        ("embed", "mlp")),
    Row(_L + "mlp.down_proj.weight", ("layers", "mlp", "down_proj", "kernel"), LINEAR,
        ("mlp", "embed")),
    Row(_L + "self_attn.o_proj.weight", ("layers", "attn", "o_proj", "kernel"), O_HEADS,
        ("heads", "head_dim", "embed")),
    # An alternative projection is laid out like its base: it is a trained tensor, so it and its
    # optimizer moments are split over fsdp / tensor instead of held whole on every device.
    Row(_L + "self_attn.beacon_o_proj.weight", ("layers", "attn", "alt_o_proj", "kernel"), O_HEADS,
        ("heads", "head_dim", "embed"), _alt("o")),
) + tuple(
    row for p, heads, bias, h in (("q", Q_HEADS, Q_BIAS, "heads"),
                                  ("k", KV_HEADS, KV_BIAS, "kv_heads"),
                                  ("v", KV_HEADS, KV_BIAS, "kv_heads"))
    for row in (
        Row(_L + f"self_attn.{p}_proj.weight", ("layers", "attn", f"{p}_proj", "kernel"), heads,
            ("embed", h, "head_dim")),
        Row(_L + f"self_attn.{p}_proj.bias", ("layers", "attn", f"{p}_proj", "bias"), bias,
            (h, "head_dim"), _bias),
        Row(_L + f"self_attn.beacon_{p}_proj.weight", ("layers", "attn", f"alt_{p}_proj", "kernel"),
            heads, ("embed", h, "head_dim"), _alt(p)),
        Row(_L + f"self_attn.beacon_{p}_proj.bias", ("layers", "attn", f"alt_{p}_proj", "bias"),
            bias, (h, "head_dim"), _alt_bias(p)),
    ))



def alt_proj_name(p: str, layer="0") -> str:
  """The HF name of a layer's alternative (beacon / candidate) projection ``p`` in q/k/v/o: the
  only place outside ROWS that spells it (``layer="*"`` for messages)."""
  return _L.format(i=layer) + f"self_attn.beacon_{p}_proj.weight"



def alt_projections_in(names) -> tuple:
  """Which of q/k/v/o a checkpoint's tensor ``names`` carry alternative projections for."""
  return tuple(p for p in "qkvo" if alt_proj_name(p) in names)


# Tensors some checkpoints carry that hold nothing the model needs (non-persistent buffers saved by
# old transformers versions).
IGNORED_SUFFIXES = (".rotary_emb.inv_freq",)


def rows_for(cfg: ModelConfig):
  return [r for r in ROWS if r.when is None or r.when(cfg)]


def expected_names(cfg: ModelConfig) -> dict:
  """HF name -> (row, layer index or None) for every tensor a checkpoint of ``cfg`` must hold."""
  out = {}
  for row in rows_for(cfg):
    if row.per_layer:
      for i in range(cfg.num_layers):
        out[row.hf.format(i=i)] = (row, i)
    else:
      out[row.hf] = (row, None)
  return out


def get_path(tree, path):
  for p in path:
    tree = tree[p]
  return tree


def put_tensor(params, row, layer, value):
  """Write ``value`` (already in JAX layout) where ``row`` keeps it: the whole array, or one
  layer's slice of the stacked per-layer array."""
  target = get_path(params, row.path)
  if layer is None:
    target[...] = value
  else:
    target[layer] = value


def set_path(tree, path, value):
  for p in path[:-1]:
    tree = tree.setdefault(p, {})
  tree[path[-1]] = value


def hf_shape(row: Row, cfg: ModelConfig, jax_shape) -> tuple:
  """The HF shape a longjax parameter (per-layer slice) corresponds to."""
  dummy = np.empty(jax_shape, np.int8)
  return row.transform.to_hf(dummy, cfg).shape
