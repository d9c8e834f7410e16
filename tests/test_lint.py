"""The tree passes ``ruff check`` with the configuration in pyproject.toml (pyflakes, pycodestyle,
lines of at most 100 characters). ruff is one of the test extras."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _ruff():
  exe = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
  if not Path(exe).is_file():
    pytest.fail("ruff is not installed: pip install -r requirements-test.txt")
  return exe


def test_ruff_check_passes():
  r = subprocess.run([_ruff(), "check", "--no-cache", "--output-format", "concise", "."],
                     cwd=REPO, capture_output=True, text=True)
  assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]


def test_the_check_fails_on_a_defect(tmp_path):
  """The same configuration catches an unused import and an over-long line."""
  bad = tmp_path / "bad.py"
  bad.write_text("import os\nx = '" + "a" * 120 + "'\n")
  r = subprocess.run([_ruff(), "check", "--no-cache", "--output-format", "concise",
                      "--config", str(REPO / "pyproject.toml"), str(bad)],
                     capture_output=True, text=True)
  assert r.returncode == 1 and "F401" in r.stdout and "E501" in r.stdout, r.stdout
