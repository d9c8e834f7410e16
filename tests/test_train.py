"""Training: frozen base, optimizer state only for trainable params, resume-after-kill
bit-equality, corrupt-checkpoint fallback, NaN stop, 8 fake devices == 1 device, clear errors."""
import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import traverse_util

from conftest import run_python
from train_helpers import ROOT, micro_config

from longjax import methods
from longjax.train import loop
from longjax.train.checkpointing import CheckpointMismatch
from longjax.run_config import ConfigError, from_config
from longjax.train.metrics import read_metrics

ENV = dict(os.environ, JAX_PLATFORMS="cpu", HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT),
           JAX_COMPILATION_CACHE_DIR=os.environ.get(
               "LONGJAX_JAX_CACHE", os.path.expanduser("~/.cache/longjax-jax")),
           JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0.5")


def _flat(t):
  return traverse_util.flatten_dict(jax.device_get(t), sep="/")


@pytest.mark.parametrize("method", ["beacon", "focus"])
def test_frozen_base_and_optimizer_state(tmp_path, method):
  c = micro_config(method, tmp_path / method, steps=3, save_every=3)
  tr = loop.Trainer(from_config(c))
  tr.setup()
  frozen0 = {k: np.array(v) for k, v in _flat(tr.frozen).items()}
  train0 = {k: np.array(v) for k, v in _flat(tr.state["params"]).items()}
  tr2 = loop.Trainer(from_config(c))
  out = tr2.run()
  assert out["final_step"] == 3
  frozen1, train1 = _flat(tr2.frozen), _flat(tr2.state["params"])
  # frozen parameters bit-identical, trainable ones moved
  assert set(frozen1) == set(frozen0)
  for k in frozen0:
    np.testing.assert_array_equal(frozen0[k], frozen1[k], err_msg=k)
  assert all("alt_" in k for k in train1)
  assert any(not np.array_equal(train0[k], train1[k]) for k in train0)
  if method == "beacon":
    assert "alt_embedding" in train1 and "layers/attn/alt_q_proj/kernel" in train1
  else:
    assert "alt_embedding" not in train1 and "layers/attn/alt_o_proj/kernel" in train1
  # optimizer state: only trainable-shaped arrays (Adam mu/nu mirror the trainable tree)
  shapes = sorted(tuple(v.shape) for v in train1.values())
  opt = [x for x in jax.tree.leaves(tr2.state["opt_state"]) if np.ndim(x) > 0]
  assert sorted(tuple(x.shape) for x in opt) == sorted(shapes * 2)
  n_frozen = sum(v.size for v in frozen1.values())
  assert sum(x.size for x in opt) == 2 * sum(v.size for v in train1.values()) < n_frozen
  # falling-or-finite loss and the metrics file
  m = read_metrics(c.workdir)
  assert [r["step"] for r in m] == [1, 2, 3] and all(np.isfinite(r["loss"]) for r in m)
  # what host planning controls: compiled step programs so far, and the padding share
  assert all(1 <= r["programs"] <= r["step"] for r in m)
  assert [r["programs"] for r in m] == sorted(r["programs"] for r in m)
  assert all(0.0 <= r["padding_share"] < 1.0 for r in m)
  # the export has the official tensor names
  from safetensors import safe_open
  with safe_open(str(Path(out["export"]) / "model.safetensors"), "np") as f:
    names = set(f.keys())
  assert "model.layers.0.self_attn.beacon_q_proj.weight" in names
  assert "model.beacon_embed_tokens.weight" in names
  if method == "focus":
    assert "model.layers.1.self_attn.beacon_o_proj.weight" in names


def _run_cli(workdir, *extra, check=True, kill_after_step=None):
  """train.py on the micro config; ``kill_after_step``: the process SIGKILLs itself once that
  step's checkpoint is written (tests/train_killed.py wraps train.py for it)."""
  entry = ([str(ROOT / "tests" / "train_killed.py"), str(kill_after_step)]
           if kill_after_step is not None else [str(ROOT / "train.py")])
  cmd = [*entry, "--config=" + str(ROOT / "tests" / "micro_train_config.py"),
         f"--config.workdir={workdir}", *extra]
  p = run_python(*cmd, env=ENV, timeout=600)
  if check and p.returncode != 0:
    raise AssertionError(f"rc={p.returncode}\n{p.stderr[-3000:]}")
  return p


