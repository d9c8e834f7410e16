"""Language-modelling perplexity on long documents (PG19-style).

Documents: ``perplexity.data`` (a ``.jsonl`` with one document per line in ``text_field``, e.g.
``long-llm:lm/pg19.json``; a ``.txt`` file; or a directory of ``.txt`` files), or a TFDS dataset
prepared in ``tfds_data_dir`` (``tfds_name``, e.g. ``pg19`` with its ``book_text`` feature), read
with ``tfds.data_source`` (array_record, no TensorFlow). The first ``max_docs`` documents are used.
Each is tokenized with the tokenizer's default special tokens (BOS if it uses one).

Protocols:

* ``sliding`` (beacon ``eval_lm.py``): chunks of ``max_length`` tokens starting every ``stride``;
  in each chunk only the tokens no earlier chunk scored are labelled (the first chunk: all but its
  first token). Each chunk is one independent forward (fresh memory). Per document: mean NLL over
  its labelled tokens; overall perplexity = ``exp(mean over documents of the per-document mean
  NLL)``.
* ``last`` (FocusLLM ``eval_lm.py`` / CEPE): windows of ``max_length`` tokens every ``stride``, only
  the last ``last_n`` tokens of each window scored (the FocusLLM ``inference_ppl_forward`` path:
  prefill on the rest, then teacher-forced decode steps, one per held-out token; beacon and the
  plain model score the same tokens in one labelled forward). Overall perplexity =
  ``exp(mean over windows of the window's mean NLL)``; per document the same over its windows.

The plain baseline uses chunks / windows of at most its truncation limit (its context window) and
a stride no longer than that. Reported: per-document and overall perplexity, token counts, wall
time and peak memory (device ``peak_bytes_in_use`` where the backend reports it, else the host's
peak resident set size).
"""
from __future__ import annotations

import json
import math
import resource
import sys
import time
from pathlib import Path

import numpy as np

from longjax.eval.errors import EvalError


# ------------------------------------------------------------------------------------------------
# Documents.
def _jsonl_docs(path: Path, field: str, limit: int):
  docs = []
  with open(path, encoding="utf-8") as f:
    for i, line in enumerate(f, 1):
      if not line.strip():
        continue
      try:
        rec = json.loads(line)
      except json.JSONDecodeError as e:
        raise EvalError(f"{path}:{i}: not a JSON line ({e.msg})") from None
      if not isinstance(rec, dict) or not isinstance(rec.get(field), str):
        keys = sorted(rec) if isinstance(rec, dict) else type(rec).__name__
        raise EvalError(f"{path}:{i}: no text field {field!r} (found {keys}); set "
                        "--config.eval.perplexity.text_field")
      docs.append((str(rec.get("id", rec.get("_id", len(docs)))), rec[field]))
      if limit and len(docs) >= limit:
        break
  return docs


def _prepared_dir(root: Path, name: str):
  """The prepared dataset directory (holding dataset_info.json): ``root`` itself, or the newest
  ``root/name[/config]/version``; ``None`` if there is none."""
  if (root / "dataset_info.json").exists():
    return root
  found = sorted((root / name).glob("**/dataset_info.json"),
                 key=lambda f: tuple(int(x) if x.isdigit() else 0
                                     for x in f.parent.name.split(".")))
  return found[-1].parent if found else None


