"""README command 1 as a newcomer runs it: the command CI runs is the README's (extracted, not
copied), .ci/run runs that job and fails with it, and no entry point opens with transformers'
"PyTorch was not found" advice (torch is not in requirements.txt)."""
import ast
import re
import sys
from pathlib import Path

import pytest

from conftest import run_python

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

import readme_command  # noqa: E402

COMMAND_1 = ("python3 -m venv .venv && . .venv/bin/activate && pip install -r requirements.txt && "
             "JAX_PLATFORMS=cpu python scripts/smollm2_passkey.py")
COMMAND_2 = ("python3 -m venv .venv && . .venv/bin/activate && pip install -r requirements-test.txt"
             " && JAX_PLATFORMS=cpu python -m pytest -q")


def test_readme_command_finds_exactly_the_setup_commands():
  assert readme_command.setup_commands((REPO / "README.md").read_text()) == [COMMAND_1, COMMAND_2]
  proc = run_python("scripts/readme_command.py", "1")
  assert proc.returncode == 0 and proc.stdout == COMMAND_1 + "\n" and proc.stderr == ""


@pytest.mark.parametrize("text, words", [
    ("# x\n```bash\nls\n```\n", "no '## Set-up' heading"),
    ("## Set-up\ntext\n## Next\n```bash\nls\n```\n", "no ```bash block"),
    ("## Set-up\n```bash\nls\n", "not closed"),
    ("## Set-up\n```bash\nls \\\n  -l\n```\n", "continues over lines"),
    ("## Set-up\n```bash\n# only a comment\nls\n```\n",
     "command 2 asked, the '## Set-up' block has 1"),
])
def test_readme_command_bad_readme_is_one_line(tmp_path, capsys, text, words):
  readme = tmp_path / "README.md"
  readme.write_text(text)
  assert readme_command.main(["2", "--readme", str(readme)]) == 1
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and words in err[0] and str(readme) in err[0], err


def test_ci_runs_command_1_on_a_fresh_machine_and_fails_with_it():
  """The job's shape (running it takes ~10 min: CI does, tests do not): the command comes from the
  README, a fresh clone in a temporary directory, requirements.txt only, an empty cache, the
  offline switches; .ci/run runs it before the test venv exists and exits with its failure."""
  job = (REPO / ".ci/newcomer").read_text()
  assert "scripts/readme_command.py 1" in job and 'bash -c "$command_1"' in job
  assert "git clone" in job and "mktemp -d" in job and 'LONGJAX_CACHE="$work/cache"' in job
  assert "HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1" in job and "-u VIRTUAL_ENV" in job
  assert "requirements-test" not in job
  run = (REPO / ".ci/run").read_text()
  assert run.index(".ci/newcomer") < run.index("python3 -m venv .venv")
  assert re.search(r'if \[ "\$rc_readme" -ne 0 \]; then exit "\$rc_readme"; fi', run)


ENTRY_POINTS = ["train.py", "eval.py", "convert_weights.py", *sorted(
    str(p.relative_to(REPO)) for d in ("scripts", "experiments", "hardware")
    for p in (REPO / d).glob("*.py"))]


def _imports(node, names):
  if isinstance(node, ast.Import):
    return any(a.name.split(".")[0] in names for a in node.names)
  return isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in names


@pytest.mark.parametrize("path", ENTRY_POINTS)
def test_entry_points_import_longjax_before_transformers(path):
  """longjax/__init__ drops transformers' "PyTorch was not found" advice; that works for every
  entry point that imports longjax before transformers (python -m longjax.* always does): at
  module level, or earlier in the function that imports transformers."""
  tree = ast.parse((REPO / path).read_text())
  module_longjax = [n.lineno for n in tree.body if _imports(n, {"longjax"})]
  functions = (ast.FunctionDef, ast.AsyncFunctionDef)
  scopes = [tree, *(n for n in ast.walk(tree) if isinstance(n, functions))]
  for scope in scopes:
    body = scope.body if scope is tree else list(ast.walk(scope))
    for node in body:
      if not _imports(node, {"transformers"}):
        continue
      before = [n.lineno for n in body if _imports(n, {"longjax"}) and n.lineno < node.lineno]
      if scope is not tree:
        before += module_longjax
      assert before, f"{path}:{node.lineno} imports transformers before any longjax import"


def test_no_entry_point_opens_with_the_torch_notice():
  """Where torch is missing, importing longjax and then transformers prints nothing of torch."""
  code = ("import importlib.util, sys\n"
          "real = importlib.util.find_spec\n"
          "importlib.util.find_spec = lambda n, *a, **k: (None if n.split('.')[0] == 'torch'\n"
          "                                               else real(n, *a, **k))\n"
          "sys.modules['torch'] = None\n"
          "import longjax.ckpts.smollm2, transformers, transformers.utils.import_utils as iu\n"
          "assert not iu.is_torch_available()\n"
          "transformers.logging.get_logger('transformers').warning('other advice stays')\n")
  env = {k: v for k, v in __import__("os").environ.items()
         if k != "TRANSFORMERS_NO_ADVISORY_WARNINGS"}
  proc = run_python("-c", code, env=env, timeout=300)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert "PyTorch was not found" not in proc.stderr and "other advice stays" in proc.stderr


@pytest.mark.parametrize("module, words", [
    ("tensorflow_datasets.core", "'tensorflow-datasets' is not installed: pip install -r "
                                 "requirements.txt (it pins tensorflow-datasets)"),
    ("torch", "'torch' is not installed: pip install -r requirements-test.txt (it pins torch)"),
    ("libtpu", "pip install -r requirements-tpu.txt"),
    ("some_extra", "'some-extra' is not installed: pip install some-extra"),
])
def test_a_missing_package_is_one_line_naming_it_and_the_install_command(capsys, module, words):
  from longjax.runtime import cli

  def fn():
    raise ModuleNotFoundError(f"No module named '{module}'", name=module)

  assert cli.run("prog", fn, compile_cache="off") == 1
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith("prog: error: the Python package ") and words in err[0]
  with pytest.raises(ModuleNotFoundError):  # --debug: the original exception
    cli.run("prog", fn, debug=True, compile_cache="off")


def test_a_missing_longjax_module_is_a_bug_with_its_traceback():
  from longjax.runtime import cli

  def fn():
    raise ModuleNotFoundError("No module named 'longjax.nope'", name="longjax.nope")

  with pytest.raises(ModuleNotFoundError):
    cli.run("prog", fn, compile_cache="off")
