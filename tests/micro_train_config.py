"""A micro beacon config for the CLI tests (tests/test_train.py)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_helpers import micro_config  # noqa: E402


def get_config():
  c = micro_config("beacon", "runs/micro", steps=5, save_every=2)
  c.train.async_checkpoint = True
  return c
