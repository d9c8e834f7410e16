"""Bad inputs are refused with one clear message instead of being used silently (the reliability
issue, items 5, 6, 8, 9, 10): non-text data records, out-of-range / float token ids, a checkpoint
loaded as the other method, NaN sampling settings, exported config.json that transformers
refuses."""
from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import fixtures_root
from longjax.ckpts import checkpoint
from longjax.ckpts.hf import CheckpointError, save_hf
from longjax.data.sources import DataError, read_source
from longjax.inference.generate import generate
from longjax.plain import PlainLM
from longjax.models.config import ModelConfig
from longjax.models.decoder import init_params
from longjax.inference.sampling import SamplingConfig

FIXTURES = fixtures_root()
V = 97


# ------------------------------------------------------------------------------------------------
# 5. data records must be text
@pytest.mark.parametrize("line, msg", [
    ('{"text": ["a", "b"]}', "field 'text' is an array, not a string"),
    ('{"text": {"a": 1}}', "field 'text' is an object, not a string"),
    ('{"text": null}', "field 'text' is null, not a string"),
    ('{"text": 7}', "field 'text' is a number, not a string"),
    ('{"input": "q", "output": [1]}', "field 'output' is an array, not a string"),
    ('"just a string"', "record is a string, not a JSON object"),
    ("42", "record is a number, not a JSON object"),
    ("[1, 2]", "record is an array, not a JSON object"),
])
def test_non_text_records_are_refused_with_file_and_line(tmp_path, line, msg):
  path = tmp_path / "train.jsonl"
  path.write_text('{"text": "fine"}\n' + line + "\n")
  with pytest.raises(DataError) as e:
    list(read_source(f"jsonl:{path}"))
  assert f"{path}:2: {msg}" in str(e.value)


def test_text_records_still_read(tmp_path):
  path = tmp_path / "train.jsonl"
  path.write_text('{"text": "a"}\n{"input": "q", "output": "ans"}\n')
  assert list(read_source(f"jsonl:{path}")) == [[("a", False)],
                                                 [("q", False), ("\n", False), ("ans", True)]]


# ------------------------------------------------------------------------------------------------
# 6. token ids and max_new_tokens are checked before jit, for every method
@pytest.fixture(scope="module")
def plain():
  cfg = ModelConfig(vocab_size=V, hidden_size=32, intermediate_size=48, num_layers=1, num_heads=4,
                    num_kv_heads=2, head_dim=8)
  return PlainLM(cfg), init_params(cfg, 0)


@pytest.fixture(scope="module")
def focus():
  from focus_helpers import tiny_focus, tiny_model
  from longjax.focus import FocusLLM
  cfg, params = tiny_model()
  assert cfg.vocab_size == V
  return FocusLLM(cfg, tiny_focus()), params


RANGE = rf"token ids must be in \[0, {V}\) \(the model's vocab_size\); got "


@pytest.mark.parametrize("which", ["plain", "focus"])
def test_out_of_range_ids_are_refused(which, request):
  method, params = request.getfixturevalue(which)
  with pytest.raises(ValueError, match=RANGE + r"\[-1\] in the prompt"):
    generate(method, params, [5, -1, 7], max_new_tokens=1)
  with pytest.raises(ValueError, match=RANGE + rf"\[{V + 100}\] in prompt 1"):
    generate(method, params, [[5, 6], [V + 100]], max_new_tokens=1)
  # 2**32 + 5 would wrap to 5 in the int32 batch: checked before the cast.
  with pytest.raises(ValueError, match=RANGE + rf"\[{2**32 + 5}\]"):
    generate(method, params, [3, 2**32 + 5], max_new_tokens=1)
  with pytest.raises(ValueError, match=r"token ids must be integers, got dtype float64"):
    generate(method, params, [5, 2.5, 7], max_new_tokens=1)
  with pytest.raises(ValueError, match="token ids must be integers, got dtype float32"):
    generate(method, params, np.array([[5.0, 6.0]], np.float32), max_new_tokens=1)
  # The public prefill entry point checks too (right padding past the length is not checked).
  tokens, lengths = np.array([[5, V, 0]]), np.array([2])
  with pytest.raises(ValueError, match=RANGE + rf"\[{V}\]"):
    method.prefill(params, tokens, lengths, 1)
  assert generate(method, params, [5, V - 1, 0], max_new_tokens=1).tokens[0][0] in range(V)


