r"""Train Activation Beacon / FocusLLM parameters on a frozen base model.

  python train.py --config=configs/tiny_beacon.py [--config.workdir=...] [--noresume]
  python train.py --config=configs/beacon_qwen2.py \
      --config.model.checkpoint=/path/to/Qwen2-7B-Instruct \
      --config.data.sources=jsonl:/path/redpajama/train.json

Everything a run writes goes under --config.workdir: checkpoints/ (orbax: trainable params,
optimizer, data iterator, step; keep-N), metrics.jsonl, tensorboard/ (if a writer is installed),
config.json and export_hf/ (the trained model in HF format, official tensor names), and train.lock
while it runs (a second run on the workdir is refused). Rerunning the same command resumes from the
latest readable checkpoint (--noresume refuses to touch existing checkpoints).

A known failure (bad config key or value, missing file, unreadable checkpoints, a workdir that is
a file or is locked by another run...) ends with one line on stderr and exit status 1; --debug
shows the traceback instead.
"""
import logging
import sys
from pathlib import Path

from absl import app, flags
from ml_collections import config_flags

# The repository root first on sys.path (as eval.py): the config files import ``configs.common``.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from longjax.runtime import cli  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", None,
                                          "ml_collections config file (configs/*.py)",
                                          lock_config=True)
_RESUME = flags.DEFINE_bool("resume", True, "resume from the latest checkpoint in the workdir")
_DEBUG = flags.DEFINE_bool("debug", False, "show the traceback of an error")
_COMPILE_CACHE = flags.DEFINE_string("compile_cache", "auto", cli.COMPILE_CACHE_HELP)


def main(argv):
  del argv
  if _CONFIG.value is None:
    sys.exit("train.py needs --config=configs/<name>.py (e.g. configs/tiny_beacon.py)")
  sys.exit(cli.run("train.py", lambda: _train(_CONFIG.value), debug=_DEBUG.value,
                   compile_cache=_COMPILE_CACHE.value))


def _train(config):
  logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                      force=True)
  for noisy in ("absl", "orbax", "jax._src", "etils"):
    logging.getLogger(noisy).setLevel(logging.WARNING)
  import dataclasses
  from longjax.run_config import from_config
  from longjax.train import sharding
  run = from_config(config)  # the one typed, checked config of this run (a bad key: one line)
  sharding.maybe_initialize_distributed(run.train.distributed,
                                        dataclasses.asdict(run.train.cluster))
  from longjax.train.loop import Trainer
  out = Trainer(run, resume=_RESUME.value).run()  # a known failure: cli.run's one line
  print(f"train.py: done: steps {out['start_step']}..{out['final_step']} in "
        f"{out['seconds']:.1f}s; workdir {Path(run.workdir).absolute()}"
        + (f"; exported {out['export']}" if out.get("export") else ""))


if __name__ == "__main__":
  app.run(main, flags_parser=cli.absl_flags_parser("train.py"))