def test_resume_after_kill_is_bit_identical(tmp_path):
  a, b = tmp_path / "a", tmp_path / "b"
  _run_cli(a)
  p = _run_cli(b, check=False, kill_after_step=3)
  assert p.returncode == -9, p.stderr[-2000:]
  assert [r["step"] for r in read_metrics(b)] == [1, 2, 3]
  p = _run_cli(b)  # the same command again: resumes from step 2
  assert "resumed from" in p.stderr
  la = [(r["step"], r["loss"], r["grad_norm"]) for r in read_metrics(a)]
  lb = [(r["step"], r["loss"], r["grad_norm"]) for r in read_metrics(b)]
  assert la == lb and len(la) == 5
  # trained tensors equal too
  from safetensors.numpy import load_file
  ta, tb = (load_file(str(a / "export_hf/model.safetensors")),
            load_file(str(b / "export_hf/model.safetensors")))
  for k in ta:
    np.testing.assert_array_equal(ta[k], tb[k], err_msg=k)


def test_stops_with_a_checkpoint_before_the_kernel_mapping_limit(tmp_path, monkeypatch):
  """Near vm.max_map_count the next XLA compile aborts the process; the trainer saves and stops
  first with a clear error, and the same command then resumes."""
  from longjax.train import map_count
  held, limit = map_count.usage()  # Linux (CI and these machines)
  assert 0 < held < limit
  c = micro_config("beacon", tmp_path / "w", steps=12, save_every=4)
  calls = []
  monkeypatch.setattr(map_count, "usage", lambda: calls.append(1) or (95, 100))
  with pytest.raises(loop.TrainingError, match=r"stopped after step 10 \(saved\).*max_map_count"):
    loop.Trainer(from_config(c)).run()
  assert len(calls) == 1 and "10" in _ckpt_dirs(c.workdir)
  monkeypatch.setattr(map_count, "usage", lambda: (50, 100))
  out = loop.Trainer(from_config(c)).run()
  assert out["start_step"] == 10 and out["final_step"] == 12


def test_corrupt_latest_checkpoint_falls_back(tmp_path, caplog):
  c = micro_config("beacon", tmp_path / "w", steps=4, save_every=2)
  loop.Trainer(from_config(c)).run()
  step4 = Path(c.workdir) / "checkpoints" / "4"
  assert step4.is_dir()
  for f in step4.rglob("*"):
    if f.is_file() and f.stat().st_size > 0 and "state" in str(f):
      f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
  c.train.num_steps = 5
  with caplog.at_level("WARNING", logger="longjax.train"):
    out = loop.Trainer(from_config(c)).run()
  assert out["start_step"] == 2 and out["final_step"] == 5
  assert any("falling back" in r.getMessage() for r in caplog.records)


def _ckpt_dirs(workdir):
  return sorted(p.name for p in (Path(workdir) / "checkpoints").iterdir() if p.name[0].isdigit())


def test_nan_stops_and_keeps_last_good_checkpoint(tmp_path, monkeypatch):
  c = micro_config("beacon", tmp_path / "w", steps=6, save_every=1)
  metrics = loop.Trainer._host_metrics

  def nan_at_step_3(self, step, m):  # a non-finite loss on purpose
    m = metrics(self, step, m)
    return dict(m, loss=float("nan")) if step == 3 else m
  monkeypatch.setattr(loop.Trainer, "_host_metrics", nan_at_step_3)
  # the NaN at step 3 came from step 2's weights: that checkpoint is set aside, not kept
  with pytest.raises(loop.TrainingError, match="non-finite loss .* step 3.*checkpoint of step 2.* "
                     "set aside.*last good checkpoint \\(step 1\\)"):
    loop.Trainer(from_config(c)).run()
  assert _ckpt_dirs(c.workdir) == ["1", "2.nonfinite"]


