"""Trained-beacon assets: only the beacon tensors (official names, bf16) + settings, loaded in one
call on top of the base model."""
import json

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import load_file

from hf_models import save_tiny
from longjax.beacon import BeaconConfig, load_beacon
from longjax.beacon.asset import AssetError, load_beacon_asset, save_beacon_asset


def _trained(tmp_path):
  _, base = save_tiny(tmp_path, "llama2")
  bcfg = BeaconConfig(window=32, stride=32, ratios=(4,), param=("q", "k", "v"))
  cfg, bcfg, params = load_beacon(base, init="official", beacon=bcfg, param_dtype="float32")
  rng = np.random.default_rng(0)  # "training": move every beacon tensor off its initial copy
  attn = params["layers"]["attn"]
  for p in "qkv":
    attn[f"alt_{p}_proj"]["kernel"] = attn[f"alt_{p}_proj"]["kernel"] + rng.normal(
        0, 0.1, attn[f"alt_{p}_proj"]["kernel"].shape).astype(np.float32)
  params["alt_embedding"] = params["alt_embedding"] + 0.5
  return base, cfg, bcfg, params


def test_asset_round_trip(tmp_path):
  base, cfg, bcfg, params = _trained(tmp_path)
  out = save_beacon_asset(tmp_path / "asset", cfg, bcfg, params, base=str(base))
  tensors = load_file(out / "beacon.safetensors")
  assert set(tensors) == ({f"model.layers.{i}.self_attn.beacon_{p}_proj.weight"
                           for i in range(cfg.num_layers) for p in "qkv"}
                          | {"model.beacon_embed_tokens.weight"})
  assert all(t.dtype == ml_dtypes.bfloat16 for t in tensors.values())
  meta = json.loads((out / "beacon.json").read_text())
  assert meta["beacon_window"] == 32 and meta["beacon_ratio"] == [4]

  cfg2, bcfg2, loaded = load_beacon_asset(out)  # the base named in beacon.json
  assert bcfg2 == bcfg and cfg2.alt_projections == cfg.alt_projections
  bf16 = lambda x: np.asarray(x).astype(ml_dtypes.bfloat16).astype(np.float32)  # noqa: E731
  for p in "qkv":
    np.testing.assert_array_equal(loaded["layers"]["attn"][f"alt_{p}_proj"]["kernel"],
                                  bf16(params["layers"]["attn"][f"alt_{p}_proj"]["kernel"]))
    # the base projections come from the base checkpoint, untouched
    np.testing.assert_array_equal(loaded["layers"]["attn"][f"{p}_proj"]["kernel"],
                                  params["layers"]["attn"][f"{p}_proj"]["kernel"])
  np.testing.assert_array_equal(loaded["alt_embedding"], bf16(params["alt_embedding"]))


def test_asset_of_another_base_is_refused(tmp_path):
  _, cfg, bcfg, params = _trained(tmp_path)
  out = save_beacon_asset(tmp_path / "asset", cfg, bcfg, params, base="unused")
  _, other = save_tiny(tmp_path / "o", "llama2", num_hidden_layers=2)
  with pytest.raises(AssetError, match="does not fit this base model"):
    load_beacon_asset(out, other)
  with pytest.raises(AssetError, match="not a beacon asset"):
    load_beacon_asset(tmp_path)


def test_shipped_smollm2_asset_loads_in_one_call(smollm2_dir):
  """assets/smollm2_beacon (what the main job uses) loads on the converted SmolLM2 in one call:
  the settings of its beacon.json, every beacon tensor moved off the official init, and a
  beacon forward of one window plus a partial one gives finite logits."""
  import jax.numpy as jnp
  from conftest import REPO
  from longjax.beacon import BeaconLM
  asset = REPO / "assets" / "smollm2_beacon"
  meta = json.loads((asset / "beacon.json").read_text())
  cfg, bcfg, params = load_beacon_asset(asset, smollm2_dir)
  assert (bcfg.window, tuple(bcfg.ratios), tuple(bcfg.param)) == (
      meta["beacon_window"], tuple(meta["beacon_ratio"]), tuple(meta["beacon_param"]))
  _, _, init = load_beacon(smollm2_dir, init="official", beacon=bcfg, param_dtype="float32")
  for p in bcfg.param:
    moved = np.abs(params["layers"]["attn"][f"alt_{p}_proj"]["kernel"]
                   - init["layers"]["attn"][f"alt_{p}_proj"]["kernel"]).max()
    assert moved > 1e-3, p
  ids = np.random.default_rng(0).integers(10, cfg.vocab_size, bcfg.window + 40)
  out = BeaconLM(cfg, bcfg, max_length=2 * bcfg.window).forward(
      params, ids)
  assert np.isfinite(np.asarray(jnp.asarray(out.next_logits))).all()


