"""Small synthetic datasets in the published formats (tests and smoke runs; no downloads).

``write_all(root)`` writes, under ``root``:

* ``haystack/``: a few ``.txt`` essays (needle);
* ``pg19.jsonl``: documents with a ``text`` field (perplexity);
* ``longbench/{task}.jsonl`` for the 14 English tasks (``context``, ``input``, ``answers``,
  ``all_classes``, ``length``, ``dataset``, ``language``, ``_id``);
* ``infbench/{task}.jsonl`` for the 4 InfiniteBench tasks (``id``, ``context``, ``input``,
  ``answer``, ``options``);
* ``tfds/``: with ``tfds=True``, a tiny ``pg19`` TFDS dataset (``book_text``, ``book_title``,
  ``book_id``; splits train / validation / test) prepared as array_record.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

WORDS = ("time people year way day man thing woman life child world school state family student "
         "group country problem hand part place case week company system program question work "
         "government number night point home water room mother area money story fact month lot "
         "right study book eye job word business issue side kind head house service friend father "
         "power hour game line end member law car city community name president team minute idea "
         "kid body information back parent face others level office door health person art war "
         "history party result change morning reason research girl guy moment air teacher force "
         "education").split()


def sentence(rng, n_words: int = 8) -> str:
  w = [WORDS[int(i)] for i in rng.integers(0, len(WORDS), n_words)]
  return " ".join(w).capitalize() + "."


def paragraph(rng, n_sent: int) -> str:
  return " ".join(sentence(rng, int(rng.integers(5, 12))) for _ in range(n_sent))


def _jsonl(path: Path, recs):
  path.parent.mkdir(parents=True, exist_ok=True)
  with open(path, "w", encoding="utf-8") as f:
    for r in recs:
      f.write(json.dumps(r) + "\n")


def write_haystack(root: Path, n_files: int = 3, seed: int = 0) -> Path:
  rng = np.random.default_rng(seed)
  d = Path(root) / "haystack"
  d.mkdir(parents=True, exist_ok=True)
  for i in range(n_files):
    (d / f"essay{i:02d}.txt").write_text(paragraph(rng, 12) + "\n")
  return d


def write_pg19_jsonl(root: Path, n_docs: int = 2, n_sent: int = 30, seed: int = 1) -> Path:
  rng = np.random.default_rng(seed)
  path = Path(root) / "pg19.jsonl"
  _jsonl(path, [{"id": f"book{i}", "text": paragraph(rng, n_sent)} for i in range(n_docs)])
  return path


def write_longbench(root: Path, n: int = 1, seed: int = 2, context_sent: int = 6) -> Path:
  from longjax.eval.longbench import TASKS
  rng = np.random.default_rng(seed)
  d = Path(root) / "longbench"
  classes = ["Description", "Entity", "Abbreviation", "Human", "Location", "Numeric"]
  for task in TASKS:
    recs = []
    for i in range(n):
      ctx = paragraph(rng, context_sent)
      if task in ("lcc", "repobench-p"):
        ctx = "def f(x):\n    y = x + 1\n    return y\n\n"
        ans = ["print(f(2))"]
      elif task == "trec":
        ans = [classes[i % len(classes)]]
      elif task in ("gov_report", "qmsum", "multi_news", "samsum"):
        ans = [sentence(rng, 10)]
      else:
        ans = [WORDS[int(rng.integers(len(WORDS)))]]
      recs.append(dict(input=f"Question {i}: what is {WORDS[i % len(WORDS)]}?", context=ctx,
                       answers=ans, length=len(ctx.split()), dataset=task, language="en",
                       all_classes=classes if task == "trec" else None, _id=f"{task}-{i}"))
    _jsonl(d / f"{task}.jsonl", recs)
  return d


def write_infbench(root: Path, n: int = 1, seed: int = 3) -> Path:
  rng = np.random.default_rng(seed)
  d = Path(root) / "infbench"
  for task in ("longbook_choice_eng", "passkey", "number_string", "kv_retrieval"):
    recs = []
    for i in range(n):
      if task == "longbook_choice_eng":
        opts = [WORDS[int(j)] for j in rng.choice(len(WORDS), 4, replace=False)]
        recs.append(dict(id=i, context=paragraph(rng, 6), input="Who is the hero?",
                         answer=[opts[i % 4]], options=opts))
      elif task == "kv_retrieval":
        kv = {f"{int(rng.integers(1e6))}-key": f"{int(rng.integers(1e6))}-val" for _ in range(4)}
        k = list(kv)[0]
        recs.append(dict(id=i, context=json.dumps(kv),
                         input=f"Key: \"{k}\"\nThe value associated with the specified key is: ",
                         answer=kv[k], options=[]))
      else:
        key = str(int(rng.integers(10000, 99999)))
        noise = "The grass is green. The sky is blue. " * 4
        what = "pass key" if task == "passkey" else "sequence of digits"
        recs.append(dict(id=i, context=f"{noise}The {what} is {key}. Remember it. {noise}",
                         input=f"What is the {what}?", answer=[key], options=[]))
    _jsonl(d / f"{task}.jsonl", recs)
  return d


def write_tfds_pg19(root: Path, n_docs: int = 2, seed: int = 4) -> Path:
  """A tiny TFDS ``pg19`` (array_record) under ``root/tfds``; returns the data_dir."""
  import tensorflow_datasets as tfds

  rng = np.random.default_rng(seed)
  texts = [paragraph(rng, 20) for _ in range(n_docs)]

  class Pg19(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    VERSION = tfds.core.Version("0.1.0")
    # A one-part module name: TFDS then skips its code_path lookup (which needs the
    # importlib_resources backport for builders defined inside a package).
    __module__ = "pg19_synthetic"

    def _info(self):
      return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({
          "book_text": tfds.features.Text(), "book_title": tfds.features.Text(),
          "book_id": np.int32}))

    def _split_generators(self, dl_manager):
      return {s: self._generate_examples(s) for s in ("train", "validation", "test")}

    def _generate_examples(self, split):
      for i, t in enumerate(texts):
        yield f"{split}-{i}", {"book_text": t, "book_title": f"{split} book {i}", "book_id": i}

  data_dir = Path(root) / "tfds"
  Pg19(data_dir=str(data_dir), file_format="array_record").download_and_prepare()
  return data_dir


def write_all(root, tfds: bool = False) -> dict:
  root = Path(root)
  out = dict(haystack=write_haystack(root), pg19=write_pg19_jsonl(root),
             longbench=write_longbench(root), infbench=write_infbench(root))
  if tfds:
    out["tfds"] = write_tfds_pg19(root)
  return out
