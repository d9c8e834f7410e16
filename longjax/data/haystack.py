"""Needle-in-a-haystack training and held-out data with variety on every axis (host-side only).

A *document* is an instruction, a haystack of a token budget, and one question. Haystacks are real
prose (Debian packages, Python's own docs) or procedural (repeated plain sentences, shuffled
sentence lists, key-value records, station logs). Needles are numbers of 3-10 digits, words, names,
dates, hex codes (groups of four hex digits) or short facts about a person, one target and 0-3
distractors (same kind and noun, other keys, other values) at depths uniform over the haystack.
Some questions ask about the haystack itself instead: which words follow a quoted sentence, which
name goes with a record. Instruction, needle and question phrasings come in two sets that share no
phrasing: ``train`` and ``heldout``.

Held out, never emitted by the train split (checked when a record is made): the prose source
``pydoc`` (Python's ``pydoc_data.topics``, also the project's held-out perplexity text) and the
procedural family ``logs``, plus every held-out phrasing. The heldout split uses only those
haystacks and phrasings, so everything about it is unseen in training.

Records (one JSON object a line) are train.py ``jsonl:`` input/output pairs: ``input`` is the
prompt (wrapped as one user turn by the tokenizer's chat template, up to the assistant header, when
it has one; the reader adds the newline), ``output`` the answer span. ``output`` starts as the exact
``target`` string; a teacher-labelling step (the full-attention base's greedy answer while the
whole document fits its context) stores its answer in ``teacher_output`` and, when that answer
is correct (:func:`score`), in ``output`` too (:func:`label`), so training learns the base's own
words and never one fixed answer sentence. ``n_tokens``: the tokens of ``input`` (train.py then
adds the newline, the answer and EOS), at most the drawn budget and within a few tokens of it.
``--kind prose`` writes ``{"text": ...}`` windows of real prose for a dense LM / distillation
signal.

Same arguments, same file, byte for byte (every document draws from its own ``(seed, split,
index)`` generator). Sources: ``apt-get install -y bible-kjv bible-kjv-text debian-handbook
fortunes``; ``licenses`` is Debian's ``base-files``; ``pydoc`` ships with Python.

The command line is ``scripts/haystack.py``.
"""
from __future__ import annotations

import collections
import functools
import html.parser
import json
import os
import re
import shutil
import subprocess
import unicodedata
import warnings
from pathlib import Path

import numpy as np

from longjax.data.errors import DataError

SPLITS = ("train", "heldout")
PROSE = ("kjv", "handbook", "licenses", "fortunes", "pydoc")
FAMILIES = ("repeat", "shuffled", "records", "logs")
HELDOUT_PROSE = "pydoc"
HELDOUT_FAMILY = "logs"
HELDOUT_HAYSTACKS = (HELDOUT_PROSE, HELDOUT_FAMILY)

# ------------------------------------------------------------------------------------------------
# Real prose sources (read once per process).
HANDBOOK_DIR = Path("/usr/share/doc/debian-handbook/html/en-US")
LICENSES_DIR = Path("/usr/share/common-licenses")
FORTUNES_DIR = Path("/usr/share/games/fortunes")
BIBLE_EXE = "bible"
APT = {"kjv": "bible-kjv bible-kjv-text", "handbook": "debian-handbook", "licenses": "base-files",
       "fortunes": "fortunes",
       "pydoc": "libpython3-stdlib"}  # pydoc_data: Debian's Python standard library package


class _HtmlText(html.parser.HTMLParser):
  SKIP = {"script", "style", "head", "nav", "pre"}  # code listings are not prose

  def __init__(self):
    super().__init__()
    self.parts, self.skip = [], 0

  def handle_starttag(self, tag, attrs):
    self.skip += tag in self.SKIP
    if tag in ("p", "div", "li", "h1", "h2", "h3", "h4", "tr", "br", "dt", "dd"):
      self.parts.append("\n")

  def handle_endtag(self, tag):
    if tag in self.SKIP and self.skip > 0:
      self.skip -= 1

  def handle_data(self, data):
    if not self.skip:
      self.parts.append(data)


def _missing(name: str, what: str) -> DataError:
  return DataError(f"haystack source {name!r} is missing ({what}); install it with "
                   f"`apt-get install -y {APT[name]}` or leave {name!r} out of --haystacks")


def _kjv_text() -> str:
  exe = shutil.which(BIBLE_EXE)
  if exe is None:
    raise _missing("kjv", f"no `{BIBLE_EXE}` command")
  r = subprocess.run([exe, "-l100000", "Gen1:1-Rev22:21"], capture_output=True, text=True,
                     timeout=300)
  if r.returncode != 0 or len(r.stdout) < 100_000:
    raise _missing("kjv", f"`{BIBLE_EXE}` printed no text (exit {r.returncode})")
  # verse lines are "  12 text" (one line each at this width); book/chapter headers are dropped
  return "\n".join(m.group(1) for m in re.finditer(r"^ +\d+ (.*)$", r.stdout, re.M))


