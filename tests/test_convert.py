"""HF <-> longjax conversion: round trips, dtypes, sharded reading, and clear errors."""
import json
import shutil
import tracemalloc
from pathlib import Path

import jax
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import longjax.ckpts.hf as hf_io
from conftest import forward, run_python
from hf_models import hf_logits, save_tiny
from longjax.ckpts import checkpoint
from longjax.ckpts import CheckpointError, load_hf, save_hf

def _all_tensors(d: Path) -> dict:
  out = {}
  for f in sorted(d.glob("*.safetensors")):
    out.update(load_file(f))
  return out


@pytest.mark.parametrize("family", ["llama3", "qwen2", "mistral", "qwen2_tied"])
def test_round_trip_is_bit_exact_and_loads_in_transformers(family, tmp_path):
  import transformers
  model, src = save_tiny(tmp_path, family)
  cfg, params = load_hf(src)
  checkpoint.save(tmp_path / "lj", cfg, params)
  cfg2, params2, _ = checkpoint.load(tmp_path / "lj")
  assert cfg2 == cfg
  save_hf(tmp_path / "back", cfg2, params2)
  original, exported = _all_tensors(src), _all_tensors(tmp_path / "back")
  assert sorted(original) == sorted(exported)
  for name, value in original.items():
    assert exported[name].dtype == value.dtype and np.array_equal(exported[name], value), name
  reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "back",
                                                               attn_implementation="eager")
  ids = np.random.default_rng(0).integers(3, 320, (1, 40))
  np.testing.assert_array_equal(hf_logits(reloaded, ids), hf_logits(model, ids))


def test_bf16_stays_bf16_and_computes_within_tolerance(tmp_path):
  model, src = save_tiny(tmp_path, "qwen2", dtype="bfloat16")
  cfg, params = load_hf(src)
  assert cfg.param_dtype == "bfloat16"
  assert {str(x.dtype) for x in jax.tree.leaves(params)} == {"bfloat16"}
  save_hf(tmp_path / "back", cfg, params)
  original, exported = _all_tensors(src), _all_tensors(tmp_path / "back")
  for name, value in original.items():
    assert str(exported[name].dtype) == "bfloat16" and np.array_equal(exported[name], value), name
  ids = np.random.default_rng(1).integers(3, 320, (1, 64))
  ref = forward(cfg.replace(dtype="float32"), params, ids)  # bf16 weights, fp32 compute
  got = forward(cfg.replace(dtype="bfloat16"), params, ids)
  scale = np.abs(ref).max()
  assert np.abs(got - ref).max() < 0.05 * scale
  assert np.abs(got - ref).mean() < 0.01 * scale
  assert (got.argmax(-1) == ref.argmax(-1)).mean() > 0.9


def test_four_shards_are_read_one_at_a_time(tmp_path, monkeypatch):
  model = save_tiny(tmp_path, "llama2")[0]
  sharded = tmp_path / "sharded"
  model.save_pretrained(sharded, max_shard_size="160KB")
  shards = sorted(sharded.glob("*.safetensors"))
  assert len(shards) == 4, shards
  weight_map = json.loads((sharded / "model.safetensors.index.json").read_text())["weight_map"]

  events, open_now, real = [], [0], hf_io.safe_open

  class Tracking:
    def __init__(self, path, framework):
      self.path, self.inner = Path(path).name, real(path, framework=framework)

    def __enter__(self):
      open_now[0] += 1
      assert open_now[0] == 1, "two shards open at once"
      events.append(("open", self.path))
      self.f = self.inner.__enter__()
      return self

    def __exit__(self, *exc):
      open_now[0] -= 1
      return self.inner.__exit__(*exc)

    def keys(self):
      return self.f.keys()

    def get_slice(self, name):
      return self.f.get_slice(name)

    def get_tensor(self, name):
      assert weight_map[name] == self.path, f"{name} read from the wrong shard"
      events.append(("read", name))
      return self.f.get_tensor(name)

  load_hf(sharded)  # warm-up: the first call also traces the model to get parameter shapes
  monkeypatch.setattr(hf_io, "safe_open", Tracking)
  tracemalloc.start()
  cfg, params = load_hf(sharded)
  _, peak = tracemalloc.get_traced_memory()
  tracemalloc.stop()

  reads = [n for kind, n in events if kind == "read"]
  assert sorted(reads) == sorted(weight_map)  # every tensor read exactly once
  # Data reads happen shard after shard: the shard sequence of reads never returns to a shard.
  order = [weight_map[n] for n in reads]
  runs = [s for i, s in enumerate(order) if i == 0 or s != order[i - 1]]
  assert sorted(runs) == sorted(set(runs)) and len(runs) == 4
  out_bytes = sum(x.nbytes for x in jax.tree.leaves(params))
  biggest = max(v.nbytes for f in shards for v in load_file(f).values())
  # Peak host memory: the output plus about one tensor (a 2x-the-model reader fails this).
  assert peak < out_bytes + biggest + 64 * 1024, (peak, out_bytes, biggest)
  monkeypatch.undo()
  ref = load_hf(tmp_path / "llama2")[1]
  jax.tree.map(np.testing.assert_array_equal, params, ref)


