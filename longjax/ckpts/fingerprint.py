"""Content fingerprints of weight trees: how a training run, an eval resume or a results file
tells one model from another by its weights, never by its path (a checkpoint retrained in place
keeps its path)."""
from __future__ import annotations

import hashlib

import jax
import numpy as np


def weights_hash(tree) -> str:
  """A cheap content hash of a weight tree: every name, shape and dtype plus up to 4096 evenly
  strided values of each tensor (another fine-tune or seed changes them; a 7B base hashes in
  well under a second)."""
  h = hashlib.sha256()
  for path, x in sorted(jax.tree_util.tree_leaves_with_path(tree),
                        key=lambda t: jax.tree_util.keystr(t[0])):
    x = np.asarray(x)
    flat = x.reshape(-1)
    h.update(f"{jax.tree_util.keystr(path)}:{x.shape}:{x.dtype};".encode())
    h.update(np.ascontiguousarray(flat[::max(1, flat.size // 4096)][:4096]).tobytes())
  return h.hexdigest()[:16]


def weights_hash_full(tree) -> str:
  """A hash of every byte of a weight tree (names, shapes, dtypes and all values): a base changed
  in a few values that :func:`weights_hash` does not sample is told apart too. One read of the
  weights per run (~1 s per GB)."""
  h = hashlib.blake2b(digest_size=16)
  for path, x in sorted(jax.tree_util.tree_leaves_with_path(tree),
                        key=lambda t: jax.tree_util.keystr(t[0])):
    x = np.ascontiguousarray(np.asarray(x))
    h.update(f"{jax.tree_util.keystr(path)}:{x.shape}:{x.dtype};".encode())
    h.update(memoryview(x.reshape(-1).view(np.uint8)))
  return h.hexdigest()