def test_focus_forward_checks_ids(focus):
  method, params = focus
  with pytest.raises(ValueError, match=RANGE + r"\[-3\] in the prompt"):
    method.forward(params, [4, -3])
  with pytest.raises(ValueError, match=RANGE + rf"\[{V}\] in the generated ids"):
    method.recompute(params, [[4, 5]], [[V]])


@pytest.mark.parametrize("n", [2.5, 0, -1, True, "3"])
def test_max_new_tokens_must_be_a_positive_int(plain, n):
  method, params = plain
  with pytest.raises(ValueError, match=rf"max_new_tokens must be an integer >= 1, got {n!r}"):
    generate(method, params, [5, 6], max_new_tokens=n)


def test_focus_prefill_max_new_tokens(focus):
  method, params = focus
  with pytest.raises(ValueError, match=r"max_new_tokens must be an integer >= 0, got 2.5"):
    method.prefill(params, np.array([[5, 6]]), np.array([2]), 2.5)


# ------------------------------------------------------------------------------------------------
# 9. sampling settings
@pytest.mark.parametrize("kw, msg", [
    (dict(temperature=float("nan")),
     "temperature must be a finite number >= 0 (0 = greedy), got nan"),
    (dict(temperature=float("inf")),
     "temperature must be a finite number >= 0 (0 = greedy), got inf"),
    (dict(temperature=-0.5), "temperature must be a finite number >= 0 (0 = greedy), got -0.5"),
    (dict(temperature=1.0, top_p=float("nan")), "top_p must be in (0, 1] (or None), got nan"),
    (dict(temperature=1.0, top_p=0.0), "top_p must be in (0, 1] (or None), got 0.0"),
    (dict(temperature=1.0, top_p=1.5), "top_p must be in (0, 1] (or None), got 1.5"),
    (dict(temperature=1.0, top_k=0), "top_k must be an integer >= 1 (or None), got 0"),
    (dict(temperature=1.0, top_k=2.5), "top_k must be an integer >= 1 (or None), got 2.5"),
])
def test_bad_sampling_settings_are_refused(plain, kw, msg):
  with pytest.raises(ValueError) as e:
    SamplingConfig(**kw)
  assert str(e.value) == msg
  method, params = plain
  with pytest.raises(ValueError, match=msg.split(",")[0].replace("(", r"\(").replace(")", r"\)")):
    generate(method, params, [5, 6], max_new_tokens=2, **kw)


def test_good_sampling_settings():
  SamplingConfig(0.7, np.int64(5), 0.9)
  SamplingConfig(np.float32(1.0), 1, 1.0)


# ------------------------------------------------------------------------------------------------
# 8. a beacon export is not a FocusLLM one, and vice versa
def _tiny_alt(alt):
  cfg = ModelConfig(family="llama", vocab_size=V, hidden_size=32, intermediate_size=48,
                    num_layers=1, num_heads=4, num_kv_heads=2, head_dim=8, alt_projections=alt,
                    num_alt_embeddings=1)
  return cfg, init_params(cfg, 0)


