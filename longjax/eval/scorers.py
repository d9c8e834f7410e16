"""Scorers of the official evaluation protocols, written from their published definitions.

Nothing here imports a metric package; each function documents the definition it follows and how
it relates to the package the official scripts call.

* :func:`qa_f1` -- SQuAD-style token F1 after LongBench's answer normalisation (lower case, drop
  ASCII punctuation, drop the articles a/an/the, collapse whitespace).
* :func:`rouge_l` -- ROUGE-L (Lin, 2004, summary-level LCS) with the conventions of the ``rouge``
  PyPI package (1.0.1) that LongBench and the beacon needle script call: sentences are split on
  ``"."``, words on whitespace (case and punctuation kept; a whitespace-only piece between two
  dots counts as one empty word, as in the package), and words are counted as a **set**
  (the package's default "exclusive" mode: m and n are the numbers of *distinct* words of the
  reference and the prediction; the LCS hits of a reference sentence are unioned over prediction
  sentences, and hits already counted for an earlier reference sentence are not counted again).
  The LCS is read back from the DP table dropping the prediction word on ties, which decides
  which words an LCS covers when several LCSs exist (it matters only under set counting).
  F is the harmonic mean (beta = 1). An empty prediction or reference scores 0 (LongBench
  catches the package's ValueError and returns 0).
* :func:`fuzz_ratio` -- ``fuzz.ratio`` of fuzzywuzzy as installed by the official requirements
  (pure-Python fallback, no python-Levenshtein): ``round(100 * difflib.SequenceMatcher(None, a,
  b).ratio())`` (Python's round-half-even), 100 for equal strings (also both empty), 0 when one
  is empty. ``method="indel"`` gives the exact normalised indel similarity
  ``100 * 2 * LCS(a, b) / (|a| + |b|)`` instead, which is what python-Levenshtein / rapidfuzz /
  thefuzz compute; the two agree whenever difflib's greedy matching finds a longest common
  subsequence (most short strings) and differ by difflib's heuristics otherwise.
* :func:`code_sim` -- LongBench ``code_sim_score``: the first line of the prediction (after
  stripping leading newlines) containing none of ``` ` ```, ``#``, ``//``; fuzz_ratio / 100.
* :func:`classification` -- LongBench ``classification_score`` (see its docstring for the list
  quirk it reproduces).
* InfiniteBench (``compute_scores.py``): :func:`first_int_match` (passkey, number_string),
  :func:`kv_match` (kv_retrieval), :func:`choice_match` (longbook_choice_eng).
"""
from __future__ import annotations

import difflib
import re
import string
from collections import Counter
from typing import Iterable, Optional, Sequence

from longjax.eval.errors import EvalError

_PUNCT = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_INT = re.compile(r"\d+")


# ------------------------------------------------------------------------------------------------
# QA F1 (LongBench / SQuAD).
def normalize_answer(s: str) -> str:
  """Lower-case, remove ASCII punctuation, remove articles, collapse whitespace (in that order)."""
  s = s.lower()
  s = "".join(ch for ch in s if ch not in _PUNCT)
  s = _ARTICLES.sub(" ", s)
  return " ".join(s.split())


def token_f1(pred_tokens: Sequence[str], ref_tokens: Sequence[str]) -> float:
  """F1 of the multiset overlap of two token lists (0 when nothing is shared)."""
  same = sum((Counter(pred_tokens) & Counter(ref_tokens)).values())
  if same == 0:
    return 0.0
  p = same / len(pred_tokens)
  r = same / len(ref_tokens)
  return 2 * p * r / (p + r)


def qa_f1(prediction: str, reference: str, **_) -> float:
  return token_f1(normalize_answer(prediction).split(), normalize_answer(reference).split())


# ------------------------------------------------------------------------------------------------
# ROUGE-L.
def _lcs_table(x: Sequence[str], y: Sequence[str]):
  n, m = len(x), len(y)
  c = [[0] * (m + 1) for _ in range(n + 1)]
  for i in range(1, n + 1):
    xi, row, prev = x[i - 1], c[i], c[i - 1]
    for j in range(1, m + 1):
      row[j] = prev[j - 1] + 1 if xi == y[j - 1] else max(prev[j], row[j - 1])
  return c


def lcs_length(x: Sequence, y: Sequence) -> int:
  """Length of a longest common subsequence (O(|x||y|) time, O(|y|) memory)."""
  if len(x) < len(y):
    x, y = y, x
  prev = [0] * (len(y) + 1)
  for xi in x:
    cur = [0]
    for j, yj in enumerate(y, 1):
      cur.append(prev[j - 1] + 1 if xi == yj else max(prev[j], cur[j - 1]))
    prev = cur
  return prev[-1]


def _lcs_words(ref: Sequence[str], hyp: Sequence[str]) -> set:
  """Words of one LCS of ``ref`` and ``hyp``; on ties the prediction word is dropped."""
  c = _lcs_table(ref, hyp)
  i, j, words = len(ref), len(hyp), set()
  while i > 0 and j > 0:
    if ref[i - 1] == hyp[j - 1]:
      words.add(ref[i - 1])
      i, j = i - 1, j - 1
    elif c[i - 1][j] > c[i][j - 1]:
      i -= 1
    else:
      j -= 1
  return words


def _sentences(text: str) -> list:
  """Split on ".", keep non-empty pieces, words = whitespace-normalised piece split on " " (a
  whitespace-only piece, e.g. between ". .", becomes the single word "", as in the package)."""
  return [" ".join(s.split()).split(" ") for s in text.split(".") if s]