def _edit_tensors(src: Path, dst: Path, edit):
  shutil.copytree(src, dst)
  tensors = load_file(dst / "model.safetensors")
  edit(tensors)
  save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})
  return dst


def test_missing_and_unknown_tensors_are_listed(tmp_path):
  _, src = save_tiny(tmp_path, "qwen2")

  def edit(t):
    t.pop("model.layers.1.mlp.up_proj.weight")
    t.pop("model.layers.2.self_attn.k_proj.bias")
    t["model.layers.0.self_attn.mystery.weight"] = np.zeros((2, 2), np.float32)

  bad = _edit_tensors(src, tmp_path / "bad", edit)
  with pytest.raises(CheckpointError) as e:
    load_hf(bad)
  msg = str(e.value)
  assert "missing tensors (2)" in msg and "model.layers.1.mlp.up_proj.weight" in msg
  assert "model.layers.2.self_attn.k_proj.bias" in msg
  assert "unexpected tensors (1): model.layers.0.self_attn.mystery.weight" in msg


def test_shape_mismatches_are_listed(tmp_path):
  _, src = save_tiny(tmp_path, "llama2")
  bad = tmp_path / "bad"
  shutil.copytree(src, bad)
  config = json.loads((bad / "config.json").read_text())
  config["intermediate_size"] = 80
  (bad / "config.json").write_text(json.dumps(config))
  with pytest.raises(CheckpointError, match=r"shape mismatches .*\(9\)") as e:
    load_hf(bad)
  assert ("model.layers.0.mlp.gate_proj.weight: checkpoint (96, 64), config expects (80, 64)"
          in str(e.value))


def test_unsupported_model_type(tmp_path):
  _, src = save_tiny(tmp_path, "llama2")
  bad = tmp_path / "bad"
  shutil.copytree(src, bad)
  config = json.loads((bad / "config.json").read_text())
  config["model_type"] = "gpt2"
  (bad / "config.json").write_text(json.dumps(config))
  with pytest.raises(ValueError, match=r"unsupported model_type 'gpt2'.*supports"):
    load_hf(bad)


def test_pickle_checkpoints_are_refused(tmp_path):
  (tmp_path / "config.json").write_text("{}")
  (tmp_path / "pytorch_model.bin").write_bytes(b"not loaded")
  with pytest.raises(CheckpointError, match="safetensors only"):
    load_hf(tmp_path)


def test_unsupported_rope_type(tmp_path):
  _, src = save_tiny(tmp_path, "llama2")
  config = json.loads((src / "config.json").read_text())
  config["rope_scaling"] = {"rope_type": "yarn", "factor": 4.0}
  config.pop("rope_parameters", None)
  (src / "config.json").write_text(json.dumps(config))
  with pytest.raises(ValueError, match="rope_scaling type 'yarn' is not supported"):
    load_hf(src)


