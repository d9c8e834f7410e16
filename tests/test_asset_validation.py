"""Trained-tensor assets (beacon.json / focus.json + safetensors) are untrusted input: shard files
outside the asset, wrong shapes (broadcastable ones included), undeclared dtypes, NaN/inf, and
fractional, boolean, misspelt or mistyped settings are each one AssetError line naming the file,
the tensor or the field, before anything is used. The export never deletes a directory that is
not an asset, and an overwrite killed between its two renames leaves the old asset restorable.

Every asset here is a tiny hand-made one (a 1-layer base), copied per test and then damaged."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from longjax.ckpts.assets import AssetError
from longjax.ckpts.hf import save_hf
from longjax.models import ModelConfig, init_params

Q = "model.layers.0.self_attn.beacon_q_proj.weight"
EMBED = "model.beacon_embed_tokens.weight"


@pytest.fixture(scope="module")
def made(tmp_path_factory):
  """``(base dir, beacon asset, focus asset)``, built once; tests damage copies."""
  from longjax.beacon import BeaconConfig, load_beacon
  from longjax.beacon.asset import save_beacon_asset
  from longjax.focus import FocusConfig
  from longjax.focus.asset import save_focus_asset
  from longjax.focus.convert import focus_from_llama
  root = tmp_path_factory.mktemp("assets")
  cfg = ModelConfig(family="llama", vocab_size=97, hidden_size=32, intermediate_size=48,
                    num_layers=1, num_heads=4, num_kv_heads=2, head_dim=8, bos_token_id=1,
                    eos_token_id=2)
  save_hf(root / "base", cfg, init_params(cfg, 0))
  bcfg = BeaconConfig(window=8, stride=8, ratios=(2,), param=("q", "k", "v"))
  bc, bcfg, bp = load_beacon(root / "base", init="official", beacon=bcfg, param_dtype="float32")
  save_beacon_asset(root / "beacon", bc, bcfg, bp, base=str(root / "base"))
  fcfg = FocusConfig(local_window=16, chunk_stride=8, prompt_cap=8, min_len_threshold=0)
  fc, fcfg, fp = focus_from_llama(root / "base", fcfg, param_dtype="float32")
  save_focus_asset(root / "focus", fc, fcfg, fp, base=str(root / "base"))
  return root / "base", root / "beacon", root / "focus"


def _copy(src, tmp_path):
  dst = tmp_path / src.name
  shutil.copytree(src, dst)
  return dst


def _load(asset):
  from longjax.beacon.asset import load_beacon_asset
  from longjax.focus.asset import load_focus_asset
  return (load_beacon_asset if asset.name == "beacon" else load_focus_asset)(asset)


def _tensors(asset, fn):
  """Rewrite the asset's single tensor file with ``fn(tensors)``."""
  f = asset / f"{asset.name}.safetensors"
  t = fn(load_file(f))
  save_file(t, str(f), metadata={"format": "pt"})


def _meta(asset, **changes):
  f = asset / f"{asset.name}.json"
  meta = json.loads(f.read_text())
  for k, v in changes.items():
    if v is _DROP:
      meta.pop(k)
    else:
      meta[k] = v
  f.write_text(json.dumps(meta))


_DROP = object()


def _shard(asset, target: str, names):
  """A one-shard index of ``names`` whose shard name is ``target`` (the single file moved away)."""
  (asset / "beacon.safetensors.index.json").write_text(json.dumps(
      dict(metadata={}, weight_map={n: target for n in names})))


def test_undamaged_assets_load(made):
  _load(made[1])
  _load(made[2])


# ------------------------------------------------------------------------------------------------
# Shard index: names that leave the asset (relative, absolute, or a symlink) are refused
@pytest.mark.parametrize("how", ["dotdot", "absolute", "symlink"])
def test_shard_outside_the_asset_is_refused(made, tmp_path, how):
  asset = _copy(made[1], tmp_path / "in")
  outside = tmp_path / "outside.safetensors"
  names = list(load_file(asset / "beacon.safetensors"))
  os.rename(asset / "beacon.safetensors", outside)
  if how == "dotdot":
    _shard(asset, "../../outside.safetensors", names)
  elif how == "absolute":
    _shard(asset, str(outside), names)
  else:
    os.symlink(outside, asset / "beacon-00001-of-00001.safetensors")
    _shard(asset, "beacon-00001-of-00001.safetensors", names)
  with pytest.raises(AssetError, match="outside"):
    _load(asset)


