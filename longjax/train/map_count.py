"""How close the process is to the kernel's limit on memory mappings (Linux).

Every program XLA compiles for the CPU maps its code into the process, and a training run whose
batches take many shapes (a beacon run compiles one program per window count, objective and
memory bucket) keeps adding mappings. At the kernel's ``vm.max_map_count`` (65,530 by default)
the next compile fails inside LLVM ("Cannot allocate memory") and the process aborts, however much
RAM is free: a beacon campaign on SmolLM2 most likely died that way at step 173. The trainer
checks the count and stops cleanly first (``Trainer.run``), in single-process runs only: stopping
and saving are collective in a multi-process run, and one process stopping alone would leave the
others waiting.
"""
from __future__ import annotations

from typing import Optional, Tuple

# Stop at this share of the limit: a step may compile several programs at once.
STOP_SHARE = 0.9
# Check every this many steps (reading /proc/self/maps costs about 1.5 us per mapping).
CHECK_EVERY = 10


def usage() -> Optional[Tuple[int, int]]:
  """``(mappings held, vm.max_map_count)``, or None where the kernel does not say (not Linux)."""
  try:
    with open("/proc/sys/vm/max_map_count") as f:
      limit = int(f.read().split()[0])
    with open("/proc/self/maps", "rb") as f:
      held = sum(1 for _ in f)
  except (OSError, ValueError, IndexError):
    return None
  return held, limit


def near_limit() -> Optional[str]:
  """A message saying why to stop, when the mappings are within ``STOP_SHARE`` of the limit."""
  u = usage()
  if u is None or u[0] < STOP_SHARE * u[1]:
    return None
  held, limit = u
  return (f"the process holds {held:,} memory mappings of the kernel's vm.max_map_count = "
          f"{limit:,} (every compiled program adds some; at the limit the next compile aborts "
          f"the process)")