def _handbook_text() -> str:
  files = sorted(HANDBOOK_DIR.glob("*.html")) if HANDBOOK_DIR.is_dir() else []
  if not files:
    raise _missing("handbook", f"no HTML in {HANDBOOK_DIR}")
  out = []
  for f in files:
    p = _HtmlText()
    p.feed(f.read_text(encoding="utf-8", errors="replace"))
    out.append("".join(p.parts))
  return "\n".join(out)


def _licenses_text() -> str:
  files = [f for f in sorted(LICENSES_DIR.glob("*")) if f.is_file() and not f.is_symlink()]
  if not files:
    raise _missing("licenses", f"no files in {LICENSES_DIR}")
  return "\n".join(f.read_text(encoding="utf-8", errors="replace") for f in files)


def _fortunes_text() -> str:
  # one cookie file per topic, cookies separated by "%" lines; the drawings are not prose
  files = [f for f in sorted(FORTUNES_DIR.glob("*")) if f.is_file() and not f.suffix
           and "art" not in f.name] if FORTUNES_DIR.is_dir() else []
  if not files:
    raise _missing("fortunes", f"no cookie files in {FORTUNES_DIR}")
  cookies = [c for f in files
             for c in re.split(r"^%$", f.read_text(encoding="utf-8", errors="replace"), flags=re.M)]
  # attribution lines ("-- Mark Twain") would glue onto the next cookie's first sentence
  return "\n".join(re.sub(r"^\s*--.*$", "", c, flags=re.M) for c in cookies)


def _pydoc_text() -> str:
  try:
    from pydoc_data.topics import topics
  except ImportError:
    raise _missing("pydoc", "this Python has no pydoc_data module") from None
  return "\n".join(topics[k] for k in sorted(topics))


def split_sentences(text: str) -> list:
  """Sentences of 4-60 words (headings, code and list debris are dropped)."""
  text = " ".join(text.split())
  parts = re.split(r"(?<=[.!?])\s+(?=[A-Z\"'(])", text)
  return [p for p in parts if 4 <= len(p.split()) <= 60 and p[-1] in ".!?" and p[0].isupper()]


_LOADERS = {"kjv": _kjv_text, "handbook": _handbook_text, "licenses": _licenses_text,
            "fortunes": _fortunes_text, "pydoc": _pydoc_text}


@functools.lru_cache(maxsize=None)
def prose_sentences(name: str) -> tuple:
  sents = tuple(split_sentences(_LOADERS[name]()))
  if len(sents) < 200:
    raise _missing(name, f"only {len(sents)} sentences found")
  return sents


def load_texts(haystacks, allow_missing: bool = False) -> dict:
  """``{name: sentences}`` for the prose names in ``haystacks``; a missing source raises one
  :class:`DataError` naming its apt package, or (``allow_missing``) is skipped with a warning."""
  out = {}
  for h in haystacks:
    if h not in PROSE:
      continue
    try:
      out[h] = prose_sentences(h)
    except DataError as e:
      if not allow_missing:
        raise
      warnings.warn(f"skipped: {e}")
  return out


# ------------------------------------------------------------------------------------------------
# Vocabulary of needles and procedural haystacks (written for this project).
FIRST = ("Amara Bastian Celeste Dorian Elif Farid Greta Hollis Ines Jasper Kaito Lucia Mateo Nadia "
         "Oskar Priya Quentin Rosalind Soren Talia Umberto Vera Wendell Ximena Yusuf Zora Anselm "
         "Brigid Cosmo Delphine").split()
LAST = ("Ashcombe Birchfield Calloway Drummond Everly Fairweather Galloway Hartigan Ivers Jessop "
        "Kingsley Lockhart Merriweather Northcott Oakes Pemberton Quarry Ravensworth Stanhope "
        "Thistlewood Underhill Vance Whitlock Yardley Ellery Fenwick Greaves Holt Marchetti "
        "Okafor").split()
WORDS = ("lantern harbour velvet orchard compass thimble glacier saffron meadow anvil cobalt "
         "juniper falcon pewter marble quiver tundra walnut ember lagoon beacon cinder harp "
         "mosaic nutmeg oyster parsley quartz riddle sextant tinder umbrella vellum willow "
         "yarrow zephyr almond barley canyon dynamo easel fennel garnet hazel indigo jasmine "
         "kestrel lilac mango nickel obsidian pepper quill rhubarb sparrow tamarind").split()
