"""longjax.runtime.tree_cache.TreeCache: one derived value per tree of live jax arrays, dropped
with it."""
import gc

import jax.numpy as jnp
import numpy as np

from longjax.runtime.tree_cache import TreeCache


def _counting(fn):
  calls = []

  def make(tree):
    calls.append(1)
    return fn(tree)
  return make, calls


def test_kept_per_tree_and_dropped_with_a_leaf():
  cache = TreeCache()
  make, calls = _counting(lambda t: {k: v * 2 for k, v in t.items()})
  tree = {"a": jnp.ones(3), "b": jnp.zeros(2)}
  first = cache.get(tree, make)
  assert cache.get(tree, make) is first and len(calls) == 1
  assert cache.get({"a": tree["a"], "b": tree["b"]}, make) is first  # same leaves, new container
  tree2 = {"a": jnp.ones(3), "b": tree["b"]}
  assert cache.get(tree2, make) is not first and len(calls) == 2 and len(cache) == 2
  assert cache.get(tree, make, "mesh-1") is not first and len(cache) == 3  # extra key
  np.testing.assert_array_equal(first["a"], 2 * np.ones(3))
  del tree["a"]
  gc.collect()
  assert len(cache) == 1  # the two entries made from the collected leaf are gone
  del tree2
  gc.collect()
  assert len(cache) == 0


def test_numpy_leaves_are_derived_at_every_call():
  cache = TreeCache()
  make, calls = _counting(lambda t: {"a": jnp.asarray(t["a"]) + 1})
  host = {"a": np.zeros(2, np.float32)}
  np.testing.assert_array_equal(cache.get(host, make)["a"], [1, 1])
  host["a"][:] = 5  # numpy may change in place: nothing may be kept
  np.testing.assert_array_equal(cache.get(host, make)["a"], [6, 6])
  assert len(calls) == 2 and len(cache) == 0


def test_a_value_holding_its_own_leaves_is_not_kept():
  cache = TreeCache()
  make, calls = _counting(lambda t: {"a": t["a"], "b": t["b"] + 1})
  tree = {"a": jnp.ones(2), "b": jnp.ones(2)}
  out = cache.get(tree, make)
  assert out["a"] is tree["a"] and len(cache) == 0  # an entry would keep its key alive forever
  cache.get(tree, make)
  assert len(calls) == 2
