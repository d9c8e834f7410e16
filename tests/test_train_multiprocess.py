"""Multi-process training: train.py on 2 processes x 2 CPU devices (jax.distributed with a local
coordinator, gloo collectives) follows the loss trajectory of 1 process x 4 devices; its
checkpoints are written once (one step directory, both processes' shards in it) and either
layout resumes the other's. Inconsistent distributed settings are refused before anything
connects.

Each launch is a fresh ``python train.py`` (a process joins one distributed run only). On CPU
the second process never finds the step in JAX's persistent compilation cache (its key holds a
per-process topology), so each 2-process launch compiles once: the tests keep to one such
launch in the default suite.
"""
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest

from train_helpers import ROOT

from longjax.train import distributed
from longjax.train.distributed import Cluster, DistributedConfigError
from longjax.train.metrics import read_metrics

CONFIG = ROOT / "tests" / "multiprocess_train_config.py"
LAUNCH_TIMEOUT = 300  # s per launch; about 10-30 s each on 2 idle cores
# settings of an enclosing distributed job must not leak into the children
_DROP = ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID", "JAX_LOCAL_DEVICE_IDS",
         "SLURM_NTASKS", "TPU_WORKER_HOSTNAMES", "XLA_FLAGS")


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _env(devices: int, **extra) -> dict:
  env = {k: v for k, v in os.environ.items()
         if k not in _DROP and "proxy" not in k.lower()}  # gRPC would route 127.0.0.1 via a proxy
  # XLA's CPU backend at -O0: compiling the step is most of a 2-process launch (see above) and
  # takes ~40 % less time; every run compared is compiled alike.
  env.update(JAX_PLATFORMS="cpu", HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT),
             XLA_FLAGS=f"--xla_force_host_platform_device_count={devices} "
                       "--xla_backend_optimization_level=0", **extra)
  return env


def _start(workdir: Path, num_steps: int, *, processes: int, devices: int, extra=()):
  """``train.py`` on ``processes`` processes of ``devices`` CPU devices each (not waited for)."""
  port = _free_port() if processes > 1 else None
  runs = []
  for i in range(processes):
    cluster = {} if processes == 1 else dict(JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
                                             JAX_NUM_PROCESSES=str(processes),
                                             JAX_PROCESS_ID=str(i))
    log = workdir.parent / f"{workdir.name}.{processes}x{devices}.p{i}.log"
    with log.open("w") as out:
      p = subprocess.Popen([sys.executable, str(ROOT / "train.py"), f"--config={CONFIG}",
                            f"--config.workdir={workdir}", f"--config.train.num_steps={num_steps}",
                            *extra], cwd=ROOT, env=_env(devices, **cluster), stdout=out,
                           stderr=subprocess.STDOUT)
    runs.append((p, log))
  return runs


def _tails(runs, n=2500) -> str:
  return "\n".join(f"--- {log.name} (rc {p.returncode}):\n{log.read_text()[-n:]}"
                   for p, log in runs)


def _wait(*launches, timeout=LAUNCH_TIMEOUT):
  """Wait for every process; the first failure or the timeout kills the others (a process whose
  peer died waits in a collective for minutes) and fails with each one's output tail."""
  runs = [r for launch in launches for r in launch]
  deadline = time.monotonic() + timeout
  while any(p.poll() is None for p, _ in runs):
    failed = any(p.returncode not in (None, 0) for p, _ in runs)
    if failed or time.monotonic() > deadline:
      for p, _ in runs:
        if p.poll() is None:
          p.kill()
          p.wait()
      what = "failed" if failed else f"did not finish in {timeout}s"
      pytest.fail(f"train.py {what}:\n{_tails(runs)}")
    time.sleep(0.2)
  if any(p.returncode != 0 for p, _ in runs):
    pytest.fail(f"train.py failed:\n{_tails(runs)}")
  return [log.read_text() for _, log in runs]


