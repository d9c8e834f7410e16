"""What the two Pallas flash kernels (``pallas_gpu``, ``pallas_tpu``) share besides the mask."""
from __future__ import annotations

from jax.experimental import pallas as pl


def flash_cost(q, k):
  """XLA's scheduling hint for one flash forward over ``q [B, Hq, Tq, D]`` and ``k``/``v``
  ``[B, Hkv, Tk, D]``: two matmuls (QK^T, PV) and one exp per score, Q, K and V read once.
  ``None`` on a jax without ``pl.CostEstimate`` (the call then runs without a hint)."""
  if not hasattr(pl, "CostEstimate"):
    return None
  bsz, hq, tq, d = q.shape
  tk = k.shape[2]
  return pl.CostEstimate(flops=4 * bsz * hq * tq * tk * d, transcendentals=bsz * hq * tq * tk,
                         bytes_accessed=(q.size + 2 * k.size) * q.dtype.itemsize)
