"""FocusLLM (leezythu/FocusLLM) on a frozen decoder: chunked parallel condensing into candidate
tokens, a local forward over them, cached decoding, training losses and checkpoint conversion.
Semantics: docs/focusllm.md."""
from longjax.focus.condense import chunk_mesh
from longjax.focus.config import FocusConfig, FocusError
from longjax.focus.convert import focus_from_llama, load_focus, save_focus
from longjax.focus.model import FocusLLM, FocusOutput, FocusState
from longjax.focus.planner import RowPlan, split_prompt, split_training

__all__ = ["FocusConfig", "FocusError", "FocusLLM", "FocusOutput", "FocusState", "chunk_mesh",
           "load_focus", "save_focus", "focus_from_llama", "RowPlan", "split_prompt",
           "split_training"]
