"""FocusLLM training step on a real model: the candidates-only condensing path vs the whole-row
path it replaced, and vs a forward of the same loss.

    JAX_PLATFORMS=cpu python -m bench.bench_focus_train                  # SmolLM2-135M-Instruct
    JAX_PLATFORMS=cpu python -m bench.bench_focus_train --batch 2 --runs 2

SmolLM2-135M-Instruct (``longjax.ckpts.smollm2.get()``, cached), candidate q/k/v/o copied from the
base, ``FocusConfig(local_window=256, chunk_stride=256, prompt_cap=128)``
(configs/smollm2_focus.py), ``--batch`` samples of ``--chunks`` memory chunks + a 200-token local
span, random ids.

* ``forward``: the loss value only (``FocusLoss.loss``).
* ``whole-row``: ``value_and_grad`` with every chunk row condensed in one forward whose candidate is
  a scattered slot (:func:`longjax.focus.condense.condense`): autodiff carries a tangent for every
  token of every row (the path before this bench).
* ``candidates``: ``value_and_grad`` of ``FocusLoss`` as shipped: each row's tokens before its
  candidate run forward-only, then the candidate as a one-token step
  (:func:`longjax.focus.condense.condense_candidates`).

The three alternate inside one process (order rotated every run), so a drifting host load hits
them alike; the ratios are medians of per-run ratios. Results: ``bench/results/focus_train.md``.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
  sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import harness as H  # noqa: E402


def build(batch: int, chunks: int):
  import jax
  import jax.numpy as jnp
  import numpy as np
  from longjax.focus import FocusConfig, focus_from_llama
  from longjax.focus import condense as C
  from longjax.focus.losses import FocusLoss, freeze_base
  from longjax.focus.planner import ChunkBatch
  from longjax.ckpts import smollm2
  from longjax.models.head import head_nll

  fcfg = FocusConfig(local_window=256, chunk_stride=256, prompt_cap=128, min_len_threshold=0)
  cfg, fcfg, params = focus_from_llama(smollm2.get(), fcfg)
  params = jax.tree.map(jnp.asarray, params)
  fl = FocusLoss(cfg, fcfg)
  rng = np.random.default_rng(0)
  mem, local = 256 * chunks, 200
  xs = [rng.integers(100, cfg.vocab_size, mem + local + 1) for _ in range(batch)]
  ix = [dict(memory_len=mem, local_start=mem, local_size=local, stride=256)] * batch
  tb = fl.plan(xs, ix)

  def whole_row(p, b):
    p = freeze_base(p)
    cb: ChunkBatch = b.chunks
    ck, cv, _, _ = C.condense(fl.model, p, cb.tokens, cb.positions, cb.valid, cb.lengths)
    h = C.local_hidden(fl.model, p, ck, cv, cb.gather, cb.cand_valid, b.local.tokens,
                       b.local.lengths, b.local.n_chunks)
    return jnp.mean(head_nll(cfg, p, C.last_hidden(h, b.local.lengths), b.targets))

  fns = {"forward": fl.loss, "whole-row": jax.jit(jax.value_and_grad(whole_row)),
         "candidates": fl.value_and_grad}
  return fns, params, tb, int(np.asarray(tb.chunks.tokens).size)


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--batch", type=int, default=4)
  ap.add_argument("--chunks", type=int, default=2)
  ap.add_argument("--runs", type=int, default=3)
  ap.add_argument("--out", default="bench/results/focus_train.md")
  args = ap.parse_args(argv)
  import jax
  fns, params, tb, chunk_tokens = build(args.batch, args.chunks)
  times = {k: [] for k in fns}
  order = list(fns)
  for k in order:  # compile + warm up
    jax.block_until_ready(fns[k](params, tb))
  for r in range(args.runs):
    for k in order[r % 3:] + order[:r % 3]:
      t0 = time.perf_counter()
      jax.block_until_ready(fns[k](params, tb))
      times[k].append(time.perf_counter() - t0)
  ratio = lambda a, b: H.median([x / y for x, y in zip(times[a], times[b])])
  rows = [dict(path=k, seconds=H.median(times[k]),
               vs_whole_row=ratio(k, "whole-row"), vs_forward=ratio(k, "forward"))
          for k in order]
  table = H.markdown_table(rows, [("path", "path"), ("median s", "seconds"),
                                  ("/ whole-row", "vs_whole_row"), ("/ forward", "vs_forward")])
  text = (f"# FocusLLM training step, SmolLM2-135M-Instruct, fp32\n\n"
          f"batch {args.batch}, {args.chunks} chunks of 256 + prompt 128 each "
          f"({chunk_tokens} chunk-row tokens, padding included), local 200; "
          f"{args.runs} runs\n\n{H.uptime_line()}\n\n{table}\n")
  print(text)
  Path(args.out).write_text(text)


if __name__ == "__main__":
  main()
