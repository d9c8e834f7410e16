"""Attention for longjax: one entry point, one mask description, several implementations."""
from longjax.kernels.mask import NO_WINDOW, MaskRule, TokenMeta, allowed
from longjax.kernels.attention import attention

__all__ = ["attention", "allowed", "MaskRule", "TokenMeta", "NO_WINDOW"]
