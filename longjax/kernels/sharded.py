"""Pallas kernel calls on operands spread over several devices: one ``jax.shard_map`` per call.

XLA cannot partition a Pallas custom call (TPU: "Mosaic kernels cannot be automatically
partitioned. Please wrap the call in a shard_map"; GPU: the operands would be gathered onto every
device). :func:`per_shard` runs a kernel forward ``fwd(q, k, v, km) -> (out, lse)`` on each
device's rows instead: attention is independent per batch row and per KV head (with its query
heads), so the call splits over

* the **batch** axis over the mesh axes ``data`` and ``fsdp`` (the project's batch axes,
  ``longjax.train.sharding.LOGICAL_RULES``) and any other mesh axis it does not know, and
* the **head** axes over ``tensor`` (the project's ``heads`` / ``kv_heads`` axis) when its size
  divides the KV heads (each device then holds whole GQA groups); otherwise ``tensor`` is treated
  as a batch axis.

An axis whose size does not divide what it would split is left out of the specs: the operands are
replicated over it and each of its devices computes the same rows (correct, only redundant; e.g.
a decode step with batch 1). ``shard_map`` reshards the operands to these specs itself.

The mesh is the context mesh (``jax.set_mesh`` / ``jax.sharding.use_abstract_mesh``), else the
mesh the operands' shardings name (inside ``jit`` a value derived from sharded arguments carries
it), else there is none and the call runs as is. A mesh of one device, or one whose axes are all
manual already (the call sits inside an enclosing ``shard_map``), also leaves the call as is, so
single-device programs and CPU runs are unchanged. Otherwise every axis that is not manual yet
becomes manual (Mosaic refuses a partially manual context), those of size 1 included.
"""
from __future__ import annotations

import functools
import math

import jax
from jax.sharding import PartitionSpec as P

from longjax.kernels.mask import KernelMeta

# Mirrors longjax.train.sharding.LOGICAL_RULES (tests/test_kernels_sharded.py checks they agree).
BATCH_AXES = ("data", "fsdp")
HEAD_AXES = ("tensor",)


def _nonempty(mesh) -> bool:
  return mesh is not None and not getattr(mesh, "empty", False) and len(mesh.axis_names) > 0


def current_mesh(*operands):
  """The mesh a kernel call on ``operands`` runs under (see module docstring), or ``None``."""
  mesh = jax.sharding.get_abstract_mesh()
  if _nonempty(mesh):
    return mesh
  for x in operands:
    sharding = getattr(jax.typeof(x), "sharding", None)
    mesh = getattr(sharding, "mesh", None)
    if _nonempty(mesh):
      return mesh
  return None


def _auto_axes(mesh) -> tuple:
  """Mesh axes not manual already (an enclosing ``shard_map`` makes its axes manual)."""
  manual = jax.sharding.AxisType.Manual
  types = getattr(mesh, "axis_types", None) or (None,) * len(mesh.axis_names)
  return tuple(a for a, t in zip(mesh.axis_names, types) if t != manual)


def split_axes(mesh, batch: int, kv_heads: int):
  """``(batch_axes, head_axes)``: the mesh axes the batch and the heads split over (possibly
  empty), or ``None`` when the call needs no ``shard_map`` (no mesh, one device, or every axis
  manual already)."""
  if mesh is None or math.prod(mesh.shape.values()) == 1 or not _auto_axes(mesh):
    return None
  free = tuple(a for a in _auto_axes(mesh) if mesh.shape[a] > 1)
  heads, rows = [], []
  for a in free:
    if a in HEAD_AXES and kv_heads % (math.prod(mesh.shape[h] for h in heads) * mesh.shape[a]) == 0:
      heads.append(a)
    else:
      rows.append(a)
  batch_axes = []
  for a in sorted(rows, key=lambda a: a not in BATCH_AXES):  # data, fsdp first (stable)
    if batch % (math.prod(mesh.shape[b] for b in batch_axes) * mesh.shape[a]) == 0:
      batch_axes.append(a)
  return tuple(batch_axes), tuple(heads)


def _entry(axes):
  return None if not axes else (axes[0] if len(axes) == 1 else tuple(axes))


def per_shard(fwd, q, k, v, km: KernelMeta):
  """``fwd(q, k, v, km)`` run per device under one ``jax.shard_map`` when a multi-device mesh is
  active; ``fwd(q, k, v, km)`` itself otherwise. ``q [B, Tq, Hq, D]``, ``k``/``v [B, Tk, Hkv, D]``,
  ``km`` fields ``[B, T]``; returns ``(out [B, Tq, Hq, D], lse [B, Hq, Tq])``."""
  mesh = current_mesh(q, k, v)
  split = split_axes(mesh, q.shape[0], k.shape[2])
  if split is None:
    return fwd(q, k, v, km)
  batch_axes, head_axes = split
  b, h = _entry(batch_axes), _entry(head_axes)
  x_spec = P(b, None, h, None)
  meta_spec = jax.tree.map(lambda _: P(b, None), km)
  if jax.sharding.AxisType.Explicit in tuple(getattr(mesh, "axis_types", ())):
    # Explicit axes: shard_map takes operands only in its in_specs' layout.
    q, k, v = (jax.sharding.reshard(x, x_spec) for x in (q, k, v))
    km = jax.tree.map(jax.sharding.reshard, km, meta_spec)
  fn = jax.shard_map(fwd, mesh=mesh, in_specs=(x_spec, x_spec, x_spec, meta_spec),
                     out_specs=(x_spec, P(b, h, None)), axis_names=set(_auto_axes(mesh)),
                     check_vma=False)
  return fn(q, k, v, km)


def wrap(fwd):
  """``fwd`` made to run per shard (:func:`per_shard`); hashable (``attention_with_vjp`` takes
  it as a static argument)."""
  return functools.partial(per_shard, fwd)
