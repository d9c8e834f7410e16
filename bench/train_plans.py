r"""What a training run's host planning hands the device: distinct step programs and padding.

    JAX_PLATFORMS=cpu python -m bench.train_plans --config=configs/smollm2_focus.py \
        [--config.data.sources=...] [--steps 100] [--name train_plans_focus]

Plans the first ``--steps`` global batches of the run the config describes exactly as train.py
does (``Trainer._prepare``: same data, seed, draws and static shapes), without running them, and
reports per step the real and computed token positions and how many distinct step programs
(plan structure + leaf shapes, what ``jax.jit`` compiles once each) the run has needed so far. A
new program costs a compile (tens of seconds on CPU for a SmolLM2 step); padding costs compute.
train.py records the same two numbers per step in ``metrics.jsonl`` (``programs``,
``padding_share``). Results: ``bench/results/<name>.{json,md}``.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

if __package__ in (None, ""):
  sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from absl import app, flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from bench import harness as H  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", None, "train.py config file",
                                          lock_config=True)
_STEPS = flags.DEFINE_integer("steps", 100, "global batches to plan")
_NAME = flags.DEFINE_string("name", "", "results name (default: train_plans_<method>)")


def plan_steps(trainer, steps: int) -> list:
  """Per step: tokens, real and computed positions, distinct programs so far, planning seconds."""
  from longjax.train.loop import _ProgramCount
  count, rows = _ProgramCount(), []
  for step in range(1, steps + 1):
    t0 = time.perf_counter()
    preps = trainer._prepare(step)
    dt = time.perf_counter() - t0
    rec = count.record(preps)
    real, computed = (sum(x) for x in zip(*(p["occupancy"] for p in preps)))
    rows.append(dict(step=step, tokens=sum(p["tokens"] for p in preps), real=real,
                     computed=computed, programs=rec["programs"], plan_s=round(dt, 4)))
  return rows


def summarise(rows: list) -> dict:
  real = sum(r["real"] for r in rows)
  computed = sum(r["computed"] for r in rows)
  firsts = [r["step"] for i, r in enumerate(rows)
            if r["programs"] > (rows[i - 1]["programs"] if i else 0)]
  return dict(steps=len(rows), programs=rows[-1]["programs"], new_program_at_steps=firsts,
              padding_share=round(1 - real / max(computed, 1), 4),
              tokens_per_step=round(sum(r["tokens"] for r in rows) / len(rows), 1),
              computed_per_step=round(computed / len(rows), 1),
              plan_s_per_step=round(H.median([r["plan_s"] for r in rows]), 4))


def render(payload) -> str:
  s = payload["summary"]
  return "\n".join([
      f"# Training plans: {payload['method']} (`{payload['config']}`)", "",
      H.machine_md(payload["machine"]), "",
      f"`{payload['command']}`", "",
      f"Planned {s['steps']} global batches (global batch {payload['global_batch']}) without "
      "running them.", "",
      "| steps | distinct step programs | new program at steps | padding share | document "
      "tokens / step | computed positions / step | host planning s / step |",
      "|---|---|---|---|---|---|---|",
      f"| {s['steps']} | {s['programs']} | {', '.join(map(str, s['new_program_at_steps']))} | "
      f"{100 * s['padding_share']:.1f} % | {s['tokens_per_step']:,.0f} | "
      f"{s['computed_per_step']:,.0f} | {s['plan_s_per_step']} |", ""])


def main(argv):
  del argv
  if _CONFIG.value is None:
    sys.exit("train_plans needs --config=configs/<name>.py")
  import tempfile
  from longjax.run_config import from_config
  from longjax.train.loop import Trainer
  config = _CONFIG.value.unlock()
  with tempfile.TemporaryDirectory() as tmp:
    # setup() writes into the workdir (a tiny base's cache): never into a real run's
    config.workdir = tmp
    config.train.init_from = ""  # the trained tensors do not change the plans
    run = from_config(config)
    trainer = Trainer(run)
    trainer.setup()
    rows = plan_steps(trainer, _STEPS.value)
  cfg_path = config_flags.get_config_filename(flags.FLAGS["config"])
  payload = dict(method=run.method, config=cfg_path,
                 command=" ".join(["python -m bench.train_plans"] + sys.argv[1:]),
                 global_batch=run.train.global_batch, machine=H.machine_info(),
                 summary=summarise(rows), steps=rows)
  name = _NAME.value or f"train_plans_{run.method}"
  path = H.write_results(name, payload, render(payload))
  print(render(payload))
  print(f"wrote {path}")


if __name__ == "__main__":
  app.run(main)
