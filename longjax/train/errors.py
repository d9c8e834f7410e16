"""The error of a training run that cannot go on (``longjax.train``)."""
from longjax.errors import LongjaxError


class TrainingError(LongjaxError, RuntimeError):
  """A training run cannot go on (checkpoints unreadable, a non-finite loss, a config clash...)."""
