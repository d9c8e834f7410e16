"""Entry points parse their configs and fail clearly for what is not built yet."""
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _run(*args):
  return subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True,
                        env={"JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin"}, timeout=300)


@pytest.mark.parametrize("script", ["train.py", "eval.py"])
def test_stub_entry_points_parse_config_and_explain(script):
  r = _run(script, "--config=configs/tiny_beacon.py")
  assert r.returncode != 0 and "not built yet" in r.stderr
  r = _run(script, "--config=configs/tiny_beacon.py", "--config.no_such_key=1")
  assert r.returncode != 0 and "no_such_key" in r.stderr


def test_demo_runs(tmp_path):
  r = _run("scripts/demo.py", "--workdir", str(tmp_path), "--max_new_tokens", "4")
  assert r.returncode == 0, r.stderr
  assert "bit-exact: True" in r.stdout and "generated 4 tokens" in r.stdout
