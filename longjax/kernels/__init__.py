"""Attention for longjax: one entry point, one mask description, several implementations.

``attention`` dispatches between the dense reference, the blockwise jnp fallback and the Pallas
kernels (``impl="auto"|"xla"|"chunked"|"blockwise"|"pallas"``); ``explain`` says which one a call
would use and why.
"""
from longjax.kernels.mask import CAUSAL_PREFILL, NO_WINDOW, MaskRule, TokenMeta, allowed
from longjax.kernels.attention import attention, explain

__all__ = ["attention", "explain", "allowed", "MaskRule", "TokenMeta", "NO_WINDOW",
           "CAUSAL_PREFILL"]
