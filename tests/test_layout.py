"""The parameter layout read from the conversion table: sharding axes, trainable sets and the
initialisation of alternative (beacon / candidate) parameters."""
from __future__ import annotations

import numpy as np
import pytest
from flax import traverse_util

from longjax import methods
from longjax.ckpts import layout
from longjax.focus.losses import trainable_mask
from longjax.models.config import ModelConfig
from longjax.models.decoder import init_params, param_shapes

# The axes of every leaf (train/sharding's former hand-written suffix list, except that the
# alternative projections, which matched none of its suffixes and were replicated, are now laid
# out like their base projections).
EXPECTED_AXES = {
    "alt_embedding": ("alt_rows", "embed"),
    "embedding": ("vocab", "embed"),
    "final_norm/scale": ("norm",),
    "lm_head/kernel": ("embed", "vocab"),
    "layers/attn/k_proj/bias": ("layers", "kv_heads", "head_dim"),
    "layers/attn/k_proj/kernel": ("layers", "embed", "kv_heads", "head_dim"),
    "layers/attn/o_proj/kernel": ("layers", "heads", "head_dim", "embed"),
    "layers/attn/q_proj/bias": ("layers", "heads", "head_dim"),
    "layers/attn/q_proj/kernel": ("layers", "embed", "heads", "head_dim"),
    "layers/attn/v_proj/bias": ("layers", "kv_heads", "head_dim"),
    "layers/attn/v_proj/kernel": ("layers", "embed", "kv_heads", "head_dim"),
    "layers/input_norm/scale": ("layers", "norm"),
    "layers/mlp/down_proj/kernel": ("layers", "mlp", "embed"),
    "layers/mlp/gate_proj/kernel": ("layers", "embed", "mlp"),
    "layers/mlp/up_proj/kernel": ("layers", "embed", "mlp"),
    "layers/post_attention_norm/scale": ("layers", "norm"),
}
# each alternative projection (a trained tensor) is laid out like its base projection
EXPECTED_AXES.update({k.replace("attn/", "attn/alt_"): v for k, v in list(EXPECTED_AXES.items())
                      if k.startswith("layers/attn/")})


def _cfg(**kw):
  base = dict(family="llama", vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=2,
              num_heads=4, num_kv_heads=2, head_dim=8, bos_token_id=1, eos_token_id=2)
  base.update(kw)
  return ModelConfig(**base)


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("bias", [False, True])
def test_logical_axes_of_every_leaf(tied, bias):
  cfg = _cfg(family="qwen2" if bias else "llama", attention_bias=bias, tie_word_embeddings=tied,
             alt_projections=("q", "k", "v", "o"), num_alt_embeddings=1)
  flat = traverse_util.flatten_dict(param_shapes(cfg), sep="/")
  assert ("lm_head/kernel" in flat) == (not tied)
  assert ("layers/attn/q_proj/bias" in flat) == bias
  for path, leaf in flat.items():
    assert layout.logical_axes(path, leaf.ndim) == EXPECTED_AXES[path], path
    # Under a prefix (an optimizer-state key) the leaf keeps its axes.
    assert layout.logical_axes("mu/" + path, leaf.ndim) == EXPECTED_AXES[path], path


def test_unknown_paths_and_ranks_are_replicated():
  assert layout.logical_axes("layers/attn/q_proj/kernel", 3) == (None, None, None)
  assert layout.logical_axes("something/else", 2) == (None, None)
  assert layout.logical_axes("pre_embedding", 2) == (None, None)


def test_trainable_sets():
  paths = ["embedding", "alt_embedding", "lm_head/kernel", "layers/attn/q_proj/kernel",
           "layers/attn/alt_q_proj/kernel", "layers/attn/alt_v_proj/bias",
           "layers/input_norm/scale"]
  want = {
      "beacon": {"alt_embedding", "layers/attn/alt_q_proj/kernel", "layers/attn/alt_v_proj/bias"},
      "focus": {"layers/attn/alt_q_proj/kernel", "layers/attn/alt_v_proj/bias"},
      "lm": set(paths),
  }
  for name, trained in want.items():  # each method object says what it trains
    assert {p for p in paths if methods.get(name).is_trainable(p)} == trained, name
  with pytest.raises(ValueError, match="unknown method 'llm'"):
    methods.get("llm")


def test_focus_trainable_mask_is_the_focus_rule():
  cfg = _cfg(alt_projections=("q", "k"), num_alt_embeddings=1)
  params = init_params(cfg, 0)
  mask = traverse_util.flatten_dict(trainable_mask(params), sep="/")
  assert set(mask) == set(traverse_util.flatten_dict(params, sep="/"))
  assert {k for k, v in mask.items() if v} == {"layers/attn/alt_q_proj/kernel",
                                               "layers/attn/alt_k_proj/kernel"}


def test_add_alt_params_copies_base_projections_and_an_embedding_row():
  cfg = _cfg(family="qwen2", attention_bias=True, eos_token_id=(5, 6), bos_token_id=3)
  params = init_params(cfg, 0)
  before = traverse_util.flatten_dict(params, sep="/")
  cfg2, out = layout.add_alt_params(cfg, params, ("k", "q"), num_alt_embeddings=1)
  assert cfg2.alt_projections == ("q", "k") and cfg2.num_alt_embeddings == 1
  attn = out["layers"]["attn"]
  for p in "qk":
    for leaf in ("kernel", "bias"):
      np.testing.assert_array_equal(attn[f"alt_{p}_proj"][leaf], attn[f"{p}_proj"][leaf])
      assert not np.shares_memory(attn[f"alt_{p}_proj"][leaf], attn[f"{p}_proj"][leaf])
  assert "alt_v_proj" not in attn
  np.testing.assert_array_equal(out["alt_embedding"], np.asarray(params["embedding"])[[5]])
  # The input tree is left as it was.
  assert traverse_util.flatten_dict(params, sep="/").keys() == before.keys()

  _, from_bos = layout.add_alt_params(cfg, params, (), 1, embed_init="bos")
  np.testing.assert_array_equal(from_bos["alt_embedding"], np.asarray(params["embedding"])[[3]])


def test_add_alt_params_keeps_present_parameters():
  cfg = _cfg(alt_projections=("q",), num_alt_embeddings=1)
  params = init_params(cfg, 0)
  cfg2, out = layout.add_alt_params(cfg, params, ("q", "v"), num_alt_embeddings=1)
  assert cfg2.alt_projections == ("q", "v")
  np.testing.assert_array_equal(out["layers"]["attn"]["alt_q_proj"]["kernel"],
                                params["layers"]["attn"]["alt_q_proj"]["kernel"])
  np.testing.assert_array_equal(out["alt_embedding"], params["alt_embedding"])
  assert layout.alt_projections_of(out) == ("q", "v")


def test_add_alt_params_needs_the_init_token():
  cfg = _cfg(eos_token_id=None)
  with pytest.raises(ValueError, match="no eos_token_id"):
    layout.add_alt_params(cfg, init_params(cfg, 0), ("q",), num_alt_embeddings=1)