COLOURS = "amber teal crimson ochre lavender olive scarlet turquoise maroon ivory".split()
FRUITS = "apricot fig quince plum mango cherry guava lychee damson papaya".split()
TOWNS = "Harwick Dunmore Elsby Fernhill Gorsedale Kettering Lowmoor Marbury Pellston Rydal".split()
INSTRUMENTS = "cello oboe harp bassoon banjo viola clarinet trombone lute accordion".split()
MONTHS = ("January February March April May June July August September October November "
          "December").split()
PLACES = ("warehouse depot gate cellar workshop archive greenhouse boathouse observatory library "
          "garage studio pantry tower chapel mill").split()
SIDES = "north south east west upper lower old new inner outer".split()
# noun (what the value is called) per needle kind; fact nouns pick their value pool
NOUNS = {
    "number": ("access code", "serial number", "ticket number", "safe combination",
               "account number", "order number"),
    "word": ("password", "code word", "secret word", "watchword"),
    "name": ("contact person", "night guard", "caretaker", "guest of honour"),
    "date": ("delivery date", "opening day", "inspection date", "renewal date"),
    "code": ("licence key", "access token", "device id", "booking reference"),
    "fact": ("favourite colour", "favourite fruit", "home town", "favourite instrument"),
}
NEEDLE_KINDS = tuple(NOUNS)
FACT_VALUES = {"favourite colour": COLOURS, "favourite fruit": FRUITS, "home town": TOWNS,
               "favourite instrument": INSTRUMENTS}

# Plain sentences of the procedural families: subject + action + place, combined at random.
SUBJECTS = ("The baker", "A tired porter", "The ferryman", "An old teacher", "The gardener",
            "A young clerk", "The miller", "A travelling tinker", "The innkeeper", "A shepherd",
            "The blacksmith", "A quiet student", "The postwoman", "A fisherman", "The mayor")
ACTIONS = ("sweeps the steps", "counts the crates", "mends a fence", "reads a letter",
           "waits for the tram", "paints a shutter", "carries a ladder", "feeds the geese",
           "winds the clock", "sharpens a knife", "folds the linen", "lights the stove",
           "tunes a fiddle", "checks the ledger", "repairs a wheel")
WHERES = ("near the bridge", "behind the chapel", "at the market", "by the canal",
          "in the courtyard", "outside the bakery", "on the hill road", "beside the well",
          "under the arcade", "at the station", "in the orchard", "by the harbour wall")
REPEAT = ("The kettle sits on the cold stove.", "A path winds down towards the river.",
          "Nobody is in the waiting room today.", "The shutters of the shop are closed.",
          "Clouds drift slowly over the roofs.", "The chairs are stacked along the hall.",
          "Somewhere a dog barks twice.", "The lamp in the corridor flickers.",
          "Dust settles on the window ledge.", "A cart rolls past the empty square.")
STATIONS = ("Kestrel", "Bramble", "Corrie", "Dunlin", "Eyrie", "Fathom", "Gannet", "Heron",
            "Ibis", "Jetty", "Kittiwake", "Lapwing")

