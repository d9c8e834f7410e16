"""Tokenise -> filter -> global batches, deterministic in a seed and resumable.

* :func:`build_dataset` reads the configured sources, tokenises every record (segment by segment,
  so answer spans are exact), truncates to ``max_length``, appends EOS to what was not truncated
  (official ``src/data.py``), and drops samples shorter than ``min_length``.
* :class:`GlobalBatches` yields global batches of sample indices, epoch after epoch. The order of
  epoch ``e`` is a function of ``(seed, e)`` only; with ``group_key`` every batch holds samples of
  one key (a method's ``group_key``: Activation Beacon groups by its number of windows, the
  official ``group_by_stride strict``); incomplete groups are dropped (strict). Its state
  (``epoch``, ``index``) is two integers, saved with each checkpoint.
* :func:`row_rng` is the ``(seed, step, row)``-keyed generator every method's per-sample draws
  come from, so a resumed run draws the same. The pipeline knows no method.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Optional

import numpy as np

from longjax.data import sources
from longjax.data.sources import DataError
from longjax.run_config import source_options as source_spec


@dataclasses.dataclass
class Dataset:
  ids: list  # int32 arrays
  answer: list  # bool arrays (True: answer-span token) or None
  stats: dict
  # per sample: the training objective its source names (``SOURCE@lm|answer|distill``), or None
  # (the run's default, ``data.loss_on``)
  objective: Optional[list] = None
  # per sample: the beacon ratio its source fixes (``SOURCE@ratio=N``), or None (the run's
  # beacon.ratio_mix draws)
  ratio: Optional[list] = None

  def __len__(self):
    return len(self.ids)

  @property
  def lengths(self) -> np.ndarray:
    return np.asarray([len(x) for x in self.ids], np.int64)


def tokenize_segments(segments, tokenizer, *, add_bos: bool):
  ids = [tokenizer.bos_id] if add_bos and tokenizer.bos_id is not None else []
  ans = [False] * len(ids)
  for text, is_answer in segments:
    t = tokenizer.encode(text)
    ids.extend(t)
    ans.extend([bool(is_answer)] * len(t))
  return np.asarray(ids, np.int32), np.asarray(ans, bool)


def build_dataset(dc, tokenizer, seed: int) -> Dataset:
  """``dc``: the run's ``data`` section (``longjax.run_config.DataSection``)."""
  opts = source_options(sources.parse_specs(dc.sources))
  specs = [o.source for o in opts]
  add_bos = dc.add_bos
  if add_bos in (None, "auto"):
    add_bos = tokenizer.adds_bos
  elif isinstance(add_bos, str):
    add_bos = add_bos.lower() in ("1", "true", "yes")
  min_len, max_len = int(dc.min_length), int(dc.max_length)
  if min_len > max_len:
    raise DataError(f"data.min_length ({min_len}) > data.max_length ({max_len})")
  ids_out, ans_out, obj_out, ratio_out = [], [], [], []
  read = short = truncated = 0
  per_source = [0] * len(specs)
  read_from = [0] * len(specs)
  limit = int(dc.max_per_source or 0)
  for i, segs in sources.read_all(specs, text_field=dc.text_field,
                                  tfds_data_dir=dc.tfds_data_dir or None,
                                  tfds_split=dc.tfds_split, seed=seed,
                                  synthetic_cfg=dc.synthetic):
    if limit and per_source[i] >= limit:
      continue
    read += 1
    read_from[i] += 1
    ids, ans = tokenize_segments(segs, tokenizer, add_bos=add_bos)
    cut = len(ids) > max_len
    if cut:
      ids, ans = ids[:max_len], ans[:max_len]
      truncated += 1
    if opts[i].objective == "answer" and not ans.any():
      # scored on every token instead would train another objective than the one asked for
      why = (f"its answer lies past data.max_length={max_len} tokens: raise max_length or "
             "shorten the record" if cut else "it has none: give every record an output "
             "(jsonl input/output) or drop '@answer'")
      raise DataError(f"data source {specs[i]!r}@answer, record {read_from[i] - 1}: no answer "
                      f"span to score ({why})")
    if not cut and dc.append_eos and tokenizer.eos_id is not None:
      ids = np.append(ids, np.int32(tokenizer.eos_id))
      # an answer's EOS is part of the answer: scored, a trained model learns to stop after it
      ans = np.append(ans, bool(ans[-1]) if len(ans) else False)
    if len(ids) < min_len:
      short += 1
      continue
    per_source[i] += 1
    ids_out.append(ids)
    ans_out.append(ans if ans.any() else None)
    obj_out.append(opts[i].objective)
    ratio_out.append(opts[i].ratio)
  stats = dict(read=read, kept=len(ids_out), too_short=short, truncated=truncated,
               tokens=int(sum(len(x) for x in ids_out)))
  if not ids_out:
    raise DataError(f"the dataset is empty after filtering: read {read} records from {specs}, "
                    f"{short} shorter than data.min_length={min_len} tokens; lower min_length or "
                    "add data")
  return Dataset(ids_out, ans_out, stats, obj_out if any(obj_out) else None,
                 ratio_out if any(r is not None for r in ratio_out) else None)


