"""FocusLLM asset: candidate tensors only (official names, bf16, sharded with an index when larger
than a file may be), loaded in one call on top of the base; train.init_from for FocusLLM."""
from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest

from longjax.ckpts import assets
from longjax.ckpts.hf import save_hf
from longjax.focus.asset import AssetError, load_focus_asset, save_focus_asset

from focus_helpers import tiny_focus, tiny_model


@pytest.fixture()
def base(tmp_path):
  cfg, params = tiny_model(projections=())
  save_hf(tmp_path / "base", cfg, params)
  return tmp_path / "base"


def _trained(seed=1):
  cfg, params = tiny_model(seed=seed)
  return cfg, params


def test_asset_roundtrip_sharded(tmp_path, base):
  cfg, params = _trained()
  f = tiny_focus()
  # 2 layers x q/k/v/o candidates in bf16 are ~10 KB: a 3 KB limit forces several shards
  save_focus_asset(tmp_path / "a", cfg, f, params, base=str(base), info=dict(train_step=7),
                   max_file_bytes=3000)
  files = sorted(p.name for p in (tmp_path / "a").iterdir())
  shards = [n for n in files if n.startswith("focus-") and n.endswith(".safetensors")]
  assert len(shards) >= 3 and "focus.safetensors.index.json" in files, files
  # a shard's tensors stay within the limit (the safetensors header adds a little)
  assert all((tmp_path / "a" / n).stat().st_size <= 3000 + 1024 for n in shards)
  index = json.loads((tmp_path / "a" / "focus.safetensors.index.json").read_text())
  assert set(index["weight_map"]) == {f"model.layers.{i}.self_attn.beacon_{p}_proj.weight"
                                      for i in (0, 1) for p in "qkvo"}
  meta = json.loads((tmp_path / "a" / "focus.json").read_text())
  assert meta["local_window"] == 24 and meta["memory_stride"] == [16] and meta["train_step"] == 7
  cfg2, f2, p2 = load_focus_asset(tmp_path / "a")
  assert f2 == f and cfg2.alt_projections == ("q", "k", "v", "o")
  for p in "qkvo":  # the candidates: the trained ones, through bf16
    want = np.asarray(params["layers"]["attn"][f"alt_{p}_proj"]["kernel"])
    got = p2["layers"]["attn"][f"alt_{p}_proj"]["kernel"]
    np.testing.assert_array_equal(got, want.astype(ml_dtypes.bfloat16).astype(np.float32))
  # the base: the base directory's, not the trained model's
  base_cfg, base_params = tiny_model(projections=())
  np.testing.assert_array_equal(p2["layers"]["attn"]["q_proj"]["kernel"],
                                base_params["layers"]["attn"]["q_proj"]["kernel"])
  assert cfg2.num_layers == base_cfg.num_layers


def test_asset_single_file_and_errors(tmp_path, base):
  cfg, params = _trained()
  save_focus_asset(tmp_path / "a", cfg, tiny_focus(), params, base=str(base))
  assert (tmp_path / "a" / "focus.safetensors").exists()
  with pytest.raises(AssetError, match="must name the base"):
    save_focus_asset(tmp_path / "b", cfg, tiny_focus(), params, base="")
  plain_cfg, plain = tiny_model(projections=())
  with pytest.raises(AssetError, match="no FocusLLM candidate"):
    save_focus_asset(tmp_path / "c", plain_cfg, tiny_focus(), plain, base=str(base))
  with pytest.raises(AssetError, match="not a FocusLLM asset"):
    load_focus_asset(tmp_path)
  with pytest.raises(FileExistsError):  # never written over an existing output
    save_focus_asset(tmp_path / "a", cfg, tiny_focus(), params, base=str(base))


def test_missing_shard_is_named(tmp_path, base):
  cfg, params = _trained()
  save_focus_asset(tmp_path / "a", cfg, tiny_focus(), params, base=str(base), max_file_bytes=3000)
  victim = sorted((tmp_path / "a").glob("focus-*.safetensors"))[1]
  victim.unlink()
  with pytest.raises(AssetError, match=victim.name):
    load_focus_asset(tmp_path / "a")


def test_one_tensor_larger_than_a_file_is_refused(tmp_path):
  with pytest.raises(AssetError, match="more than one file may hold"):
    assets.write_tensors(tmp_path, "x",
                         {"a": np.zeros(100, np.float32), "b": np.zeros(3, np.float32)},
                         max_bytes=200)


