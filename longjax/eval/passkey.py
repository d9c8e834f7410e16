"""Passkey retrieval: the two official generators and their metrics.

**beacon** (``eval_passkey.py``, docs/beacon.md §8), lengths in tokens x depths in percent:

* ``DESCRIPTION`` (with the tokenizer's default BOS, as ``tokenizer.encode(description)``), then
  the ``NOISE`` sentence repeated and cut by tokens to fill, the information line
  ``INFO`` with a 5-digit key inserted at token position
  ``desc_len + round((length - question_len - info_len - 1 - desc_len) * depth / 100)``, then
  ``QUESTION``. The ids are decoded to text, wrapped as one user turn with the generation prompt
  (chat template, where the tokenizer has one) and re-encoded.
* keys: ``np.random.default_rng(seed=123).integers(10000, 100000)`` drawn in grid order (lengths
  outer, depths inner); greedy, ``max_new_tokens`` 50.
* metrics: accuracy = the first integer of the output equals the key; fuzz =
  ``fuzz_ratio(first integer, key) / 100`` (see :mod:`longjax.eval.scorers`).

**focus** (``generate_prompt_landmark(n_garbage, seed)``, docs/focusllm.md §6), lengths in
characters x numpy seeds:

* ``np.random.seed(seed)``; prefix length ``randint(0, n_garbage)``, then the key
  ``randint(1, 50000)``; the garbage is the noise sentence repeated (joined by spaces) and cut by
  characters, the suffix (``n_garbage - prefix`` characters) again from the start of it;
* lines ``[prefix, "The pass key is {k}. Remember it. {k} is the pass key.", suffix,
  FOCUS_DESCRIPTION, "What is the pass key? The pass key is"]`` joined by ``"\\n"``, encoded with
  the default special tokens, no chat template;
* greedy with ``max_new_tokens = len(answer_ids)``, ``answer_ids = tokenize(str(k))[1:]`` (the
  official rule, BOS dropped; :meth:`Tokenizer.answer_ids`: the byte tokenizer spells out the
  leading space); correct (``acc_official``) when ``decode(generated) == decode(answer_ids)`` (both
  stripped); accuracy and fuzz as above are reported too. Depth = prefix / n_garbage.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Sequence

import numpy as np

from longjax.eval import scorers
from longjax.eval.errors import EvalError
from longjax.method_names import BEACON, FOCUS

# config.eval.passkey.protocol: the two papers' passkey protocols, each named after its method
# (Activation Beacon's token lengths x depths grid, FocusLLM's garbage characters x seeds)
PROTOCOLS = (BEACON.name, FOCUS.name)

DESCRIPTION = ("There is an important infomation hidden in the following context. Find the "
               "information and memorize it. I will quiz you about the important information "
               "there.\n")
NOISE = ("The grass is green. The sky is blue. The sun is yellow. Here we go. There and back "
         "again.")
INFO = "\n\nThe pass key is {key}. Remember it. {key} is the pass key.\n\n"
QUESTION = "\n\nWhat is the pass key?"

FOCUS_DESCRIPTION = ("There is an important info hidden inside a lot of irrelevant text. Find it "
                     "and memorize them. I will quiz you about the important information there.")
FOCUS_INFO = "The pass key is {key}. Remember it. {key} is the pass key."
FOCUS_QUESTION = "What is the pass key? The pass key is"


# ------------------------------------------------------------------------------------------------
# Generators.
def repeated_ids(tok, text: str, n: int, sep: str = "") -> list:
  """Token ids of ``text`` repeated (joined by ``sep``) until there are at least ``n``; cut to n."""
  if n <= 0:
    return []
  one = max(len(tok.encode(text + sep)), 1)
  reps = n // one + 2
  while True:
    ids = tok.encode(sep.join([text] * reps))
    if len(ids) >= n:
      return ids[:n]
    reps *= 2


def depth_sample(tok, length: int, depth: float, needle: str, question: str,
                 noise_ids: Sequence[int] = None, noise_text: str = NOISE,
                 description: str = DESCRIPTION) -> dict:
  """The beacon passkey / needle layout (module docstring): returns ``ids`` (before the final
  decode), ``text`` and ``position`` (token index of the needle's first token)."""
  desc = tok.encode(description, special=True)
  info = tok.encode(needle)
  q = tok.encode(question)
  n_noise = length - len(q) - len(info) - 1 - len(desc)
  if n_noise < 0:
    raise EvalError(f"length {length} is too short for the prompt: description {len(desc)} + "
                    f"needle {len(info)} + question {len(q)} + 1 = {length - n_noise} tokens; use "
                    f"lengths >= {length - n_noise}")
  if noise_ids is None:
    noise = repeated_ids(tok, noise_text, n_noise)
  else:
    if len(noise_ids) < n_noise:
      raise EvalError(f"the haystack has {len(noise_ids)} tokens, {n_noise} are needed")
    noise = list(noise_ids[:n_noise])
  position = len(desc) + round(n_noise * float(depth) / 100)
  cut = position - len(desc)
  ids = desc + noise[:cut] + info + noise[cut:] + q
  return dict(ids=ids, text=tok.decode(ids), position=position, n_noise=n_noise)


def beacon_keys(n: int, seed: int = 123) -> list:
  rng = np.random.default_rng(seed)
  return [int(rng.integers(10000, 100000)) for _ in range(n)]


def beacon_grid(lengths, depths, seed: int = 123) -> list:
  cells = [(int(n), float(d)) for n in lengths for d in depths]
  keys = beacon_keys(len(cells), seed)
  return [dict(length=n, depth=d, key=k) for (n, d), k in zip(cells, keys)]


def focus_sample(n_garbage: int, seed: int) -> dict:
  """``generate_prompt_landmark(n_garbage, seed)`` (module docstring)."""
  rs = np.random.RandomState(int(seed))
  prefix_len = int(rs.randint(0, n_garbage))
  suffix_len = n_garbage - prefix_len
  garbage = " ".join([NOISE] * (n_garbage // (len(NOISE) + 1) + 2))
  key = int(rs.randint(1, 50000))
  lines = [garbage[:prefix_len], FOCUS_INFO.format(key=key), garbage[:suffix_len],
           FOCUS_DESCRIPTION, FOCUS_QUESTION]
  return dict(text="\n".join(lines), key=key, prefix_len=prefix_len,
              depth=100.0 * prefix_len / n_garbage)


# ------------------------------------------------------------------------------------------------
def validate(ecfg):
  p = ecfg.passkey
  if p.protocol not in PROTOCOLS:
    raise EvalError(f"passkey.protocol must be {' or '.join(map(repr, PROTOCOLS))}, got "
                    f"{p.protocol!r}")
  if p.protocol == BEACON.name and (not len(p.lengths) or not len(p.depths)):
    raise EvalError("passkey.lengths and passkey.depths must not be empty")
  if p.protocol == BEACON.name and any(not 0 <= float(d) <= 100 for d in p.depths):
    raise EvalError(f"passkey.depths must be percentages in [0, 100], got {tuple(p.depths)}")
  if p.protocol == FOCUS.name and (not len(p.n_garbage) or not len(p.seeds)):
    raise EvalError("passkey.n_garbage and passkey.seeds must not be empty")


def _cap(items, ecfg):
  n = int(ecfg.max_samples or 0)
  return items[:n] if n > 0 else items


def prepare(ctx) -> list:
  """Every sample's prompt ids, key and cell (no model calls)."""
  p, tok, b = ctx.tcfg, ctx.built.tokenizer, ctx.built
  chat = ctx.ecfg.chat_template != "none"
  samples = []
  if p.protocol == BEACON.name:
    for cell in _cap(beacon_grid(p.lengths, p.depths, p.seed), ctx.ecfg):
      s = depth_sample(tok, cell["length"], cell["depth"], INFO.format(key=cell["key"]), QUESTION)
      ids = b.fit(tok.prompt_ids(s["text"], chat), p.max_new_tokens)
      samples.append(dict(key=f"{cell['length']}/{cell['depth']:g}", length=cell["length"],
                          depth=cell["depth"], passkey=str(cell["key"]), position=s["position"],
                          ids=ids, max_new_tokens=int(p.max_new_tokens)))
  else:
    cells = [(int(n), int(s)) for n in p.n_garbage for s in p.seeds]
    for n, seed in _cap(cells, ctx.ecfg):
      s = focus_sample(n, seed)
      answer = tok.answer_ids(str(s["key"]))
      ids = b.fit(tok.prompt_ids(s["text"], False), len(answer))
      samples.append(dict(key=f"{n}/{seed}", length=n, seed=seed, depth=s["depth"],
                          passkey=str(s["key"]), answer_text=tok.decode(answer), ids=ids,
                          max_new_tokens=len(answer)))
  return samples


def run(ctx) -> dict:
  p = ctx.tcfg
  if p.protocol == BEACON.name:  # before building documents of that many tokens
    ctx.built.check_capacity(max(int(n) for n in p.lengths) + int(p.max_new_tokens),
                             f"passkey (protocol beacon, lengths up to {max(p.lengths)})")
  samples = prepare(ctx)
  longest = max(len(s["ids"]) + s["max_new_tokens"] for s in samples)
  ctx.built.check_fits(longest, f"passkey (protocol {p.protocol}, largest prompt "
                       f"{max(len(s['ids']) for s in samples)} tokens)")
  store = ctx.open_store(dict(protocol=p.protocol))
  stops = ctx.built.stop_ids()
  bar = ctx.progress(len(samples))
  for s in samples:
    if s["key"] not in store:
      gen, text = ctx.built.generate(s["ids"], s["max_new_tokens"], stops)
      pred = scorers.first_int(text)
      rec = {k: v for k, v in s.items() if k not in ("ids", "key")}
      rec.update(n_tokens=len(s["ids"]), output=text, pred=pred,
                 acc=float(pred == s["passkey"]),
                 fuzz=scorers.fuzz_ratio(pred, s["passkey"]) / 100)
      if p.protocol == FOCUS.name:
        rec["acc_official"] = float(text.strip() == s["answer_text"].strip())
      store.add(s["key"], rec)
    bar.update(1)
  bar.close()
  return summarize(ctx, [store.records[s["key"]] for s in samples])


def summarize(ctx, recs: list) -> dict:
  from longjax.eval.plots import heatmap
  p = ctx.tcfg
  focus = p.protocol == FOCUS.name
  lengths = sorted({r["length"] for r in recs})
  if focus:
    depths = [float(d) for d in range(0, 101, 10)]
    dkey = lambda r: min(depths, key=lambda d: abs(d - r["depth"]))  # noqa: E731
  else:
    depths = sorted({float(r["depth"]) for r in recs})
    dkey = lambda r: float(r["depth"])  # noqa: E731
  grid = defaultdict(list)
  for r in recs:
    grid[(r["length"], dkey(r))].append(r)
  mean = lambda xs, f: float(np.mean([x[f] for x in xs])) if xs else float("nan")  # noqa: E731
  acc = np.full((len(depths), len(lengths)), np.nan)
  cells = []
  for i, d in enumerate(depths):
    for j, n in enumerate(lengths):
      rs = grid.get((n, d), [])
      if rs:
        acc[i, j] = mean(rs, "acc")
        cells.append(dict(length=n, depth=d, n=len(rs), acc=acc[i, j], fuzz=mean(rs, "fuzz")))
  per_length = []
  for n in lengths:
    rs = [r for r in recs if r["length"] == n]
    row = dict(length=n, n=len(rs), acc=mean(rs, "acc"), fuzz=mean(rs, "fuzz"))
    if focus:
      row["acc_official"] = mean(rs, "acc_official")
    per_length.append(row)
  unit = "characters of garbage" if focus else "tokens"
  fig = heatmap(acc, lengths, depths, f"{ctx.out_prefix}.png",
                title=f"Passkey ({ctx.built.name}, {p.protocol} protocol): "
                      f"acc {mean(recs, 'acc'):.3f}",
                xlabel=f"Context length ({unit})",
                ylabel="Depth (%)" + (" (binned)" if focus else ""))
  out = dict(task="passkey", protocol=p.protocol, n_samples=len(recs), acc=mean(recs, "acc"),
             fuzz=mean(recs, "fuzz"), per_length=per_length, cells=cells,
             figures=[str(fig)], samples_file=str(ctx.store.path))
  if focus:
    out["acc_official"] = mean(recs, "acc_official")
  return out


def table(summary: dict) -> str:
  from longjax.eval.runner import format_table
  focus = summary["protocol"] == FOCUS.name
  header = ["length", "samples", "acc", "fuzz"] + (["acc_official"] if focus else [])
  rows = [[r["length"], r["n"], r["acc"], r["fuzz"]] + ([r["acc_official"]] if focus else [])
          for r in summary["per_length"]]
  rows.append(["all", summary["n_samples"], summary["acc"], summary["fuzz"]]
              + ([summary["acc_official"]] if focus else []))
  text = format_table(header, rows)
  if not focus:
    depths = sorted({c["depth"] for c in summary["cells"]})
    lengths = [r["length"] for r in summary["per_length"]]
    acc = {(c["length"], c["depth"]): c["acc"] for c in summary["cells"]}
    text += "\n\naccuracy per (depth %, length):\n" + format_table(
        ["depth"] + [str(n) for n in lengths],
        [[f"{d:g}"] + [acc.get((n, d), float("nan")) for n in lengths] for d in depths])
  return text