def _assert_checkpoints(workdir: Path, steps, written_by: dict):
  """Exactly these step directories (no temporary or duplicate ones), each committed, and
  ``written_by[step]`` processes' array metadata in the ones written by several processes: one
  checkpoint written jointly, not one per process."""
  ck = Path(workdir) / "checkpoints"
  assert sorted(p.name for p in ck.iterdir()) == sorted(str(s) for s in steps)
  for s in steps:
    d = ck / str(s)
    assert (d / "_CHECKPOINT_METADATA").is_file(), d
    for item in ("state", "data", "meta"):
      assert (d / item / "commit_success.txt").is_file(), d / item
  for s, n in written_by.items():
    got = sorted(p.name for p in (ck / str(s) / "state" / "array_metadatas").iterdir())
    assert got == [f"process_{i}" for i in range(n)], (s, got)


def _assert_same_trajectory(got_dir, ref_dir, steps):
  got, ref = read_metrics(got_dir), read_metrics(ref_dir)
  assert [r["step"] for r in got] == list(steps) and [r["step"] for r in ref] == list(steps)
  for key in ("tokens", "label_tokens", "lr"):  # the same global batches and schedule
    assert [r[key] for r in got] == [r[key] for r in ref], key
  for key in ("loss", "grad_norm"):
    np.testing.assert_allclose([r[key] for r in got], [r[key] for r in ref], rtol=1e-5,
                               err_msg=key)


def test_two_processes_continue_one_process_run_and_back(tmp_path):
  """1 process x 4 devices to step 6 (the reference); a copy stopped after its step-2
  checkpoint is continued by 2 processes x 2 devices to step 4, then by 1 process again to 6:
  the same trajectory, each checkpoint written once."""
  ref, run = tmp_path / "ref", tmp_path / "run"
  _wait(_start(ref, 6, processes=1, devices=4))
  _assert_checkpoints(ref, [2, 4, 6], {})
  shutil.copytree(ref, run)
  for s in (4, 6):  # as if the run had been stopped after its checkpoint of step 2
    shutil.rmtree(run / "checkpoints" / str(s))
  logs = _wait(_start(run, 4, processes=2, devices=2))
  for i, log in enumerate(logs):
    assert f"process {i} of 2 (2 local / 4 global devices)" in log, log[-2000:]
    assert "resumed from" in log and "step 2" in log, log[-2000:]
  _assert_checkpoints(run, [2, 4], {4: 2})
  log, = _wait(_start(run, 6, processes=1, devices=4))
  assert "step 4" in log and "resumed from" in log, log[-2000:]
  _assert_checkpoints(run, [2, 4, 6], {4: 2, 6: 1})
  _assert_same_trajectory(run, ref, range(1, 7))


@pytest.mark.slow
def test_fresh_two_process_run_matches_one_process(tmp_path):
  """From nothing (the tiny base built by process 0 alone) to the export: 2 processes x 2
  devices and 1 process x 4 devices, launched side by side, train the same tensors."""
  one, two = tmp_path / "one", tmp_path / "two"
  _wait(_start(one, 4, processes=1, devices=4, extra=["--config.train.export=true"]),
        _start(two, 4, processes=2, devices=2, extra=["--config.train.export=true"]))
  _assert_same_trajectory(two, one, range(1, 5))
  _assert_checkpoints(two, [2, 4], {2: 2, 4: 2})
  assert sorted(p.name for p in two.iterdir()) == ["base", "checkpoints", "config.json",
                                                   "export_hf", "metrics.jsonl"]
  from safetensors.numpy import load_file
  a = load_file(str(one / "export_hf" / "model.safetensors"))
  b = load_file(str(two / "export_hf" / "model.safetensors"))
  assert sorted(a) == sorted(b)
  for k in a:
    np.testing.assert_allclose(b[k], a[k], rtol=1e-5, atol=1e-7, err_msg=k)


# ------------------------------------------------------------------------------------------------
# settings
def _resolve(cluster=None, enabled="auto", **env):
  return distributed.resolve(enabled, cluster, environ=env)


