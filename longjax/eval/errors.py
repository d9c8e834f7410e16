"""The one exception type of longjax.eval: bad settings or bad data, with what to do about it."""


class EvalError(ValueError):
  """A bad evaluation setting or input (task name, data directory, dataset file, grid)."""
