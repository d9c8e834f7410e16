"""The plain decoder: the base model alone, with a KV cache (``PlainLM``; ``BucketedPlainLM`` pads
prompts to buckets for eval), and its score of a suffix. The truncation and full-attention
baseline of Activation Beacon and FocusLLM, and its training task (``LMTask``, which pretrains the
tiny bases); ``longjax.methods.Plain`` hands them out."""
from longjax.plain.model import BucketedPlainLM, PlainLM, PlainStep
from longjax.plain.scoring import suffix_nll
from longjax.plain.task import LMTask

__all__ = ["PlainLM", "BucketedPlainLM", "PlainStep", "suffix_nll", "LMTask"]
