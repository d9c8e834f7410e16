"""The plain decoder: the base model alone, with a KV cache (``PlainLM``; ``BucketedPlainLM`` pads
prompts to buckets for eval), and its score of a suffix. The truncation and full-attention
baseline of Activation Beacon and FocusLLM; ``longjax.methods.Plain`` hands it out."""
from longjax.plain.model import BucketedPlainLM, PlainLM, PlainStep
from longjax.plain.scoring import suffix_nll

__all__ = ["PlainLM", "BucketedPlainLM", "PlainStep", "suffix_nll"]
