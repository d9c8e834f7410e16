"""Entry points parse their configs and fail clearly for what is not built yet."""
from pathlib import Path

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


# ------------------------------------------------------------------------------------------------
# --help of every entry point: exit 0, the name the user types, example lines kept, every option
# explained with its default. The argparse ones are checked in-process (their parser is all that
# --help runs); train.py / eval.py (absl) and one ``python -m`` run as the user runs them.
import argparse  # noqa: E402
import importlib  # noqa: E402
import importlib.util  # noqa: E402

from conftest import REPO  # noqa: E402

ARGPARSE_ENTRY_POINTS = {  # module or script -> the program name its help must show
    "longjax.beacon.__main__": "python -m longjax.beacon",
    "longjax.focus.__main__": "python -m longjax.focus",
    "longjax.beacon.asset": "python -m longjax.beacon.asset",
    "longjax.focus.asset": "python -m longjax.focus.asset",
    "longjax.ckpts.smollm2": "python -m longjax.ckpts.smollm2",
    "scripts/haystack.py": "scripts/haystack.py",
    "convert_weights.py": "convert_weights.py",
    "scripts/demo.py": "scripts/demo.py",
    "scripts/smollm2_passkey.py": "scripts/smollm2_passkey.py",
    "scripts/tpu_compile_report.py": "scripts/tpu_compile_report.py",
}


def _module(name):
  if not name.endswith(".py"):
    return importlib.import_module(name)
  spec = importlib.util.spec_from_file_location(f"entry_{Path(name).stem}", REPO / name)
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


@pytest.mark.parametrize("name", sorted(ARGPARSE_ENTRY_POINTS))
def test_argparse_help(name, capsys):
  mod = _module(name)
  ap = mod.build_parser()
  with pytest.raises(SystemExit) as e:
    ap.parse_args(["--help"])
  assert e.value.code == 0
  text = capsys.readouterr().out
  assert text.startswith(f"usage: {ARGPARSE_ENTRY_POINTS[name]} "), text[:80]
  # the description as written: each example line of the docstring is a line of the help
  examples = [ln for ln in (mod.__doc__ or "").splitlines() if ln.lstrip().startswith("python ")]
  for line in examples:
    assert line in text.splitlines(), (line, text)
  for action in ap._actions:
    if isinstance(action, argparse._HelpAction):
      continue
    assert action.help, f"{name}: {action.option_strings} has no help text"
    shown = ap._get_formatter()._get_help_string(action)
    assert action.required or "default" in shown.lower(), (name, action.option_strings, shown)
    assert not (action.choices and any("," in str(c) for c in action.choices)
                and action.metavar is None), f"{action.option_strings}: choices read as one list"


@pytest.mark.parametrize("argv, prog", [
    (["train.py", "--help"], "train.py"),
    (["eval.py", "-h"], "eval.py"),
    (["-m", "longjax.beacon", "--help"], "usage: python -m longjax.beacon "),
])
def test_help_as_run(argv, prog):
  r = _run(*argv)
  assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
  assert prog in r.stdout
  mod = argv[0] if argv[0] != "-m" else "longjax/beacon/__main__.py"
  doc = (REPO / mod).read_text()
  # the docstring's continued example (a trailing backslash) is shown as two lines, not one
  cont = [ln for ln in doc.splitlines() if ln.startswith("  python") and ln.endswith("\\")]
  assert cont and all(ln in r.stdout.splitlines() for ln in cont), r.stdout[:1500]
  assert "README's \"Evaluation\"" not in r.stdout
