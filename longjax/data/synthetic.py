"""Deterministic synthetic documents (no files, no network) for the tiny default configs and the
learning proof: passkey-style retrieval documents and simple repeated patterns.

A document is a list of ``(text, is_answer)`` segments, so that the answer span survives
tokenisation with any tokenizer (each segment is tokenised on its own and concatenated).
"""
from __future__ import annotations

import numpy as np

from longjax.data.errors import DataError

GARBAGE = ("The grass is green. The sky is blue. The sun is yellow. Here we go. "
           "There and back again. ")
QUESTION = "What is the pass key? The pass key is "
# "marker" style (the proof-of-learning task, sized for a tiny byte-level LM trained in minutes on
# a CPU): the key follows ':' and each of its symbols comes from a slot alphabet that occurs
# nowhere else, so retrieval is content-based; the filler is random words of a per-document
# vocabulary.
MARKER_QUESTION = "What is the pass key? The pass key is:"
STYLES = ("official", "marker")
# marker keys: symbol i comes from its own 10-symbol alphabet (none occurs in the filler or the
# fixed text), e.g. "7CM"; chance of guessing a 3-symbol key is 1/1000.
MARKER_SLOTS = ("0123456789", "ABCDEFGHIJ", "KLMNOPQRSU")


def needle(key: str, style: str = "official") -> str:
  if style == "marker":
    return f"The pass key is:{key}. Remember it. "
  return f"The pass key is {key}. Remember it. {key} is the pass key. "


def _garbage(n: int, start: int = 0) -> str:
  if n <= 0:
    return ""
  reps = (start + n) // len(GARBAGE) + 2
  return (GARBAGE * reps)[start:start + n]


def _words_filler(rng: np.random.Generator, n: int, vocab: list, start: int = 0) -> str:
  if n <= 0:
    return ""
  out, k = [], 0
  while k < n + start:
    w = vocab[int(rng.integers(len(vocab)))] + " "
    out.append(w)
    k += len(w)
  return "".join(out)[start:start + n]


def passkey_segments(rng: np.random.Generator, n_chars: int, *, digits: int = 5,
                     depth=None, key=None, style: str = "official") -> list:
  """A passkey document of about ``n_chars`` characters (at least needle + question + answer).

  ``depth`` in [0, 1] places the needle (default: uniform); ``key`` forces the passkey.
  Segments: garbage, needle, garbage, question, answer (``is_answer=True``), ".".
  """
  if style not in STYLES:
    raise DataError(f"unknown passkey style {style!r}; choose one of {STYLES}")
  if key is None:
    if style == "marker":
      key = "".join(MARKER_SLOTS[i % len(MARKER_SLOTS)][int(rng.integers(10))]
                    for i in range(digits))
    else:
      key = str(int(rng.integers(10 ** (digits - 1), 10 ** digits)))
  nd = needle(key, style)
  question = MARKER_QUESTION if style == "marker" else QUESTION
  fill = max(0, n_chars - len(nd) - len(question) - len(key) - 1)
  frac = float(rng.random()) if depth is None else float(depth)
  pre = int(round(frac * fill))
  start = int(rng.integers(len(GARBAGE)))
  if style == "marker":
    # filler: random lowercase words from a per-document vocabulary (predictable only by
    # copying from context, which is the skill retrieval needs)
    vocab = ["".join(chr(int(c)) for c in rng.integers(97, 123, size=int(rng.integers(2, 6))))
             for _ in range(12)]
    text = _words_filler(rng, fill, vocab)
    return [(text[:pre], False), (nd, False), (text[pre:], False), (question, False),
            (key, True), (".", False)]
  return [(_garbage(pre, start), False), (nd, False),
          (_garbage(fill - pre, (start + pre) % len(GARBAGE)), False), (question, False),
          (key, True), (".", False)]


def pattern_segments(rng: np.random.Generator, n_chars: int) -> list:
  """Random short words repeated in a random order: learnable local structure."""
  words = ["".join(chr(int(c)) for c in rng.integers(97, 123, size=int(rng.integers(2, 6))))
           for _ in range(8)]
  out, n = [], 0
  while n < n_chars:
    w = words[int(rng.integers(len(words)))] + " "
    out.append(w)
    n += len(w)
  return [("".join(out)[:n_chars], False)]


KINDS = ("passkey", "pattern")


def generate(kind: str, count: int, min_chars: int, max_chars: int, seed: int, **kw) -> list:
  """``count`` documents (lists of segments), deterministic in ``seed``."""
  if kind not in KINDS:
    raise DataError(f"unknown synthetic data kind {kind!r}; choose one of {KINDS}")
  rng = np.random.default_rng([seed, KINDS.index(kind)])
  docs = []
  for _ in range(count):
    n = int(rng.integers(min_chars, max_chars + 1))
    docs.append(passkey_segments(rng, n, **kw) if kind == "passkey" else pattern_segments(rng, n))
  return docs
