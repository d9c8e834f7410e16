"""Evaluation on the tiny models: generators, every task end to end, resuming, bad input, CLI."""
import importlib.util
import json
import os
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO, run_python
from longjax.data.tokenizers import ByteTokenizer, Tokenizer
from longjax import methods
from longjax.eval import EvalError
from longjax.eval import passkey as P
from longjax.eval.models import build_method
from longjax.eval.perplexity import last_windows, load_documents, sliding_chunks
from longjax.eval.runner import parse_tasks, run
from longjax.run_config import from_config
from longjax.eval.synthetic import write_all



def load_config(name: str, workdir, **eval_kw):
  spec = importlib.util.spec_from_file_location(f"cfg_{name}", REPO / "configs" / f"{name}.py")
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  c = mod.get_config()
  c.workdir = str(workdir)
  for k, v in eval_kw.items():
    node = c.eval
    *path, last = k.split(".")
    for p in path:
      node = node[p]
    node[last] = v
  return c


@pytest.fixture(scope="module")
def data(tmp_path_factory):
  return write_all(tmp_path_factory.mktemp("evdata"), tfds=True)


def with_data(c, data):
  c.eval.needle.haystack_dir = str(data["haystack"])
  c.eval.perplexity.data = str(data["pg19"])
  c.eval.longbench.data_dir = str(data["longbench"])
  c.eval.infbench.data_dir = str(data["infbench"])
  return c


@pytest.fixture(scope="module")
def tiny_beacon(tmp_path_factory):
  c = load_config("tiny_beacon", tmp_path_factory.mktemp("wd"))
  return c, build_method(from_config(c))


@pytest.fixture
def beacon(tiny_beacon):
  """The module's tiny beacon model with a fresh copy of its config (tests may change it)."""
  c, built = tiny_beacon
  return c.copy_and_resolve_references(), built


# ------------------------------------------------------------------------------------------------
# Generators.
def test_beacon_passkey_strings_and_key_placement():
  # the exact strings of docs/beacon.md §8 (typo "infomation" included)
  assert P.DESCRIPTION == ("There is an important infomation hidden in the following context. "
                           "Find the information and memorize it. I will quiz you about the "
                           "important information there.\n")
  assert P.NOISE == ("The grass is green. The sky is blue. The sun is yellow. Here we go. "
                     "There and back again.")
  assert P.INFO.format(key=12345) == ("\n\nThe pass key is 12345. Remember it. 12345 is the "
                                      "pass key.\n\n")
  assert P.QUESTION == "\n\nWhat is the pass key?"
  tok = Tokenizer(ByteTokenizer())
  info = P.INFO.format(key=54321)
  desc_len = len(P.DESCRIPTION) + 1  # bytes + BOS
  for length, depth in [(400, 0), (400, 50), (400, 100), (1000, 33)]:
    s = P.depth_sample(tok, length, depth, info, P.QUESTION)
    n_noise = length - len(P.QUESTION) - len(info) - 1 - desc_len
    pos = desc_len + round((length - len(P.QUESTION) - len(info) - 1 - desc_len) * depth / 100)
    assert s["position"] == pos and s["n_noise"] == n_noise
    assert len(s["ids"]) == length - 1
    assert s["ids"][pos:pos + len(info)] == tok.encode(info)  # the key starts at that token
    text = s["text"]
    assert text.startswith(P.DESCRIPTION) and text.endswith(P.QUESTION)
    assert text.count("The pass key is 54321.") == 1
    noise = (P.NOISE * 50)[:n_noise]
    k = pos - desc_len
    assert text == P.DESCRIPTION + noise[:k] + info + noise[k:] + P.QUESTION
  assert P.depth_sample(tok, 400, 0, info, P.QUESTION)["position"] == desc_len
  # keys: default_rng(123) in grid order (lengths outer, depths inner), 5 digits
  rng = np.random.default_rng(123)
  grid = P.beacon_grid([100, 200], [0, 100])
  assert [g["key"] for g in grid] == [int(rng.integers(10000, 100000)) for _ in range(4)]
  assert [(g["length"], g["depth"]) for g in grid] == [(100, 0), (100, 100), (200, 0), (200, 100)]
  assert all(10000 <= g["key"] < 100000 for g in grid)
  with pytest.raises(EvalError, match="too short"):
    P.depth_sample(tok, 100, 50, info, P.QUESTION)