def check_teacher_context(ds: Dataset, default_objective: str, positions: int) -> None:
  """Distillation's teacher is the frozen base reading a whole sample: a distilled sample longer
  than the base's ``positions`` would be scored against a teacher past its own context (rotary
  positions it never saw). Refused before any step, naming the fix: such documents train on
  their answers (``@answer``), which needs no teacher."""
  objectives = ds.objective or [None] * len(ds)
  over = [int(n) for n, o in zip(ds.lengths, objectives)
          if (o or default_objective) == "distill" and n > positions]
  if over:
    raise DataError(
        f"{len(over)} distilled training samples (the longest {max(over)} tokens) are longer "
        f"than the base's {positions} positions, and the teacher reads each one whole: give "
        "their source '@answer' (the answer loss needs no teacher) or lower data.max_length to "
        f"{positions}")


def source_options(specs):
  """``SOURCE[@OBJECTIVE][@ratio=N]`` -> one ``SourceOptions`` per spec (``run_config``)."""
  try:
    return source_spec.parse_all(specs)
  except source_spec.SourceSpecError as e:
    raise DataError(str(e)) from None


def split_objectives(specs):
  """``SOURCE@OBJECTIVE`` -> ``(sources, objectives)``; a source without a suffix gets None."""
  opts = source_options(specs)
  return [o.source for o in opts], [o.objective for o in opts]


class GlobalBatches:
  """Deterministic, resumable global batches of sample indices (see the module docstring)."""

  def __init__(self, lengths, global_batch: int, seed: int, *,
               group_key: Optional[Callable[[int], int]] = None, shuffle: bool = True):
    self.lengths = np.asarray(lengths)
    self.global_batch = int(global_batch)
    self.seed = int(seed)
    self.shuffle = shuffle
    self.keys = None if group_key is None else np.asarray([group_key(int(n)) for n in self.lengths])
    self.epoch, self.index = 0, 0
    self._cache = None
    self._checked = set()  # curriculum limits known to admit a complete batch
    if not self.epoch_batches(0):
      groups = "" if self.keys is None else (
          f" in any group of equal window count (groups: "
          f"{dict(zip(*np.unique(self.keys, return_counts=True)))})")
      raise DataError(f"{len(self.lengths)} samples make no complete global batch of "
                      f"{self.global_batch}{groups}; add data or lower train.global_batch")

  def epoch_batches(self, epoch: int) -> list:
    if self._cache is not None and self._cache[0] == epoch:
      return self._cache[1]
    rng = np.random.default_rng([self.seed, epoch])
    order = rng.permutation(len(self.lengths)) if self.shuffle else np.arange(len(self.lengths))
    batches = []
    if self.keys is None:
      for i in range(0, len(order) - self.global_batch + 1, self.global_batch):
        batches.append(order[i:i + self.global_batch])
    else:
      by_key = {}
      for i in order:
        by_key.setdefault(int(self.keys[i]), []).append(int(i))
      for key in sorted(by_key):
        idx = by_key[key]
        for i in range(0, len(idx) - self.global_batch + 1, self.global_batch):
          batches.append(np.asarray(idx[i:i + self.global_batch]))
      if self.shuffle:
        batches = [batches[i] for i in rng.permutation(len(batches))]
    self._cache = (epoch, batches)
    return batches

  @property
  def batches_per_epoch(self) -> int:
    return len(self.epoch_batches(0))

  def __iter__(self):
    return self

  def __next__(self) -> np.ndarray:
    return self.take()

  def take(self, max_key: Optional[int] = None) -> np.ndarray:
    """The next batch; with ``max_key`` (a curriculum stage's most windows) the next one whose
    group key is at most that, skipping the others where the epoch's order has them (the order
    stays a function of ``(seed, epoch)``: a resumed run skips the same batches)."""
    if max_key is not None and max_key not in self._checked:  # once per limit, not per step
      self.check_max_key(max_key)
      self._checked.add(max_key)
    while True:
      batches = self.epoch_batches(self.epoch)
      if self.index >= len(batches):
        self.epoch, self.index = self.epoch + 1, 0
        batches = self.epoch_batches(self.epoch)
      b = batches[self.index]
      self.index += 1
      if max_key is None or self.keys is None or int(self.keys[b[0]]) <= max_key:
        return b

  def check_max_key(self, max_key: int):
    """Refuse a limit that no complete batch meets (``take`` would never return)."""
    if self.keys is None:
      raise DataError("a limit on windows per document needs batches grouped by window count")
    keys, counts = np.unique(self.keys, return_counts=True)
    if not np.any((keys <= max_key) & (counts >= self.global_batch)):
      raise DataError(f"no complete global batch of {self.global_batch} documents of at most "
                      f"{max_key} windows (documents per window count: "
                      f"{dict(zip(keys.tolist(), counts.tolist()))}); add shorter documents or "
                      "raise that stage's windows in data.curriculum")

  def get_state(self) -> dict:
    return {"epoch": int(self.epoch), "index": int(self.index), "seed": self.seed,
            "global_batch": self.global_batch, "num_samples": int(len(self.lengths))}

  def set_state(self, state: dict):
    for k in ("seed", "global_batch", "num_samples"):
      mine = self.get_state()[k]
      if k in state and int(state[k]) != mine:
        raise DataError(f"the checkpointed data iterator had {k}={state[k]} but this run has "
                        f"{mine}: the data or config changed since the checkpoint was written")
    self.epoch, self.index = int(state["epoch"]), int(state["index"])


def row_rng(seed: int, step: int, row: int, salt: int = 0) -> np.random.Generator:
  return np.random.default_rng([int(seed), int(step), int(row), int(salt)])
