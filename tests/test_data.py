"""Data pipeline: sources (jsonl, text, TFDS offline, synthetic), filtering, EOS, grouping by
window count, determinism and resumable iterator state, FocusLLM span sampling."""
import json

import numpy as np
import pytest

from longjax.beacon.task import beacon_windows
from longjax.data import pipeline
from longjax.focus.spans import focus_indices
from longjax.data.sources import DataError
from longjax.data.tokenizers import get_tokenizer
from longjax.run_config import DataSection, SyntheticSection

TOK = get_tokenizer("byte")


def dc(**kw):
  """A run's data section (run_config.DataSection): the byte tokenizer, small synthetic sizes."""
  d = dict(sources="", tokenizer="byte", text_field="text", tfds_data_dir="", tfds_split="train",
           min_length=0, max_length=1 << 30, append_eos=True, add_bos="auto", max_per_source=0,
           loss_on="all",
           synthetic=SyntheticSection(count=16, min_chars=50, max_chars=90, digits=5))
  d.update(kw)
  return DataSection(**d)


def test_jsonl_text_filter_truncate_eos(tmp_path):
  f = tmp_path / "train.json"
  f.write_text("\n".join(json.dumps({"text": "x" * n}) for n in (3, 10, 40)) + "\n"
               + json.dumps({"input": "q?", "output": "ans"}) + "\n")
  d = tmp_path / "docs"
  d.mkdir()
  (d / "a.txt").write_text("hello world")
  ds = pipeline.build_dataset(dc(sources=f"jsonl:{f},text:{d}", min_length=8, max_length=20),
                              TOK, 0)
  # 3 chars + BOS + EOS = 5 < 8 dropped; 40 chars truncated to 20 (no EOS); the rest get EOS
  assert ds.stats["too_short"] == 1 and ds.stats["truncated"] == 1
  lens = sorted(len(x) for x in ds.ids)
  assert lens == [8, 12, 13, 20]
  short = [x for x in ds.ids if len(x) == 12][0]
  assert short[0] == TOK.bos_id and short[-1] == TOK.eos_id
  assert all(x[-1] != TOK.eos_id for x in ds.ids if len(x) == 20)
  conv = [a for a in ds.answer if a is not None]
  # "ans" and the EOS after it are the answer span (an answer's end is scored); plain text has none
  assert len(conv) == 1 and conv[0].tolist() == [False] * (len(conv[0]) - 4) + [True] * 4
  # [N] keeps the first N records
  ds2 = pipeline.build_dataset(dc(sources=f"jsonl:{f}[2]", min_length=0), TOK, 0)
  assert len(ds2) == 2


def test_bad_inputs(tmp_path):
  with pytest.raises(DataError, match="does not exist"):
    pipeline.build_dataset(dc(sources=f"jsonl:{tmp_path}/missing.json"), TOK, 0)
  with pytest.raises(DataError, match="does not exist"):
    pipeline.build_dataset(dc(sources=f"text:{tmp_path}/nothing"), TOK, 0)
  with pytest.raises(DataError, match="unknown data source kind"):
    pipeline.build_dataset(dc(sources="csv:x"), TOK, 0)
  with pytest.raises(DataError, match="no data sources"):
    pipeline.build_dataset(dc(sources=""), TOK, 0)
  f = tmp_path / "t.json"
  f.write_text(json.dumps({"text": "abc"}) + "\n")
  with pytest.raises(DataError, match="empty after filtering.*min_length=100"):
    pipeline.build_dataset(dc(sources=f"jsonl:{f}", min_length=100), TOK, 0)
  f.write_text("{not json\n")
  with pytest.raises(DataError, match="not valid JSON"):
    pipeline.build_dataset(dc(sources=f"jsonl:{f}"), TOK, 0)
  with pytest.raises(DataError, match="tfds_data_dir"):
    pipeline.build_dataset(dc(sources="tfds:whatever"), TOK, 0)
  # an @answer source must give every record an answer span, also after truncation (a record
  # without one would be scored on every token: another objective than the one asked for)
  f.write_text(json.dumps({"input": "q?", "output": "ans"}) + "\n" + json.dumps({"text": "abc"})
               + "\n")
  with pytest.raises(DataError, match=r"t.json'@answer, record 1: no answer span.*it has none"):
    pipeline.build_dataset(dc(sources=f"jsonl:{f}@answer"), TOK, 0)
  f.write_text(json.dumps({"input": "question " * 5, "output": "ans"}) + "\n")
  with pytest.raises(DataError, match=r"record 0: no answer span.*max_length=10 tokens"):
    pipeline.build_dataset(dc(sources=f"jsonl:{f}@answer", max_length=10), TOK, 0)
  assert len(pipeline.build_dataset(dc(sources=f"jsonl:{f}@answer"), TOK, 0).answer[0]) > 10
  assert len(pipeline.build_dataset(dc(sources=f"jsonl:{f}", max_length=10), TOK, 0)) == 1


