"""Needle in a haystack (beacon ``eval_needle.py``, docs/beacon.md §8).

The haystack is every ``*.txt`` file of ``needle.haystack_dir`` (sorted by name) concatenated, and
repeated when a length needs more tokens than it has. The prompt follows the beacon passkey layout
(:func:`longjax.eval.passkey.depth_sample`): the same description, the haystack cut by tokens, the
needle at ``desc_len + round((length - question - needle - 1 - desc_len) * depth / 100)``, then the
question; decoded, wrapped as one chat turn where the tokenizer has a template, re-encoded. Greedy,
``max_new_tokens`` 50. Score: ROUGE-L **recall** of the first line of the (stripped) output
against the stripped needle (:func:`longjax.eval.scorers.rouge_l`), per (length, depth) cell.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from longjax.eval import scorers
from longjax.eval.errors import EvalError
from longjax.eval.passkey import depth_sample


def haystack_files(ecfg) -> list:
  d = ecfg.needle.haystack_dir
  if not d:
    raise EvalError("needle needs a haystack: set --config.eval.needle.haystack_dir=DIR (a "
                    "directory of .txt files, e.g. PaulGrahamEssays)")
  path = Path(d)
  if not path.is_dir():
    raise EvalError(f"needle.haystack_dir {str(path)!r} is not a directory")
  files = sorted(path.glob("*.txt"))
  if not files:
    raise EvalError(f"needle.haystack_dir {str(path)!r} has no .txt files")
  return files


def validate(ecfg):
  haystack_files(ecfg)
  n = ecfg.needle
  if not len(n.lengths) or not len(n.depths):
    raise EvalError("needle.lengths and needle.depths must not be empty")
  if any(not 0 <= float(d) <= 100 for d in n.depths):
    raise EvalError(f"needle.depths must be percentages in [0, 100], got {tuple(n.depths)}")


def haystack_ids(tok, files, n_tokens: int) -> list:
  text = "".join(f.read_text(encoding="utf-8", errors="replace") for f in files)
  if not text.strip():
    raise EvalError(f"the haystack files ({len(files)} .txt) are empty")
  ids = tok.encode(text)
  out = list(ids)
  while len(out) < n_tokens:
    out += ids
  return out[:n_tokens]


def run(ctx) -> dict:
  n, tok, b = ctx.tcfg, ctx.built.tokenizer, ctx.built
  chat = ctx.ecfg.chat_template != "none"
  cells = [(int(L), float(d)) for L in n.lengths for d in n.depths]
  if ctx.ecfg.max_samples:
    cells = cells[:int(ctx.ecfg.max_samples)]
  ctx.built.check_fits(max(L for L, _ in cells) + int(n.max_new_tokens),
                       f"needle (length {max(L for L, _ in cells)})")
  hay = haystack_ids(tok, haystack_files(ctx.ecfg), max(L for L, _ in cells))
  store = ctx.open_store({})
  stops = b.stop_ids()
  needle_ref = n.needle.strip()
  bar = ctx.progress(len(cells))
  for L, d in cells:
    key = f"{L}/{d:g}"
    if key not in store:
      s = depth_sample(tok, L, d, n.needle, n.question, noise_ids=hay)
      ids = b.fit(tok.prompt_ids(s["text"], chat), n.max_new_tokens)
      _, text = b.generate(ids, int(n.max_new_tokens), stops)
      first = text.strip().split("\n")[0]
      store.add(key, dict(length=L, depth=d, position=s["position"], n_tokens=len(ids),
                          output=text, score=scorers.rouge_l_recall(first, needle_ref)))
    bar.update(1)
  bar.close()
  return summarize(ctx, [store.records[f"{L}/{d:g}"] for L, d in cells])


def summarize(ctx, recs) -> dict:
  from longjax.eval.plots import heatmap
  lengths = sorted({r["length"] for r in recs})
  depths = sorted({float(r["depth"]) for r in recs})
  grid = np.full((len(depths), len(lengths)), np.nan)
  for r in recs:
    grid[depths.index(float(r["depth"])), lengths.index(r["length"])] = r["score"]
  avg = float(np.mean([r["score"] for r in recs]))
  fig = heatmap(grid, lengths, depths, f"{ctx.out_prefix}.png",
                title=f"Needle in a haystack ({ctx.built.name}): ROUGE-L recall {avg:.3f}")
  per_length = [dict(length=L, n=int(np.sum(np.isfinite(grid[:, j]))),
                     score=float(np.nanmean(grid[:, j]))) for j, L in enumerate(lengths)]
  return dict(task="needle", n_samples=len(recs), score=avg, per_length=per_length,
              cells=[dict(length=r["length"], depth=r["depth"], score=r["score"]) for r in recs],
              figures=[str(fig)], samples_file=str(ctx.store.path))


def table(summary) -> str:
  from longjax.eval.runner import format_table
  lengths = [r["length"] for r in summary["per_length"]]
  depths = sorted({c["depth"] for c in summary["cells"]})
  sc = {(c["length"], c["depth"]): c["score"] for c in summary["cells"]}
  rows = [[f"{d:g}"] + [sc.get((L, d), float("nan")) for L in lengths] for d in depths]
  rows.append(["avg"] + [r["score"] for r in summary["per_length"]])
  return (f"ROUGE-L recall (first line vs needle), overall {summary['score']:.3f}\n"
          + format_table(["depth"] + [str(L) for L in lengths], rows))
