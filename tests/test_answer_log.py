"""longjax/eval/answer_log.py: answers logged as they come and reused by a rerun of the same
model only; a line cut by a kill is dropped, never read."""
from __future__ import annotations

import json

from longjax.eval.answer_log import AnswerLog, files_fingerprint, request_key

REQ = ("a prompt", {"until": ["\n"], "max_gen_toks": 8})


def test_a_rerun_reuses_what_the_same_model_answered(tmp_path):
  path = tmp_path / "cells" / "a.jsonl"
  log = AnswerLog(path, "model A")
  assert len(log) == 0 and log.get("generate_until", REQ) is None
  log.add("generate_until", REQ, "42 é")
  log.add("generate_until", ("another", {}), "7")
  again = AnswerLog(path, "model A")
  assert again.get("generate_until", REQ) == "42 é" and len(again) == 2
  # the request's kind and every argument are part of the key
  assert again.get("loglikelihood", REQ) is None
  assert again.get("generate_until", ("a prompt", {"until": ["\n"], "max_gen_toks": 9})) is None
  assert request_key("generate_until", REQ) == request_key(
      "generate_until", ("a prompt", {"max_gen_toks": 8, "until": ["\n"]}))
  again.discard()
  assert not path.exists()


def test_a_line_cut_by_a_kill_is_dropped_and_appends_start_clean(tmp_path):
  path = tmp_path / "a.jsonl"
  AnswerLog(path, "m").add("generate_until", REQ, "first")
  with open(path, "a") as f:
    f.write('{"key": "abc", "te')  # killed mid-write
  log = AnswerLog(path, "m")
  assert len(log) == 1
  log.add("generate_until", ("b", {}), "second")
  lines = path.read_text().splitlines()
  assert [json.loads(x).get("text") for x in lines] == [None, "first", "second"]
  assert len(AnswerLog(path, "m")) == 2


def test_answers_of_another_model_are_set_aside_not_mixed_in(tmp_path):
  path = tmp_path / "a.jsonl"
  AnswerLog(path, "model A").add("generate_until", REQ, "from A")
  log = AnswerLog(path, "model B")
  assert len(log) == 0 and log.get("generate_until", REQ) is None
  assert log.stale == tmp_path / "a.jsonl.stale" and "from A" in log.stale.read_text()
  path.write_text("not json\n")
  assert len(AnswerLog(path, "model B")) == 0


def test_fingerprint_follows_the_bytes(tmp_path):
  (tmp_path / "w.safetensors").write_bytes(b"\x00" * 10)
  one = files_fingerprint(tmp_path)
  assert one == files_fingerprint(tmp_path) and len(one) == 64
  (tmp_path / "w.safetensors").write_bytes(b"\x00" * 9 + b"\x01")
  assert files_fingerprint(tmp_path) != one
  assert files_fingerprint(tmp_path / "missing") == ""