def test_distilled_samples_past_the_teachers_context_are_refused(tmp_path):
  """The teacher reads a distilled sample whole, so one longer than the base's positions is
  refused before training, whether its source or the run's data.loss_on distills it; the same
  length trained on its answer (no teacher) passes."""
  long, short = tmp_path / "long.json", tmp_path / "short.json"
  long.write_text(json.dumps({"input": "x" * 60, "output": "ans"}) + "\n")
  short.write_text(json.dumps({"input": "x" * 20, "output": "ans"}) + "\n")
  n = len(pipeline.build_dataset(dc(sources=f"jsonl:{long}"), TOK, 0).ids[0])
  ds = pipeline.build_dataset(dc(sources=f"jsonl:{long}@distill,jsonl:{short}"), TOK, 0)
  with pytest.raises(DataError, match=rf"1 distilled training samples \(the longest {n} tokens\)"
                                      r".*base's 48 positions.*'@answer'"):
    pipeline.check_teacher_context(ds, "all", 48)
  pipeline.check_teacher_context(ds, "all", n)  # exactly the base's positions: readable
  mixed = pipeline.build_dataset(dc(sources=f"jsonl:{long}@answer,jsonl:{short}"), TOK, 0)
  pipeline.check_teacher_context(mixed, "all", 48)
  with pytest.raises(DataError, match="1 distilled"):  # data.loss_on="distill" is the default
    pipeline.check_teacher_context(
        pipeline.build_dataset(dc(sources=f"jsonl:{long},jsonl:{short}"), TOK, 0), "distill", 48)
  pipeline.check_teacher_context(mixed, "distill", 48)  # '@answer' overrides it


def test_synthetic_deterministic_and_answer_spans():
  a = pipeline.build_dataset(dc(sources="synthetic:passkey"), TOK, 3)
  b = pipeline.build_dataset(dc(sources="synthetic:passkey"), TOK, 3)
  c = pipeline.build_dataset(dc(sources="synthetic:passkey"), TOK, 4)
  assert all(np.array_equal(x, y) for x, y in zip(a.ids, b.ids))
  assert not all(np.array_equal(x, y) for x, y in zip(a.ids, c.ids))
  for ids, ans in zip(a.ids, a.answer):
    key = TOK.decode(ids[ans])
    assert len(key) == 5 and key.isdigit() and f"The pass key is {key}." in TOK.decode(ids)


def test_group_by_stride_strict_and_resume():
  lengths = np.random.default_rng(0).integers(40, 300, size=200)
  key = lambda n: beacon_windows(n, 64, 64)
  it = pipeline.GlobalBatches(lengths, 8, seed=1, group_key=key)
  first = [next(it) for _ in range(it.batches_per_epoch + 5)]  # crosses an epoch boundary
  for b in first:
    assert len(b) == 8 and len({key(int(lengths[i])) for i in b}) == 1
  # same seed -> same order; restoring a state continues identically
  it2 = pipeline.GlobalBatches(lengths, 8, seed=1, group_key=key)
  for _ in range(7):
    next(it2)
  st = it2.get_state()
  rest = [next(it2) for _ in range(10)]
  it3 = pipeline.GlobalBatches(lengths, 8, seed=1, group_key=key)
  it3.set_state(json.loads(json.dumps(st)))
  assert all(np.array_equal(x, y) for x, y in zip(rest, [next(it3) for _ in range(10)]))
  assert all(np.array_equal(x, y) for x, y in zip(first[7:17], rest))
  with pytest.raises(DataError, match="changed since the checkpoint"):
    pipeline.GlobalBatches(lengths, 4, seed=1, group_key=key).set_state(st)
  with pytest.raises(DataError, match="no complete global batch"):
    pipeline.GlobalBatches([10, 20], 8, seed=0)


def test_focus_indices():
  rng = np.random.default_rng(0)
  fc = dict(window=64, strides=(16, 32), min_local=8, objective="random")
  for _ in range(50):
    ix = focus_indices(rng, 200, None, fc)
    assert ix["objective"] in ("continuation", "repetition") and ix["stride"] in (16, 32)
    assert ix["target_index"] == ix["local_start"] + ix["local_size"] < 200
  ans = np.zeros(200, bool)
  ans[150:155] = True
  for _ in range(20):
    ix = focus_indices(rng, 200, ans, dict(fc, objective="answer"))
    assert 150 <= ix["target_index"] < 155 and ix["memory_len"] == ix["local_start"] >= 1


def test_tfds_offline(tmp_path):
  """A tiny TFDS dataset built offline (array_record), read without TensorFlow."""
  tfds = pytest.importorskip("tensorflow_datasets")

  class TinyText(tfds.core.GeneratorBasedBuilder):
    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
      return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict(
          {"text": tfds.features.Text()}))

    def _split_generators(self, dl_manager):
      return {"train": self._generate_examples()}

    def _generate_examples(self):
      for i in range(6):
        yield i, {"text": f"document number {i} " * (i + 1)}

  b = TinyText(data_dir=str(tmp_path), file_format="array_record")
  b.download_and_prepare()
  ds = pipeline.build_dataset(dc(sources="tfds:tiny_text", tfds_data_dir=str(tmp_path),
                                 min_length=40), TOK, 0)
  texts = sorted(TOK.decode(x) for x in ds.ids)
  assert len(ds) == 4 and all(t.startswith("document number") for t in texts)
  ds2 = pipeline.build_dataset(dc(sources=f"tfds_dir:{b.data_dir}"), TOK, 0)
  assert len(ds2) == 6
  with pytest.raises(DataError, match="cannot open TFDS dataset"):
    pipeline.build_dataset(dc(sources="tfds:not_there", tfds_data_dir=str(tmp_path)), TOK, 0)
