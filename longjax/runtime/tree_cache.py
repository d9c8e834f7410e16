"""Values derived from a parameter tree, made once per tree and kept while the tree lives.

A decode loop driven from the host calls its jitted step once per token with the same parameter
tree. What a step needs in another form (the layers unstacked for an unrolled loop, the whole
tree replicated over a mesh) would otherwise be re-made, and the weights copied, at every call.
A :class:`TreeCache` keeps one derived value per tree, keyed by the identities of the tree's
leaves: jax arrays are immutable, so the same leaves mean the same values. An ``id`` is unique
only while its object lives, so an entry is dropped as soon as any leaf of its tree is collected.

Trees that cannot be kept are derived afresh at every call: numpy leaves (they may change in
place), tracers (inside a transformation), and trees whose derived value shares leaves with the
input (the entry would keep its own key alive: it could never be dropped).
"""
from __future__ import annotations

import weakref
from typing import Any, Callable, Hashable

import jax


def live_arrays(leaves) -> bool:
  """Every leaf is a concrete jax array (not numpy, not a tracer)."""
  return all(isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer) for x in leaves)


class TreeCache:
  """One derived value per parameter tree (see the module docstring)."""

  def __init__(self):
    self._entries: dict = {}

  def __len__(self) -> int:
    return len(self._entries)

  def get(self, tree, make: Callable[[Any], Any], *extra: Hashable):
    """``make(tree)``, made once per tree of live jax arrays (and per ``extra``, e.g. a mesh)."""
    leaves = jax.tree.leaves(tree)
    if not live_arrays(leaves):
      return make(tree)
    key = extra + tuple(id(x) for x in leaves)
    hit = self._entries.get(key)
    if hit is None:
      hit = make(tree)
      ids = {id(x) for x in leaves}
      if any(id(y) in ids for y in jax.tree.leaves(hit)):
        return hit  # holds its own leaves: an entry would never be dropped
      self._entries[key] = hit
      for x in leaves:
        weakref.finalize(x, self._entries.pop, key, None)
    return hit