def rouge_l(prediction: str, reference: str) -> dict:
  """Summary-level ROUGE-L ``{"p", "r", "f"}`` with the ``rouge`` package conventions (module
  docstring). 0 for an empty prediction or reference."""
  hyp, ref = _sentences(prediction), _sentences(reference)
  if not hyp or not ref:
    return {"p": 0.0, "r": 0.0, "f": 0.0}
  m = len({w for s in ref for w in s})
  n = len({w for s in hyp for w in s})
  counted: set = set()
  hits = 0
  for r in ref:
    union = set()
    for h in hyp:
      union |= _lcs_words(r, h)
    new = union - counted
    hits += len(new)
    counted |= new
  r_, p_ = hits / m, hits / n
  f = 0.0 if hits == 0 else 2 * p_ * r_ / (p_ + r_)
  return {"p": p_, "r": r_, "f": f}


def rouge_l_f(prediction: str, reference: str, **_) -> float:
  return rouge_l(prediction, reference)["f"]


def rouge_l_recall(prediction: str, reference: str) -> float:
  return rouge_l(prediction, reference)["r"]


# ------------------------------------------------------------------------------------------------
# Fuzzy string similarity and code similarity.
def fuzz_ratio(a: str, b: str, method: str = "difflib") -> float:
  """``fuzz.ratio`` in [0, 100] (module docstring): ``difflib`` (integer, fuzzywuzzy's fallback)
  or ``indel`` (exact normalised indel similarity, float)."""
  if a == b:
    return 100.0 if method == "indel" else 100
  if not a or not b:
    return 0.0 if method == "indel" else 0
  if method == "difflib":
    return int(round(100 * difflib.SequenceMatcher(None, a, b).ratio()))
  if method == "indel":
    return 100.0 * 2 * lcs_length(a, b) / (len(a) + len(b))
  raise EvalError(f"fuzz_ratio method must be 'difflib' or 'indel', got {method!r}")


def code_sim(prediction: str, reference: str, **_) -> float:
  line = ""
  for cand in prediction.lstrip("\n").split("\n"):
    if "`" not in cand and "#" not in cand and "//" not in cand:
      line = cand
      break
  return fuzz_ratio(line, reference) / 100


# ------------------------------------------------------------------------------------------------
# Classification (LongBench trec / lsht).
def classification(prediction: str, reference: str, all_classes: Optional[Iterable[str]] = None,
                   **_) -> float:
  """1 / (number of matched class names) if the reference is among them, else 0.

  Matched names: the classes that occur as substrings of the prediction, in ``all_classes``
  order. Then names that are substrings of the reference (but not equal to it) are removed, in
  one forward pass over the list that, like the published loop (it removes from the list it is
  iterating over), does not examine the entry that follows a removed one.
  """
  if all_classes is None:
    raise EvalError("classification scoring needs all_classes (the dataset's 'all_classes')")
  matched = [c for c in all_classes if c in prediction]
  kept, skip = [], False
  for name in matched:
    if skip:
      kept.append(name)
      skip = False
      continue
    if name in reference and name != reference:
      skip = True  # removed; the published loop then steps over the next entry
      continue
    kept.append(name)
  return 1.0 / len(kept) if reference in kept else 0.0


# ------------------------------------------------------------------------------------------------
# Passkey / InfiniteBench.
def first_int(text: str) -> str:
  """The first run of decimal digits in ``text`` ("" if none)."""
  m = _INT.search(text)
  return m.group(0) if m else ""


def first_int_match(prediction: str, reference) -> float:
  """InfiniteBench passkey / number_string, beacon passkey accuracy: first integer == answer."""
  return float(first_int(prediction) == str(reference).strip())


def kv_match(prediction: str, reference: str) -> float:
  """InfiniteBench kv_retrieval: the value is one of the prediction's words after replacing
  newline and ``: " ' . , ? ! { }`` by spaces."""
  for ch in "\n:\"'.,?!{}":
    prediction = prediction.replace(ch, " ")
  return float(reference in prediction.split())


def choice_match(prediction: str, letter: str, answer_text: str = "") -> float:
  """InfiniteBench longbook_choice_eng (``compute_scores.py`` rules, in order):

  1. empty prediction (after strip) -> wrong;
  2. first character is one of A-D -> it must be the correct letter (the official rule the
     FocusLLM spec states; the rest are fallbacks for other outputs);
  3. the prediction is a substring of the correct option text -> right;
  4. after "answer is:", "answer:", "answer is" or "option is" (first one found, punctuation
     turned to spaces) the text must start with the letter or the option text;
  5. otherwise the first word that is a single letter A-D decides.
  """
  labels = [letter] + ([answer_text] if answer_text else [])
  pred = prediction.strip()
  if not pred:
    return 0.0
  if pred[0] in "ABCD":
    return float(pred[0] == letter)
  if answer_text and pred in answer_text:
    return 1.0
  for ch in "\n\"'.,?!{}":
    pred = pred.replace(ch, " ")
  while "  " in pred:
    pred = pred.replace("  ", " ")
  for prefix in ("answer is:", "answer:", "answer is", "option is"):
    idx = pred.find(prefix)
    if idx == -1:
      continue
    after = pred[idx + len(prefix) + 1:]
    return float(any(after.startswith(lab) for lab in labels))
  for word in pred.split():
    if word in ("A", "B", "C", "D"):
      return float(word == letter)
  return 0.0


def best_of(metric, prediction: str, references: Sequence[str], **kw) -> float:
  """LongBench: the best score over the reference answers."""
  return max((metric(prediction, r, **kw) for r in references), default=0.0)
