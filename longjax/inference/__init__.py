"""Inference: ``generate`` (prefill + decode, on-device or host loop), sampling, teacher-forced
scoring and the ask CLIs. It drives any method through the method protocol (docs/architecture.md)
and imports no method package."""
