"""train.init_from on damaged or foreign assets: one TrainingError line each, checked before a
tiny base is pretrained for the run; an asset records the base it was trained on and a run on
another base refuses it."""
import json
import logging
from types import SimpleNamespace

import pytest

from longjax.beacon import load_beacon
from longjax.beacon.asset import save_beacon_asset
from longjax.train.loop import TrainingError, params_from_asset
from test_beacon_asset import _trained


@pytest.fixture(scope="module")
def asset(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("asset")
  base, cfg, bcfg, params = _trained(tmp)
  out = save_beacon_asset(tmp / "asset", cfg, bcfg, params, base=str(base))
  return out, base, bcfg


def _copy(asset_dir, dst):
  import shutil
  shutil.copytree(asset_dir, dst)
  return dst


def _init(base, bcfg):
  return load_beacon(base, init="official", beacon=bcfg, param_dtype="float32")[2]


def _run(src):
  return SimpleNamespace(method="beacon", train=SimpleNamespace(init_from=str(src)))


@pytest.mark.parametrize("damage", ["cut_json", "list_json", "cut_shard"])
def test_damaged_asset_is_one_line(asset, tmp_path, damage):
  src, base, bcfg = asset
  d = _copy(src, tmp_path / "a")
  if damage == "cut_json":
    (d / "beacon.json").write_text((d / "beacon.json").read_text()[:40])
  elif damage == "list_json":
    (d / "beacon.json").write_text("[1, 2]")
  else:
    f = d / "beacon.safetensors"
    f.write_bytes(f.read_bytes()[:300])
  with pytest.raises(TrainingError, match=r"train.init_from=.*(cannot be read|truncated)"):
    params_from_asset(_run(d), bcfg, _init(base, bcfg), None)


def test_asset_of_another_base_is_refused_and_old_assets_are_noted(asset, tmp_path, caplog):
  src, base, bcfg = asset
  meta = json.loads((src / "beacon.json").read_text())
  assert len(meta["base_weights"]) == 32
  params_from_asset(_run(src), bcfg, _init(base, bcfg), None)  # its own base: accepted
  other = _init(base, bcfg)  # the same shapes, one base value changed
  other["layers"]["attn"]["q_proj"]["kernel"][0, 0, 0] += 0.5
  with pytest.raises(TrainingError, match="was trained on another base model"):
    params_from_asset(_run(src), bcfg, other, None)
  # an asset exported before the fingerprint was recorded: taken, with one line saying so
  old = _copy(src, tmp_path / "old")
  del meta["base_weights"]
  (old / "beacon.json").write_text(json.dumps(meta))
  with caplog.at_level(logging.WARNING, logger="longjax.train"):
    params_from_asset(_run(old), bcfg, other, None)
  assert any("records no fingerprint of its base" in r.getMessage() for r in caplog.records)


def test_bad_init_from_on_a_fresh_tiny_workdir_leaves_nothing(tmp_path):
  """Refused before the tiny base is pretrained (which would leave base/ and base_run/); the
  base's own pretraining run does not inherit the asset (it refused to start with one)."""
  from configs import tiny_beacon
  from longjax.run_config import from_config
  from longjax.train.loop import Trainer, _pretrain_config
  bad = tmp_path / "asset"
  bad.mkdir()
  (bad / "beacon.json").write_text('{"beacon_window": 6')
  (bad / "beacon.safetensors").write_bytes(b"\0" * 16)
  for src, words in ((tmp_path / "missing", "no such asset directory"), (bad, "cannot be read")):
    c = tiny_beacon.get_config()
    c.workdir = str(tmp_path / "wd")
    c.train.init_from = str(src)
    with pytest.raises(TrainingError, match=words):
      Trainer(from_config(c)).setup()
    assert not (tmp_path / "wd" / "base_run").exists() and not (tmp_path / "wd" / "base").exists()
  assert _pretrain_config(from_config(c), tmp_path / "wd").train.init_from == ""


def test_disk_full_during_a_checkpoint_save_is_one_line(tmp_path, caplog, monkeypatch):
  """orbax logs each failed background write with its traceback (a full disk: 450 lines for one
  save, by hand on a 2 MB tmpfs) and raises a ValueError: the trainer gets one TrainingError line
  naming the step a rerun resumes from, and the partial step is removed."""
  import sys
  import jax.numpy as jnp
  from longjax.train.checkpointing import Checkpointer
  ck = Checkpointer(tmp_path / "ck", keep=2, async_save=False)
  ck.save(1, {"a": jnp.zeros(4)}, {"x": 1}, {"m": 1})
  ck.wait()
  partial = tmp_path / "ck" / "2.orbax-checkpoint-tmp"

  def full(*a, **k):
    partial.mkdir()
    err = "RESOURCE_EXHAUSTED: Failed writing ... No space left on device [os_error_code='28']"
    try:
      raise ValueError(err)
    except ValueError:  # as orbax's background thread logs it
      absl = logging.getLogger("absl")
      absl.handle(absl.makeRecord("absl", logging.ERROR, "/site-packages/orbax/checkpoint/x.py", 1,
                                  "_SignalingThread.run() raised an exception", None,
                                  sys.exc_info()))
    raise ValueError(err)
  monkeypatch.setattr(ck.mgr, "save", full)
  with pytest.raises(TrainingError, match=r"\(step 2\): ValueError: No space left on device; free "
                                          r"space .* resumes from step 1"):
    ck.save(2, {"a": jnp.ones(4)}, {"x": 1}, {"m": 1})
  ck.close()
  assert not [r for r in caplog.records if r.name == "absl"], "orbax's tracebacks got through"
  assert not partial.exists() and ck.all_steps() == [1]
