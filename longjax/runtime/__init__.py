"""Runtime plumbing below every model and method: the CLI helpers, compiled-program caches and
the integer rounding of static shapes."""
