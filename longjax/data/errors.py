"""The one exception type of longjax.data."""
from longjax.errors import LongjaxError


class DataError(LongjaxError, ValueError):
  """Missing files, unreadable records, an empty dataset: a clear message for the user."""
