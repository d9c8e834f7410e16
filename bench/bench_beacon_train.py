"""Activation Beacon training cost on a real model: forward vs one training step, and peak RSS.

    JAX_PLATFORMS=cpu python -m bench.bench_beacon_train              # SmolLM2-135M-Instruct
    JAX_PLATFORMS=cpu python -m bench.bench_beacon_train --tokens 512 --runs 2

SmolLM2-135M-Instruct (``longjax.ckpts.smollm2.get()``, cached) loaded with
``load_beacon(dir, init="official")``, W = S = 256, ratio 4, beacon q/k/v, fp32, one document of
``--tokens`` random ids. Each measurement runs in its own subprocess; its peak RSS is the
``ru_maxrss`` that ``os.wait4`` returns for it (the whole process: model, compile, runs).

* ``forward``: ``BeaconLM(max_length=T).forward(params, ids)`` (the prefill) and the loss value
  ``BeaconLM(training=True).loss(params, ids)`` only: the RSS of a forward-only process.
* ``grad``: the documented path,
  ``jax.grad(lambda p: BeaconLM(cfg, bcfg, training=True).loss(p, ids))(params)`` (a new
  ``BeaconLM`` every call, as written), after timing both forwards in the same process.
* ``task``: one train.py optimizer step: ``loop.Trainer`` set up from ``configs/smollm2_beacon.py``
  (ratio 4, loss on every token), its ``task.prepare`` on the document and its jitted fused step
  (value_and_grad of the trainable beacon tensors + AdamW), after timing both forwards in the
  same process.
* ``task-noremat``: the same step with ``train.remat=False`` (no recomputation in the backward).

Times are the median of ``--runs`` runs after one warm-up (compile) run. Ratios: step / prefill
and step / loss forward. Results: ``bench/results/beacon_train.{json,md}``.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):
  sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import harness as H  # noqa: E402


def _setup(spec):
  import numpy as np
  from longjax.beacon import BeaconConfig, load_beacon
  from longjax.ckpts import smollm2
  bcfg = BeaconConfig(window=spec["window"], stride=spec["window"], ratios=(spec["ratio"],),
                      param=("q", "k", "v"))
  cfg, bcfg, params = load_beacon(smollm2.get(), init="official", beacon=bcfg)
  ids = np.random.default_rng(0).integers(10, cfg.vocab_size, spec["tokens"])
  return cfg, bcfg, params, ids


def _block(x):
  import jax
  jax.tree.map(lambda a: a.block_until_ready() if hasattr(a, "block_until_ready") else a, x)
  return x


def _timer(fn):
  def run():
    t = time.perf_counter()
    _block(fn())
    return time.perf_counter() - t
  return run


def _forward_timers(cfg, bcfg, params, ids) -> dict:
  """Timers of the prefill and of the loss-value forward of the same tokens."""
  from longjax.beacon import BeaconLM
  lm = BeaconLM(cfg, bcfg, max_length=len(ids))
  return dict(prefill=_timer(lambda: lm.forward(params, ids).next_logits),
              loss_forward=_timer(lambda: BeaconLM(cfg, bcfg, training=True).loss(params, ids)))


def _interleaved(timers: dict, runs: int):
  """Median seconds of each timer after one warm-up, the timers run back to back in every round
  (prefill, loss forward, step, prefill, ...): load from other processes on the host then hits
  all of them alike, so the ratios hold better than with one block of runs per timer."""
  return H.timed_runs(lambda: {k: t() for k, t in timers.items()}, runs=runs, budget_s=1e9)


def worker(spec):
  import jax
  import jax.numpy as jnp
  mode = spec["mode"]
  res = dict(spec)
  t0 = time.perf_counter()
  if mode in ("forward", "grad"):
    from longjax.beacon import BeaconLM
    cfg, bcfg, params, ids = _setup(spec)
    params = jax.tree.map(jnp.asarray, params)
    timers = _forward_timers(cfg, bcfg, params, ids)
    if mode == "grad":
      timers["step"] = _timer(lambda: jax.grad(
          lambda p: BeaconLM(cfg, bcfg, training=True).loss(p, ids))(params))
    fw = _interleaved(timers, spec["runs"])
  else:
    fw = _task(spec)
  res.update(forward=fw)
  if mode != "forward":
    s = fw["median"]["step"]
    res.update(step_s=s, train_tokens_per_s=spec["tokens"] / s,
               step_over_prefill=s / fw["median"]["prefill"],
               step_over_loss_forward=s / fw["median"]["loss_forward"])
  res.update(prefill_s=fw["median"]["prefill"], loss_forward_s=fw["median"]["loss_forward"],
             self_peak_rss_mib=H.peak_rss_mib(), seconds=round(time.perf_counter() - t0, 1))
  H.emit(res)


def _task(spec):
  """train.py's beacon step, built by ``loop.Trainer`` exactly as a run builds it."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  from longjax.ckpts import layout
  from longjax.run_config import from_config
  from longjax.run_config.files import load_config_file
  from longjax.train import loop
  tmp = Path(tempfile.mkdtemp(prefix="bench_beacon_train_"))
  data = tmp / "train.jsonl"
  data.write_text("".join(json.dumps(dict(text="The grass is green. " * spec["tokens"])) + "\n"
                          for _ in range(4)))
  c = load_config_file(Path(__file__).resolve().parents[1] / "configs" / "smollm2_beacon.py")
  c.workdir = str(tmp / "run")
  c.beacon.window = c.beacon.stride = spec["window"]
  c.beacon.ratios = (spec["ratio"],)
  c.data.sources = f"jsonl:{data}"
  c.data.loss_on = "all"  # labels = ids, as the documented path
  c.data.max_length = spec["tokens"]  # sizes the task's BeaconLM (max_length = longest document)
  if spec["mode"] == "task-noremat":  # every activation kept (no recompute in the backward)
    with c.train.ignore_type():  # the config's remat is the string "dots"
      c.train.remat = False
  tr = loop.Trainer(from_config(c))
  tr.setup()
  ids = np.random.default_rng(0).integers(10, tr.cfg.vocab_size, spec["tokens"])

  class DS:  # the one document, where task.prepare reads it
    pass
  ds = DS()
  ds.ids, ds.answer = [ids], [None]
  # The forwards get their own copy of the trainable tensors: the fused step donates its inputs.
  params = layout.merge_trainable(jax.tree.map(jnp.copy, tr.state["params"]), tr.frozen)
  timers = _forward_timers(tr.cfg, tr.task.bcfg, params, ids)
  state = dict(trainable=tr.state["params"], opt=tr.state["opt_state"])

  def step():
    plans = tr._device_plans(tr.task.prepare(ds, [0], step=1)["plans"])
    state["trainable"], state["opt"], m = tr._fused(state["trainable"], state["opt"], tr.frozen,
                                                    plans)
    return m

  timers["step"] = _timer(step)
  return _interleaved(timers, spec["runs"])


