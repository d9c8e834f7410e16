"""longjax benchmarks (issue 8): see bench/README.md."""
