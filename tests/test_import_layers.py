"""The layers of docs/architecture.md, checked against the code's imports: every import (module
level or inside a function) of a repository file points to its own layer or a lower one, and the
files of the package import each other without a circle. A move that breaks the picture fails
here, naming the file, the import and both layers."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Top to bottom, as the picture in docs/architecture.md ("The layers"). A path ending in "/" is a
# folder; the longest matching entry wins.
LAYERS = [
    ("entry points", ["train.py", "eval.py", "convert_weights.py", "scripts/", "bench/",
                      "experiments/", "configs/", "hardware/", "longjax/beacon/__main__.py",
                      "longjax/focus/__main__.py"]),
    ("running", ["longjax/train/", "longjax/eval/"]),
    ("the registry and the package's face", ["longjax/methods.py", "longjax/__init__.py"]),
    ("the methods", ["longjax/beacon/", "longjax/focus/", "longjax/plain/"]),
    ("inference, checkpoints, data", ["longjax/inference/", "longjax/ckpts/", "longjax/data/"]),
    ("the decoder", ["longjax/models/"]),
    ("kernels, run config", ["longjax/kernels/", "longjax/run_config/"]),
    ("the ground floor", ["longjax/runtime/", "longjax/method_names.py", "longjax/errors.py"]),
]


def layer_of(rel: str) -> int:
  best, found = -1, None
  for i, (_, paths) in enumerate(LAYERS):
    for p in paths:
      if (rel == p or (p.endswith("/") and rel.startswith(p))) and len(p) > best:
        best, found = len(p), i
  return found


def _sources():
  for path in sorted(ROOT.rglob("*.py")):
    rel = path.relative_to(ROOT).as_posix()
    if not rel.startswith((".", "tests/")) and "/." not in rel and "__pycache__" not in rel:
      yield rel


def _resolve(dotted: str):
  """The repository file a dotted module name loads (``None``: not ours)."""
  base = ROOT.joinpath(*dotted.split("."))
  for cand in (base.with_suffix(".py"), base / "__init__.py"):
    if cand.is_file():
      return cand.relative_to(ROOT).as_posix()
  return None


def imports(rel: str):
  """``(line, module file)`` of every import of ``rel`` that names a repository file: ``from a.b
  import c`` counts as a.b.c where c is a module, else as a.b."""
  tree = ast.parse((ROOT / rel).read_text(), rel)
  for node in ast.walk(tree):
    targets = []
    if isinstance(node, ast.Import):
      targets = [_resolve(a.name) for a in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
      targets = [_resolve(f"{node.module}.{a.name}") for a in node.names]
      if not all(targets):  # some names are defined in the module itself, not submodules
        targets.append(_resolve(node.module))
    for target in targets:
      if target and target != rel:
        yield node.lineno, target


def test_every_file_has_a_layer():
  missing = [rel for rel in _sources() if layer_of(rel) is None]
  assert not missing, f"files on no layer (add them to LAYERS and the picture): {missing}"


def test_imports_point_down():
  upward = []
  for rel in _sources():
    for line, target in imports(rel):
      if layer_of(target) < layer_of(rel):
        upward.append(f"{rel}:{line} imports {target} ({LAYERS[layer_of(rel)][0]} -> "
                      f"{LAYERS[layer_of(target)][0]})")
  assert not upward, "imports from a lower layer to a higher one:\n" + "\n".join(upward)


def test_no_import_circles_in_the_package():
  # A package's __init__.py only hands names on: it is left out, as python resolves it first.
  graph = {rel: {t for _, t in imports(rel) if not t.endswith("__init__.py")}
           for rel in _sources() if rel.startswith("longjax/") and not rel.endswith("__init__.py")}
  state, stack = {}, []

  def visit(n):
    state[n] = 1
    stack.append(n)
    for m in sorted(graph.get(n, ())):
      if state.get(m) == 1:
        pytest.fail("import circle: " + " -> ".join(stack[stack.index(m):] + [m]))
      if m not in state:
        visit(m)
    stack.pop()
    state[n] = 2

  for n in sorted(graph):
    if n not in state:
      visit(n)


def test_the_check_catches_an_upward_import():
  """The checker itself: a kernel file importing the beacon package is an upward import."""
  assert layer_of("longjax/kernels/mask.py") > layer_of("longjax/beacon/model.py")
  assert layer_of("longjax/beacon/model.py") > layer_of("longjax/methods.py")
  src = "from longjax.beacon import model\nimport longjax.methods\n"
  tree_imports = [t for node in ast.walk(ast.parse(src)) for t in (
      [_resolve(f"{node.module}.{a.name}") for a in node.names] if isinstance(node, ast.ImportFrom)
      else [_resolve(a.name) for a in node.names] if isinstance(node, ast.Import) else [])]
  assert tree_imports == ["longjax/beacon/model.py", "longjax/methods.py"]


METHOD_PACKAGES = ("longjax/beacon/", "longjax/focus/", "longjax/plain/")


def test_inference_and_the_methods_meet_only_through_the_protocol():
  """``longjax/inference`` drives any method through ``longjax.models.protocol`` and imports no
  method; a method implements the protocol and imports nothing of ``longjax/inference`` (only its
  command-line entry point, ``__main__.py``, calls ``generate``)."""
  found = []
  for rel in _sources():
    for line, target in imports(rel):
      if rel.startswith("longjax/inference/") and target.startswith(METHOD_PACKAGES):
        found.append(f"{rel}:{line} imports {target}")
      if (rel.startswith(METHOD_PACKAGES) and not rel.endswith("__main__.py")
          and target.startswith("longjax/inference/")):
        found.append(f"{rel}:{line} imports {target}")
  assert not found, "\n".join(found)


def test_few_loose_modules_at_the_top_of_the_package():
  """The package's top holds its face (``__init__``), the method registry, the method names and
  the errors; everything else lives in a package that says what it is."""
  loose = sorted(p.name for p in (ROOT / "longjax").glob("*.py"))
  assert loose == ["__init__.py", "errors.py", "method_names.py", "methods.py"], loose
