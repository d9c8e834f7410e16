"""longjax.data.haystack: the training / held-out needle documents and their scorer.

Small prose stand-ins replace the Debian sources (every sentence names its source), so the tests
run on any machine and show where each sentence came from; one test reads the real sources when
they are installed."""
import json
import re
import warnings

import numpy as np
import pytest

from longjax.data import haystack as H
from longjax.data import sources
from longjax.data.errors import DataError
from longjax.data.tokenizers import get_tokenizer


def haystack_cli():
  """scripts/haystack.py, the generator's command line, loaded from its file."""
  import importlib.util
  from conftest import REPO
  spec = importlib.util.spec_from_file_location("haystack_cli", REPO / "scripts" / "haystack.py")
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod

BYTE = get_tokenizer("byte")


def _fake(name):
  words = "river stone lamp field bell cart road mill gate rope".split()
  return " ".join(f"Src{name} line {i} mentions the {words[i % 10]} and the {words[i * 7 % 10]}."
                  for i in range(400))


@pytest.fixture
def fake_sources(monkeypatch):
  for name in H.PROSE:
    monkeypatch.setitem(H._LOADERS, name, lambda name=name: _fake(name))
  H.prose_sentences.cache_clear()
  yield
  H.prose_sentences.cache_clear()


def _records(split, count=60, tokens=(700, 1600), seed=3, **kw):
  return list(H.generate(BYTE, split, count, tokens, seed, **kw))


def test_same_seed_same_file_byte_for_byte(fake_sources, tmp_path):
  paths = []
  for i, seed in enumerate((5, 5, 6)):
    p = tmp_path / f"{i}.jsonl"
    H.write_jsonl(p, H.generate(BYTE, "train", 12, (600, 1200), seed))
    paths.append(p.read_bytes())
  assert paths[0] == paths[1]
  assert paths[0] != paths[2]
  # a prefix of a longer run is the shorter run
  longer = _records("train", 15, (600, 1200), 5)
  assert [json.dumps(r, sort_keys=True, ensure_ascii=False) for r in longer[:12]] == \
      paths[0].decode().splitlines()


def _literal_parts(template):
  return [p for p in re.split(r"\{[a-z]+\}", template) if len(p.strip()) >= 12]


def test_train_split_never_holds_heldout_haystacks_or_phrasings(fake_sources):
  recs = _records("train", 120)
  held_phrases = [p for sets in H.PHRASINGS.values() for t in sets["heldout"]
                  for p in _literal_parts(t)]
  assert len(held_phrases) >= 20
  for r in recs:
    assert r["haystack"] not in H.HELDOUT_HAYSTACKS
    assert "Srcpydoc" not in r["input"] and not re.search(r"station \w+ logged", r["input"])
    for p in held_phrases:
      assert p not in r["input"], (p, r["id"])
  assert {r["haystack"] for r in recs} == set(H.allowed_haystacks("train"))
  held = _records("heldout", 30)
  assert {r["haystack"] for r in held} == set(H.HELDOUT_HAYSTACKS)
  train_phrases = [p for sets in H.PHRASINGS.values() for t in sets["train"]
                   for p in _literal_parts(t)]
  for r in held:
    for p in train_phrases:
      assert p not in r["input"], (p, r["id"])
  with pytest.raises(DataError, match="'pydoc' is not in the train split"):
    H.check_haystacks("train", ["kjv", "pydoc"])
  with pytest.raises(DataError, match="'kjv' is not in the heldout split"):
    _records("heldout", 1, haystacks=["kjv"])


def test_lengths_within_the_budget(fake_sources):
  for r in _records("train", 40, (700, 3000)) + _records("train", 10, (500, 900), kind="prose"):
    text = r["input"] if "input" in r else r["text"]
    assert r["n_tokens"] == len(BYTE.encode(text))
    assert r["budget"] - 2 <= r["n_tokens"] <= r["budget"], r["id"]
  with pytest.raises(DataError, match="raise --tokens"):
    _records("train", 5, (64, 64))


