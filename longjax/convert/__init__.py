"""Weight conversion between HF checkpoints and longjax (a mapping table + per-key transforms)."""
from longjax.convert.hf import CheckpointError, load_hf, save_hf
from longjax.convert.table import ROWS, expected_names

__all__ = ["CheckpointError", "load_hf", "save_hf", "ROWS", "expected_names"]
