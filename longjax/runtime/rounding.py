"""Integer sizes of buffers and buckets: rounding up to a multiple or to a power of two.

Static shapes are rounded so that few programs compile (one per bucket) and kernels get the block
multiples they need; every module rounds through these two helpers, so a bucket computed in one
place matches the same bucket computed in another.
"""
from __future__ import annotations


def round_up(n: int, m: int) -> int:
  """The smallest multiple of ``m`` that is ``>= n`` (``n >= 0``, ``m >= 1``)."""
  return -(-int(n) // int(m)) * int(m)


def next_pow2(n: int) -> int:
  """The smallest power of two ``>= n`` (1 for ``n <= 1``)."""
  n = int(n)
  return 1 if n <= 1 else 1 << (n - 1).bit_length()


def is_pow2(n: int) -> bool:
  return n > 0 and (n & (n - 1)) == 0
