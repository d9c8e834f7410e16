"""The static-shape buckets against their definitions, by enumeration."""
import numpy as np

from longjax.focus.planner import half_octave_bucket, pow2_bucket
from longjax.runtime.rounding import next_half_octave, next_pow2


def test_next_half_octave_is_the_smallest_member_at_or_above():
  members = sorted({2 ** k for k in range(16)} | {3 * 2 ** k for k in range(15)})
  for n in range(0, 3000):
    want = min(m for m in members if m >= max(n, 1))
    assert next_half_octave(n) == want, n
    assert next_half_octave(n) <= next_pow2(n)
  ratios = [next_half_octave(n) / n for n in range(2, 3000)]
  assert 1.49 < max(ratios) < 1.5  # 2^k + 1 -> 3 * 2^(k-1)
  assert max(next_pow2(n) / n for n in range(2, 3000)) > 1.99


def test_half_octave_bucket_pads_less_than_pow2_with_twice_the_widths():
  ns = np.arange(1, 8193)
  half = np.asarray([half_octave_bucket(int(n), 256) for n in ns])
  pow2 = np.asarray([pow2_bucket(int(n), 256) for n in ns])
  assert (half % 256 == 0).all() and (half >= ns).all() and (half <= pow2).all()
  assert sorted(set(half)) == [256, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192]
  assert len(set(pow2)) == 6
  # past two multiples (257 tokens need 512 either way) the padding stays below 1.5x
  assert (half / ns)[ns > 512].max() < 1.5 < (pow2 / ns)[ns > 512].max()