# ------------------------------------------------------------------------------------------------
# Phrasings: train and held-out sets, disjoint (checked at import).
INSTRUCTIONS = {
    "train": (
        "Read the text below and answer the question at the end.",
        "Here is a document. A question about it follows.",
        "The following passage contains a few details worth noticing. Read it carefully.",
        "Below is a long text. Answer the question after it.",
        "Go through this document; you will be asked about it.",
        "Study the material below, then answer briefly.",
        "Some facts are buried in the text that follows.",
        "Read everything below. Then reply to the question.",
        "A document follows. Pay attention to names, numbers and dates in it.",
        "Please read this and answer the question that comes after it.",
        "Look through the text below for the answer to a question at its end.",
        "Read this document closely and then answer.",
    ),
    "heldout": (
        "You will see a text and then one question about it.",
        "Take in the document below; a question is waiting at its end.",
        "What follows is a long piece of writing. One question comes after.",
        "Read on. At the end there is something to answer.",
        "The text below contains what you need to answer a question.",
        "Here comes a document, followed by a question on its content.",
    ),
}
NEEDLES = {
    "train": (
        "The {noun} for {key} is {value}.",
        "Note: {key} has the {noun} {value}.",
        "For {key}, the {noun} is {value}.",
        "Remember that the {noun} of {key} is {value}.",
        "Someone wrote down the {noun} for {key}: it is {value}.",
        "The {noun} assigned to {key} reads {value}.",
        "Please keep in mind that {key} uses {value} as its {noun}.",
        "In the records, the {noun} listed for {key} is {value}.",
        "It was agreed that the {noun} for {key} would be {value}.",
        "As for {key}, its {noun} is {value}.",
        "The {noun} belonging to {key} was set to {value}.",
        "Everyone knows the {noun} of {key}: {value}.",
    ),
    "heldout": (
        "A quick reminder: {value} is the {noun} of {key}.",
        "The {noun} that goes with {key} happens to be {value}.",
        "Write this down: {key}, {noun} {value}.",
        "According to the notice, {key} goes by the {noun} {value}.",
        "It was {value} that became the {noun} for {key}.",
        "If anyone asks about {key}, its {noun} is {value}.",
    ),
}
QUESTIONS = {
    "train": (
        "What is the {noun} for {key}?",
        "Which {noun} does {key} have?",
        "Tell me the {noun} of {key}.",
        "What {noun} was given for {key}?",
        "Can you find the {noun} that belongs to {key}?",
        "Look up the {noun} for {key}. What is it?",
        "What did the text say the {noun} of {key} is?",
        "Find the {noun} of {key} in the text.",
        "I need the {noun} of {key}. What is it?",
        "According to the document, what is the {noun} of {key}?",
        "Give the {noun} for {key}.",
        "What is {key}'s {noun}?",
    ),
    "heldout": (
        "Do you remember the {noun} of {key}?",
        "Which value is recorded as the {noun} for {key}?",
        "Say the {noun} linked to {key}.",
        "What was noted as the {noun} of {key}?",
        "Quickly: the {noun} for {key}?",
        "From the document, give the {noun} for {key}.",
    ),
}
# content questions: what follows a quoted sentence; which name goes with a record / log entry
NEXT_QUESTIONS = {
    "train": ('Which words come right after the sentence "{quote}" in the text?',
              'Continue the text: what follows "{quote}"?',
              'In the document, what is written immediately after "{quote}"?',
              'Quote the words that follow "{quote}".'),
    "heldout": ('What does the text say next, after "{quote}"?',
                'After the line "{quote}", how does the text go on?'),
}
RECORD_QUESTIONS = {
    "train": ("Which name appears with record {key}?", "Who is listed on record {key}?",
              "Record {key} names a person. Who?", "Whose name is on record {key}?"),
    "heldout": ("Which station logged the reading at {key}?",
                "At {key}, which station sent a reading?"),
}
PHRASINGS = {"instruction": INSTRUCTIONS, "needle": NEEDLES, "question": QUESTIONS,
             "next": NEXT_QUESTIONS, "record": RECORD_QUESTIONS}
for _name, _sets in PHRASINGS.items():
  assert not set(_sets["train"]) & set(_sets["heldout"]), f"{_name} phrasings overlap"


def allowed_haystacks(split: str) -> tuple:
  if split not in SPLITS:
    raise DataError(f"unknown split {split!r}; use one of {SPLITS}")
  if split == "heldout":
    return HELDOUT_HAYSTACKS
  return tuple(h for h in PROSE + FAMILIES if h not in HELDOUT_HAYSTACKS)


def check_haystacks(split: str, haystacks) -> tuple:
  allowed = allowed_haystacks(split)
  for h in haystacks:
    if h not in PROSE + FAMILIES:
      raise DataError(f"unknown haystack {h!r}; choose from {', '.join(PROSE + FAMILIES)}")
    if h not in allowed:
      raise DataError(f"haystack {h!r} is not in the {split} split (held out: "
                      f"{', '.join(HELDOUT_HAYSTACKS)}, and nothing else is in heldout); "
                      f"choose from {', '.join(allowed)}")
  return tuple(haystacks)


# ------------------------------------------------------------------------------------------------
# Values
def _pick(rng, seq):
  return seq[int(rng.integers(len(seq)))]


def _name(rng) -> str:
  return f"{_pick(rng, FIRST)} {_pick(rng, LAST)}"


def _value(rng, kind: str, noun: str) -> str:
  if kind == "number":
    d = int(rng.integers(3, 11))
    return str(int(rng.integers(1, 10))) + "".join(str(int(x)) for x in rng.integers(0, 10, d - 1))
  if kind == "word":
    return _pick(rng, WORDS)
  if kind == "name":
    return _name(rng)
  if kind == "date":
    return f"{int(rng.integers(1, 29))} {_pick(rng, MONTHS)} {int(rng.integers(1950, 2031))}"
  if kind == "code":
    return "-".join("".join("0123456789abcdef"[int(x)] for x in rng.integers(0, 16, 4))
                    for _ in range(int(rng.integers(2, 5))))
  return _pick(rng, FACT_VALUES[noun])


def _key(rng, kind: str) -> str:
  if kind == "fact":
    return _name(rng)
  return f"the {_pick(rng, SIDES)} {_pick(rng, PLACES)}"


