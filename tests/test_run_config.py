"""The typed run config (``longjax.run_config``): train.py and eval.py turn the ml_collections
config into one frozen RunConfig, once, at the edge; nothing below reads a ConfigDict; unknown keys
and bad values stop there with one line that names the key and its near miss; a run's config.json
reads back as the same RunConfig."""
import ast
import dataclasses
import importlib
import json

import pytest

from conftest import run_python
from train_helpers import ROOT, micro_config

from longjax.run_config import ConfigError, TrainSection, from_config, stored_config, to_dict

CONFIGS = ("tiny_beacon", "tiny_focus", "beacon_qwen2", "beacon_llama3", "smollm2_beacon",
           "smollm2_focus", "focus_llama2")
ENV = {"JAX_PLATFORMS": "cpu", "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}


def _config(name):
  return importlib.import_module(f"configs.{name}").get_config()


def _holds(typed: dict, given: dict) -> bool:
  """Every key of ``given`` is in ``typed`` with the same value (``typed`` adds the defaults of
  the keys the file leaves out)."""
  return all(_holds(typed[k], v) if isinstance(v, dict) else typed.get(k) == v
             for k, v in given.items())


@pytest.mark.parametrize("name", CONFIGS)
def test_every_config_file_types_and_reads_back_unchanged(name, tmp_path):
  """The typed config holds every value the file gives; the config.json of a run of the old code
  (the file's own dict, as runs/ holds them) and of a new one read back as the same RunConfig."""
  c = _config(name)
  rc = from_config(c)
  given = json.loads(json.dumps(c.to_dict(), default=str))
  typed = json.loads(json.dumps(to_dict(rc), default=str))
  assert _holds(typed, given)
  (tmp_path / "config.json").write_text(json.dumps(c.to_dict(), indent=2, default=str))
  assert from_config(stored_config(tmp_path / "config.json")) == rc  # an old run's config.json
  (tmp_path / "config.json").write_text(json.dumps(to_dict(rc), indent=2, default=str))
  assert from_config(stored_config(tmp_path / "config.json")) == rc  # a new run's


def test_run_config_is_frozen():
  rc = from_config(_config("tiny_beacon"))
  for section, field in ((rc, "method"), (rc.train, "lr"), (rc.beacon, "window"),
                         (rc.eval.passkey, "lengths"), (rc.train.mesh, "data")):
    with pytest.raises(dataclasses.FrozenInstanceError):
      setattr(section, field, 1)
  assert hash(rc.train) == hash(from_config(_config("tiny_beacon")).train)


def test_defaults_have_one_home():
  """configs/common.py builds the files' sections from the dataclasses' defaults, and a key a
  config leaves out takes the same default."""
  from configs import common
  assert common.train_defaults().to_dict() == to_dict(TrainSection())
  c = _config("tiny_focus")
  with c.unlocked():
    del c.train["keep"]
    del c.focus["objective"]
  rc = from_config(c)
  assert rc.train.keep == TrainSection().keep and rc.focus.objective == "random"


@pytest.mark.parametrize("key, value, message", [
    ("train.lrr", 1.0,
     "unknown config key 'train.lrr' (did you mean 'lr'?); known keys of train: "),
    ("beacon.windw", 64, "unknown config key 'beacon.windw' (did you mean 'window'?)"),
    ("eval.passkey.lenghts", (1, 2),
     "unknown config key 'eval.passkey.lenghts' (did you mean 'lengths'?)"),
    ("data.loss_on", "distil", "data.loss_on='distil': use 'all' (every token), 'answer'"),
    ("train.layout", "inferense", "train.layout='inferense': use one of ('official', 'inference')"),
    ("train.global_batch", 0, "train.global_batch must be >= 1"),
])
def test_unknown_keys_and_bad_values_are_one_line(key, value, message):
  c = _config("tiny_beacon")
  *path, last = key.split(".")
  node = c
  for p in path:
    node = node[p]
  with c.unlocked(), node.ignore_type():
    node[last] = value
  with pytest.raises(ConfigError) as e:
    from_config(c)
  assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_built_once_at_the_edge(tmp_path, monkeypatch):
  """The Trainer and eval's model builder take the typed config as it is: they refuse a ConfigDict
  and never build it again (from_config is not called below the entry points)."""
  from longjax import run_config
  from longjax.eval.models import build_method
  from longjax.train import loop
  from longjax.train.errors import TrainingError
  c = micro_config("beacon", tmp_path / "w", steps=1, batch=8)  # (8: any fake device count)
  rc = from_config(c)
  with pytest.raises(TrainingError, match="Trainer takes a RunConfig"):
    loop.Trainer(c)

  def again(*a, **k):
    raise AssertionError("the run config was built a second time")
  for mod in (run_config, run_config.build):
    monkeypatch.setattr(mod, "from_config", again)
  trainer = loop.Trainer(rc)
  trainer.setup()
  assert trainer.c is rc
  assert build_method(rc).extra == trainer.settings


def test_nothing_below_the_entry_points_reads_a_config_dict():
  """Only the edge knows ml_collections: run_config (which types it), cli (which checks the
  command line's overrides against the file) and eval/config (which writes the files' eval
  section); and only the entry points build a RunConfig."""
  knows = {"longjax/run_config/build.py", "longjax/runtime/cli.py", "longjax/eval/config.py"}
  # ckpts/assets: the asset exporters', from config.json
  builders = {"longjax/ckpts/assets.py",
              "longjax/run_config/__init__.py"}  # (its face hands the builders on)
  found, built = [], []
  for f in sorted((ROOT / "longjax").rglob("*.py")):
    rel = str(f.relative_to(ROOT))
    for node in ast.walk(ast.parse(f.read_text())):
      names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
               [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
      if any(n.split(".")[0] == "ml_collections" for n in names) and rel not in knows:
        found.append(rel)
      if (isinstance(node, ast.ImportFrom) and (node.module or "").startswith("longjax.run_config")
          and "from_config" in {a.name for a in node.names}
          and rel not in builders):
        built.append(rel)
  assert not found, found
  assert not built, built


def test_a_bad_key_in_the_config_file_is_one_line_from_eval_py(tmp_path):
  cfg = tmp_path / "bad_eval.py"
  cfg.write_text("from configs import tiny_beacon\n\n\ndef get_config():\n"
                 "  c = tiny_beacon.get_config()\n  c.eval.passkey.lenghts = (1, 2)\n  return c\n")
  r = run_python(ROOT / "eval.py", f"--config={cfg}", env=ENV, timeout=120)
  lines = [l for l in r.stderr.strip().splitlines() if l.strip()]
  assert r.returncode == 1 and len(lines) == 1, r.stderr[-3000:]
  assert lines[0].startswith("eval.py: error: unknown config key 'eval.passkey.lenghts' "
                             "(did you mean 'lengths'?)"), lines[0]



def test_scalar_fields_are_typed_once_at_from_config():
  """A plain dict's scalars take their field's type (1 -> 1.0 for a float, 2.0 -> 2 for an int);
  a value that would change (2.5 for an int, 1 for a bool, a string for a number) is one error
  naming the field."""
  d = _config("tiny_beacon").to_dict()
  d["train"].update(lr=1, global_batch=2.0)
  rc = from_config(d)
  assert type(rc.train.lr) is float and rc.train.lr == 1.0
  assert type(rc.train.global_batch) is int and rc.train.global_batch == 2
  for field, bad, want in (("global_batch", 2.5, "int"), ("export", 1, "bool"),
                           ("lr", "fast", "float")):
    d = _config("tiny_beacon").to_dict()
    d["train"][field] = bad
    with pytest.raises(ConfigError, match=rf"config field train\.{field} must be {want}, got "):
      from_config(d)
