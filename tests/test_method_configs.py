"""train.py and eval.py build a method's config from a run config with one builder each
(``BeaconConfig.from_config`` / ``FocusConfig.from_config``), so they cannot disagree; FocusLLM's
conditional-BOS token is the model's own BOS (SmolLM2's id 1 is ``<|im_start|>``)."""
import importlib

import pytest

from longjax.eval import models as eval_models
from longjax.focus import FocusConfig
from longjax.models.config import ModelConfig
from longjax.train import loop

BEACON_CONFIGS = ("tiny_beacon", "beacon_qwen2", "beacon_llama3", "smollm2_beacon")
FOCUS_CONFIGS = ("tiny_focus", "focus_llama2")


def _config(name):
  return importlib.import_module(f"configs.{name}").get_config()


@pytest.mark.parametrize("name", BEACON_CONFIGS)
def test_train_and_eval_build_the_same_beacon_config(name):
  c = _config(name)
  assert loop.beacon_config(c) == eval_models.beacon_config(c)
  assert loop.beacon_config(c).ratios == tuple(c.beacon.ratios)


@pytest.mark.parametrize("name", FOCUS_CONFIGS)
@pytest.mark.parametrize("bos", [1, 0, 11])
def test_train_and_eval_build_the_same_focus_config_with_the_models_bos(name, bos):
  c = _config(name)
  cfg = ModelConfig(family="llama", vocab_size=64, hidden_size=16, intermediate_size=32,
                    num_layers=1, num_heads=2, num_kv_heads=2, head_dim=8, bos_token_id=bos)
  train_side = loop.focus_config(c, cfg)
  assert train_side == eval_models.focus_config(c, cfg.bos_token_id)
  assert train_side.bos_id == bos
  assert train_side.chunk_stride == c.focus.stride


def test_focus_config_from_hf_reads_the_checkpoints_bos():
  assert FocusConfig.from_hf({"bos_token_id": 0}).bos_id == 0
  assert FocusConfig.from_hf({}).bos_id == 1  # the official hard-coded id when the config has none
