"""Entry points parse their configs and fail clearly for what is not built yet."""
import pytest

from conftest import run_python


def _run(*args):
  return run_python(*args, env={"JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin"}, timeout=300)


@pytest.mark.parametrize("script", ["train.py", "eval.py"])
@pytest.mark.parametrize("config", ["tiny_beacon", "tiny_focus", "beacon_qwen2", "beacon_llama3",
                                    "focus_llama2"])
def test_entry_points_reject_unknown_config_keys(script, config):
  r = _run(script, f"--config=configs/{config}.py", "--config.no_such_key=1")
  assert r.returncode != 0 and "no_such_key" in r.stderr


@pytest.mark.parametrize("config", ["beacon_qwen2", "beacon_llama3", "focus_llama2"])
def test_real_configs_need_a_checkpoint(config, tmp_path):
  r = _run("train.py", f"--config=configs/{config}.py", f"--config.workdir={tmp_path}")
  assert r.returncode != 0 and "model.checkpoint" in (r.stderr + r.stdout)


def test_demo_runs(tmp_path):
  r = _run("scripts/demo.py", "--workdir", str(tmp_path), "--max_new_tokens", "4")
  assert r.returncode == 0, r.stderr
  assert "bit-exact: True" in r.stdout and "generated 4 tokens" in r.stdout
