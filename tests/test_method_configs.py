"""One object per method (``longjax.methods``): train.py and eval.py build a method's settings
from a run config through it, so they cannot disagree; FocusLLM's conditional-BOS token is the
model's own BOS (SmolLM2's id 1 is ``<|im_start|>``)."""
import importlib

import pytest

from longjax import methods
from longjax.beacon import BeaconConfig
from longjax.eval.models import build_method
from longjax.focus import FocusConfig
from longjax.run_config import from_config
from longjax.train import loop

from hf_models import byte_level_tokenizer, save_tiny
from train_helpers import micro_config

BEACON_CONFIGS = ("tiny_beacon", "beacon_qwen2", "beacon_llama3", "smollm2_beacon")
FOCUS_CONFIGS = ("tiny_focus", "focus_llama2")


def _config(name):
  return importlib.import_module(f"configs.{name}").get_config()


@pytest.mark.parametrize("name", BEACON_CONFIGS)
def test_beacon_settings_come_from_the_config_section(name):
  c = _config(name)
  got = methods.get("beacon").settings(from_config(c))
  assert got == BeaconConfig.from_config(from_config(c).beacon)
  assert got.ratios == tuple(c.beacon.ratios) and got.window == c.beacon.window


@pytest.mark.parametrize("name", FOCUS_CONFIGS)
@pytest.mark.parametrize("bos", [1, 0, 11])
def test_focus_settings_carry_the_models_bos(name, bos):
  c = _config(name)
  got = methods.get("focus").settings(from_config(c), bos)
  assert got.bos_id == bos and got.chunk_stride == c.focus.stride


def test_every_focus_reading_field_reaches_the_method_from_the_run_config():
  """Each reading field an asset may carry (``Focus.layout_only_fields``) is a ``focus`` section
  field that ``settings`` hands to FocusConfig, so an asset exported from a run reads as the run
  did; a field left out of the section would export silently at its default."""
  c = _config("tiny_focus")
  with c.unlocked():
    for name, value in dict(candidate_gate=3.0, gate_threshold=0.2, gate_gain=1.5,
                            gate_peer_gain=2.0, gate_top_k=4, chunk_overlap=8, chunk_vote=0.5,
                            vote_min=0.9, vote_open=True).items():
      setattr(c.focus, name, value)
  got = methods.get("focus").settings(from_config(c), 1)
  for name in methods.get("focus").layout_only_fields:
    assert getattr(got, name) == c.focus[name], name
    assert getattr(got, name) != getattr(FocusConfig(), name), name  # the value travelled


def test_focus_config_from_hf_reads_the_checkpoints_bos():
  assert FocusConfig.from_hf({"bos_token_id": 0}).bos_id == 0
  assert FocusConfig.from_hf({}).bos_id == 1  # the official hard-coded id when the config has none


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
  """A tiny LLaMA HF checkpoint whose BOS is 0 (not the official 1), with its tokenizer."""
  _, out = save_tiny(tmp_path_factory.mktemp("ckpt"), "llama2", bos_token_id=0, eos_token_id=1)
  byte_level_tokenizer().save_pretrained(out)
  return out


@pytest.mark.parametrize("method", ["beacon", "focus"])
def test_train_and_eval_build_identical_settings_from_one_config(tmp_path, hf_dir, method):
  """The divergence this guards against: eval left FocusConfig.bos_id at 1 while train used the
  model's BOS. Both sides now load the same checkpoint and settings through the method object."""
  c = micro_config(method, tmp_path / "w", steps=1)
  c.model.checkpoint = str(hf_dir)
  trainer = loop.Trainer(from_config(c))
  trainer.setup()
  built = build_method(from_config(c))
  assert built.extra == trainer.settings
  assert built.cfg.alt_projections == trainer.cfg.alt_projections
  if method == "focus":
    assert trainer.settings.bos_id == 0


def test_unknown_method_names_the_valid_ones():
  with pytest.raises(methods.UnknownMethodError, match="beacon, focus, plain"):
    methods.get("beacons")
  assert methods.get("lm") is methods.get("plain")  # train.py's name for the plain decoder


def test_config_check_asks_the_registry(tmp_path):
  """The run config is checked against the method of ``config.method`` (``plain`` and ``lm``
  name one method; an unknown name lists the registry's): its section and the distill rule."""
  from longjax.run_config import ConfigError
  c = micro_config("beacon", tmp_path)
  for name in ("beacon", "lm", "plain"):
    with c.unlocked():
      c.method = name
    assert from_config(c).method == name
  with pytest.raises(methods.UnknownMethodError,
                     match="unknown method 'llm'; valid: beacon, focus, plain"):
    methods.get("llm")
  with c.unlocked():
    c.method = "focus"
  with pytest.raises(ConfigError, match="no 'focus' section"):
    from_config(c)  # a beacon config: no focus section
  f = micro_config("focus", tmp_path)
  with f.unlocked():
    f.data.loss_on = "distill"
  assert from_config(f).data.loss_on == "distill"  # FocusLLM distills its scored steps too
  with c.unlocked():
    c.method = "llm"
  with pytest.raises(methods.UnknownMethodError, match="unknown method 'llm'"):
    from_config(c)


def test_method_names_are_spelled_only_in_the_registry():
  """The registry (methods.py, and method_names.py below it) is the one place that spells a
  method's name; everything else asks it. Allowed: the training objective "lm" (a loss, not a
  method) and the beacon settings field of a bench result."""
  import re
  from pathlib import Path
  root = Path(__file__).resolve().parents[1]
  allowed = ('OBJECTIVES = ("lm"', 'else "lm")', "payload['beacon']")
  folders = ("longjax", "scripts", "experiments", "hardware", "bench")
  files = [f for d in folders for f in sorted((root / d).rglob("*.py"))]
  files += sorted(root.glob("*.py"))
  found = []
  for f in files:
    if f.name in ("methods.py", "method_names.py") and f.parent.name == "longjax":
      continue
    for i, line in enumerate(f.read_text().splitlines(), 1):
      if (re.search(r"[\"'](beacon|focus|plain|lm)[\"']", line)
          and not any(a in line for a in allowed)):
        found.append(f"{f.relative_to(root)}:{i}: {line.strip()}")
  assert not found, found