@pytest.mark.filterwarnings("ignore:overflow encountered in cast")
def test_poisoned_update_is_never_kept(tmp_path):
  """lr=1e38 after a zero-lr warmup step: step 2's update leaves finite weights of ~1e37 whose
  loss at step 3 is NaN; its checkpoint is set aside and the kept one trains on finitely."""
  c = micro_config("beacon", tmp_path / "w", steps=4, save_every=1)
  c.train.lr, c.train.warmup_steps = 1e38, 2
  with pytest.raises(loop.TrainingError, match="non-finite loss .* step 3.*checkpoint of step 2.* "
                     "set aside.*last good checkpoint \\(step 1\\)"):
    loop.Trainer(from_config(c)).run()
  assert _ckpt_dirs(c.workdir) == ["1", "2.nonfinite"]
  c.train.lr = 1e-3
  out = loop.Trainer(from_config(c)).run()
  assert out["start_step"] == 1
  assert [r["step"] for r in read_metrics(c.workdir)] == [1, 2, 3, 4]
  assert all(np.isfinite(r["loss"]) for r in read_metrics(c.workdir))
  # an lr that overflows float32 makes non-finite weights at once: not applied, nothing saved
  c = micro_config("beacon", tmp_path / "inf", steps=4, save_every=1)
  c.train.lr, c.train.warmup_steps = 1e39, 0
  with pytest.raises(loop.TrainingError, match="update to non-finite weights at step 1: training "
                     "stopped without applying it; no good checkpoint is left in"):
    loop.Trainer(from_config(c)).run()
  assert _ckpt_dirs(c.workdir) == []


def test_workdir_lock(tmp_path):
  """A second run on a workdir is refused naming the holder; a dead holder's lock is taken over."""
  import socket
  c = micro_config("beacon", tmp_path / "w", steps=1, save_every=1)
  lock = Path(c.workdir) / "train.lock"
  lock.parent.mkdir(parents=True)
  holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
  try:
    lock.write_text(json.dumps(dict(pid=holder.pid, host=socket.gethostname(), started="then")))
    p = _run_cli(c.workdir, check=False)
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr[-2000:]
    assert (f"train.py: error: {lock.parent} is in use by another training run (pid {holder.pid} "
            f"on host {socket.gethostname()}, started then)") in p.stderr
    assert not (Path(c.workdir) / "checkpoints").exists()
  finally:
    holder.kill()
    holder.wait()
  # the same lock, its pid now dead (as after kill -9): stale
  out = loop.Trainer(from_config(c)).run()
  assert out["final_step"] == 1 and not lock.exists()


def test_changed_model_config_on_cached_tiny_base_is_refused(tmp_path):
  from longjax.data.tokenizers import get_tokenizer
  c = micro_config("beacon", tmp_path / "w")
  loop.load_base(from_config(c), get_tokenizer("byte"), Path(c.workdir))  # caches the tiny base
  c.model.hidden_size, c.model.head_dim, c.model.num_layers = 48, 12, 3
  with pytest.raises(loop.TrainingError, match=r"w/base holds a tiny base model built for another "
                     r"config \(model.hidden_size 32 -> 48, model.num_layers 2 -> 3, "
                     r"model.head_dim 8 -> 12; cached -> this run\)"):
    loop.Trainer(from_config(c)).run()
  c = micro_config("beacon", tmp_path / "w", pretrain=5)
  with pytest.raises(loop.TrainingError, match=r"another config \(model.pretrain.steps 0 -> 5;"):
    loop.Trainer(from_config(c)).run()


def test_checkpoint_from_other_model_is_refused(tmp_path):
  c = micro_config("beacon", tmp_path / "w", steps=2, save_every=2)
  loop.Trainer(from_config(c)).run()
  c2 = micro_config("beacon", tmp_path / "w", steps=4, save_every=2)
  c2.model.hidden_size = 48
  c2.model.head_dim = 12
  import shutil
  shutil.rmtree(Path(c2.workdir) / "base")
  with pytest.raises(CheckpointMismatch, match="different model"):
    loop.Trainer(from_config(c2)).run()
  c3 = micro_config("focus", tmp_path / "w", steps=4)
  shutil.rmtree(Path(c3.workdir) / "base")  # (else refused first for its other tiny base)
  with pytest.raises(CheckpointMismatch, match="'beacon' run"):
    loop.Trainer(from_config(c3)).run()