def _tfds_docs(p, limit: int):
  if not p.tfds_data_dir or not Path(p.tfds_data_dir).is_dir():
    raise EvalError(f"perplexity.tfds_data_dir {p.tfds_data_dir!r} is not a directory (prepare "
                    f"the {p.tfds_name!r} dataset there in array_record format)")
  import tensorflow_datasets as tfds
  root = Path(p.tfds_data_dir)
  prepared = _prepared_dir(root, p.tfds_name)
  try:
    if prepared is not None:
      src = tfds.builder_from_directory(str(prepared)).as_data_source(split=p.tfds_split)
    else:
      src = tfds.data_source(p.tfds_name, data_dir=str(root), split=p.tfds_split,
                             try_gcs=False, download=False)
  except Exception as e:  # noqa: BLE001 -- TFDS raises many types for a missing dataset
    raise EvalError(f"cannot open TFDS dataset {p.tfds_name!r} split {p.tfds_split!r} in "
                    f"{str(root)!r} ({type(e).__name__}: {e}); it must be prepared with "
                    "file_format='array_record'") from None
  docs = []
  n = len(src) if not limit else min(limit, len(src))
  for i in range(n):
    ex = src[i]
    field = p.text_field if p.text_field in ex else ("book_text" if "book_text" in ex else None)
    if field is None:
      raise EvalError(f"TFDS {p.tfds_name!r} records have no {p.text_field!r} / 'book_text' "
                      f"feature (found {sorted(ex)}); set --config.eval.perplexity.text_field")
    text = ex[field]
    text = text.decode("utf-8", errors="replace") if isinstance(text, bytes) else str(text)
    did = ex.get("book_id", i)
    did = did.decode() if isinstance(did, bytes) else did
    docs.append((str(np.asarray(did).item() if hasattr(did, "shape") else did), text))
  return docs


def load_documents(p) -> list:
  """``[(doc_id, text)]`` from the configured source (module docstring)."""
  limit = int(p.max_docs or 0)
  if p.tfds_name:
    return _tfds_docs(p, limit)
  if not p.data:
    raise EvalError("perplexity needs data: --config.eval.perplexity.data=FILE.jsonl|FILE.txt|DIR "
                    "or --config.eval.perplexity.tfds_name=pg19 with tfds_data_dir")
  path = Path(p.data)
  if not path.exists():
    raise EvalError(f"perplexity.data {str(path)!r} does not exist")
  if path.is_dir():
    files = sorted(path.glob("*.txt"))
    if not files:
      raise EvalError(f"perplexity.data directory {str(path)!r} has no .txt files")
    files = files[:limit] if limit else files
    return [(f.stem, f.read_text(encoding="utf-8", errors="replace")) for f in files]
  if path.suffix in (".jsonl", ".json"):
    return _jsonl_docs(path, p.text_field, limit)
  return [(path.stem, path.read_text(encoding="utf-8", errors="replace"))]


def validate(ecfg):
  p = ecfg.perplexity
  if p.protocol not in ("sliding", "last"):
    raise EvalError(f"perplexity.protocol must be 'sliding' or 'last', got {p.protocol!r}")
  if p.max_length < 2 or p.stride < 1:
    raise EvalError(f"perplexity.max_length ({p.max_length}) must be >= 2 and stride "
                    f"({p.stride}) >= 1")
  if p.protocol == "last" and not 1 <= p.last_n < p.max_length:
    raise EvalError(f"perplexity.last_n ({p.last_n}) must be in [1, max_length)")
  docs = load_documents(p)
  if not docs:
    raise EvalError("perplexity: the data source has no documents")


# ------------------------------------------------------------------------------------------------
# Windows.
def sliding_chunks(n_tokens: int, max_length: int, stride: int) -> list:
  """``[(begin, end, n_scored)]``: chunks ``[begin, end)``; the last ``n_scored`` tokens of each
  are the ones no earlier chunk scored."""
  out, prev_end = [], 0
  for begin in range(0, n_tokens, stride):
    end = min(begin + max_length, n_tokens)
    n = end - max(prev_end, begin)
    out.append((begin, end, min(n, end - begin - 1) if begin == 0 else n))
    prev_end = end
    if end == n_tokens:
      break
  return out


def last_windows(n_tokens: int, max_length: int, stride: int, last_n: int) -> list:
  out = []
  for begin in range(0, n_tokens, stride):
    end = min(begin + max_length, n_tokens)
    if end - begin > last_n:
      out.append((begin, end, last_n))
    if end == n_tokens:
      break
  return out


