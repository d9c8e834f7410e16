"""Train Activation Beacon / FocusLLM parameters on a frozen base model.

  python train.py --config=configs/tiny_beacon.py [--config.workdir=...]
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
    sys.exit("train.py needs --config=configs/<name>.py (e.g. configs/tiny_beacon.py)")
  sys.exit(f"train.py: training ({config.get('method', '?')}) is not built yet in this version of "
           "longjax (tracked in the training issue). Use `python scripts/demo.py` for the "
           "convert-and-generate demo.")


if __name__ == "__main__":
  app.run(main)
