"""Evaluate long-context models (passkey, needle, perplexity, LongBench, InfiniteBench).

  python eval.py --config=configs/tiny_beacon.py --config.eval.task=passkey
"""
import sys

from absl import app
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "ml_collections config file (configs/*.py)",
                                          lock_config=True)


def main(argv):
  del argv
  config = _CONFIG.value
  if config is None:
    sys.exit("eval.py needs --config=configs/<name>.py (e.g. configs/tiny_beacon.py)")
  task = config.get("eval", {}).get("task", "?")
  sys.exit(f"eval.py: evaluation task {task!r} is not built yet in this version of longjax "
           "(tracked in the evaluation issue).")


if __name__ == "__main__":
  app.run(main)
