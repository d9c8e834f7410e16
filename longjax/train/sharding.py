"""The device mesh and the one table that says how arrays are laid out on it.

Mesh axes: ``data`` (pure data parallelism), ``fsdp`` (data parallelism with parameters split
over it) and ``tensor`` (heads / MLP split). Parameters get *logical* axes from their row of the
conversion table (:func:`longjax.ckpts.layout.logical_axes`); :data:`LOGICAL_RULES` maps logical
axes to mesh axes, once, for every array. A dimension that a mesh axis does not divide is
replicated instead (tiny models on many devices), so one config runs on 1 CPU device, 8 fake CPU
devices or a pod.
"""
from __future__ import annotations

from typing import Mapping

import jax
import numpy as np
from flax import traverse_util
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

from longjax.ckpts.layout import logical_axes
from longjax.errors import LongjaxError

MESH_AXES = ("data", "fsdp", "tensor")

# logical axis -> mesh axes (a tuple shards over several).
LOGICAL_RULES = (
    ("batch", ("data", "fsdp")),
    ("embed", "fsdp"),
    ("vocab", "tensor"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("mlp", "tensor"),
    ("layers", None),
    ("head_dim", None),
    ("norm", None),
    ("alt_rows", None),
)


def maybe_initialize_distributed(enabled="auto", cluster=None):
  """Join a multi-process run when the settings (``train.cluster`` or the ``JAX_*`` env) or the
  environment (TPU pod, SLURM) say so, before any other JAX call; see
  :mod:`longjax.train.distributed`."""
  from longjax.train import distributed
  return distributed.maybe_initialize(enabled, cluster)


class MeshError(LongjaxError, ValueError):
  """A ``train.mesh`` that the devices cannot form."""


def make_mesh(shape: Mapping[str, int]) -> jax.sharding.Mesh:
  """A mesh over all devices; one axis size may be -1 (= whatever is left)."""
  n = jax.device_count()
  sizes = [int(shape.get(a, 1)) for a in MESH_AXES]
  if sizes.count(-1) > 1:
    raise MeshError(f"at most one mesh axis may be -1, got {dict(zip(MESH_AXES, sizes))}")
  if -1 in sizes:
    rest = int(np.prod([s for s in sizes if s != -1]))
    if n % rest:
      raise MeshError(f"{n} devices are not divisible by the fixed mesh axes "
                      f"{dict(zip(MESH_AXES, sizes))}")
    sizes[sizes.index(-1)] = n // rest
  if int(np.prod(sizes)) != n:
    raise MeshError(f"mesh {dict(zip(MESH_AXES, sizes))} needs {int(np.prod(sizes))} devices, "
                    f"{n} are available")
  return jax.make_mesh(tuple(sizes), MESH_AXES, axis_types=(AxisType.Auto,) * 3)


def logical_to_spec(logical, shape, mesh) -> P:
  rules = dict(LOGICAL_RULES)
  used, out = set(), []
  for ax, dim in zip(logical, shape):
    mesh_axes = rules.get(ax)
    if mesh_axes is None:
      out.append(None)
      continue
    mesh_axes = (mesh_axes,) if isinstance(mesh_axes, str) else tuple(mesh_axes)
    mesh_axes = tuple(a for a in mesh_axes if a not in used and mesh.shape[a] > 1)
    size = int(np.prod([mesh.shape[a] for a in mesh_axes])) if mesh_axes else 1
    if not mesh_axes or dim % size:
      out.append(None)
      continue
    used.update(mesh_axes)
    out.append(mesh_axes[0] if len(mesh_axes) == 1 else mesh_axes)
  return P(*out)


def param_shardings(params, mesh):
  """A NamedSharding per leaf of a (nested dict) parameter tree."""
  flat = traverse_util.flatten_dict(params, sep="/")
  out = {k: NamedSharding(mesh, logical_to_spec(logical_axes(k, np.ndim(v)), np.shape(v),
                                                mesh))
         for k, v in flat.items()}
  return traverse_util.unflatten_dict(out, sep="/")


def batch_sharding(mesh, ndim: int, batch_axis: int = 0, size=None):
  """Shard a batch-major array's ``batch_axis`` over (data, fsdp) when it divides."""
  spec = [None] * ndim
  axes = tuple(a for a in ("data", "fsdp") if mesh.shape[a] > 1)
  n = int(np.prod([mesh.shape[a] for a in axes])) if axes else 1
  if axes and (size is None or size % n == 0):
    spec[batch_axis] = axes if len(axes) > 1 else axes[0]
  return NamedSharding(mesh, P(*spec))


def replicated(mesh):
  return NamedSharding(mesh, P())


def put_global(x: np.ndarray, sharding):
  """Host array holding the *global* value -> a global jax.Array (every host passes the same
  global value; each keeps its addressable shards)."""
  x = np.asarray(x)
  return jax.make_array_from_callback(x.shape, sharding, lambda idx: x[idx])