# ------------------------------------------------------------------------------------------------
# Haystack units: (text, meta) in document order
def _units(name: str, rng, texts: dict):
  if name in PROSE:
    sents = texts[name]
    i = int(rng.integers(len(sents)))
    while True:
      yield sents[i % len(sents)], None
      i += 1
  if name == "repeat":
    pool = [REPEAT[int(j)] for j in rng.choice(len(REPEAT), int(rng.integers(2, 6)), replace=False)]
    while True:
      for s in pool:
        yield s, None
  if name == "shuffled":
    while True:
      yield f"{_pick(rng, SUBJECTS)} {_pick(rng, ACTIONS)} {_pick(rng, WHERES)}.", None
  if name == "records":
    rid = int(rng.integers(1000, 90000))
    while True:
      rid += int(rng.integers(1, 40))  # increasing: every record id occurs once
      who, colour = _name(rng), _pick(rng, COLOURS)
      yield (f"Record {rid}: {who}, {colour} folder, shelf {int(rng.integers(1, 60))}.",
             {"key": str(rid), "target": who})
  if name == "logs":
    minute = int(rng.integers(0, 600))
    while True:
      minute += int(rng.integers(1, 9))  # increasing: every timestamp occurs once
      at = f"day {minute // 1440 + 1}, {minute % 1440 // 60:02d}:{minute % 60:02d}"
      st = _pick(rng, STATIONS)
      yield (f"[{at}] station {st} logged {int(rng.integers(-20, 40))}.{int(rng.integers(10))} "
             f"degrees", {"key": at, "target": st})
  raise DataError(f"unknown haystack {name!r}")


def _count(tok, text: str) -> int:
  return len(tok.encode(text))


def _wrap(tok, text: str, chat: bool) -> str:
  if chat and tok.has_chat_template:
    p = tok.tok.apply_chat_template([{"role": "user", "content": text}],
                                    add_generation_prompt=True, tokenize=False)
    # train.py's jsonl reader puts a newline between input and output: the header's own
    return p[:-1] if p.endswith("\n") else p
  return text


class _Doc:
  """A document under construction: head units (some protected), then a tail of loose words."""

  def __init__(self, tok, chat, instruction, question, sep):
    self.tok, self.chat, self.instruction, self.question, self.sep = (tok, chat, instruction,
                                                                      question, sep)
    # tail: the loose words that end the haystack, a prefix of pool (the words after the head)
    self.head, self.protected, self.tail, self.pool = [], [], [], []

  def body(self, k=None) -> str:
    parts = self.head + ([" ".join(self.tail[:k])] if self.tail[:k] else [])
    return self.sep.join(parts)

  def text(self, k=None) -> str:
    body = self.body(k)
    if self.instruction is None:
      return body
    return _wrap(self.tok, f"{self.instruction}\n\n{body}\n\n{self.question}", self.chat)

  def n(self, k=None) -> int:
    return _count(self.tok, self.text(k))


def _settle(doc: _Doc, budget: int):
  """Keep as many tail words as fit in ``budget`` (binary search on the real token count), after
  dropping trailing unprotected head units while even no tail is too long."""
  while doc.n(0) > budget:
    free = [i for i, p in enumerate(doc.protected) if not p]
    if not free:
      raise DataError(f"--tokens is too small for this document: its instruction, question "
                      f"and needles alone take {doc.n(0)} tokens, more than the {budget} left "
                      "for them; raise --tokens")
    del doc.head[free[-1]], doc.protected[free[-1]]
  words = doc.pool
  doc.tail = words
  lo, hi = 0, len(words)  # the largest k with n(k) <= budget; n(0) <= budget holds
  while lo < hi:
    mid = (lo + hi + 1) // 2
    if doc.n(mid) <= budget:
      lo = mid
    else:
      hi = mid - 1
  doc.tail = words[:lo]
  if lo < len(words):  # then as many characters of the next word as fit: within a token or two
    w, c_lo, c_hi = words[lo], 0, len(words[lo]) - 1
    while c_lo < c_hi:
      mid = (c_lo + c_hi + 1) // 2
      doc.tail = words[:lo] + [w[:mid]]
      if doc.n() <= budget:
        c_lo = mid
      else:
        c_hi = mid - 1
    doc.tail = words[:lo] + ([w[:c_lo]] if c_lo else [])


def _fit(doc: _Doc, units, budget: int):
  """Fill ``doc`` up to ``budget`` tokens: whole units while they fit (by their own counts with
  the separator, an estimate under BPE merges), then as many loose words of the following units
  as fit."""
  base = doc.n()
  while True:
    t, _ = next(units)
    c = _count(doc.tok, doc.sep + t)
    if base + c > budget:
      break
    doc.head.append(t)
    doc.protected.append(False)
    base += c
  words = t.split()
  while len(words) <= budget - base + 1:  # every word is at least one token
    words += next(units)[0].split()
  doc.pool = words
  _settle(doc, budget)