def test_focus_passkey_generator():
  for n, seed in [(600, 0), (15000, 7)]:
    s = P.focus_sample(n, seed)
    rs = np.random.RandomState(seed)
    prefix = rs.randint(0, n)
    key = rs.randint(1, 50000)
    garbage = " ".join([P.NOISE] * 1000)
    lines = s["text"].split("\n")
    assert lines == [garbage[:prefix],
                     f"The pass key is {key}. Remember it. {key} is the pass key.",
                     garbage[:n - prefix], P.FOCUS_DESCRIPTION,
                     "What is the pass key? The pass key is"]
    assert s["key"] == key and s["prefix_len"] == prefix
  tok = Tokenizer(ByteTokenizer())
  assert tok.decode(tok.answer_ids("123")) == " 123"


def test_windows_by_hand():
  # 10 tokens, chunks of 4 every 2: [0,4) scores 3 (not its first token), then 2 new each
  assert sliding_chunks(10, 4, 2) == [(0, 4, 3), (2, 6, 2), (4, 8, 2), (6, 10, 2)]
  assert sum(n for *_, n in sliding_chunks(1000, 256, 100)) == 999
  assert sliding_chunks(5, 8, 4) == [(0, 5, 4)]
  assert last_windows(10, 4, 2, 1) == [(0, 4, 1), (2, 6, 1), (4, 8, 1), (6, 10, 1)]


def test_tfds_pg19_source(data):
  c = load_config("tiny_beacon", "/nonexistent", **{"perplexity.tfds_name": "pg19",
                                                    "perplexity.tfds_data_dir": str(data["tfds"])})
  docs = load_documents(c.eval.perplexity)
  assert len(docs) == 2 and all(len(t) > 200 for _, t in docs)


# ------------------------------------------------------------------------------------------------
# Models.
def test_suffix_nll_paths_agree(beacon, tmp_path):
  """The plain forward, teacher-forced decoding and the beacon loss (inside one window, where
  beacon = plain) score the same tokens identically."""
  c, _ = beacon
  plain = build_method(from_config(c), "plain")
  ids = list(np.random.default_rng(0).integers(3, 250, 40))
  s_plain, n_plain = plain.suffix_nll(ids, 10)
  s_tf, n_tf = methods.Focus().suffix_nll(plain.model, plain.params, plain.cfg, np.asarray(ids), 10)
  b = build_method(from_config(c), "beacon")
  s_b, n_b = b.suffix_nll(ids, 10)
  assert n_plain == n_tf == n_b == 10
  np.testing.assert_allclose([s_tf, s_b], [s_plain, s_plain], rtol=2e-4)
  assert plain.suffix_nll(ids, 100)[1] == 39  # the first token is never scored


# ------------------------------------------------------------------------------------------------
# Tasks end to end.
def test_all_tasks_beacon(beacon, data, tmp_path):
  c, built = beacon
  c = with_data(c, data)
  c.eval.output_dir = str(tmp_path)
  out = run(from_config(c), "all", built=built, log=lambda s: None)
  assert set(out) == {"passkey", "needle", "perplexity", "longbench", "infbench"}
  pk = out["passkey"]
  assert pk["n_samples"] == 6 and len(pk["cells"]) == 6 and 0 <= pk["acc"] <= 1
  assert Path(pk["figures"][0]).stat().st_size > 1000
  assert Path(out["needle"]["figures"][0]).exists() and len(out["needle"]["cells"]) == 6
  ppl = out["perplexity"]
  assert ppl["n_docs"] == 2 and 50 < ppl["ppl"] < 2000  # a random byte model: ~vocab size
  assert ppl["n_scored"] == sum(d["n_tokens"] - 1 for d in ppl["per_doc"])
  assert "host_peak_rss_mb" in ppl and all("seconds" in d for d in ppl["per_doc"])
  lb = out["longbench"]
  assert len(lb["scores"]) == 14 and len(lb["categories"]) == 5
  assert lb["average"] == pytest.approx(np.mean(list(lb["scores"].values())), abs=0.01)
  assert set(out["infbench"]["scores"]) == {"longbook_choice_eng", "passkey", "number_string",
                                            "kv_retrieval"}
  for t in out:
    assert json.loads((tmp_path / f"beacon_{t}.json").read_text())["task"] == t
  assert set(json.loads((tmp_path / "beacon_results.json").read_text())) == set(out)
  recs = (tmp_path / "beacon_longbench.samples.jsonl").read_text().splitlines()
  assert len(recs) == 1 + 14 and "_settings" in json.loads(recs[0])


