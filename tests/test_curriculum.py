"""data.curriculum: the longest documents (beacon windows) trained on, by step: parsing, the
batch order it skips (deterministic and resumable), clear errors, and a training run that
obeys it."""
import numpy as np
import pytest

from train_helpers import micro_config

from longjax.beacon.task import beacon_windows
from longjax.data import pipeline
from longjax.data.sources import DataError
from longjax.run_config import ConfigError, curriculum, from_config
from longjax.train import loop
from longjax.train.metrics import read_metrics


def test_parse_and_stage_lookup():
  stages = curriculum.parse(" 0:2, 300:4,600:8 ")
  assert stages == ((0, 2), (300, 4), (600, 8))
  assert [curriculum.max_windows(stages, s) for s in (1, 299, 300, 599, 600, 10 ** 6)] == \
      [2, 2, 4, 4, 8, 8]
  assert curriculum.parse("") == () and curriculum.max_windows((), 5) is None
  for text, msg in (("2,4", "is not STEP:WINDOWS"), ("0:2,x:4", "is not STEP:WINDOWS"),
                    ("100:2", "must start at step 0"), ("0:2,300:4,300:8", "must increase"),
                    ("0:0", "at least 1 window")):
    with pytest.raises(curriculum.CurriculumError, match=msg):
      curriculum.parse(text)


def _window_keys(lengths):
  return lambda n: beacon_windows(n, 32, 32)


def test_take_skips_longer_documents_deterministically_and_resumes():
  lengths = np.random.default_rng(0).integers(20, 200, size=120)
  wins = np.asarray([beacon_windows(int(n), 32, 32) for n in lengths])
  make = lambda: pipeline.GlobalBatches(lengths, 2, 7, group_key=_window_keys(lengths))
  a = make()
  first = [a.take(2) for _ in range(5)]
  assert all(wins[b].max() <= 2 for b in first)
  state = a.get_state()
  later = [a.take(3) for _ in range(10)]
  assert all(wins[b].max() <= 3 for b in later)
  assert any(wins[b].max() == 3 for b in later)  # the limit admits longer documents later
  b = make()  # the same limits from the start give the same batches ...
  assert [x.tolist() for x in [b.take(2) for _ in range(5)]] == [x.tolist() for x in first]
  c = make()  # ... and so does a run resumed from the saved iterator state
  c.set_state(state)
  assert [c.take(3).tolist() for _ in range(10)] == [x.tolist() for x in later]
  with pytest.raises(DataError, match="no complete global batch of 2 documents of at most 0 "
                                      "windows.*raise that stage's windows"):
    make().take(0)
  plain = pipeline.GlobalBatches(lengths, 2, 7)
  with pytest.raises(DataError, match="grouped by window count"):
    plain.take(2)


def test_config_errors(tmp_path):
  c = micro_config("beacon", tmp_path / "b")
  c.data.curriculum = "0:2,5"
  with pytest.raises(ConfigError, match="data.curriculum='0:2,5': '5' is not STEP:WINDOWS"):
    from_config(c)
  f = micro_config("focus", tmp_path / "f")
  f.data.curriculum = "0:2"
  with pytest.raises(ConfigError, match="cut documents into windows.*'focus' does not"):
    from_config(f)
  c.data.curriculum = "0:3"  # micro documents are 105-128 tokens: 4 windows of 32
  with pytest.raises(DataError, match="at most 3 windows"):
    loop.Trainer(from_config(c)).setup()


def test_training_run_follows_the_curriculum(tmp_path):
  c = micro_config("beacon", tmp_path / "run", steps=4, save_every=4, batch=2)
  c.data.synthetic.max_chars, c.data.max_length = 250, 256  # documents of 4-8 windows of 32
  c.data.curriculum = "0:5,3:8"
  tr = loop.Trainer(from_config(c))
  tr.run()
  m = read_metrics(c.workdir)
  assert [r["max_windows"] for r in m] == [5, 5, 8, 8]
  # documents of at most 5 windows of 32 tokens: at most 160 tokens each
  assert all(r["tokens"] <= 2 * 160 for r in m[:2]) and tr.ds.lengths.max() > 160