def test_smollm2_tokenizer_lengths_and_chat_prompt(smollm2_dir):
  tok = get_tokenizer(str(smollm2_dir))
  for r in H.generate(tok, "heldout", 4, (1024, 2048), 1000):
    assert r["budget"] - 3 <= r["n_tokens"] <= r["budget"]
    assert r["n_tokens"] == len(tok.encode(r["input"]))
    assert r["input"].endswith("<|im_start|>assistant")


def test_every_needle_kind_and_task_with_its_answer_in_the_document(fake_sources):
  recs = _records("train", 150, (600, 1400), seed=11)
  kinds = {r.get("needle_kind") for r in recs if r["task"] == "needle"}
  assert kinds == set(H.NEEDLE_KINDS)
  assert {r["task"] for r in recs} == {"needle", "next", "record"}
  digits = {len(r["target"]) for r in recs if r.get("needle_kind") == "number"}
  assert min(digits) <= 4 and max(digits) >= 9
  depths = [n["depth"] for r in recs for n in r["needles"]]
  assert min(depths) < 0.1 and max(depths) > 0.9
  for r in recs:
    doc = r["input"]
    assert r["output"] == r["target"] and r["teacher_output"] is None
    if r["task"] == "needle":
      assert r["needles"][0]["value"] == r["target"]
      assert 1 <= len(r["needles"]) <= 4
      assert r["needles"][0]["key"] in r["question"]
      for n in r["needles"]:
        assert n["value"] in doc and n["key"] in doc
      assert all(d != r["target"] for d in r["distractors"])
      assert len(set(n["key"] for n in r["needles"])) == len(r["needles"])
      assert r["distractors"] == [n["value"] for n in r["needles"][1:]]
    elif r["task"] == "next":
      quote = re.search(r'"(.*)"', r["question"]).group(1)
      assert doc.replace(r["question"], "").count(quote) == 1  # once in the haystack
      assert (quote + " " + r["target"]) in doc
    else:
      key = re.search(r"record (\d+)", r["question"], re.I).group(1)
      assert re.search(rf"Record {key}: {re.escape(r['target'])},", doc)


def test_needle_kinds_plant_only_those_kinds_and_leave_the_default_file_unchanged(
    fake_sources, tmp_path, capsys):
  recs = _records("train", 40, (600, 1400), seed=11, needle_kinds="number,date")
  assert {r["task"] for r in recs} == {"needle"}  # no content questions
  assert {r["needle_kind"] for r in recs} == {"number", "date"}
  for r in recs:
    assert r["needles"][0]["value"] == r["target"] and r["target"] in r["input"]
  # without the option the records are the ones the default run writes, draw for draw
  plain = _records("train", 40, (600, 1400), seed=11)
  assert plain == _records("train", 40, (600, 1400), seed=11, needle_kinds=None)
  assert any(r["task"] != "needle" or r["needle_kind"] not in ("number", "date") for r in plain)
  with pytest.raises(DataError, match="unknown kind colour; give a comma-separated subset of"):
    _records("train", 1, needle_kinds="number,colour")
  cli = haystack_cli()
  out = tmp_path / "o.jsonl"
  for extra, said in ((["--needle_kinds", "word", "--kind", "prose"], "--kind qa documents"),
                      (["--needle_kinds", "digits"], "unknown kind digits")):
    rc = cli.main(["--split", "train", "--tokenizer", "byte", "--out", str(out), "--count", "2",
                   "--tokens", "800"] + extra)
    err = capsys.readouterr().err
    assert rc == 1 and err.count("\n") == 1 and said in err, err
    assert not out.exists()


def test_jsonl_reader_takes_the_output_as_the_answer(fake_sources, tmp_path):
  p = tmp_path / "d.jsonl"
  H.write_jsonl(p, H.generate(BYTE, "train", 3, (600, 800), 2))
  recs = [json.loads(x) for x in p.read_text().splitlines()]
  for rec, segs in zip(recs, sources.read_source(f"jsonl:{p}")):
    assert segs[-1] == (rec["target"], True) and segs[0] == (rec["input"], False)
  with pytest.raises(DataError, match="exists"):
    H.write_jsonl(p, [])


