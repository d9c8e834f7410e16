"""The errors of longjax.kernels: an attention call it cannot run as asked."""
from longjax.errors import LongjaxError


class KernelError(LongjaxError, ValueError):
  """Bad attention arguments: an unknown implementation or platform, shapes that do not fit."""


class KernelUnavailable(LongjaxError, RuntimeError):
  """The Pallas backend asked for is not in this jax installation."""
