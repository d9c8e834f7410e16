"""eval.py's hostile and careless inputs: sizes, names and output paths are refused in one line
before the model loads or a document is built; resume and the results file match the model by
its weights, never mix two models, and never silently drop a summary."""
import dataclasses
import json

import numpy as np
import pytest

from longjax.eval import EvalError
from longjax.eval import models as M
from longjax.eval import passkey as P
from longjax.eval.runner import run
from longjax.run_config import from_config
from test_eval import load_config


@pytest.fixture
def no_model(monkeypatch):
  """Loading the model or building a passkey document fails the test: the checks come first."""
  def never(*a, **k):
    raise AssertionError("the model was loaded / a document was built before the check")
  monkeypatch.setattr(M, "build_method", never)
  monkeypatch.setattr(P, "depth_sample", never)
  monkeypatch.setattr(P, "focus_sample", never)


def _run(c):
  return run(from_config(c), log=lambda s: None)


@pytest.mark.parametrize("field,value,match", [
    ("passkey.lengths", (10**9,), r"passkey.lengths: 1000000000 is not an integer in \[1, "),
    ("passkey.lengths", (0,), "passkey.lengths: 0"),
    ("passkey.max_new_tokens", 0, r"passkey.max_new_tokens=0: must be an integer in \[1, "),
    ("model_max_length", -1, "model_max_length=-1"),
    ("chat_template", "bogus", "chat_template='bogus': use 'auto'"),
    ("tag", "../../x", "tag='../../x': must be a plain name"),
    ("tag", "/abs", "tag='/abs': must be a plain name"),
    ("method", "focus", "config.eval.method='focus' needs the config's 'focus' settings section"),
])
def test_bad_settings_are_one_line_before_the_model_loads(tmp_path, no_model, field, value, match):
  c = load_config("tiny_beacon", tmp_path / "wd", output_dir=str(tmp_path / "out"))
  node, *path = field.split(".")
  if path:
    c.eval[node][path[0]] = value
  else:
    c.eval[node] = value
  with pytest.raises(EvalError, match=match):
    _run(c)
  assert not (tmp_path / "out").exists() and not (tmp_path.parent / "x").exists()


def test_huge_focus_garbage_and_perplexity_sizes(tmp_path, no_model):
  c = load_config("tiny_focus", tmp_path / "wd", output_dir=str(tmp_path / "out"))
  c.eval.passkey.n_garbage = (10**12,)
  with pytest.raises(EvalError, match="passkey.n_garbage"):
    _run(c)
  c = load_config("tiny_beacon", tmp_path / "wd", task="perplexity")
  c.eval.perplexity.stride = 10**10
  with pytest.raises(EvalError, match="perplexity.stride"):
    _run(c)


def test_output_dir_that_is_a_file(tmp_path, no_model):
  f = tmp_path / "file"
  f.write_text("mine")
  for out in (f, f / "sub"):
    c = load_config("tiny_beacon", tmp_path / "wd", output_dir=str(out))
    with pytest.raises(EvalError, match="is a file, not a directory"):
      _run(c)
  assert f.read_text() == "mine"


# ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def built(tmp_path_factory):
  c = load_config("tiny_beacon", tmp_path_factory.mktemp("wd"))
  return M.build_method(from_config(c))


def _small(tmp_path):
  c = load_config("tiny_beacon", tmp_path / "wd", output_dir=str(tmp_path / "out"))
  c.eval.passkey.lengths = (320,)
  c.eval.passkey.depths = (0, 100)
  return c


def _fake_generate(calls):
  return lambda ids, n, stops=(): calls.append(1) or ([], "12345")


def test_capacity_is_checked_before_documents_are_built(tmp_path, built, monkeypatch):
  c = _small(tmp_path)
  c.eval.passkey.lengths = (320, 5_000_000)  # under the host bound, over what the model holds
  monkeypatch.setattr(P, "depth_sample", lambda *a, **k: pytest.fail("document built"))
  with pytest.raises(EvalError, match="more than this beacon model can hold"):
    run(from_config(c), "passkey", built=built, log=lambda s: None)


