"""The user's commands (run as files: python scripts/NAME.py); a package so that the tests and
tpu_compile_report.py import compile_only.py as scripts.compile_only."""