def test_symlinked_single_file_or_settings_outside_are_refused(made, tmp_path):
  asset = _copy(made[1], tmp_path / "in")
  os.rename(asset / "beacon.safetensors", tmp_path / "t.safetensors")
  os.symlink(tmp_path / "t.safetensors", asset / "beacon.safetensors")
  with pytest.raises(AssetError, match="outside the asset"):
    _load(asset)
  asset = _copy(made[1], tmp_path / "in2")
  os.rename(asset / "beacon.json", tmp_path / "b.json")
  os.symlink(tmp_path / "b.json", asset / "beacon.json")
  with pytest.raises(AssetError, match="outside the asset"):
    _load(asset)


@pytest.mark.parametrize("index, words", [
    ({"metadata": {}}, "no 'weight_map'"),
    ({"weight_map": [1, 2]}, "weight_map' that is a JSON list"),
    ([1], "a JSON list, not an object"), ("{not json", "is not valid JSON")])
def test_damaged_index_is_one_line(made, tmp_path, index, words):
  asset = _copy(made[1], tmp_path)
  (asset / "beacon.safetensors.index.json").write_text(
      index if isinstance(index, str) else json.dumps(index))
  with pytest.raises(AssetError, match=words) as e:
    _load(asset)
  assert "\n" not in str(e.value) and "beacon.safetensors.index.json" in str(e.value)


def test_settings_file_that_is_not_a_json_object_is_one_line(made, tmp_path):
  asset = _copy(made[1], tmp_path)
  (asset / "beacon.json").write_bytes(b"\xff\xfe not json")
  with pytest.raises(AssetError, match="beacon.json is not valid JSON"):
    _load(asset)
  (asset / "beacon.json").write_text("[1, 2]")
  with pytest.raises(AssetError, match="beacon.json holds a JSON list, not an object"):
    _load(asset)


# ------------------------------------------------------------------------------------------------
# Tensors: exact shapes (no broadcasting into place), the declared dtype, finite values
@pytest.mark.parametrize("name, shape", [(Q, (32, 1)), (EMBED, (1, 1)), (Q, (3, 5))])
def test_wrong_shapes_are_refused(made, tmp_path, name, shape):
  asset = _copy(made[1], tmp_path)
  _tensors(asset, lambda t: {**t, name: np.ones(shape, ml_dtypes.bfloat16)})
  with pytest.raises(AssetError, match=re.escape(f"{name} is {shape}, this base model needs (")):
    _load(asset)


@pytest.mark.parametrize("dtype", [np.int32, np.bool_, np.float32])
def test_undeclared_dtypes_are_refused(made, tmp_path, dtype):
  asset = _copy(made[1], tmp_path)
  _tensors(asset, lambda t: {**t, Q: np.ones(t[Q].shape, dtype)})
  with pytest.raises(AssetError, match=rf"tensor {Q} is {np.dtype(dtype).name}, but the asset "
                                       "declares bfloat16"):
    _load(asset)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_tensors_are_refused(made, tmp_path, bad):
  for src in made[1:]:
    asset = _copy(src, tmp_path / f"{src.name}{bad}")
    name = Q if src.name == "beacon" else "model.layers.0.self_attn.beacon_o_proj.weight"

    def poison(t):
      v = t[name].astype(np.float32)
      v[1, 2] = bad
      return {**t, name: v.astype(t[name].dtype)}
    _tensors(asset, poison)
    with pytest.raises(AssetError, match=rf"tensor {name} holds 1 NaN/inf values"):
      _load(asset)


# ------------------------------------------------------------------------------------------------
# Settings: fractions and bools are refused, never truncated; misspelt fields and wrong JSON types
# are named (an integer is written without a decimal point: 64.0 is refused too)
@pytest.mark.parametrize("which, field, value", [
    ("beacon", "beacon_ratio", 2.5), ("beacon", "beacon_ratio", [True]),
    ("beacon", "beacon_ratio", [2, 2.5]), ("beacon", "beacon_window", 8.0),
    ("beacon", "beacon_window", "8"), ("beacon", "beacon_sink_size", 1.5),
    ("beacon", "beacon_window", [8]), ("beacon", "beacon_attend_prev", 1),
    ("beacon", "beacon_param", "qkv"), ("beacon", "dtype", "int8"),
    ("focus", "local_window", 128.7), ("focus", "memory_stride", 64.5),
    ("focus", "memory_stride", [64.5]), ("focus", "min_len_threshold", 1.9),
    ("focus", "min_len_threshold", True), ("focus", "prompt_cap", "8")])