def test_resume_matches_the_weights_not_the_path(tmp_path, built, monkeypatch):
  """A checkpoint retrained in place (same path, other weights): its samples are scored again
  and the results file holds this model's summaries only."""
  c = _small(tmp_path)
  c.eval.task = "passkey,needle"
  from longjax.eval.synthetic import write_all
  data = write_all(tmp_path / "data")
  c.eval.needle.haystack_dir = str(data["haystack"])
  c.eval.needle.lengths = (384,)
  c.eval.needle.depths = (50,)
  old = dataclasses.replace(built)
  calls = []
  monkeypatch.setattr(old, "generate", _fake_generate(calls))
  run(from_config(c), built=old, log=lambda s: None)
  assert len(calls) == 3
  # the same path and description, one weight changed
  params = {**old.params}
  leaf_path = sorted(M.jax.tree_util.tree_leaves_with_path(params), key=str)[0][0]
  params = M.jax.tree_util.tree_map_with_path(
      lambda p, x: x.at[(0,) * x.ndim].add(1) if p == leaf_path else x, params)
  new = dataclasses.replace(old, params=params, weights="")
  monkeypatch.setattr(new, "generate", _fake_generate(calls))
  assert new.fingerprint != old.fingerprint and new.description == old.description
  c.eval.task = "passkey"
  lines = []
  run(from_config(c), built=new, log=lines.append)
  assert len(calls) == 3 + 2, "samples scored by the old weights were reused"
  assert any("other weights (fingerprint" in ln for ln in lines)
  out = tmp_path / "out"
  assert (out / "beacon_passkey.samples.jsonl.stale-1").exists()
  results = json.loads((out / "beacon_results.json").read_text())
  assert set(results) == {"passkey"}, "the results file mixes two models"
  assert results["passkey"]["weights"] == new.fingerprint
  assert any("dropped the summaries of needle" in ln for ln in lines)


def test_damaged_resume_and_results_files(tmp_path, built, monkeypatch):
  c = _small(tmp_path)
  b = dataclasses.replace(built)
  calls = []
  monkeypatch.setattr(b, "generate", _fake_generate(calls))
  run(from_config(c), "passkey", built=b, log=lambda s: None)
  out = tmp_path / "out"
  samples = out / "beacon_passkey.samples.jsonl"
  head, first, second = samples.read_text().splitlines()
  samples.write_text("\n".join([head, "[1, 2]", '"text"', "7", first, second[:10]]) + "\n")
  lines = []
  run(from_config(c), "passkey", built=b, log=lines.append)
  assert len(calls) == 2 + 1  # the cut record is scored again, the whole one reused
  assert any("4 line(s) that are not sample records" in ln for ln in lines)
  # a results file cut by a kill: moved aside, the summaries recovered from the task files
  results = out / "beacon_results.json"
  whole = json.loads(results.read_text())
  other = {**whole["passkey"], "task": "needle"}
  (out / "beacon_needle.json").write_text(json.dumps(other))
  results.write_text(results.read_text()[:25])
  c.eval.passkey.depths = (0,)  # another settings file for passkey: reruns, keeps needle
  lines = []
  run(from_config(c), "passkey", built=b, log=lines.append)
  assert (out / "beacon_results.json.damaged-1").exists()
  assert set(json.loads(results.read_text())) == {"passkey", "needle"}
  assert any("recovered 2 task summaries" in ln for ln in lines)


def test_fingerprint_is_of_every_value():
  a = M.EvalModel("beacon", None, {"w": np.zeros((3, 3), np.float32)}, None, None, None)
  b = M.EvalModel("beacon", None, {"w": np.zeros((3, 3), np.float32)}, None, None, None)
  b.params["w"][2, 1] = 1e-7
  assert a.fingerprint != b.fingerprint