def test_distributed_settings_resolve():
  assert _resolve() is None  # a plain single-process run
  assert _resolve(JAX_COORDINATOR_ADDRESS="10.0.0.1:1234", JAX_NUM_PROCESSES="2",
                  JAX_PROCESS_ID="1") == Cluster("10.0.0.1:1234", 2, 1)
  # the config wins over the environment, setting by setting; unset config values defer to it
  assert _resolve(dict(coordinator_address="", num_processes=0, process_id=0),
                  JAX_COORDINATOR_ADDRESS="h:1", JAX_NUM_PROCESSES="2",
                  JAX_PROCESS_ID="1") == Cluster("h:1", 2, 0)
  assert _resolve(JAX_NUM_PROCESSES="1", JAX_PROCESS_ID="0") is None  # one process, said so
  # what JAX detects itself (SLURM, a TPU pod) is left to it
  assert _resolve(SLURM_NTASKS="4") == Cluster()
  assert _resolve(TPU_WORKER_HOSTNAMES="a,b") == Cluster()
  assert _resolve(enabled=True) == Cluster()
  assert _resolve(enabled="false", JAX_COORDINATOR_ADDRESS="h:1", JAX_PROCESS_ID="x") is None


@pytest.mark.parametrize("cluster, env, enabled, match", [
    (None, dict(JAX_PROCESS_ID="1"), "auto",
     r"^\$JAX_PROCESS_ID=1 is given but not the number of processes: set "
     r"train.cluster.num_processes \(or \$JAX_NUM_PROCESSES\) too; give all three of "),
    (dict(num_processes=2, process_id=0), {}, "auto",
     r"^train.cluster.num_processes=2 but no coordinator_address \(process 0's host:port\) "
     r"is given: give all three"),
    (None, dict(JAX_COORDINATOR_ADDRESS="h:1", JAX_NUM_PROCESSES="2"), "auto",
     r"^\$JAX_NUM_PROCESSES=2 but no process_id \(this process's, 0..1\) is given"),
    (dict(coordinator_address="h:1", num_processes=2, process_id=2), {}, "auto",
     r"^train.cluster.process_id=2 is outside 0..1 \(train.cluster.num_processes=2\)"),
    (None, dict(JAX_COORDINATOR_ADDRESS="10.0.0.1", JAX_NUM_PROCESSES="2", JAX_PROCESS_ID="0"),
     "auto", r"^\$JAX_COORDINATOR_ADDRESS='10.0.0.1' has no port: use host:port of process 0"),
    (None, dict(JAX_NUM_PROCESSES="two"), "auto", r"^\$JAX_NUM_PROCESSES='two' is not an integer"),
    (None, dict(JAX_NUM_PROCESSES="0"), "auto", r"the number of processes must be >= 1"),
    (dict(coordinator_address="h:1", num_processes=2, process_id=0), {}, False,
     r"^train.distributed=false but train.cluster.num_processes=2"),
    (None, {}, "maybe", r"^train.distributed='maybe': use 'auto'"),
])
def test_inconsistent_distributed_settings_are_refused_before_connecting(monkeypatch, cluster, env,
                                                                         enabled, match):
  monkeypatch.setattr(jax.distributed, "initialize",
                      lambda *a, **k: pytest.fail("initialize called despite bad settings"))
  with pytest.raises(DistributedConfigError, match=match):
    distributed.maybe_initialize(enabled, cluster, environ=env)


def test_failed_initialize_names_the_settings(monkeypatch):
  def fail(**kw):
    raise ValueError("Number of processes must be defined.")
  monkeypatch.setattr(jax.distributed, "initialize", fail)
  with pytest.raises(DistributedConfigError, match=r"^jax.distributed.initialize\("
                     r"coordinator_address=h:1, num_processes=None, process_id=None\) failed: "
                     r"Number of processes must be defined.; give all three of"):
    distributed.maybe_initialize("auto", None, environ=dict(JAX_COORDINATOR_ADDRESS="h:1"))


def test_cli_refuses_inconsistent_settings_in_one_line(tmp_path):
  env = _env(1, JAX_PROCESS_ID="1")
  p = subprocess.run([sys.executable, str(ROOT / "train.py"), f"--config={CONFIG}",
                      f"--config.workdir={tmp_path / 'w'}"], cwd=ROOT, env=env,
                     capture_output=True, text=True, timeout=300)
  assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr[-2000:]
  assert p.stderr.strip().splitlines()[-1].startswith(
      "train.py: error: $JAX_PROCESS_ID=1 is given but not the number of processes"), p.stderr
  assert not (tmp_path / "w").exists()