def _needle_doc(tok, rng, P, ii, units, n_tokens, chat, sep, rec, kinds=NEEDLE_KINDS):
  nk = _pick(rng, kinds)
  noun = _pick(rng, NOUNS[nk])
  count = 1 + int(rng.integers(0, 4))
  keys, values = [], []
  while len(keys) < count:  # every pool has >= 10 values, so this ends
    k, v = _key(rng, nk), _value(rng, nk, noun)
    if k not in keys and v not in values:
      keys.append(k)
      values.append(v)
  qi = int(rng.integers(len(P["question"])))
  question = P["question"][qi].format(noun=noun, key=keys[0])
  needles = []
  for k, v in zip(keys, values):
    ni = int(rng.integers(len(P["needle"])))
    needles.append(dict(key=k, value=v, text=P["needle"][ni].format(noun=noun, key=k, value=v),
                        phrasing=ni))
  rec.update(needle_kind=nk, noun=noun,
             phrasing=dict(instruction=ii, question=qi, needle=[n["phrasing"] for n in needles]))
  doc = _Doc(tok, chat, P["instruction"][ii], question, sep)
  # the haystack leaves room for the needles; the loose words take up what is left after them
  _fit(doc, units, n_tokens - sum(_count(tok, sep + n["text"]) + 2 for n in needles))
  doc.pool += [w for _ in range(4) for w in next(units)[0].split()]
  # depths uniform over the haystack; draw order = target first, so no position favours it
  at = [int(round(float(rng.uniform()) * len(doc.head))) for _ in needles]
  for pos, n in sorted(zip(at, needles), key=lambda x: x[0], reverse=True):
    doc.head.insert(pos, n["text"])
    doc.protected.insert(pos, True)
  _settle(doc, n_tokens)
  return doc, question, values[0], values[1:], needles


def _content_doc(tok, rng, P, ii, units, n_tokens, chat, sep, rec, task):
  """A question about the haystack itself: the unit it quotes (and the one after it) is chosen
  among the first units of a provisional fit, then the document is fitted with the real question."""
  qset = P[task]
  qi = int(rng.integers(len(qset)))
  room = n_tokens - _Doc(tok, chat, P["instruction"][ii], "", sep).n()
  items, acc = [], 0
  while acc < 0.6 * room:
    items.append(next(units))
    acc += _count(tok, sep + items[-1][0])
  texts_in = [t for t, _ in items]
  # a quote must occur once and stay short; the unit after it must be in the head too
  cands = [j for j in range(len(items) - 2) if task == "record"
           or (texts_in.count(texts_in[j]) == 1 and len(texts_in[j].split()) <= 40)]
  if not cands:
    return None
  j = cands[int(rng.integers(len(cands)))]
  if task == "next":
    target = " ".join(items[j + 1][0].split()[:8])
    question = qset[qi].format(quote=items[j][0])
  else:
    target = items[j][1]["target"]
    question = qset[qi].format(key=items[j][1]["key"])
  rec.update(phrasing=dict(instruction=ii, question=qi))
  doc = _Doc(tok, chat, P["instruction"][ii], question, sep)
  doc.head = texts_in
  doc.protected = [i <= j + 1 for i in range(len(doc.head))]
  _fit(doc, units, n_tokens)
  if task == "next" and doc.body().count(items[j][0]) != 1:
    return None  # the quote recurs later in the document: not a question with one answer
  return doc, question, target, [], []


def _draw_haystack(rng, names, texts) -> str:
  """Real prose and procedural families equally often (when both are among ``names``); a prose
  source in proportion to the square root of its sentence count, so that a small one (the
  licences: ~900 sentences) repeats less across a large file than a uniform draw would make it."""
  prose = [h for h in names if h in texts]
  fams = [h for h in names if h in FAMILIES]
  half = 0.5 if prose and fams else 1.0
  root = np.sqrt([len(texts[h]) for h in prose])
  w = [half * r / root.sum() for r in root] + [half / max(len(fams), 1)] * len(fams)
  return (prose + fams)[int(rng.choice(len(w), p=np.asarray(w) / sum(w)))]