def test_missing_beacon_tensors_need_an_init_rule(tmp_path):
  _, src = save_tiny(tmp_path, "qwen2")
  with pytest.raises(CheckpointError, match="alt_init='copy'"):
    load_hf(src, alt_projections=("q", "k", "v"))
  cfg, params = load_hf(src, alt_projections=("q", "k", "v"), num_alt_embeddings=1,
                        alt_init="copy", alt_embed_init="eos")
  attn = params["layers"]["attn"]
  for p in "qkv":
    np.testing.assert_array_equal(attn[f"alt_{p}_proj"]["kernel"], attn[f"{p}_proj"]["kernel"])
    np.testing.assert_array_equal(attn[f"alt_{p}_proj"]["bias"], attn[f"{p}_proj"]["bias"])
  np.testing.assert_array_equal(params["alt_embedding"][0], params["embedding"][cfg.eos_token_id])
  save_hf(tmp_path / "beacon", cfg, params)
  names = set(_all_tensors(tmp_path / "beacon"))
  assert "model.beacon_embed_tokens.weight" in names
  assert "model.layers.2.self_attn.beacon_v_proj.bias" in names
  cfg2, params2 = load_hf(tmp_path / "beacon")  # the beacon tensors are detected on reload
  assert cfg2.alt_projections == ("q", "k", "v") and cfg2.num_alt_embeddings == 1
  jax.tree.map(np.testing.assert_array_equal, params2, params)


def test_cli_both_directions(tmp_path, capsys):
  _, src = save_tiny(tmp_path, "mistral")
  help_text = run_python("convert_weights.py", "--help", check=True).stdout
  assert "HF -> longjax" in help_text and "longjax -> HF" in help_text
  from convert_weights import main
  main(["--hf_dir", str(src), "--out", str(tmp_path / "lj")])
  main(["--longjax_dir", str(tmp_path / "lj"), "--hf_out", str(tmp_path / "hf")])
  for name, value in _all_tensors(src).items():
    np.testing.assert_array_equal(_all_tensors(tmp_path / "hf")[name], value)
  assert main(["--hf_dir", str(src), "--out", str(tmp_path / "lj")]) == 1  # one line, no traceback
  assert "--overwrite" in capsys.readouterr().err
  with pytest.raises(SystemExit):
    main(["--hf_dir", str(src)])


def test_sharded_export_and_no_half_written_checkpoint(tmp_path, monkeypatch):
  import transformers
  model, src = save_tiny(tmp_path, "qwen2")
  cfg, params = load_hf(src)
  save_hf(tmp_path / "sharded", cfg, params, max_shard_bytes=120_000)
  files = sorted(p.name for p in (tmp_path / "sharded").glob("*.safetensors"))
  assert len(files) > 3 and files[0].endswith(f"-of-{len(files):05d}.safetensors")
  reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "sharded",
                                                               attn_implementation="eager")
  ids = np.random.default_rng(0).integers(3, 320, (1, 30))
  np.testing.assert_array_equal(hf_logits(reloaded, ids), hf_logits(model, ids))

  # A failure while writing the third shard leaves neither a new nor a partial directory, and an
  # existing export is kept intact.
  calls = [0]

  def failing_save(*a, **k):
    calls[0] += 1
    if calls[0] == 3:
      raise OSError("disk full")
    return save_file(*a, **k)

  monkeypatch.setattr(hf_io, "save_file", failing_save)
  with pytest.raises(OSError, match="disk full"):
    save_hf(tmp_path / "new", cfg, params, max_shard_bytes=120_000)
  calls[0] = 0
  with pytest.raises(OSError, match="disk full"):
    save_hf(tmp_path / "sharded", cfg, params, max_shard_bytes=120_000, overwrite=True)
  assert not (tmp_path / "new").exists()
  assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []
  assert sorted(p.name for p in (tmp_path / "sharded").glob("*.safetensors")) == files
