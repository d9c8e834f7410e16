"""Joining a multi-process run (several hosts of a TPU pod or GPU cluster, or several processes on
one machine): ``jax.distributed.initialize`` with settings checked first.

Where the settings come from, first found wins, each of the three separately:

  coordinator_address  train.cluster.coordinator_address   $JAX_COORDINATOR_ADDRESS
  num_processes        train.cluster.num_processes (> 0)   $JAX_NUM_PROCESSES
  process_id           train.cluster.process_id (>= 0)     $JAX_PROCESS_ID

and what is still missing JAX detects itself on a TPU pod, under SLURM or Open MPI. A launch JAX
cannot detect (processes started by hand, a test) gives all three. Inconsistent settings are one
:class:`DistributedConfigError` naming the problem and the fix, raised before anything connects:
a process that waits for peers that will never come only fails after minutes.
"""
from __future__ import annotations

import dataclasses
import logging
import os
from typing import Mapping, Optional

from longjax.errors import LongjaxError

log = logging.getLogger("longjax.train")

ENV_COORDINATOR = "JAX_COORDINATOR_ADDRESS"
ENV_NUM_PROCESSES = "JAX_NUM_PROCESSES"
ENV_PROCESS_ID = "JAX_PROCESS_ID"
_FIX = (f"give all three of train.cluster.coordinator_address/num_processes/process_id (or "
        f"${ENV_COORDINATOR}, ${ENV_NUM_PROCESSES}, ${ENV_PROCESS_ID}), or none of them on a TPU "
        "pod / SLURM / Open MPI")


class DistributedConfigError(LongjaxError, ValueError):
  pass


@dataclasses.dataclass(frozen=True)
class Cluster:
  """What ``jax.distributed.initialize`` is given; ``None`` = JAX detects it."""
  coordinator_address: Optional[str] = None
  num_processes: Optional[int] = None
  process_id: Optional[int] = None


def _enabled(value) -> str:
  if value is True or str(value).lower() == "true":
    return "true"
  if value is False or str(value).lower() == "false":
    return "false"
  if value is None or str(value).lower() == "auto":
    return "auto"
  raise DistributedConfigError(f"train.distributed={value!r}: use 'auto' (join a multi-process "
                               "run when the environment says so), true or false")


def _setting(cfg: Mapping, key: str, env: Mapping[str, str], var: str, unset):
  """``(value, where it came from)`` of one setting, or ``(None, None)``."""
  v = cfg.get(key, unset) if cfg else unset
  if v is not None and v != unset:
    return v, f"train.cluster.{key}"
  if env.get(var, "").strip():
    return env[var].strip(), f"${var}"
  return None, None


def _as_int(value, where) -> Optional[int]:
  if value is None:
    return None
  try:
    return int(value)
  except (TypeError, ValueError):
    raise DistributedConfigError(f"{where}={value!r} is not an integer") from None