def make_record(tok, split: str, index: int, seed: int, n_tokens: int, texts: dict,
                haystacks=None, chat: bool = True, kind: str = "qa", needle_kinds=None) -> dict:
  """Document ``index`` of a split: a function of ``(seed, split, index)`` and the arguments
  only. ``texts``: :func:`load_texts`; ``kind``: ``qa`` (instruction, haystack, question) or
  ``prose`` (a window of real prose); ``needle_kinds``: a tuple of :data:`NEEDLE_KINDS` (as
  :func:`check_needle_kinds` returns it): every document plants needles of these kinds only
  (default: content questions too, and every kind)."""
  haystacks = check_haystacks(split, haystacks or allowed_haystacks(split))
  rng = np.random.default_rng([seed, SPLITS.index(split), index])
  rid = f"{split}-{seed}-{index:06d}"
  if kind == "prose":
    names = [h for h in haystacks if h in texts]
    if not names:
      raise DataError(f"--kind prose needs a real prose haystack of the {split} split "
                      f"({', '.join(h for h in PROSE if h in allowed_haystacks(split))})")
    hay = _draw_haystack(rng, names, texts)
    doc = _Doc(tok, chat, None, None, " ")
    _fit(doc, _units(hay, rng, texts), n_tokens)
    text = doc.text()
    return dict(id=rid, split=split, haystack=hay, text=text, n_tokens=_count(tok, text),
                budget=n_tokens)
  names = [h for h in haystacks if h in FAMILIES or h in texts]
  if not names:
    raise DataError("no haystack source is available (every prose source chosen is missing and "
                    "no procedural family is chosen)")
  hay = _draw_haystack(rng, names, texts)
  if split == "train" and hay in HELDOUT_HAYSTACKS:  # the train split's promise, whoever calls
    raise AssertionError(f"held-out haystack {hay} drawn for the train split")
  P = {k: v[split] for k, v in PHRASINGS.items()}
  sep = "\n" if hay in ("records", "logs") else " "
  units = _units(hay, rng, texts)
  r = float(rng.uniform())
  task = ("needle" if needle_kinds else
          "record" if hay in ("records", "logs") and r < 0.4 else
          "next" if hay != "repeat" and r < 0.25 else "needle")
  ii = int(rng.integers(len(P["instruction"])))
  rec = dict(id=rid, split=split, haystack=hay, task=task)
  built = None
  if task != "needle":
    built = _content_doc(tok, rng, P, ii, units, n_tokens, chat, sep, rec, task)
    if built is None:  # no unit fit for the question at this budget: plant needles instead
      rec["task"] = "needle"
  if built is None:
    built = _needle_doc(tok, rng, P, ii, units, n_tokens, chat, sep, rec,
                        needle_kinds or NEEDLE_KINDS)
  doc, question, target, distractors, needles = built
  text = doc.text()
  n = _count(tok, text)
  body = doc.body()  # depth: where a needle starts in the haystack, in its tokens
  depth = [round(_count(tok, body[:body.index(nd["text"])]) / _count(tok, body), 4)
           for nd in needles]
  rec.update(input=text, output=target, target=target, teacher_output=None, question=question,
             distractors=distractors,
             needles=[dict(key=nd["key"], value=nd["value"], depth=d)
                      for nd, d in zip(needles, depth)],
             n_tokens=n, budget=n_tokens)
  return rec


# ------------------------------------------------------------------------------------------------
# Scoring and teacher labels
def normalise(s: str) -> str:
  """Lower case, punctuation to spaces, whitespace collapsed (dates and codes keep their parts)."""
  s = unicodedata.normalize("NFKC", s).lower()
  return " ".join(re.sub(r"[^0-9a-z]+", " ", s).split())


def _contains(answer: str, target: str) -> bool:
  t = normalise(target)
  return bool(t) and f" {t} " in f" {normalise(answer)} "


def score(record: dict, answer: str) -> dict:
  """``correct``: the answer contains the target (normalised, as whole words) and no distractor
  value. Any wording around it is accepted: answers are judged on the needle, not on a sentence."""
  found = _contains(answer, record["target"])
  distractor = any(_contains(answer, d) for d in record.get("distractors", ()))
  return dict(correct=found and not distractor, found=found, distractor=distractor)


def answer_prefix(record: dict, answer: str) -> str:
  """The normalised words of ``answer`` before the target (or its first 4 words without it)."""
  a, t = normalise(answer), normalise(record["target"])
  i = f" {a} ".find(f" {t} ") if t else -1
  return " ".join((a[:i] if i >= 0 else a).split()[:4])


def summarise(records, answers) -> dict:
  """Accuracy overall and per task / needle kind / haystack, and how often the answers open with
  the same words before the target: a model that answers every question with one fixed sentence
  (whatever it asks) shows a ``top_prefix_share`` near 1 on this varied set; bare answers and
  answers in the question's own words keep it low."""
  by = collections.defaultdict(lambda: [0, 0])
  prefixes = collections.Counter()
  n_ok = n_dis = 0
  for rec, ans in zip(records, answers):
    s = score(rec, ans)
    n_ok += s["correct"]
    n_dis += s["distractor"]
    for k in (f"task={rec['task']}", f"haystack={rec['haystack']}",
              f"kind={rec.get('needle_kind', '-')}"):
      by[k][0] += s["correct"]
      by[k][1] += 1
    pre = answer_prefix(rec, ans)
    if pre:  # a bare answer opens with no sentence
      prefixes[pre] += 1
  n = len(records)
  top, top_n = prefixes.most_common(1)[0] if prefixes else ("", 0)
  return dict(n=n, correct=n_ok, accuracy=round(n_ok / max(n, 1), 4), with_distractor=n_dis,
              top_prefix=top, top_prefix_share=round(top_n / max(n, 1), 4),
              by={k: f"{v[0]}/{v[1]}" for k, v in sorted(by.items())})


