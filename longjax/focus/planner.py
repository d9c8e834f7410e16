"""Host-side (numpy) layout of FocusLLM inputs: chunks, dynamic prompt, local context, padding.

Everything here is decided from static sizes before any device code runs (docs/focusllm.md §1,
§3, §5):

* ``split_prompt`` cuts one inference prompt into memory chunks ``c_i``, the dynamic prompt
  ``d = bos(x[L-P:L])`` and the local context ``u = bos(x[L-W:L])``; generated tokens (closed-form
  decode, docs/focusllm.md §4.2) are appended to both ``d`` and ``u``.
* ``split_training`` does the same from the explicit indices of a training sample
  (docs/focusllm.md §5), optionally for several teacher-forced decode steps (§5.1).
* ``pack_chunks`` / ``pack_local`` lay a batch of such rows out as fixed-shape, right-padded arrays:
  every chunk of every prompt becomes one row ``c_i ⊕ d`` of the chunk batch (candidate = the last
  real token), and a per-prompt gather table says which chunk rows feed which prompt's local
  forward.
"""
from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import jax
import numpy as np

from longjax.focus.config import FocusConfig, FocusError
from longjax.runtime.rounding import next_half_octave, next_pow2, round_up


def pow2_bucket(n: int, multiple: int = 1) -> int:
  """``multiple * 2^k``: the smallest such value ``>= n`` (``>= multiple``). Padding stays below
  2x (beyond rounding up to ``multiple``) and small counts stay small."""
  return int(multiple) * next_pow2(-(-int(n) // int(multiple)))


def half_octave_bucket(n: int, multiple: int = 1) -> int:
  """``multiple * 2^k`` or ``multiple * 3 * 2^k``: the smallest such value ``>= n``. For the
  widths whose padding costs the most (the teacher's whole-document rows: 35 % padding at
  :func:`pow2_bucket`), at twice the compiled widths."""
  return int(multiple) * next_half_octave(-(-int(n) // int(multiple)))


def bos(s: np.ndarray, bos_id: int) -> np.ndarray:
  """``s`` when it starts with ``bos_id``, else ``[bos_id] + s`` (docs/focusllm.md §0; official
  id 1)."""
  s = np.asarray(s, np.int64)
  if s.size and s[0] == bos_id:
    return s
  return np.concatenate([np.asarray([bos_id], np.int64), s])


@dataclasses.dataclass
class RowPlan:
  """One prompt (or training sample) split into the pieces FocusLLM runs."""
  chunks: list  # memory chunks c_i (int64 arrays, no BOS)
  prompt: np.ndarray  # dynamic prompt d (with its BOS), appended to every chunk; last = candidate
  local: np.ndarray  # local context u (with its BOS) [+ generated tokens]
  target: Optional[int] = None  # training: the next token after the local context
  # training with several decode steps (docs/focusllm.md §5.1): the targets of steps 0..J-1;
  # ``prompt`` and ``local`` then end with the J-1 teacher-forced tokens of steps 1..J-1
  targets: Optional[np.ndarray] = None
  # dense training (docs/focusllm.md §5.3): the target of every local row, -1 where unscored
  row_targets: Optional[np.ndarray] = None

  @property
  def n_chunks(self) -> int:
    return len(self.chunks)

  @property
  def chunk_lens(self) -> list:
    return [len(c) for c in self.chunks]

  def chunk_rows(self) -> list:
    return [np.concatenate([c, self.prompt]) for c in self.chunks]


def _as_tokens(x) -> np.ndarray:
  x = np.asarray(x)
  if x.ndim != 1:
    raise FocusError(f"a FocusLLM prompt is a 1-D id sequence, got shape {x.shape}")
  if x.size == 0:
    raise FocusError("empty prompt: FocusLLM needs at least one token")
  return x.astype(np.int64)


def _split_memory(memory: np.ndarray, stride: int, max_chunks: int, what: str,
                  overlap: int = 0) -> list:
  """``ceil(n / stride)`` chunks of ``stride`` tokens (the last shorter); with ``overlap`` each
  chunk but the first starts ``overlap`` tokens earlier (``FocusConfig.chunk_overlap``)."""
  n = len(memory)
  count = -(-n // stride)
  if count > max_chunks:
    raise FocusError(f"{what}: {n} memory tokens make {count} chunks of {stride}, more than the "
                     f"chunk cache capacity max_chunks={max_chunks}; raise FocusConfig.max_chunks "
                     "or chunk_stride, or shorten the prompt")
  return [memory[max(0, i * stride - overlap): min((i + 1) * stride, n)] for i in range(count)]


def is_chunked(length: int, fcfg: FocusConfig) -> bool:
  """Chunking is on when ``L >= min_len_threshold`` and there is memory left (``L > W``)."""
  return length >= fcfg.min_len_threshold and length > fcfg.local_window


def split_prompt(x, fcfg: FocusConfig, generated: Sequence[int] = ()) -> RowPlan:
  """Inference layout of prompt ``x`` (docs/focusllm.md §1), optionally after ``generated``
  tokens (§4.2)."""
  x = _as_tokens(x)
  gen = np.asarray(list(generated), np.int64)
  L, W, S = len(x), fcfg.local_window, fcfg.chunk_stride
  if not is_chunked(L, fcfg):
    # Short input (docs/focusllm.md §4.3): the plain LM over bos(x) ⊕ generated.
    return RowPlan(chunks=[], prompt=np.zeros((0,), np.int64),
                   local=np.concatenate([bos(x, fcfg.bos_id), gen]))
  M = L - W
  chunks = _split_memory(x[:M], S, fcfg.max_chunks, f"prompt of {L} tokens", fcfg.chunk_overlap)
  P = fcfg.prompt_len
  prompt = np.concatenate([bos(x[L - P:], fcfg.bos_id), gen])
  local = np.concatenate([bos(x[M:], fcfg.bos_id), gen])
  return RowPlan(chunks=chunks, prompt=prompt, local=local)


def split_training(x, *, memory_len: int, local_start: int, local_size: int, stride: int,
                   prompt_cap: int = 512, bos_id: int = 1, max_chunks: int = 1 << 20,
                   steps: int = 1, overlap: int = 0) -> RowPlan:
  """Training layout from explicit indices (docs/focusllm.md §5): memory ``x[0:memory_len]`` in
  chunks of ``stride``, prompt ``bos(x[a+ls-P : a+ls])`` with ``P = min(prompt_cap, stride, ls)``,
  local context ``bos(x[a : a+ls])`` and target ``x[a+ls]``.

  ``steps = J > 1`` (§5.1): the targets ``x[a+ls : a+ls+J]``, each scored as a teacher-forced
  decode step after the prompt ``x[:a+ls]``; ``x[a+ls : a+ls+J-1]`` are appended to the prompt
  and the local context as generated tokens (``RowPlan.targets``). ``overlap``: the chunks'
  ``FocusConfig.chunk_overlap``."""
  x = _as_tokens(x)
  a, ls, steps = int(local_start), int(local_size), int(steps)
  if (stride < 1 or ls < 1 or a < 0 or steps < 1 or a + ls + steps > len(x)
      or not 1 <= memory_len <= len(x)):
    raise FocusError(f"bad training indices for a sample of {len(x)} tokens: memory_len="
                     f"{memory_len}, local_start={a}, local_size={ls}, stride={stride}, "
                     f"steps={steps} (need stride, local_size, steps >= 1, 1 <= memory_len <= L "
                     "and targets x[a+ls : a+ls+steps] inside the sample)")
  chunks = _split_memory(x[:memory_len], stride, max_chunks, "training sample", overlap)
  P = min(prompt_cap, stride, ls)
  end = a + ls
  forced = x[end:end + steps - 1]  # the tokens "generated" before steps 1..J-1
  prompt = np.concatenate([bos(x[end - P:end], bos_id), forced])
  local = np.concatenate([bos(x[a:end], bos_id), forced])
  if steps == 1:
    return RowPlan(chunks=chunks, prompt=prompt, local=local, target=int(x[end]))
  return RowPlan(chunks=chunks, prompt=prompt, local=local,
                 targets=x[end:end + steps].copy())


def split_dense(x, *, memory_len: int, local_size: int, stride: int, prompt_cap: int = 512,
                bos_id: int = 1, max_chunks: int = 1 << 20, overlap: int = 0) -> RowPlan:
  """Dense training layout (docs/focusllm.md §5.3): memory ``x[0:a]`` (``a = memory_len``) in
  chunks of ``stride``, each followed by the prompt ``bos(x[a-P : a])`` (``P = min(prompt_cap,
  stride)``: the tokens just before the local span, so no candidate sees a token it is scored
  on); local context ``bos(x[a : a+ls])``, every row of which predicts the next token: the row of
  ``x[a+k]`` predicts ``x[a+k+1]`` (the local BOS row is not scored)."""
  x = _as_tokens(x)
  a, ls = int(memory_len), int(local_size)
  if stride < 1 or ls < 1 or a < 1 or a + ls + 1 > len(x):
    raise FocusError(f"bad dense training indices for a sample of {len(x)} tokens: memory_len="
                     f"{a}, local_size={ls}, stride={stride} (need stride, local_size, "
                     "memory_len >= 1 and the last target x[memory_len+local_size] inside the "
                     "sample)")
  chunks = _split_memory(x[:a], stride, max_chunks, "training sample", overlap)
  p = min(prompt_cap, stride)
  local = bos(x[a:a + ls], bos_id)
  first = len(local) - ls  # the row of x[a]: 1 after an inserted BOS, 0 when x[a] is the BOS
  row_targets = np.full(len(local), -1, np.int64)
  row_targets[first:] = x[a + 1:a + ls + 1]
  return RowPlan(chunks=chunks, prompt=bos(x[max(0, a - p):a], bos_id), local=local,
                 row_targets=row_targets)


def step_locals(rows: Sequence[RowPlan], steps: int) -> list:
  """The local contexts of every decode step of every row (row-major: row ``b``'s step ``j`` is
  entry ``b * steps + j``): step ``j`` reads the local context up to its own forced tokens.
  ``steps = 1``: the rows themselves."""
  if steps == 1:
    return list(rows)
  out = []
  for r in rows:
    base = len(r.local) - (steps - 1)
    out.extend(RowPlan(chunks=r.chunks, prompt=r.prompt, local=r.local[:base + j])
               for j in range(steps))
  return out


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class ChunkBatch:
  """All chunk rows of a batch of prompts, right-padded to one shape.

  ``tokens/positions/valid [N, T]``; ``lengths [N]`` real length of ``c_i ⊕ d`` (the candidate is at
  ``lengths-1``; 0 for padding rows); ``owner [N]`` prompt index (-1: padding row);
  ``gather [B, Cmax]`` chunk row of each prompt's j-th chunk, ``cand_valid [B, Cmax]``;
  ``ref_row [B]`` each prompt's reference row, the dynamic prompt without a chunk (the candidate
  gate's reference, docs/focusllm.md §4.5; -1: none). A reference row is stepped and read like a
  chunk row but is no prompt's candidate.
  """
  tokens: np.ndarray
  positions: np.ndarray
  valid: np.ndarray
  lengths: np.ndarray
  owner: np.ndarray
  gather: np.ndarray
  cand_valid: np.ndarray
  ref_row: np.ndarray

  @property
  def n_rows(self) -> int:
    return self.tokens.shape[0]


def pack_chunks(rows: Sequence[RowPlan], *, row_multiple: int = 1, length_multiple: int = 1,
                min_length: int = 1, cmax_multiple: int = 1, pow2: bool = False,
                reference: bool = False) -> ChunkBatch:
  """Flatten every prompt's chunks into one padded chunk batch (row count a multiple of
  ``row_multiple``, e.g. the number of devices on the chunk axis; at least one row).

  ``pow2``: the row count is ``row_multiple * 2^k`` and the candidate slots ``cmax_multiple *
  2^k`` (:func:`pow2_bucket`) instead of the next multiples: few compiled shapes, < 2x padding.
  ``reference``: after its chunk rows, every prompt with chunks also gets its reference row (the
  dynamic prompt alone; ``ChunkBatch.ref_row``).
  """
  bucket = pow2_bucket if pow2 else round_up
  seqs, owner = [], []
  gather_rows, ref_row = [], []
  for b, r in enumerate(rows):
    ids = []
    for c in r.chunk_rows():
      ids.append(len(seqs))
      seqs.append(c)
      owner.append(b)
    gather_rows.append(ids)
    ref_row.append(len(seqs) if reference and ids else -1)
    if reference and ids:
      seqs.append(np.asarray(r.prompt))
      owner.append(b)
  n = bucket(max(len(seqs), 1), row_multiple)
  t = round_up(max([len(s) for s in seqs] + [min_length, 1]), length_multiple)
  tokens = np.zeros((n, t), np.int32)
  valid = np.zeros((n, t), bool)
  lengths = np.zeros((n,), np.int32)
  for i, s in enumerate(seqs):
    tokens[i, :len(s)] = s
    valid[i, :len(s)] = True
    lengths[i] = len(s)
  owner = np.asarray(owner + [-1] * (n - len(seqs)), np.int32)
  cmax = bucket(max([len(g) for g in gather_rows] + [1]), cmax_multiple)
  gather = np.zeros((len(rows), cmax), np.int32)
  cand_valid = np.zeros((len(rows), cmax), bool)
  for b, g in enumerate(gather_rows):
    gather[b, :len(g)] = g
    cand_valid[b, :len(g)] = True
  positions = np.broadcast_to(np.arange(t, dtype=np.int32), (n, t)).copy()
  return ChunkBatch(tokens, positions, valid, lengths, owner, gather, cand_valid,
                    np.asarray(ref_row, np.int32))


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class LocalBatch:
  """Local contexts ``[B, U]`` right-padded; ``n_chunks [B]`` candidates in front of each row,
  so local token j sits at RoPE position ``n_chunks + j`` (docs/focusllm.md §3)."""
  tokens: np.ndarray
  lengths: np.ndarray
  n_chunks: np.ndarray


def pack_local(rows: Sequence[RowPlan], *, capacity: Optional[int] = None,
               length_multiple: int = 1) -> LocalBatch:
  longest = max(len(r.local) for r in rows)
  u = round_up(max(longest, capacity or 0), length_multiple)
  tokens = np.zeros((len(rows), u), np.int32)
  lengths = np.zeros((len(rows),), np.int32)
  for b, r in enumerate(rows):
    tokens[b, :len(r.local)] = r.local
    lengths[b] = len(r.local)
  return LocalBatch(tokens, lengths, np.asarray([r.n_chunks for r in rows], np.int32))