def test_resume_refuses_other_base_weights_or_method_config(tmp_path, caplog):
  """Same shapes are not enough: other base weights or another beacon config are refused; a
  checkpoint written before these fingerprint fields existed still resumes (with a warning)."""
  from longjax.ckpts import checkpoint as ckpt
  c = micro_config("beacon", tmp_path / "w", steps=2, save_every=2)
  loop.Trainer(from_config(c)).run()
  base = Path(c.workdir) / "base"
  cfg, params, extra = ckpt.load(base)
  ckpt.save(base, cfg, jax.tree.map(lambda x: np.asarray(x) * 1.01, params), extra=extra,
            overwrite=True)
  c.train.num_steps = 3
  with pytest.raises(CheckpointMismatch, match=r"\(step 2\) is from a different model or method "
                     r"setup \(base weights differ \(content hash [0-9a-f]+ -> [0-9a-f]+\);"):
    loop.Trainer(from_config(c)).run()
  ckpt.save(base, cfg, params, extra=extra, overwrite=True)
  c.beacon.ratios = (4,)
  with pytest.raises(CheckpointMismatch, match=r"setup \(beacon.ratios \[2, 4\] -> \[4\]; "):
    loop.Trainer(from_config(c)).run()
  c.beacon.ratios = (2, 4)
  # today's checkpoints (written before this fingerprint): method, 8 model fields, shapes, digest
  meta_file = Path(c.workdir) / "checkpoints/2/meta/metadata"
  meta = json.loads(meta_file.read_text())
  old_keys = ("family", "vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads",
              "head_dim", "intermediate_size")
  meta_file.write_text(json.dumps(dict(method=meta["method"], digest=meta["digest"],
                                       trainable_shapes=meta["trainable_shapes"],
                                       model={k: meta["model"][k] for k in old_keys})))
  with caplog.at_level("WARNING", logger="longjax.train"):
    out = loop.Trainer(from_config(c)).run()
  assert out["start_step"] == 2 and out["final_step"] == 3
  assert any("predates these fingerprint fields, not checked: model.rope_theta" in r.getMessage()
             and "beacon.ratios" in r.getMessage() and "base_weights" in r.getMessage()
             for r in caplog.records)


def test_config_errors(tmp_path):
  c = micro_config("beacon", tmp_path / "w")
  with c.unlocked():
    c.train.lrr = 1.0
  with pytest.raises(ConfigError,
                     match="unknown config key 'train.lrr' \\(did you mean 'lr'\\?\\)"):
    loop.Trainer(from_config(c))
  p = _run_cli(tmp_path / "x", "--config.train.no_such_key=1", check=False)
  assert p.returncode != 0 and "no_such_key" in p.stderr
  p = run_python(ROOT / "train.py", "--config=" + str(ROOT / "configs/beacon_qwen2.py"),
                 f"--config.workdir={tmp_path / 'q'}", env=ENV, timeout=300)
  assert p.returncode == 1 and "--config.model.checkpoint" in p.stderr
  p = run_python(ROOT / "train.py", "--config=" + str(ROOT / "configs/beacon_qwen2.py"),
                 f"--config.workdir={tmp_path / 'q'}",
                 f"--config.model.checkpoint={tmp_path / 'nope'}",
                 env=ENV, timeout=300)
  assert p.returncode == 1 and "no such directory" in p.stderr


EIGHT = r"""
import json, sys
sys.path.insert(0, "tests")
from train_helpers import micro_config
from longjax import methods
from longjax.run_config import from_config
from longjax.train import loop
import jax
assert jax.device_count() == 8, jax.devices()
c = micro_config(sys.argv[1], sys.argv[2], steps=3, save_every=3, batch=8,
                 mesh=dict(data=2, fsdp=2, tensor=2))
t = loop.Trainer(from_config(c))
t.run()
# the trained alternative projections are split like their base (embed: fsdp, heads: tensor)
spec = t.state["params"]["layers"]["attn"]["alt_q_proj"]["kernel"].sharding.spec
assert tuple(spec) == (None, "fsdp", "tensor", None), spec
"""


@pytest.mark.parametrize("method", ["beacon", pytest.param("focus", marks=pytest.mark.slow)])
def test_eight_fake_devices_match_one(tmp_path, method):
  one = micro_config(method, tmp_path / "one", steps=3, save_every=3, batch=8)
  loop.Trainer(from_config(one)).run()
  env = dict(ENV, XLA_FLAGS="--xla_force_host_platform_device_count=8")
  p = run_python("-c", EIGHT, method, tmp_path / "eight", env=env, timeout=600)
  assert p.returncode == 0, p.stderr[-3000:]
  l1 = [r["loss"] for r in read_metrics(tmp_path / "one")]
  l8 = [r["loss"] for r in read_metrics(tmp_path / "eight")]
  assert len(l1) == len(l8) == 3
  np.testing.assert_allclose(l8, l1, rtol=2e-5, atol=2e-6)


def test_gradient_accumulation_matches_full_batch(tmp_path):
  a = micro_config("beacon", tmp_path / "a", steps=2, save_every=2)
  b = micro_config("beacon", tmp_path / "b", steps=2, save_every=2)
  b.train.grad_accum = 2
  loop.Trainer(from_config(a)).run()
  loop.Trainer(from_config(b)).run()
  ra, rb = read_metrics(a.workdir), read_metrics(b.workdir)
  np.testing.assert_allclose([r["loss"] for r in rb], [r["loss"] for r in ra], rtol=1e-5)
  np.testing.assert_allclose([r["grad_norm"] for r in rb], [r["grad_norm"] for r in ra], rtol=1e-4)