def test_exports_name_their_method_and_refuse_the_other_loader(tmp_path):
  from longjax.beacon import BeaconConfig, load_beacon, save_beacon
  from longjax.focus import FocusConfig, load_focus, save_focus
  cfg, params = _tiny_alt(("q", "k", "v"))
  bcfg = BeaconConfig(window=64, stride=64, ratios=(4,), param=("q", "k", "v"))
  save_beacon(tmp_path / "beacon", cfg, bcfg, params)
  assert json.loads((tmp_path / "beacon" / "config.json").read_text())["longjax_method"] == "beacon"
  with pytest.raises(CheckpointError, match=r"is a checkpoint of Activation Beacon \(config.json "
                     r"longjax_method='beacon'\), not of FocusLLM: load it with "
                     r"longjax.beacon.load_beacon"):
    load_focus(tmp_path / "beacon")
  assert load_beacon(tmp_path / "beacon")[1].window == 64

  fcfg = FocusConfig(local_window=64, chunk_stride=32, candidate_projections=("q", "k", "v"))
  save_focus(tmp_path / "focus", cfg, fcfg, params)
  with pytest.raises(CheckpointError, match=r"is a checkpoint of FocusLLM \(config.json "
                     r"longjax_method='focus'\), not of Activation Beacon: load it with "
                     r"longjax.focus.load_focus"):
    load_beacon(tmp_path / "focus", beacon=bcfg)  # an explicit config does not make it a beacon
  assert load_focus(tmp_path / "focus")[1].local_window == 64


def test_official_checkpoints_are_told_apart_by_their_fields(tmp_path):
  from longjax.beacon import load_beacon
  from longjax.focus import load_focus
  cfg, params = _tiny_alt(("q", "k", "v"))
  official = {"beacon": {"beacon_window": 64, "beacon_stride": 64, "beacon_ratio": [4],
                         "beacon_param": ["q", "k", "v"]},
              "focus": {"local_window": 64, "memory_stride": [32], "beacon_ratio": [8],
                        "beacon_param": ["q", "k", "v"]}}
  for name, fields in official.items():
    save_hf(tmp_path / name, cfg, params, extra_config=fields)
  with pytest.raises(CheckpointError, match=r"checkpoint of Activation Beacon \(config.json "
                     r"official fields beacon_window\), not of FocusLLM"):
    load_focus(tmp_path / "beacon")
  with pytest.raises(CheckpointError, match=r"checkpoint of FocusLLM \(config.json official "
                     r"fields local_window, memory_stride\), not of Activation Beacon"):
    load_beacon(tmp_path / "focus")
  assert load_beacon(tmp_path / "beacon")[1].window == 64
  assert load_focus(tmp_path / "focus")[1].local_window == 64


# ------------------------------------------------------------------------------------------------
# 10. exported config.json is the config.json that was read
def _fixture_configs():
  paths = sorted(FIXTURES.glob("**/config.json"))
  if not paths:
    pytest.skip(f"no fixture config.json under {FIXTURES} (set LONGJAX_FIXTURES to a fixtures "
                "root)")
  return paths


def test_fixture_configs_round_trip_exactly(tmp_path):
  for path in _fixture_configs():
    hf = json.loads(path.read_text())
    cfg = ModelConfig.from_hf(hf)
    hash(cfg)  # still a valid static jit argument
    assert cfg.to_hf() == hf, path
    # and through a longjax checkpoint config
    back = checkpoint.config_from_json(json.loads(json.dumps(checkpoint.config_to_json(cfg))))
    assert back == cfg and back.to_hf() == hf, path


def test_fixture_beacon_export_round_trips(tmp_path):
  """load_beacon -> save_beacon writes the official config.json back (plus longjax_method)."""
  from longjax.beacon import load_beacon, save_beacon
  src = FIXTURES / "beacon"
  if not (src / "weights.safetensors").exists():
    pytest.skip(f"beacon fixture absent under {src}")
  d = tmp_path / "in"
  d.mkdir()
  (d / "model.safetensors").symlink_to(src / "weights.safetensors")
  (d / "config.json").symlink_to(src / "config.json")
  cfg, bcfg, params = load_beacon(d)
  save_beacon(tmp_path / "out", cfg, bcfg, params)
  out = json.loads((tmp_path / "out" / "config.json").read_text())
  assert out.pop("longjax_method") == "beacon"
  assert out == json.loads((src / "config.json").read_text())
  assert out["pruned_heads"] == {}