def test_resume_skips_scored_samples(beacon, tmp_path, monkeypatch):
  c, built = beacon
  c.eval.output_dir = str(tmp_path)
  first = run(from_config(c), "passkey", built=built, log=lambda s: None)["passkey"]
  calls = []
  monkeypatch.setattr(built, "generate", lambda *a, **k: calls.append(1) or ([], ""))
  lines = []
  again = run(from_config(c), "passkey", built=built, log=lines.append)["passkey"]
  assert not calls and again["acc"] == first["acc"] and any("resuming: 6" in ln for ln in lines)
  # a partial file: only the missing samples are run
  path = tmp_path / "beacon_passkey.samples.jsonl"
  path.write_text("\n".join(path.read_text().splitlines()[:4]) + "\n")
  run(from_config(c), "passkey", built=built, log=lambda s: None)
  assert len(calls) == 3
  c.eval.passkey.max_new_tokens = 7  # other settings: the old file is kept aside, all rerun
  lines = []
  run(from_config(c), "passkey", built=built, log=lines.append)
  assert len(calls) == 3 + 6 and any("other settings" in ln for ln in lines)
  assert (tmp_path / "beacon_passkey.samples.jsonl.stale-1").exists()


def test_focus_tasks(data, tmp_path):
  c = with_data(load_config("tiny_focus", tmp_path / "wd"), data)
  c.eval.output_dir = str(tmp_path)
  c.eval.passkey.n_garbage = (300,)
  c.eval.passkey.seeds = (0, 1)
  c.eval.perplexity.max_docs = 1
  c.eval.perplexity.last_n = 16
  c.eval.infbench.tasks = "passkey,kv_retrieval"
  out = run(from_config(c), "passkey,perplexity,infbench", log=lambda s: None)
  pk = out["passkey"]
  assert pk["protocol"] == "focus" and pk["n_samples"] == 2 and "acc_official" in pk
  ppl = out["perplexity"]
  assert ppl["protocol"] == "last" and ppl["n_scored"] % 16 == 0 and ppl["n_scored"] > 0
  assert set(out["infbench"]["scores"]) == {"passkey", "kv_retrieval"}


def test_plain_truncation_baseline(data, tmp_path):
  c = with_data(load_config("tiny_beacon", tmp_path / "wd", method="plain", truncate_to=200),
                data)
  c.eval.output_dir = str(tmp_path)
  c.eval.longbench.tasks = "qasper,trec"
  out = run(from_config(c), "passkey,longbench", log=lambda s: None)
  assert out["passkey"]["method"] == "plain"
  recs = [json.loads(x) for x in
          (tmp_path / "plain_passkey.samples.jsonl").read_text().splitlines()[1:]]
  assert all(r["n_tokens"] <= 200 - 24 for r in recs)
  recs = [json.loads(x) for x in
          (tmp_path / "plain_longbench.samples.jsonl").read_text().splitlines()[1:]]
  assert all(r["n_tokens"] <= 200 - {"qasper": 128, "trec": 64}[r["task"]] for r in recs)


# ------------------------------------------------------------------------------------------------
# Bad input: one clear error each.
def test_task_name_typo():
  with pytest.raises(EvalError, match="unknown evaluation task 'pasky'.*passkey, needle, "
                                      "perplexity, longbench, infbench"):
    parse_tasks("passkey,pasky")
  assert parse_tasks("all") == ["passkey", "needle", "perplexity", "longbench", "infbench"]


def test_bad_data(beacon, data, tmp_path):
  c, built = beacon
  c = with_data(c, data)
  c.eval.output_dir = str(tmp_path)
  quiet = dict(built=built, log=lambda s: None)
  c.eval.needle.haystack_dir = str(tmp_path / "missing")
  with pytest.raises(EvalError, match="haystack_dir .* is not a directory"):
    run(from_config(c), "needle", **quiet)
  c.eval.longbench.data_dir = str(tmp_path / "nope")
  with pytest.raises(EvalError, match="longbench.data_dir .* is not a directory"):
    run(from_config(c), "longbench", **quiet)
  bad = tmp_path / "lb"
  bad.mkdir()
  (bad / "qasper.jsonl").write_text(
      json.dumps({"context": "x", "input": "y", "answer": "z"}) + "\n")
  c.eval.longbench.data_dir = str(bad)
  c.eval.longbench.tasks = "qasper"
  with pytest.raises(EvalError, match=r"qasper.jsonl:1: missing field\(s\) \['answers'\]"):
    run(from_config(c), "longbench", **quiet)
  c.eval.longbench.tasks = "qasper,trek"
  with pytest.raises(EvalError, match="unknown LongBench task"):
    run(from_config(c), "longbench", **quiet)
  c.eval.perplexity.data = str(data["longbench"] / "qasper.jsonl")
  with pytest.raises(EvalError, match="no text field 'text'"):
    run(from_config(c), "perplexity", **quiet)


