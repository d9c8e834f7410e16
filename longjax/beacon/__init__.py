"""Activation Beacon (Zhang et al., arXiv 2401.03462; official FlagEmbedding code) on longjax.

* ``BeaconConfig``: settings (official ``beacon_*`` fields), validated on construction.
* ``BeaconLM``: planner + jitted window step + ``lax.scan`` prefill + loss; a ``longjax.generate``
  method (``prefill`` / ``step``), multi-turn via ``resume``; its host planning ``lm.schedule``
  (``Schedule``: query slots, memory buckets, stacked plans).
* ``load_beacon`` / ``save_beacon``: official checkpoints in and out.
"""
from longjax.beacon.config import BeaconConfig, BeaconConfigError, adapt_ratio
from longjax.beacon.convert import load_beacon, save_beacon
from longjax.beacon.memory import BeaconState
from longjax.beacon.model import BeaconLM, BeaconSetupError, ForwardOutput
from longjax.beacon.planner import MemoryFullError, Planner, RowState
from longjax.beacon.schedule import CapacityError, Schedule

__all__ = ["BeaconConfig", "BeaconConfigError", "adapt_ratio", "load_beacon", "save_beacon",
           "BeaconState", "BeaconLM", "BeaconSetupError", "CapacityError", "ForwardOutput",
           "MemoryFullError", "Planner", "RowState", "Schedule"]
