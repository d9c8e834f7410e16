"""The micro beacon config of the multi-process tests (tests/test_train_multiprocess.py): one
layer (the step compiles in about half the time of two: the second process of a CPU run never
finds it in the persistent cache), a constant learning rate (stopping at num_steps=4 and
continuing to 6 is then the same trajectory as running to 6), no TensorBoard (its import costs
seconds) and no export unless asked for."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_helpers import micro_config  # noqa: E402


def get_config():
  c = micro_config("beacon", "runs/multiprocess", steps=6, save_every=2)
  c.model.num_layers = 1
  c.train.warmup_steps = 0
  c.train.end_lr = c.train.lr
  c.train.tensorboard = False
  c.train.export = False
  c.train.async_checkpoint = True
  return c