def test_missing_source_names_its_package(monkeypatch, tmp_path, capsys):
  H.prose_sentences.cache_clear()
  monkeypatch.setattr(H, "HANDBOOK_DIR", tmp_path / "nowhere")
  monkeypatch.setattr(H, "BIBLE_EXE", "no-such-bible-reader")
  try:
    with pytest.raises(DataError, match=r"apt-get install -y debian-handbook"):
      H.load_texts(["handbook"])
    with pytest.raises(DataError, match=r"apt-get install -y bible-kjv bible-kjv-text"):
      H.load_texts(["kjv"])
    with pytest.warns(UserWarning, match="debian-handbook"):
      assert H.load_texts(["handbook", "repeat"], allow_missing=True) == {}
    rc = haystack_cli().main(["--split", "train", "--haystacks", "handbook", "--tokenizer", "byte",
                 "--out", str(tmp_path / "o.jsonl"), "--count", "2", "--tokens", "800"])
    err = capsys.readouterr().err
    assert rc == 1 and err.count("\n") == 1 and "debian-handbook" in err
    assert not (tmp_path / "o.jsonl").exists() and not list(tmp_path.glob(".o.jsonl*"))
  finally:
    H.prose_sentences.cache_clear()


def test_real_sources_when_installed():
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # a source this machine lacks is skipped (its own test above)
    texts = H.load_texts(H.PROSE, allow_missing=True)
  assert "pydoc" in texts and "licenses" in texts  # Python's own; Debian's base-files
  for name, sents in texts.items():
    assert len(sents) > 500, name
    assert not any(re.match(r"\d+ ", s) for s in sents[:200]), name  # no verse numbers
  r = H.make_record(BYTE, "heldout", 0, 1000, 3000, texts)
  assert r["haystack"] in H.HELDOUT_HAYSTACKS


def test_scorer_judges_the_needle_not_a_sentence(tmp_path):
  rec = dict(id="a", target="82678", distractors=["55120"], task="needle", haystack="pydoc",
             needle_kind="number")
  assert H.score(rec, "The access code is 82678.")["correct"]
  assert H.score(rec, "82678")["correct"]
  assert not H.score(rec, "The pass key is 82688.")["correct"]
  assert not H.score(rec, "826781")["correct"]  # whole words only
  assert not H.score(rec, "82678 or 55120")["correct"]
  date = dict(rec, target="19 December 1966", distractors=[])
  assert H.score(date, "It was on 19 december 1966!")["correct"]
  recs = [dict(rec, id=str(i), target=str(10000 + i)) for i in range(4)]
  s = H.summarise(recs, [f"The pass key is {10000 + i}." for i in range(3)] + ["10003"])
  assert s["accuracy"] == 1.0 and s["top_prefix"] == "the pass key is"
  assert s["top_prefix_share"] == 0.75
  bare = H.summarise(recs, [r["target"] for r in recs])
  assert bare["top_prefix"] == "" and bare["top_prefix_share"] == 0
  lab = H.label(rec, "Its access code is 82678.")
  assert lab["output"] == lab["teacher_output"] == "Its access code is 82678."
  assert H.label(rec, "I do not know.")["output"] == "82678"
  data, ans = tmp_path / "d.jsonl", tmp_path / "a.jsonl"
  H.write_jsonl(data, recs)
  H.write_jsonl(ans, [dict(id=r["id"], answer=r["target"]) for r in recs[:3]])
  with pytest.raises(DataError, match="no answer for 1 of 4"):
    H.score_files(ans, data)


def test_haystack_draw_balances_prose_and_families():
  rng = np.random.default_rng(0)
  texts = {"kjv": ("s",) * 10000, "licenses": ("s",) * 100}
  names = ["kjv", "licenses", "repeat", "records"]
  got = [H._draw_haystack(rng, names, texts) for _ in range(4000)]
  prose = sum(g in texts for g in got) / len(got)
  assert 0.46 < prose < 0.54
  assert 8 < got.count("kjv") / got.count("licenses") < 12  # sqrt(10000 / 100) = 10