def test_beacon_task_loss_equals_beaconlm_loss(tmp_path):
  """The jitted one-scan training loss equals longjax.beacon's official loss (and its grads)."""
  import jax.numpy as jnp
  from longjax.beacon import BeaconLM
  from longjax.data.tokenizers import get_tokenizer
  from longjax.beacon import task as beacon_task
  c = micro_config("beacon", tmp_path / "w")
  c.beacon.ratios = (4,)
  tok = get_tokenizer("byte")
  cfg, params = loop.load_base(from_config(c), tok, Path(c.workdir))
  params = jax.tree.map(jnp.asarray, params)
  ids = np.random.default_rng(0).integers(3, 200, size=100)
  task = beacon_task.BeaconTask(cfg, methods.get("beacon").settings(from_config(c)),
                                max_length=128, seed=0, step_bucket=4)

  class DS:
    pass
  ds = DS()
  ds.ids, ds.answer = [ids], [None]
  plans = jax.tree.map(jnp.asarray, task.prepare(ds, [0], step=0)["plans"])
  mine = lambda p: (lambda ls, lc: ls[0] / lc[0])(*task.loss(p, plans))
  lm = BeaconLM(cfg, methods.get("beacon").settings(from_config(c)), max_length=128, training=True)
  ref = lambda p: lm.loss(p, ids)
  np.testing.assert_allclose(float(jax.jit(mine)(params)), float(ref(params)), rtol=1e-5)
  ga = jax.grad(mine)(params)["layers"]["attn"]["alt_q_proj"]["kernel"]
  gb = jax.grad(ref)(params)["layers"]["attn"]["alt_q_proj"]["kernel"]
  np.testing.assert_allclose(np.asarray(ga), np.asarray(gb), rtol=1e-4, atol=1e-6)


def test_focus_trains_on_several_decode_steps_per_sample(tmp_path):
  """focus.steps = J scores J teacher-forced decode steps per sample (docs/focusllm.md §5.1), and
  data.loss_on="distill" distills them from the base (§5.2): each run trains, and the first losses
  differ from the one-target run's on the same draws."""
  losses = {}
  for steps, loss_on in ((1, "all"), (3, "all"), (3, "distill")):
    c = micro_config("focus", tmp_path / f"s{steps}{loss_on}", steps=2, save_every=2)
    c.focus.steps = steps
    c.data.loss_on = loss_on
    out = loop.Trainer(from_config(c)).run()
    assert out["final_step"] == 2
    m = read_metrics(c.workdir)
    assert all(np.isfinite(r["loss"]) for r in m)
    losses[steps, loss_on] = m[0]["loss"]
  assert len(set(losses.values())) == 3


def test_step_records_count_programs_and_padding():
  """``programs`` counts distinct plan shapes (what jit compiles once each); ``padding_share``
  pools the micro-batches' (real, computed) positions."""
  count = loop._ProgramCount()
  prep = lambda n, occ: dict(plans=dict(tokens=np.zeros((2, n), np.int32)), occupancy=occ)
  assert count.record([prep(8, (12, 16))]) == dict(programs=1, padding_share=0.25)
  assert count.record([prep(8, (16, 16))]) == dict(programs=1, padding_share=0.0)
  assert count.record([prep(16, (8, 32)), prep(8, (16, 16))]) == dict(programs=2,
                                                                       padding_share=0.5)


def test_focus_samples_too_short_for_the_decode_steps_are_refused_before_training(tmp_path):
  """With focus.steps = J a sample drawn the official way needs W + J - 1 tokens: one error at
  setup naming the fix, not a failure at the batch that first holds such a sample."""
  from longjax.data.errors import DataError
  c = micro_config("focus", tmp_path / "short", steps=1)
  c.data.synthetic.min_chars, c.data.synthetic.max_chars = 30, 60  # samples of 44+ tokens
  c.data.min_length = 40
  c.focus.steps = 20  # 32 + 20 - 1 = 51
  with pytest.raises(DataError, match=r"raise data.min_length to 51 or lower focus.steps"):
    loop.Trainer(from_config(c)).setup()
  c.data.min_length = 51  # every sample long enough: the same run sets up
  loop.Trainer(from_config(c)).setup()