def _peak_memory() -> dict:
  out = {"host_peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
  if sys.platform == "darwin":  # pragma: no cover
    out["host_peak_rss_mb"] /= 1024
  try:
    import jax
    stats = jax.devices()[0].memory_stats() or {}
    if "peak_bytes_in_use" in stats:
      out["device_peak_mb"] = stats["peak_bytes_in_use"] / 2**20
  except Exception:  # noqa: BLE001 -- backends without memory stats
    pass
  return out


# ------------------------------------------------------------------------------------------------
def run(ctx) -> dict:
  p, b = ctx.tcfg, ctx.built
  docs = load_documents(p)
  max_length, stride = int(p.max_length), int(p.stride)
  if b.method.truncates:  # the plain baseline: windows no longer than what it holds
    max_length = min(max_length, int(b.truncation_limit))
    stride = min(stride, max_length)
  b.check_fits(max_length, f"perplexity (max_length {max_length})")
  store = ctx.open_store(dict(effective_max_length=max_length, effective_stride=stride))
  bar = ctx.progress(len(docs))
  t_all = time.time()
  for did, text in docs:
    key = str(did)
    if key not in store:
      ids = b.tokenizer.encode(text, special=True)
      if p.protocol == "sliding":
        wins = sliding_chunks(len(ids), max_length, stride)
      else:
        wins = last_windows(len(ids), max_length, stride, int(p.last_n))
      t0 = time.time()
      nll, cnt, win_means = 0.0, 0, []
      for begin, end, n in wins:
        s, c = b.suffix_nll(ids[begin:end], n)
        nll, cnt = nll + s, cnt + c
        if c:
          win_means.append(s / c)
      rec = dict(doc=key, n_tokens=len(ids), n_windows=len(wins), n_scored=cnt, nll_sum=nll,
                 mean_nll=nll / cnt if cnt else float("nan"), window_mean_nll=win_means,
                 seconds=time.time() - t0, **_peak_memory())
      if p.protocol == "last":
        rec["mean_nll"] = float(np.mean(win_means)) if win_means else float("nan")
      rec["ppl"] = math.exp(rec["mean_nll"]) if cnt else float("nan")
      store.add(key, rec)
    bar.update(1)
  bar.close()
  recs = [store.records[str(d)] for d, _ in docs]
  scored = [r for r in recs if r["n_scored"]]
  if not scored:
    raise EvalError(f"perplexity: no document is long enough to score a token (max_length "
                    f"{max_length}, last_n {p.last_n})")
  if p.protocol == "sliding":
    mean_nll = float(np.mean([r["mean_nll"] for r in scored]))
  else:
    mean_nll = float(np.mean([m for r in scored for m in r["window_mean_nll"]]))
  token_nll = sum(r["nll_sum"] for r in scored) / sum(r["n_scored"] for r in scored)
  mem = _peak_memory()
  return dict(task="perplexity", protocol=p.protocol, n_docs=len(recs), max_length=max_length,
              stride=stride, ppl=math.exp(mean_nll), mean_nll=mean_nll,
              token_weighted_ppl=math.exp(token_nll), n_scored=sum(r["n_scored"] for r in recs),
              eval_seconds=round(time.time() - t_all, 2), **mem,
              per_doc=[dict(doc=r["doc"], n_tokens=r["n_tokens"], n_scored=r["n_scored"],
                            ppl=r["ppl"], seconds=r["seconds"]) for r in recs],
              samples_file=str(ctx.store.path))


def table(summary) -> str:
  from longjax.eval.runner import format_table
  rows = [[d["doc"], d["n_tokens"], d["n_scored"], d["ppl"], d["seconds"]]
          for d in summary["per_doc"]]
  rows.append(["overall", sum(d["n_tokens"] for d in summary["per_doc"]), summary["n_scored"],
               summary["ppl"], summary["eval_seconds"]])
  mem = f"host peak RSS {summary['host_peak_rss_mb']:.0f} MB"
  if "device_peak_mb" in summary:
    mem += f", device peak {summary['device_peak_mb']:.0f} MB"
  return (f"perplexity ({summary['protocol']} protocol, max_length {summary['max_length']}, "
          f"stride {summary['stride']}): {summary['ppl']:.3f}  ({mem})\n"
          + format_table(["doc", "tokens", "scored", "ppl", "seconds"], rows))