def test_grid_beyond_token_limit(beacon, tmp_path):
  c, built = beacon
  c.eval.output_dir = str(tmp_path)
  # the tiny model holds (32768 positions - window 64) x ratio 4 + 64 = 130880 tokens
  c.eval.passkey.lengths = (640, 1000000)
  with pytest.raises(EvalError, match="more than this beacon model can hold"):
    run(from_config(c), "passkey", built=built, log=lambda s: None)


# ------------------------------------------------------------------------------------------------
def _cli(*args):
  env = {"JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"}
  env.update({k: os.environ[k] for k in ("HOME", "LONGJAX_CACHE", "XDG_CACHE_HOME")
              if k in os.environ})  # where the cached SmolLM2 lives
  return run_python("eval.py", *args, env=env, timeout=600)


def test_cli_acceptance_passkey(tmp_path):
  r = _cli("--config=configs/tiny_beacon.py", "--config.eval.task=passkey",
           f"--config.workdir={tmp_path}")
  assert r.returncode == 0, r.stderr[-3000:]
  assert (tmp_path / "eval" / "beacon_passkey.json").exists()
  assert (tmp_path / "eval" / "beacon_passkey.png").exists()
  assert "accuracy per (depth %, length)" in r.stdout and "passkey" in r.stderr  # table, tqdm
  r = _cli("--config=configs/tiny_beacon.py", "--config.eval.task=needel")
  assert r.returncode != 0 and "valid tasks: passkey, needle" in r.stderr


def test_cli_real_checkpoint_uses_its_own_tokenizer(tmp_path):
  """The tiny config's eval section on SmolLM2: the checkpoint's tokenizer (and chat template) is
  used, not the tiny model's byte tokenizer (which scored it 0/6). ~30 s on 2 CPU cores."""
  from longjax.ckpts import smollm2
  if not (smollm2.cache_dir() / "smollm2-135m-instruct" / "hf" / "model.safetensors").exists():
    pytest.skip("SmolLM2 is not cached (python -m longjax.ckpts.smollm2 fetches it)")
  r = _cli("--config=configs/tiny_beacon.py", "--config.eval.checkpoint=smollm2",
           "--config.eval.method=plain", "--config.eval.task=passkey",
           "--config.eval.passkey.lengths=(400,)", "--config.eval.passkey.depths=(0,50,100)",
           f"--config.workdir={tmp_path}")
  assert r.returncode == 0, r.stderr[-3000:]
  out = json.loads((tmp_path / "eval" / "plain_passkey.json").read_text())
  recs = [json.loads(x) for x in (tmp_path / "eval" / "plain_passkey.samples.jsonl").open()][1:]
  assert len(recs) == 3 and sum(r["acc"] for r in recs) >= 2, (out, recs)
  r = _cli("--config=configs/tiny_beacon.py", "--config.eval.checkpoint=smollm2",
           "--config.data.tokenizer=byte", f"--config.workdir={tmp_path}")
  assert r.returncode != 0 and "has its own tokenizer" in r.stderr and \
      "--config.data.tokenizer=''" in r.stderr


def _hf_tokenizer():
  """A tiny byte-level HF tokenizer built offline (BOS added by default, a chat template)."""
  from hf_models import byte_level_tokenizer
  tok = byte_level_tokenizer()
  tok.chat_template = ("{% for m in messages %}[U]{{ m['content'] }}{% endfor %}"
                       "{% if add_generation_prompt %}[A]{% endif %}")
  return tok


def test_hf_tokenizer_interface():
  tok = Tokenizer(_hf_tokenizer())
  assert tok.encode("hi", special=True)[0] == 0 and tok.encode("hi")[0] != 0
  assert tok.decode(tok.encode("hi there", special=True)) == "hi there"
  ids = tok.prompt_ids("hi", chat=True)
  assert tok.decode(ids) == "[U]hi[A]"
  assert tok.prompt_ids("hi", chat=False) == tok.encode("hi", special=True)
  assert tok.decode(tok.answer_ids("123")) == "123" and 0 not in tok.answer_ids("123")
  assert tok.decode([tok.newline_id]) == "\n"


@pytest.mark.slow
def test_all_tasks_focus_and_plain(data, tmp_path):
  for cfg, method in (("tiny_focus", ""), ("tiny_beacon", "plain")):
    c = with_data(load_config(cfg, tmp_path / "wd", method=method), data)
    c.eval.output_dir = str(tmp_path / cfg)
    out = run(from_config(c), "all", log=lambda s: None)
    assert set(out) == {"passkey", "needle", "perplexity", "longbench", "infbench"}
    assert len(out["longbench"]["scores"]) == 14