def test_init_from_may_add_projections_but_nothing_else(tmp_path):
  """train.init_from: a q/k/v asset starts a q/k/v/o run (the asset's tensors, o from its
  official copy of the base's o); any other difference, fewer projections included, is refused."""
  import dataclasses
  from types import SimpleNamespace
  from longjax.train.loop import TrainingError, params_from_asset
  base, cfg, bcfg, params = _trained(tmp_path)
  out = save_beacon_asset(tmp_path / "asset", cfg, bcfg, params, base=str(base))
  run = SimpleNamespace(method="beacon", train=SimpleNamespace(init_from=str(out)))
  wide = dataclasses.replace(bcfg, param=("q", "k", "v", "o"))
  _, wide, init = load_beacon(base, init="official", beacon=wide, param_dtype="float32")
  got = params_from_asset(run, wide, init, None)
  bf16 = lambda x: np.asarray(x).astype(ml_dtypes.bfloat16).astype(np.float32)  # noqa: E731
  attn, got_attn = params["layers"]["attn"], got["layers"]["attn"]
  for p in "qkv":
    np.testing.assert_array_equal(got_attn[f"alt_{p}_proj"]["kernel"],
                                  bf16(attn[f"alt_{p}_proj"]["kernel"]))
  np.testing.assert_array_equal(got_attn["alt_o_proj"]["kernel"],  # the official init: a copy
                                np.asarray(init["layers"]["attn"]["o_proj"]["kernel"]))
  np.testing.assert_array_equal(got["alt_embedding"], bf16(params["alt_embedding"]))
  # the stride only says where the tensors are used: a run may overlap its windows (append)
  app = dataclasses.replace(bcfg, pos="append")
  app_run = SimpleNamespace(method="beacon", train=SimpleNamespace(
      init_from=str(save_beacon_asset(tmp_path / "append", cfg, app, params, base=str(base)))))
  half = dataclasses.replace(app, stride=bcfg.stride // 2)
  got = params_from_asset(app_run, half, load_beacon(base, init="official", beacon=half,
                                                     param_dtype="float32")[2], None)
  np.testing.assert_array_equal(got["alt_embedding"], bf16(params["alt_embedding"]))
  # so do the ratios drawn (one embedding and one set of projections serve every ratio)
  mixed = dataclasses.replace(bcfg, ratios=(2, 4, 8), ratio_mix="instance-random")
  got = params_from_asset(run, mixed, load_beacon(base, init="official", beacon=mixed,
                                                  param_dtype="float32")[2], None)
  np.testing.assert_array_equal(got["alt_embedding"], bf16(params["alt_embedding"]))
  # and the beacons' attention pattern (which raw tokens each beacon reads; same tensors)
  other_attn = "full-coverage" if app.attn == "step-expansion" else "step-expansion"
  coverage = dataclasses.replace(app, attn=other_attn)
  got = params_from_asset(app_run, coverage, load_beacon(base, init="official", beacon=coverage,
                                                     param_dtype="float32")[2], None)
  np.testing.assert_array_equal(got["alt_embedding"], bf16(params["alt_embedding"]))
  for change, msg in ((dict(param=("q", "k")), "only the projections may grow"),
                      (dict(param=("q", "k", "v", "o"), window=16, stride=16), "settings differ")):
    other = dataclasses.replace(bcfg, **change)
    _, other, p0 = load_beacon(base, init="official", beacon=other, param_dtype="float32")
    with pytest.raises(TrainingError, match=msg):
      params_from_asset(run, other, p0, None)