NOTE = ("Times are medians after a warm-up of rounds that run prefill, loss forward and step back "
        "to back (load from other processes hits all three alike); with other processes on the "
        "cores (load average above) they vary by about 20 % from run to run, the ratios (same "
        "process) less. Peak RSS is the whole process's (model, compile, runs).")


def run_one(spec, timeout_s):
  """One measurement in a subprocess: its RESULT line plus its peak RSS from ``os.wait4``."""
  env = dict(os.environ, PYTHONPATH=str(H.ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
  env.setdefault("JAX_PLATFORMS", "cpu")
  env.setdefault("HF_HUB_OFFLINE", "1")
  cmd = [sys.executable, "-m", "bench.bench_beacon_train", "--worker", json.dumps(spec)]
  t0 = time.perf_counter()
  with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
    p = subprocess.Popen(cmd, cwd=H.ROOT, env=env, stdout=out, stderr=err, text=True)
    deadline = t0 + timeout_s
    while True:
      pid, status, ru = os.wait4(p.pid, os.WNOHANG)
      if pid:
        break
      if time.perf_counter() > deadline:
        p.kill()
        pid, status, ru = os.wait4(p.pid, 0)
        break
      time.sleep(0.5)
    p.returncode = os.waitstatus_to_exitcode(status)
    out.seek(0)
    err.seek(0)
    lines = out.read().splitlines()
    tail = err.read()[-2000:]
  rss = round(ru.ru_maxrss / 1024, 1)  # KiB on Linux
  for line in reversed(lines):
    if line.startswith("RESULT "):
      return dict(json.loads(line[7:]), status="ok", peak_rss_mib=rss,
                  wall_s=round(time.perf_counter() - t0, 1))
  return dict(spec, status=f"error (rc {p.returncode})", peak_rss_mib=rss, stderr_tail=tail)


def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  ap.add_argument("--worker", help=argparse.SUPPRESS)
  ap.add_argument("--tokens", type=int, default=1024)
  ap.add_argument("--window", type=int, default=256)
  ap.add_argument("--ratio", type=int, default=4)
  ap.add_argument("--runs", type=int, default=3)
  ap.add_argument("--modes", default="forward,grad,task,task-noremat")
  ap.add_argument("--timeout_s", type=float, default=3600)
  ap.add_argument("--out", default="beacon_train")
  a = ap.parse_args()
  if a.worker:
    worker(json.loads(a.worker))
    return
  machine = H.machine_info()
  rows = []
  for mode in a.modes.split(","):
    spec = dict(mode=mode, tokens=a.tokens, window=a.window, ratio=a.ratio, runs=a.runs)
    H.log(f"{mode}: {H.uptime_line()}")
    r = run_one(spec, a.timeout_s)
    H.log(json.dumps({k: r.get(k) for k in ("mode", "status", "prefill_s", "loss_forward_s",
                                            "step_s", "step_over_prefill",
                                            "step_over_loss_forward", "peak_rss_mib")}))
    if r["status"] != "ok":
      H.log(r.get("stderr_tail", ""))
    rows.append(r)
  machine["load_average_end"] = H.load_average()
  table = H.markdown_table(rows, [
      ("mode", "mode"), ("tokens", "tokens"), ("prefill s", "prefill_s"),
      ("loss forward s", "loss_forward_s"), ("step s", "step_s"),
      ("training tokens/s", "train_tokens_per_s"),
      ("step / prefill", "step_over_prefill"), ("step / loss forward", "step_over_loss_forward"),
      ("peak RSS MiB", "peak_rss_mib"), ("status", "status")])
  md = (f"# Beacon training step vs forward (SmolLM2-135M-Instruct, W = S = {a.window}, "
        f"ratio {a.ratio}, fp32)\n\n{H.machine_md(machine)}\n\n{table}\n\n{NOTE}\n")
  H.write_results(a.out, dict(machine=machine, rows=rows), md)
  print(md)


if __name__ == "__main__":
  main()
