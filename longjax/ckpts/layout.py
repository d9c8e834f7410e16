"""What each parameter of the longjax tree is, read from the conversion table.

The table (:mod:`longjax.ckpts.table`) names every tensor; this module answers the questions the
rest of the code asks about those tensors, so that no other file spells a parameter path:

* :func:`logical_axes`: how a parameter is laid out on the mesh (``train/sharding``);
* :func:`is_alt` / :func:`is_alt_projection`: the parameters the methods add (each method object
  in :mod:`longjax.methods` says which of them it trains); :func:`trainable_mask` applies such a
  rule to a parameter tree;
* freezing the base by such a rule, the one home of it: :func:`freeze` (gradients stopped inside
  a loss: the beacon and FocusLLM losses) and :func:`split_trainable` / :func:`merge_trainable`
  (the trainer's step differentiates the trainable subtree only; the frozen one is an argument);
* :func:`add_alt_params` and its pieces: the alternative (beacon / candidate) parameters of a
  plain checkpoint, initialised as the official ``from_pretrained`` does.

Paths are ``"/"``-joined keys of the nested parameter dict, e.g. ``"layers/attn/q_proj/kernel"``.
"""
from __future__ import annotations

from typing import Callable, Mapping, Optional

import jax
import numpy as np
from flax import traverse_util

from longjax.ckpts.table import ROWS
from longjax.models.config import ModelConfig, ModelConfigError

# Full path of every row -> its logical axes (None: replicated).
_AXES = {"/".join(row.path): row.logical_axes for row in ROWS}


def logical_axes(path: str, ndim: int) -> tuple:
  """The logical axes of the ``ndim``-dimensional parameter at ``path``. ``path`` may sit under a
  prefix (``".../layers/attn/q_proj/kernel"``); a path the table does not know, a row without
  axes, or another rank gives ``(None,) * ndim`` (replicated)."""
  for full, axes in _AXES.items():
    if (path == full or path.endswith("/" + full)) and axes is not None and len(axes) == ndim:
      return axes
  return (None,) * ndim


# ---------------------------------------------------------------------------------------------
# Trainable sets. The methods add parameters whose keys start with "alt_" (table paths
# ``alt_embedding`` and ``layers/attn/alt_{p}_proj``) and train only those.

def _keys(path) -> list:
  return path.split("/") if isinstance(path, str) else list(path)


def is_alt(path) -> bool:
  """Any alternative parameter: the projections and the beacon embedding."""
  return any(k.startswith("alt_") for k in _keys(path))


def is_alt_projection(path) -> bool:
  """An alternative attention projection (``alt_{q,k,v,o}_proj``), kernel or bias."""
  return any(k.startswith("alt_") and k.endswith("_proj") for k in _keys(path))


def trainable_mask(params, is_trainable: Callable[[str], bool]):
  """``params``' nesting (plain dicts) with a bool leaf: ``is_trainable`` of that leaf's path (a
  method's rule: a method object's ``is_trainable``, ``longjax.methods``)."""
  def walk(tree, path):
    if isinstance(tree, Mapping):
      return {k: walk(v, path + (k,)) for k, v in tree.items()}
    return is_trainable("/".join(path))
  return walk(params, ())


def freeze(params, is_trainable: Callable[[str], bool]):
  """``params`` with ``stop_gradient`` on every leaf whose path ``is_trainable`` rejects: the
  frozen base gets no gradient computed (the official training freezes every non-``beacon``
  parameter)."""
  def f(path, x):
    return x if is_trainable("/".join(str(getattr(k, "key", k)) for k in path)) \
        else jax.lax.stop_gradient(x)
  return jax.tree_util.tree_map_with_path(f, params)