def label(record: dict, teacher_answer: str) -> dict:
  """The record with the teacher's (the full-attention base's) answer in ``teacher_output``, and
  as the trained ``output`` when it is correct; a wrong teacher answer leaves the exact target."""
  ok = score(record, teacher_answer)["correct"]
  return dict(record, teacher_output=teacher_answer,
              output=teacher_answer if ok else record["target"])


# ------------------------------------------------------------------------------------------------
def parse_tokens(spec: str) -> tuple:
  m = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", str(spec))
  lo, hi = (int(m.group(1)), int(m.group(2) or m.group(1))) if m else (0, 0)
  if not m or not 64 <= lo <= hi:
    raise DataError(f"--tokens {spec!r}: give a budget N or a range LO-HI of at least 64 tokens "
                    "(e.g. 1024 or 1024-8192)")
  return lo, hi


def check_needle_kinds(kinds) -> tuple:
  """``kinds`` (names or one comma-separated string) as a tuple of :data:`NEEDLE_KINDS`."""
  names = [k.strip() for k in (kinds.split(",") if isinstance(kinds, str) else kinds)]
  bad = [k for k in names if k not in NEEDLE_KINDS]
  if bad or not names:
    raise DataError(f"--needle_kinds {','.join(names)!r}: unknown kind {', '.join(bad) or '(none)'}"
                    f"; give a comma-separated subset of {','.join(NEEDLE_KINDS)}")
  return tuple(names)


def generate(tok, split: str, count: int, tokens: tuple, seed: int, haystacks=None,
             chat: bool = True, kind: str = "qa", allow_missing: bool = False,
             needle_kinds=None):
  """``count`` records; document ``i``'s budget is drawn from ``tokens`` (lo, hi) by its own
  generator, so a prefix of a longer run is the same as a shorter run. ``needle_kinds``: plant
  needles of these kinds only, in every document (:func:`make_record`)."""
  haystacks = check_haystacks(split, haystacks or allowed_haystacks(split))
  if needle_kinds:
    needle_kinds = check_needle_kinds(needle_kinds)
  texts = load_texts(haystacks, allow_missing)
  lo, hi = tokens
  for i in range(count):
    n = int(np.random.default_rng([seed, SPLITS.index(split), i, 1]).integers(lo, hi + 1))
    yield make_record(tok, split, i, seed, n, texts, haystacks, chat, kind, needle_kinds)


def write_jsonl(path, records, overwrite: bool = False) -> int:
  """All or nothing: a hidden sibling renamed into place at the end."""
  out = Path(path)
  if out.exists() and not overwrite:
    raise DataError(f"{out} exists; choose another --out or pass --overwrite")
  out.parent.mkdir(parents=True, exist_ok=True)
  tmp = out.with_name(f".{out.name}.partial-{os.getpid()}")
  n = 0
  try:
    with open(tmp, "w", encoding="utf-8") as f:
      for rec in records:
        f.write(json.dumps(rec, ensure_ascii=False, sort_keys=True) + "\n")
        n += 1
    os.replace(tmp, out)
  finally:
    if tmp.exists():
      tmp.unlink()
  return n


def read_jsonl(path) -> list:
  p = Path(path)
  if not p.is_file():
    raise DataError(f"{p} does not exist")
  out = []
  for lineno, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
    if line.strip():
      try:
        out.append(json.loads(line))
      except json.JSONDecodeError as e:
        raise DataError(f"{p}:{lineno}: not valid JSON ({e.msg})") from None
  return out


def score_files(answers_path, data_path) -> dict:
  data = read_jsonl(data_path)
  got = {}
  for a in read_jsonl(answers_path):
    if not isinstance(a, dict) or not isinstance(a.get("id"), str) or \
        not isinstance(a.get("answer"), str):
      raise DataError(f"{answers_path}: every line needs a string 'id' and a string 'answer'")
    got[a["id"]] = a["answer"]
  missing = [r["id"] for r in data if r["id"] not in got]
  if missing:
    raise DataError(f"{answers_path} has no answer for {len(missing)} of {len(data)} documents "
                    f"of {data_path} (first: {missing[0]}); answer every document")
  return summarise(data, [got[r["id"]] for r in data])
