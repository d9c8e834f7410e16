"""The beacon memory as an explicit pytree.

``BeaconState`` holds

* ``k`` / ``v``: per-layer pre-RoPE KV buffers ``[L, B, capacity, Hkv, D]`` (device arrays, the
  pytree's leaves), laid out per row as ``[sink | beacon memory | raw region | free]`` (see
  ``planner.py``);
* ``rows``: one immutable ``RowState`` per batch row (host data: region lengths, window cursors,
  interleave remainder, current ratio, ratio-RNG state), kept as static pytree metadata.

Nothing is mutated: every call takes a state and returns a new one, so a state can be kept,
reused for several follow-up questions, or discarded.
"""
from __future__ import annotations

import dataclasses
from typing import Tuple

import jax
import jax.numpy as jnp
import numpy as np

from longjax.beacon.planner import RowState


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class BeaconState:
  k: jax.Array  # [L, B, C, Hkv, D] pre-RoPE keys
  v: jax.Array  # [L, B, C, Hkv, D] values
  rows: Tuple[RowState, ...] = dataclasses.field(metadata=dict(static=True))

  @property
  def batch(self) -> int:
    return len(self.rows)

  @property
  def capacity(self) -> int:
    return self.k.shape[2]

  def sizes(self) -> np.ndarray:
    """``[B, 3]`` int: (sink, beacon, raw) memory entries per row (official counting)."""
    return np.array([r.sizes for r in self.rows], np.int64).reshape(-1, 3)

  def memory_kv(self, row: int = 0, sink_size: int = 0):
    """The row's memory as the official cat(sink, beacon, raw): ``(k, v)`` ``[L, m, Hkv, D]``."""
    r = self.rows[row]
    k, v = self.k[:, row], self.v[:, row]
    idx = np.concatenate([np.arange(r.sink_len),
                          sink_size + np.arange(r.beacon_len + r.raw_len)]).astype(np.int32)
    return k[:, idx], v[:, idx]


def empty_state(num_layers: int, batch: int, capacity: int, num_kv_heads: int, head_dim: int,
                dtype) -> BeaconState:
  shape = (num_layers, batch, capacity, num_kv_heads, head_dim)
  return BeaconState(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype),
                     tuple(RowState() for _ in range(batch)))