@pytest.mark.parametrize("cls, kw", [
    ("LlamaConfig", dict(rope_scaling={"rope_type": "linear", "factor": 2.0})),
    ("Qwen2Config", dict(task_specific_params={}, id2label={})),
])
def test_transformers_configs_round_trip_and_reload(tmp_path, cls, kw):
  transformers = pytest.importorskip("transformers")
  config = getattr(transformers, cls)(vocab_size=V, hidden_size=32, intermediate_size=48,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, **kw)
  config.save_pretrained(tmp_path / "src")
  hf = json.loads((tmp_path / "src" / "config.json").read_text())
  cfg = ModelConfig.from_hf(hf)
  assert cfg.to_hf() == hf
  # A changed field is written; everything else stays as it was.
  changed = cfg.replace(rope_theta=5000.0).to_hf()
  assert {k for k in hf if changed.get(k) != hf[k]} <= {"rope_theta", "rope_parameters"}
  assert changed["rope_theta"] == 5000.0
  (tmp_path / "out").mkdir()
  (tmp_path / "out" / "config.json").write_text(json.dumps(cfg.to_hf()))
  reloaded = [transformers.AutoConfig.from_pretrained(tmp_path / d).to_dict()
              for d in ("src", "out")]
  for d in reloaded:
    d.pop("_name_or_path")
  assert reloaded[0] == reloaded[1]


def test_old_longjax_checkpoint_config_still_loads():
  """Before hf_extra held the whole config, it held the unused keys as [key, value] pairs (dicts
  too, so an empty dict came back as [])."""
  old = {"longjax_model_config": {
      "family": "llama", "vocab_size": 1000, "hidden_size": 64, "intermediate_size": 172,
      "num_layers": 2, "num_heads": 4, "num_kv_heads": 4, "head_dim": 16, "rope_theta": 10000.0,
      "rope_scaling": None, "max_position_embeddings": 4096, "rms_norm_eps": 1e-05,
      "attention_bias": False, "tie_word_embeddings": False, "sliding_windows": None,
      "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": None, "alt_projections": [],
      "num_alt_embeddings": 0, "dtype": "float32", "param_dtype": "float32", "remat": False,
      "hf_extra": [["architectures", None], ["hidden_act", "silu"],
                   ["id2label", [["0", "LABEL_0"], ["1", "LABEL_1"]]], ["local_window", 128],
                   ["memory_stride", [64]], ["pruned_heads", []],
                   ["transformers_version", "4.36.2"]]}}
  cfg = checkpoint.config_from_json(old)
  assert cfg.vocab_size == 1000 and cfg.max_position_embeddings == 4096
  hf = cfg.to_hf()
  assert hf["pruned_heads"] == {} and hf["id2label"] == {"0": "LABEL_0", "1": "LABEL_1"}
  assert hf["architectures"] is None and hf["memory_stride"] == [64] and hf["head_dim"] == 16
  assert hf["model_type"] == "llama" and hf["num_hidden_layers"] == 2
  again = checkpoint.config_from_json(json.loads(json.dumps(checkpoint.config_to_json(cfg))))
  assert again == cfg


def test_params_of_another_config_are_refused_before_tracing():
  """Reliability (WEAK): params of another config used to fail deep in a trace (Flax
  ScopeParamNotFoundError / a shape error); now one error names the first mismatches."""
  import longjax
  from longjax.inference.generate import GenerateError
  from longjax.models import ModelConfig, init_params
  small = ModelConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_layers=2,
                      num_heads=4, num_kv_heads=2, head_dim=8)
  bigger = small.replace(hidden_size=48, num_layers=3)
  params = init_params(small, 0)
  with pytest.raises(GenerateError, match=r"params do not fit .*shapes"):
    longjax.generate(longjax.PlainLM(bigger), params, [[5, 6, 7]], max_new_tokens=1)
  with pytest.raises(GenerateError, match=r"missing .*alt_q_proj"):
    longjax.generate(longjax.PlainLM(small.replace(alt_projections=("q",))), params, [[5, 6]],
                     max_new_tokens=1)
  assert len(longjax.generate(longjax.PlainLM(small), params, [[5, 6]], max_new_tokens=2)
             .tokens[0]) == 2
