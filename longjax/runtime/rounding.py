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


def next_half_octave(n: int) -> int:
  """The smallest ``2^k`` or ``3 * 2^k`` that is ``>= n`` (1 for ``n <= 1``): 1, 2, 3, 4, 6, 8,
  12, 16, ... Twice the buckets of :func:`next_pow2`, padding below 1.5x instead of 2x."""
  p = next_pow2(n)
  return 3 * p // 4 if p >= 4 and 3 * p // 4 >= int(n) else p


def is_pow2(n: int) -> bool:
  return n > 0 and (n & (n - 1)) == 0