def test_fractional_boolean_and_mistyped_settings_are_refused(made, tmp_path, which, field,
                                                              value):
  asset = _copy(made[1] if which == "beacon" else made[2], tmp_path)
  _meta(asset, **{field: value})
  with pytest.raises(AssetError, match=rf"{which}.json: field '{field}' must be .*, got "
                                       + json.dumps(value).replace("[", r"\[")):
    _load(asset)


@pytest.mark.parametrize("which, wrong, right", [
    ("beacon", "beacon_ratoi", "beacon_ratio"), ("beacon", "beacon_windw", "beacon_window"),
    ("focus", "local_windw", "local_window"), ("focus", "memory_strides", "memory_stride")])
def test_misspelt_fields_are_named(made, tmp_path, which, wrong, right):
  asset = _copy(made[1] if which == "beacon" else made[2], tmp_path)
  _meta(asset, **{wrong: 4})
  with pytest.raises(AssetError, match=rf"unknown field '{wrong}', did you mean '{right}'\?"):
    _load(asset)


def test_settings_are_checked_on_save_too(made, tmp_path):
  from longjax.beacon import BeaconConfig, load_beacon
  from longjax.beacon.asset import save_beacon_asset
  cfg, bcfg, params = load_beacon(made[0], init="official",
                                  beacon=BeaconConfig(window=8, stride=8, ratios=(2,)),
                                  param_dtype="float32")
  with pytest.raises(AssetError, match="unknown field 'train_stpe', did you mean 'train_step'"):
    save_beacon_asset(tmp_path / "a", cfg, bcfg, params, base="x", info=dict(train_stpe=3))
  assert not (tmp_path / "a").exists()


# ------------------------------------------------------------------------------------------------
# Export: --overwrite replaces an asset only; an overwrite killed between its renames is undone
def _dead_pid():
  p = subprocess.Popen(["true"])
  p.wait()
  return p.pid


def _save_beacon(made, out, overwrite):
  from longjax.beacon import BeaconConfig, load_beacon
  from longjax.beacon.asset import save_beacon_asset
  cfg, bcfg, params = load_beacon(made[0], init="official",
                                  beacon=BeaconConfig(window=8, stride=8, ratios=(2,)),
                                  param_dtype="float32")
  return save_beacon_asset(out, cfg, bcfg, params, base=str(made[0]), overwrite=overwrite)


def test_overwrite_refuses_a_directory_that_is_not_an_asset(made, tmp_path, capsys):
  out = tmp_path / "out"
  out.mkdir()
  (out / "thesis.tex").write_text("years of work")
  with pytest.raises(AssetError, match="is not an asset of Activation Beacon .* --overwrite "
                                       "replaces only an asset"):
    _save_beacon(made, out, overwrite=True)
  assert (out / "thesis.tex").read_text() == "years of work"
  assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # nothing else left behind
  # the export commands say so in one line, before reading the run
  from longjax.beacon.asset import main as beacon_main
  from longjax.focus.asset import main as focus_main
  for main in (beacon_main, focus_main):
    assert main(["--workdir", str(tmp_path / "no_run"), "--out", str(out), "--overwrite"]) == 1
    err = capsys.readouterr().err
    assert "is not an asset of" in err and len(err.strip().splitlines()) == 1, err
  assert (out / "thesis.tex").read_text() == "years of work"
  # an asset (and an empty directory) is replaced
  shutil.rmtree(out)
  shutil.copytree(made[1], out)
  (out / "stale.txt").write_text("x")
  _save_beacon(made, out, overwrite=True)
  assert not (out / "stale.txt").exists() and (out / "beacon.json").exists()
  empty = tmp_path / "empty"
  empty.mkdir()
  _save_beacon(made, empty, overwrite=True)
  assert (empty / "beacon.json").exists()


def test_overwrite_killed_between_its_renames_is_restored(made, tmp_path):
  """The state a kill -9 leaves between ``out -> .out.old-PID`` and ``partial -> out``: the next
  load (or export) puts the old asset back instead of deleting it."""
  from longjax.ckpts.atomic_dir import host_name
  dead = _dead_pid()
  for again in ("load", "export"):
    root = tmp_path / again
    root.mkdir()
    shutil.copytree(made[1], root / f".beacon.old-{dead}")
    shutil.copytree(made[1], root / f".beacon.partial-{dead}@{host_name()}.abcd1234")
    assert not (root / "beacon").exists()
    if again == "load":
      _load(root / "beacon")  # restored, then loaded
    else:
      _save_beacon(made, root / "beacon", overwrite=True)
    assert (root / "beacon" / "beacon.json").exists()
    if again == "export":  # the next write removes the killed writer's leftovers
      assert sorted(p.name for p in root.iterdir()) == ["beacon"]