def split_trainable(params, is_trainable: Callable[[str], bool]):
  """``(trainable, frozen)``: the subtrees of ``params`` whose paths ``is_trainable`` accepts,
  and the rest (:func:`merge_trainable` joins them again)."""
  flat = traverse_util.flatten_dict(params, sep="/")
  tr = {k: v for k, v in flat.items() if is_trainable(k)}
  fr = {k: v for k, v in flat.items() if not is_trainable(k)}
  return traverse_util.unflatten_dict(tr, sep="/"), traverse_util.unflatten_dict(fr, sep="/")


def merge_trainable(trainable, frozen):
  """The full parameter tree of :func:`split_trainable`'s two halves."""
  flat = traverse_util.flatten_dict(frozen, sep="/")
  flat.update(traverse_util.flatten_dict(trainable, sep="/"))
  return traverse_util.unflatten_dict(flat, sep="/")


# ---------------------------------------------------------------------------------------------
# Alternative parameters of a plain checkpoint, as the official from_pretrained initialises them:
# each alternative projection a copy of its base (kernel and bias), the beacon embedding the row of
# one token (EOS or BOS).

def alt_projections_of(params) -> tuple:
  """Which of q/k/v/o the parameter tree carries alternative projections for."""
  attn = params.get("layers", {}).get("attn", {})
  return tuple(p for p in "qkvo" if f"alt_{p}_proj" in attn)


def copy_projection(attn: dict, p: str) -> None:
  """``attn["alt_{p}_proj"]`` := a copy of ``attn["{p}_proj"]``. Arrays already in the alternative
  slot are filled in place (``load_hf`` preallocates them, so no second stacked copy is held);
  otherwise the slot gets new arrays."""
  base = attn[f"{p}_proj"]
  alt = attn.get(f"alt_{p}_proj")
  if alt is None:
    attn[f"alt_{p}_proj"] = {leaf: np.array(v) for leaf, v in base.items()}
    return
  for leaf, value in base.items():
    alt[leaf][...] = value


def embed_init_token(cfg: ModelConfig, embed_init: str) -> Optional[int]:
  """The token whose embedding initialises the beacon embedding: EOS for ``"eos"``, else BOS (the
  first id where the config lists several); None when the config has no such token."""
  token = cfg.eos_token_id if embed_init == "eos" else cfg.bos_token_id
  token = token[0] if isinstance(token, (tuple, list)) else token
  return None if token is None else int(token)


def alt_embedding_row(embedding, token: int) -> np.ndarray:
  """A ``[1, hidden]`` copy of ``embedding[token]``, in the embedding's dtype."""
  return np.array(np.asarray(embedding)[token][None])


def add_alt_params(cfg: ModelConfig, params, projections, num_alt_embeddings: int = 0,
                   embed_init: str = "eos"):
  """Give a plain decoder checkpoint the alternative (beacon / candidate) parameters, initialised
  as the official ``from_pretrained`` does: copies of the base projections, the extra embedding
  row from ``embed[eos]`` (or bos). Parameters already present are kept. Returns ``(cfg, params)``
  with numpy leaves; the input tree is not modified."""
  params = jax.tree.map(np.asarray, params)
  params = {k: (dict(v) if isinstance(v, dict) else v) for k, v in params.items()}
  layers = dict(params["layers"])
  attn = dict(layers["attn"])
  for p in projections:
    if f"alt_{p}_proj" not in attn:
      copy_projection(attn, p)
  layers["attn"] = attn
  params["layers"] = layers
  if num_alt_embeddings and "alt_embedding" not in params:
    token = embed_init_token(cfg, embed_init)
    if token is None:
      raise ModelConfigError(f"cannot initialise the beacon embedding from {embed_init}: the model "
                             f"config has no {embed_init}_token_id")
    params["alt_embedding"] = alt_embedding_row(params["embedding"], token)
  new_alt = tuple(sorted(set(cfg.alt_projections) | set(projections), key="qkvo".index))
  cfg = cfg.replace(alt_projections=new_alt,
                    num_alt_embeddings=max(cfg.num_alt_embeddings, num_alt_embeddings))
  return cfg, params