def resolve(enabled="auto", cluster: Optional[Mapping] = None,
            environ: Optional[Mapping[str, str]] = None) -> Optional[Cluster]:
  """The settings to initialize with, or ``None`` for a single-process run; checks them."""
  env = os.environ if environ is None else environ
  mode = _enabled(enabled)
  coord, coord_src = _setting(cluster, "coordinator_address", env, ENV_COORDINATOR, "")
  num, num_src = _setting(cluster, "num_processes", env, ENV_NUM_PROCESSES, 0)
  pid, pid_src = _setting(cluster, "process_id", env, ENV_PROCESS_ID, -1)
  if mode == "false":  # the environment is ignored; a config asking for processes contradicts it
    if num_src and num_src.startswith("train.") and _as_int(num, num_src) > 1:
      raise DistributedConfigError(f"train.distributed=false but {num_src}={num}: set "
                                   "train.distributed to 'auto' (or true) to run on several "
                                   "processes, or drop the cluster settings")
    return None
  num, pid = _as_int(num, num_src), _as_int(pid, pid_src)
  if num is not None and num < 1:
    raise DistributedConfigError(f"{num_src}={num}: the number of processes must be >= 1")
  if pid is not None and num is None:
    raise DistributedConfigError(f"{pid_src}={pid} is given but not the number of processes: "
                                 f"set train.cluster.num_processes (or ${ENV_NUM_PROCESSES}) too; "
                                 + _FIX)
  if num is not None and pid is not None and not 0 <= pid < num:
    raise DistributedConfigError(f"{pid_src}={pid} is outside 0..{num - 1} ({num_src}={num}): "
                                 "each process needs its own id, 0 to num_processes-1")
  if num is not None and num > 1:
    missing = [what for what, v in (("coordinator_address (process 0's host:port)", coord),
                                    (f"process_id (this process's, 0..{num - 1})", pid))
               if v is None]
    if missing:
      raise DistributedConfigError(f"{num_src}={num} but no {' and no '.join(missing)} is "
                                   "given: " + _FIX)
  if coord is not None and (":" not in coord or not coord.rsplit(":", 1)[1].isdigit()):
    raise DistributedConfigError(f"{coord_src}={coord!r} has no port: use host:port of process 0 "
                                 "(e.g. 10.0.0.1:1234), reachable from every process")
  if num == 1:
    return None  # said explicitly: one process
  slurm = env.get("SLURM_NTASKS", "")
  detected = (coord is not None or (slurm.isdigit() and int(slurm) > 1)
              or env.get("TPU_WORKER_HOSTNAMES", "").count(",") > 0)
  if mode == "auto" and not detected:
    return None
  return Cluster(coord, num, pid)


def maybe_initialize(enabled="auto", cluster: Optional[Mapping] = None,
                     environ: Optional[Mapping[str, str]] = None) -> bool:
  """``jax.distributed.initialize`` with :func:`resolve`'s settings when they ask for several
  processes (before any other JAX call). True when this process is part of a multi-process run."""
  import jax
  settings = resolve(enabled, cluster, environ)
  if settings is None:
    return False
  if jax.distributed.is_initialized():  # e.g. a library user who initialized it already
    return True
  _cpu_collectives()
  try:
    jax.distributed.initialize(coordinator_address=settings.coordinator_address,
                               num_processes=settings.num_processes,
                               process_id=settings.process_id)
  except (ValueError, RuntimeError, TypeError) as e:
    given = ", ".join(f"{k}={v}" for k, v in dataclasses.asdict(settings).items())
    raise DistributedConfigError(f"jax.distributed.initialize({given}) failed: {e}; " + _FIX) from e
  log.info("process %d of %d (%d local / %d global devices), coordinator %s",
           jax.process_index(), jax.process_count(), jax.local_device_count(),
           jax.device_count(), settings.coordinator_address or "detected")
  return True


def _cpu_collectives():
  """Cross-process collectives on the CPU backend (multi-process CPU runs, the tests): gloo,
  unless another implementation (mpi) was chosen. A no-op for GPU/TPU computations; it must be
  set before the backend starts, i.e. before initialize."""
  import jax
  try:
    current = jax.config.jax_cpu_collectives_implementation
  except AttributeError:  # a JAX without the option
    return
  if current in (None, "", "none"):
    jax.config.update("jax_cpu_collectives_implementation", "gloo")


# ------------------------------------------------------------------------------------------------
# What the training loop needs from the other processes (no-ops in a single-process run).
def sync(name: str):
  """Wait until every process has reached ``sync(name)``."""
  import jax
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils
    multihost_utils.sync_global_devices(name)


def agree(flag: bool) -> bool:
  """Process 0's ``flag``, on every process."""
  import jax
  if jax.process_count() == 1:
    return bool(flag)
  import numpy as np
  from jax.experimental import multihost_utils
  return bool(multihost_utils.broadcast_one_to_all(np.int32(bool(flag))))


def to_host(tree):
  """Every leaf as a numpy array of its global value, on every process. A leaf that spans other
  processes' devices is gathered (every process must call this with the same tree); the others
  are read as they are (``process_allgather`` would stack them once per process)."""
  import jax
  import numpy as np

  def get(x):
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
      from jax.experimental import multihost_utils
      return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(jax.device_get(x))
  return jax.tree.map(get, tree)
