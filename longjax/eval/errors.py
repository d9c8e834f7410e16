"""The one exception type of longjax.eval: bad settings or bad data, with what to do about it."""
from longjax.errors import LongjaxError


class EvalError(LongjaxError, ValueError):
  """A bad evaluation setting or input (task name, data directory, dataset file, grid)."""
