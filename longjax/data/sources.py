"""Data sources: local jsonl / text files, TFDS datasets from a local ``data_dir`` (no
TensorFlow: ``array_record`` + ``tfds.data_source``), and deterministic synthetic documents.

A source spec is a string:

* ``jsonl:PATH[N]``   one JSON object per line (``.json`` or ``.jsonl``): field ``text`` (see
  ``text_field``), or an ``input``/``output`` pair (the output is the answer span). ``[N]`` keeps
  the first N records (the official ``redpajama/train.json[5000]`` notation).
* ``text:PATH``       a ``.txt`` file (one document) or a directory of ``.txt`` files.
* ``tfds:NAME``       a prepared TFDS dataset under ``tfds_data_dir`` (``NAME`` may be
  ``name/config:version``); ``tfds_dir:PATH`` a prepared dataset directory; split ``tfds_split``.
* ``synthetic:KIND``  ``passkey`` or ``pattern`` documents (``longjax.data.synthetic``).

Every record becomes a list of ``(text, is_answer)`` segments.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Iterator, List, Sequence, Tuple

from longjax.data import synthetic
from longjax.data.errors import DataError
from longjax.run_config.sections import SyntheticSection

Segments = List[Tuple[str, bool]]


def parse_specs(sources) -> list:
  if isinstance(sources, str):
    sources = [s.strip() for s in sources.split(",")]
  specs = [s for s in (sources or ()) if s]
  if not specs:
    raise DataError("no data sources configured (config.data.sources is empty); give e.g. "
                    "--config.data.sources=jsonl:/path/train.json")
  return specs


def _json_type(v) -> str:
  return {dict: "an object", list: "an array", type(None): "null", bool: "a boolean",
          int: "a number", float: "a number", str: "a string"}.get(type(v), type(v).__name__)


def _text_of(rec: dict, field: str, where: str) -> str:
  # str() would train on the Python repr of a list / dict / None: refuse anything but text.
  t = rec[field]
  if isinstance(t, bytes):  # TFDS text features
    return t.decode("utf-8", "replace")
  if not isinstance(t, str):
    raise DataError(f"{where}: field {field!r} is {_json_type(t)}, not a string; every record "
                    "needs text there")
  return t


def _record_segments(rec: dict, text_field: str, where: str) -> Segments:
  if not isinstance(rec, dict):
    raise DataError(f"{where}: record is {_json_type(rec)}, not a JSON object; jsonl sources need "
                    f"one object per line with a {text_field!r} field (or input/output)")
  if text_field in rec:
    return [(_text_of(rec, text_field, where), False)]
  if "input" in rec and "output" in rec:
    return [(_text_of(rec, "input", where), False), ("\n", False),
            (_text_of(rec, "output", where), True)]
  raise DataError(f"{where}: record has neither a {text_field!r} field nor input/output fields "
                  f"(keys: {sorted(rec)[:10]}); set --config.data.text_field")


def _jsonl(path: str, limit, text_field: str) -> Iterator[Segments]:
  p = Path(path)
  if not p.is_file():
    raise DataError(f"data file {p} does not exist (source 'jsonl:{path}')")
  n = 0
  with p.open("rb") as f:
    for lineno, raw in enumerate(f, 1):
      if limit is not None and n >= limit:
        break
      try:
        line = raw.decode("utf-8")
      except UnicodeDecodeError as e:
        raise DataError(f"{p}:{lineno}: not UTF-8 (byte 0x{raw[e.start]:02x} at column "
                        f"{e.start + 1}); jsonl sources are UTF-8: re-encode the file (e.g. "
                        f"iconv -f latin1 -t utf-8)") from None
      if limit is not None and n >= limit:
        break
      line = line.strip()
      if not line:
        continue
      try:
        rec = json.loads(line)
      except json.JSONDecodeError as e:
        raise DataError(f"{p}:{lineno}: not valid JSON ({e.msg}); jsonl sources need one JSON "
                        "object per line") from None
      yield _record_segments(rec, text_field, f"{p}:{lineno}")
      n += 1


def _text(path: str) -> Iterator[Segments]:
  p = Path(path)
  if p.is_file():
    files = [p]
  elif p.is_dir():
    files = sorted(p.rglob("*.txt"))
    if not files:
      raise DataError(f"directory {p} holds no .txt files (source 'text:{path}')")
  else:
    raise DataError(f"data path {p} does not exist (source 'text:{path}')")
  for f in files:
    yield [(f.read_text(encoding="utf-8", errors="replace"), False)]


def _tfds(spec: str, data_dir, text_field: str, split: str, from_dir: bool) -> Iterator[Segments]:
  import tensorflow_datasets as tfds
  try:
    if from_dir:
      if not Path(spec).is_dir():
        raise DataError(f"TFDS dataset directory {spec} does not exist (source 'tfds_dir:{spec}')")
      ds = tfds.builder_from_directory(spec).as_data_source(split=split)
    else:
      if not data_dir:
        raise DataError(f"source 'tfds:{spec}' needs --config.data.tfds_data_dir (a local "
                        "directory with the prepared dataset; nothing is downloaded)")
      ds = tfds.data_source(spec, data_dir=str(data_dir), split=split, download=False)
  except DataError:
    raise
  except Exception as e:  # TFDS raises many kinds of errors for a missing/unprepared dataset
    raise DataError(f"cannot open TFDS dataset {spec!r} split {split!r} (data_dir={data_dir}): "
                    f"{type(e).__name__}: {e}. It must be prepared locally in array_record "
                    "format (TensorFlow is not used)") from None
  for i in range(len(ds)):
    yield _record_segments(dict(ds[i]), text_field, f"tfds {spec} record {i}")


def read_source(spec: str, *, text_field: str = "text", tfds_data_dir=None,
                tfds_split: str = "train", seed: int = 0, synthetic_cfg=None) -> Iterator[Segments]:
  """``synthetic_cfg``: the ``data.synthetic`` section (``run_config.SyntheticSection``; None: its
  defaults)."""
  kind, sep, rest = spec.partition(":")
  if not sep:
    raise DataError(f"data source {spec!r} has no kind; use jsonl:, text:, tfds:, tfds_dir: or "
                    "synthetic:")
  if kind == "jsonl":
    m = re.fullmatch(r"(.*?)(?:\[(\d+)\])?", rest)
    return _jsonl(m.group(1), int(m.group(2)) if m.group(2) else None, text_field)
  if kind == "text":
    return _text(rest)
  if kind in ("tfds", "tfds_dir"):
    return _tfds(rest, tfds_data_dir, text_field, tfds_split, from_dir=kind == "tfds_dir")
  if kind == "synthetic":
    s = synthetic_cfg or SyntheticSection()
    kw = {k: getattr(s, k) for k in ("digits", "style")
          if rest == "passkey" and getattr(s, k) is not None}
    return iter(synthetic.generate(rest, int(s.count), int(s.min_chars), int(s.max_chars), seed,
                                   **kw))
  raise DataError(f"unknown data source kind {kind!r} in {spec!r}; use jsonl:, text:, tfds:, "
                  "tfds_dir: or synthetic:")


def read_all(specs: Sequence[str], **kw) -> Iterator[Tuple[int, Segments]]:
  for i, spec in enumerate(specs):
    for rec in read_source(spec, **kw):
      yield i, rec