def test_asset_carries_its_candidate_gate(tmp_path, base):
  """The gate is a reading setting (docs/focusllm.md §4.5): written only when on (an official
  asset's focus.json is unchanged), read back, and refused when not a number >= 0."""
  cfg, params = _trained()
  save_focus_asset(tmp_path / "off", cfg, tiny_focus(), params, base=str(base))
  assert "candidate_gate" not in json.loads((tmp_path / "off" / "focus.json").read_text())
  assert "gate_threshold" not in json.loads((tmp_path / "off" / "focus.json").read_text())
  assert "gate_gain" not in json.loads((tmp_path / "off" / "focus.json").read_text())
  assert "gate_peer_gain" not in json.loads((tmp_path / "off" / "focus.json").read_text())
  assert "gate_top_k" not in json.loads((tmp_path / "off" / "focus.json").read_text())
  save_focus_asset(tmp_path / "on", cfg, tiny_focus(candidate_gate=4.0, gate_threshold=0.5,
                                                    gate_gain=1.5, gate_peer_gain=3.0,
                                                    gate_top_k=8),
                   params, base=str(base))
  meta = json.loads((tmp_path / "on" / "focus.json").read_text())
  assert meta["candidate_gate"] == 4.0 and meta["gate_threshold"] == 0.5
  assert meta["gate_gain"] == 1.5 and meta["gate_peer_gain"] == 3.0
  assert load_focus_asset(tmp_path / "on")[1].gate_peer_gain == 3.0
  assert load_focus_asset(tmp_path / "off")[1].gate_peer_gain == 0.0
  assert meta["gate_top_k"] == 8 and load_focus_asset(tmp_path / "on")[1].gate_top_k == 8
  assert load_focus_asset(tmp_path / "off")[1].gate_top_k == 1
  assert load_focus_asset(tmp_path / "on")[1].candidate_gate == 4.0
  assert load_focus_asset(tmp_path / "on")[1].gate_threshold == 0.5
  assert load_focus_asset(tmp_path / "on")[1].gate_gain == 1.5
  assert load_focus_asset(tmp_path / "off")[1].candidate_gate == 0.0
  assert load_focus_asset(tmp_path / "off")[1].gate_threshold == 1.0
  assert load_focus_asset(tmp_path / "off")[1].gate_gain == 0.0
  for bad in (-1, "4", True):
    (tmp_path / "on" / "focus.json").write_text(json.dumps(dict(meta, candidate_gate=bad)))
    with pytest.raises(AssetError, match="'candidate_gate' must be a finite number >= 0"):
      load_focus_asset(tmp_path / "on")
  assert "chunk_vote" not in json.loads((tmp_path / "off" / "focus.json").read_text())
  save_focus_asset(tmp_path / "vote", cfg, tiny_focus(candidate_gate=2.0, chunk_vote=1.0,
                                                      vote_min=0.5, vote_open=True), params,
                   base=str(base))
  voted = json.loads((tmp_path / "vote" / "focus.json").read_text())
  assert (voted["chunk_vote"], voted["vote_min"], voted["vote_open"]) == (1.0, 0.5, True)
  got = load_focus_asset(tmp_path / "vote")[1]
  assert (got.chunk_vote, got.vote_min, got.vote_open) == (1.0, 0.5, True)
  assert load_focus_asset(tmp_path / "off")[1].chunk_vote == 0.0
  for bad in (0, 2.5, "8"):
    (tmp_path / "on" / "focus.json").write_text(json.dumps(dict(meta, gate_top_k=bad)))
    with pytest.raises(AssetError, match="'gate_top_k' must be an integer >= 1"):
      load_focus_asset(tmp_path / "on")


def test_a_gated_run_starts_from_an_ungated_asset(tmp_path, base):
  """train.init_from: the candidate gate only weighs the candidates when they are read and the
  chunk overlap only widens what each chunk row reads, so a run with them starts from an asset
  trained without (its tensors, through bf16); any other difference in the settings is still
  refused."""
  from types import SimpleNamespace

  import jax

  from longjax.train.loop import TrainingError, params_from_asset
  cfg, params = _trained()
  src = save_focus_asset(tmp_path / "a", cfg, tiny_focus(), params, base=str(base))
  run = SimpleNamespace(method="focus", train=SimpleNamespace(init_from=str(src)))
  init = jax.tree_util.tree_map_with_path(  # the run's own start: candidates zeroed, same base
      lambda path, x: np.zeros_like(x) if "alt_" in jax.tree_util.keystr(path) else np.asarray(x),
      params)
  got = params_from_asset(run, tiny_focus(candidate_gate=8.0, chunk_overlap=4), init, None)
  for p in "qkvo":
    want = np.asarray(params["layers"]["attn"][f"alt_{p}_proj"]["kernel"])
    np.testing.assert_array_equal(got["layers"]["attn"][f"alt_{p}_proj"]["kernel"],
                                  want.astype(ml_dtypes.bfloat16).astype(np.float32))
    assert np.abs(want).max() > 0  # the test can tell the asset's tensors from the zeroed start
  with pytest.raises(TrainingError, match="settings differ"):
    params_from_asset(run, tiny_focus(local_window=32), init, None)
