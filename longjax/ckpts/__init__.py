"""Checkpoints: reading, writing and acquiring weights (HF safetensors and the conversion table,
GGUF, the SmolLM2 fetch, longjax checkpoints, trained method assets, atomic directory writes)."""
from longjax.ckpts.hf import CheckpointError, load_hf, save_hf
from longjax.ckpts.table import ROWS, expected_names

__all__ = ["CheckpointError", "load_hf", "save_hf", "ROWS", "expected_names"]
