"""One long-context report for every method on SmolLM2-135M-Instruct.

For full attention (``plain``), truncation to ``W`` tokens (``truncation``), Activation Beacon and
FocusLLM (the committed assets), each cell (task x length x method) is scored through the
lm-eval model ``longjax`` (longjax/eval/harness.py), greedy, chat template applied:

* RULER's six offline tasks of lm-eval 0.4.13 (niah_single_1, niah_multikey_2, niah_multikey_3,
  ruler_vt, ruler_cwe, ruler_fwe): the first ``n`` of the samples lm-eval generates for a length
  (``limit``), scored by RULER's case-insensitive string match (0-1);
* ``passkey``: the project's passkey (longjax/eval/passkey.py: the Activation Beacon layout,
  5-digit keys at the middles of ``n`` equal depth bins), exact match of the first integer;
* ``heldout_qa``: the held-out split of the project's training-data generator
  (longjax/data/haystack.py, seed 1000: pydoc prose and station logs, needles of many kinds with
  distractors, questions about the content, phrasings no training file uses), correct when the
  answer holds the target and no distractor, in any wording;
* ``perplexity``: held-out text (``--ppl_data``: by default Python's ``pydoc_data.topics``, never
  trained on) read through the method, the last 256 tokens of a ``length``-token window scored;
  lower is better.

Each finished cell is saved at once (``<out>/longctx_cells/<method>__<task>__<length>.json``,
written atomically); a rerun skips finished cells, so a stopped report resumes. Inside a
generation cell every answer is logged as it comes (``longctx_cells/.answers/``, JSON lines keyed
by the request, dropped once the cell is saved): a rerun of a stopped cell reuses them and only
the rest run (the cell's ``seconds`` then count the rerun only; ``resumed_answers`` says how many
were reused). After every cell
the table (``<out>/longctx.md``, ``longctx.json``) and the figure (``longctx.png``: score against
length, one line per method, one panel per task) are rewritten.

SmolLM2's trained context is 8192 tokens: past it the plain model runs outside its trained
positions (marked in the table).

Default cells (chosen for under 2 hours on 2 CPU cores): 2 samples per cell (``--samples``),
lengths 4096, 8192 and 32768 (``--lengths``; add 16384 for the step between), every task at 4096
tokens, only niah_single_1, passkey and perplexity past it, full attention only up to 8192 (past
SmolLM2's trained context it is not a reader) and FocusLLM's perplexity only at 4096
(teacher-forced decoding re-runs its local window for every scored token); those cells are
recorded as not run. ``--cells all`` runs every task at every length for
every method. lm-eval
generates RULER's 500 samples of a length at each cell (5-40 s) whatever ``--samples`` is. Each
cell records its seconds and the host's 1-minute load average at its start and end.

  python scripts/longctx_report.py                       # the default cells (see --help)
  python scripts/longctx_report.py --lengths 4096,8192,16384,32768 --cells all --samples 20
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from longjax.eval import harness  # noqa: E402

RULER = ("niah_single_1", "niah_multikey_2", "niah_multikey_3", "ruler_vt", "ruler_cwe",
         "ruler_fwe")
# heldout_qa: the project's own generator, held-out split only (longjax.data.haystack: pydoc prose
# and station logs, phrasings no training file uses; docs/learning.md "Training data")
TASKS = RULER + ("passkey", "heldout_qa", "perplexity")
# the lm-eval model_args of each method (names from the registry, through the adapter)
METHODS = {
    harness.PLAIN: f"method={harness.PLAIN},checkpoint=smollm2",
    harness.TRUNCATION: f"method={harness.TRUNCATION},window={{window}},checkpoint=smollm2",
    harness.BEACON: f"method={harness.BEACON},asset=smollm2_beacon,checkpoint=smollm2",
    harness.FOCUS: f"method={harness.FOCUS},asset=smollm2_focus,checkpoint=smollm2",
}
TRAINED_POSITIONS = 8192
PPL_SCORED = 256
# a generation cell keeps each answer cut to this many characters (the curve shows how it answers)
ANSWER_CHARS = 160
# past the shortest length, the default grid runs these only (CPU time)
SHORTEST = 4096
LONG_TASKS = ("niah_single_1", "passkey", "perplexity")
# FocusLLM's perplexity re-runs the local window for every scored token (docs/focusllm.md §4.2)
FOCUS_PPL_MAX = 4096
FOCUS_PPL_LONG = ("FocusLLM's teacher-forced perplexity past 4K (a decode step per scored token: "
                  "16 minutes at 8K on 2 CPU cores; --cells all runs it)")
PLAIN_PAST_CONTEXT = ("full attention past SmolLM2's 8K trained positions (the methods are the "
                      "readers there; --cells all runs it)")


def write_atomic(path: Path, text: str):
  path.parent.mkdir(parents=True, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
  with os.fdopen(fd, "w") as f:
    f.write(text)
  os.chmod(tmp, 0o644)  # mkstemp's 0600 would keep a committed result from other readers
  os.replace(tmp, path)


def cell_path(out: Path, method, task, length) -> Path:
  return out / "longctx_cells" / f"{method}__{task}__{length}.json"


def answer_log_path(out: Path, method, task, length) -> Path:
  """A generation cell's answers as they come (longjax.eval.answer_log), gone once it is saved."""
  return out / "longctx_cells" / ".answers" / f"{method}__{task}__{length}.jsonl"


def answer_identity(lm, model_args: str) -> str:
  """What a cell's logged answers must match to be reused: the model arguments, the settings the
  method reads and the bytes of its asset (one retrained under the same name answers anew)."""
  from lm_eval.utils import simple_parse_args_string
  from longjax.eval.answer_log import files_fingerprint
  asset = simple_parse_args_string(model_args).get("asset")
  return json.dumps(dict(model_args=model_args, settings=repr(lm.parts.settings),
                         asset=files_fingerprint(harness.resolve_asset(asset)) if asset else ""))


# ------------------------------------------------------------------------------------------------
def run_ruler(lm, task, length, n, tok_dir, max_gen_toks=None):
  """``max_gen_toks``: answers cut to this many tokens instead of the task's own (RULER's score
  is whether the answer holds the needle, so a shorter answer can only score lower: a lower
  bound, at a fraction of the decode time for a model that never stops on its own)."""
  import lm_eval
  res = lm_eval.simple_evaluate(model=lm, tasks=[task], limit=n, apply_chat_template=True,
                                metadata={"tokenizer": str(tok_dir), "max_seq_lengths": [length]},
                                gen_kwargs=(None if max_gen_toks is None
                                            else {"max_gen_toks": int(max_gen_toks)}),
                                log_samples=True)
  answers = [answer_record(s.get("target"), (s.get("resps") or [[""]])[0])
             for s in res.get("samples", {}).get(task, [])]
  return (float(res["results"][task][f"{length},none"]),
          int(res["n-samples"][task]["effective"]), dict(answers=answers))


def answer_record(target, resp) -> dict:
  """What a generation cell keeps of one sample: the expected answer and the model's text (cut
  to ANSWER_CHARS), so that a curve shows *how* a method answers, e.g. in one fixed sentence."""
  if isinstance(resp, (list, tuple)):
    resp = resp[0] if resp else ""
  return dict(target=target if isinstance(target, (str, int)) else list(map(str, target)),
              answer=str(resp)[:ANSWER_CHARS])


def run_passkey(lm, length, n, seed=2024):
  import numpy as np
  from longjax.eval import passkey, scorers
  tok = lm.parts.tokenizer
  # the middles of n equal depth bins: never the very start or end of the document, which the
  # truncation baseline's middle truncation would keep
  depths = [round(100 * (i + 0.5) / n, 2) for i in range(n)]
  grid = passkey.beacon_grid([length], depths, seed=seed)
  hits, answers = [], []
  for cell in grid:
    s = passkey.depth_sample(tok, cell["length"], cell["depth"],
                             passkey.INFO.format(key=cell["key"]), passkey.QUESTION)
    prompt = lm.apply_chat_template([{"role": "user", "content": s["text"]}])
    req = type("R", (), {"args": (prompt, {"until": [], "max_gen_toks": 16})})()
    text = lm.generate_until([req], disable_tqdm=True)[0]
    hits.append(float(scorers.first_int(text) == str(cell["key"])))
    answers.append(answer_record(str(cell["key"]), text))
  return float(np.mean(hits)), len(hits), dict(answers=answers)


HELDOUT_SEED = 1000  # the held-out set's seed (docs/learning.md)
HELDOUT_QA_TOKENS = 48  # generation budget: an answer in the model's own words, one sentence


def run_heldout_qa(lm, length, n):
  """The first ``n`` held-out documents of ``length`` tokens (the question inside, as the base
  sees any user turn): correct when the answer holds the target and no distractor, whatever
  its wording (``haystack.score``)."""
  from longjax.data import haystack
  recs = list(haystack.generate(lm.parts.tokenizer, "heldout", n, (length, length),
                                HELDOUT_SEED, chat=False))
  texts = []
  for rec in recs:
    prompt = lm.apply_chat_template([{"role": "user", "content": rec["input"]}])
    req = type("R", (), {"args": (prompt, {"until": [], "max_gen_toks": HELDOUT_QA_TOKENS})})()
    texts.append(lm.generate_until([req], disable_tqdm=True)[0])
  # the scorer's summary: the correct answers, and the share opening with the same words (near 1
  # when one fixed sentence answers every question)
  summary = haystack.summarise(recs, texts)
  return summary["correct"] / len(recs), len(recs), dict(
      answers=[answer_record(r["target"], t) for r, t in zip(recs, texts)],
      top_prefix=summary["top_prefix"], top_prefix_share=summary["top_prefix_share"])


def held_out_text(data: str) -> str:
  """``pydoc``: Python's reference topics (``pydoc_data.topics``, sorted keys joined), the held-out
  prose of every perplexity in the project (no training file uses it); else a UTF-8 .txt file."""
  if data == "pydoc":
    from pydoc_data.topics import topics
    return "\n\n".join(topics[k] for k in sorted(topics))
  return Path(data).read_text(encoding="utf-8")


def run_perplexity(lm, length, n, data):
  import math
  toks = lm.tok_encode(held_out_text(data))
  need = length + 1
  windows = [toks[i:i + need] for i in range(0, len(toks) - need + 1, need)][:n]
  if not windows:
    raise SkipCell(f"--ppl_data has {len(toks)} tokens, a window needs {need}")
  nll = []
  for w in windows:
    ids = [lm.prefix_token_id] + w
    if lm.parts.window:
      ids = ids[-(lm.parts.window + 1):] if PPL_SCORED <= lm.parts.window else ids
    nll.append(lm._suffix_nll(ids, PPL_SCORED) / PPL_SCORED)
  return float(math.exp(sum(nll) / len(nll))), len(nll)


class SkipCell(Exception):
  """A cell that cannot run here: recorded as "not run: reason"."""


# ------------------------------------------------------------------------------------------------
def render(out: Path, cells: list, args):
  """The table (markdown + json) and the figure, from every finished cell."""
  methods = [m for m in METHODS if m in args.methods or any(c["method"] == m for c in cells)]
  tasks = [t for t in TASKS if t in args.tasks or any(c["task"] == t for c in cells)]
  by = {(c["task"], c["length"], c["method"]): c for c in cells}
  lengths = sorted({c["length"] for c in cells} | set(args.lengths))
  lines = ["# Long-context report: SmolLM2-135M-Instruct", "",
           f"Command: `python scripts/longctx_report.py {' '.join(args.argv)}`".rstrip(), "",
           "Cell: score, n = samples, s = seconds of the cell (model load excluded). RULER and "
           "passkey: accuracy 0-1 (higher is better); perplexity: lower is better. "
           f"truncation reads {args.window} prompt tokens. † plain past {TRAINED_POSITIONS} tokens "
           "runs outside SmolLM2's trained positions; ‡ not run by default: "
           f"{PLAIN_PAST_CONTEXT}; {FOCUS_PPL_LONG}. — not run (yet): a rerun of the command "
           "adds it."
           + _load_note(cells) + _default_note(cells, args), "",
           "| task | length | " + " | ".join(methods) + " |",
           "|---|---:|" + "---|" * len(methods)]
  for task in tasks:
    for n in lengths:
      row = []
      for m in methods:
        c = by.get((task, n, m))
        if c is None:
          row.append("—")
        elif c.get("not_run"):
          row.append("not run ‡" if c["not_run"] in (PLAIN_PAST_CONTEXT, FOCUS_PPL_LONG) else
                     f"not run: {c['not_run']}")
        else:
          mark = " †" if m == harness.PLAIN and n > TRAINED_POSITIONS else ""
          row.append(f"{c['score']:.3g}{mark} (n={c['n']}, {c['seconds']:.0f} s)")
      if any(r != "—" for r in row):
        lines.append(f"| {task} | {n} | " + " | ".join(row) + " |")
  write_atomic(out / "longctx.md", "\n".join(lines) + "\n")
  write_atomic(out / "longctx.json", json.dumps(dict(cells=cells), indent=1))
  figure(out, cells, methods)


def _load_note(cells) -> str:
  loads = [x for c in cells for x in c.get("load", [])]
  if not loads:
    return ""
  total = sum(c.get("seconds", 0) for c in cells)
  return (f" The cells took {total / 3600:.2f} h in all, on {os.cpu_count()} CPU cores at a "
          f"1-minute load average of {min(loads):.1f}-{max(loads):.1f}.")


def _default_note(cells, args) -> str:
  """The share of the time that is the default grid's (what the command without flags runs)."""
  if not args.default_grid:
    return ""
  mine = [c for c in cells if "seconds" in c and c["method"] in args.methods
          and (c["task"], c["length"]) in args.pairs
          and (c["method"], c["task"], c["length"]) not in args.skipped]
  return (f" The default grid's {len(mine)} cells that run took "
          f"{sum(c['seconds'] for c in mine) / 3600:.2f} h of it.")


def figure(out: Path, cells, methods):
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  tasks = [t for t in TASKS if any(c["task"] == t and "score" in c for c in cells)]
  if not tasks:
    return
  cols = min(4, len(tasks))
  rows = -(-len(tasks) // cols)
  fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3.2 * rows), squeeze=False)
  for ax, task in zip(axes.flat, tasks):
    for m in methods:
      pts = sorted((c["length"], c["score"]) for c in cells
                   if c["task"] == task and c["method"] == m and "score" in c)
      if pts:
        # one colour per method in every panel; marker sizes differ so equal scores stay visible
        k = list(METHODS).index(m)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", color=f"C{k}",
                markersize=9 - 2 * k, label=m)
    ax.set_xscale("log", base=2)
    ax.set_title(task)
    ax.set_xlabel("length (tokens)")
    ax.set_ylabel("perplexity" if task == "perplexity" else "accuracy")
    ax.legend(fontsize=7)
  for ax in list(axes.flat)[len(tasks):]:
    ax.axis("off")
  fig.tight_layout()
  fd, tmp = tempfile.mkstemp(dir=out, prefix=".longctx.png.", suffix=".png")
  os.close(fd)
  fig.savefig(tmp, dpi=100)
  plt.close(fig)
  os.chmod(tmp, 0o644)
  os.replace(tmp, out / "longctx.png")


# ------------------------------------------------------------------------------------------------
def parse(argv):
  ap = argparse.ArgumentParser(description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--out", default="results", help="directory of the table, figure and cells")
  ap.add_argument("--methods", default=",".join(METHODS))
  ap.add_argument("--tasks", default=",".join(TASKS))
  ap.add_argument("--lengths", default="4096,8192,32768",
                  help="comma list (RULER: 4096 and up, powers of two)")
  ap.add_argument("--samples", type=int, default=2, help="samples per cell (RULER: the first n "
                  "lm-eval generates; passkey: n depths; perplexity: n windows)")
  ap.add_argument("--cells", default="", help="only these task:length pairs (e.g. "
                  "niah_single_1:16384,passkey:4096), or 'all'; default: every task at "
                  f"{SHORTEST} tokens, only {', '.join(LONG_TASKS)} past it")
  ap.add_argument("--window", type=int, default=256, help="truncation: prompt tokens kept")
  ap.add_argument("--assets", default="", help="other assets than the committed ones, e.g. "
                  "beacon=runs/smollm2_beacon/candidate (a campaign's candidate, measured on "
                  "the same held-out cells; give another --out)")
  ap.add_argument("--ppl_data", default="pydoc", help="held-out text for perplexity: 'pydoc' "
                  "(Python's pydoc_data.topics, never trained on), a .txt file, or '' to record "
                  "the perplexity cells as not run")
  ap.add_argument("--skip", default="", help="method:task:length cells recorded as not run, "
                  "with --skip_reason")
  ap.add_argument("--skip_reason", default="too slow on 2 CPU cores")
  ap.add_argument("--max_gen_toks", type=int, default=None,
                  help="RULER: cut every answer to this many tokens (default: the task's own, "
                       "128 for niah); the score is then a lower bound of the task's, recorded "
                       "in each cell")
  ap.add_argument("--render", action="store_true", help="only rewrite the table and the figure "
                  "from the finished cells (the same command without it runs the rest)")
  args = ap.parse_args(argv)
  args.argv = [a for a in argv if a != "--render"]  # the command that runs (or resumes) the grid
  args.methods = [m.strip() for m in args.methods.split(",") if m.strip()]
  args.tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
  args.lengths = [int(x) for x in args.lengths.split(",") if x.strip()]
  from longjax.eval.harness import HarnessError, check_ruler_lengths
  for m in args.methods:
    if m not in METHODS:
      raise HarnessError(f"--methods: unknown method {m!r}; use {', '.join(METHODS)}")
  for t in args.tasks:
    if t not in TASKS:
      raise HarnessError(f"--tasks: unknown task {t!r}; use {', '.join(TASKS)}")
  if args.samples < 1:
    raise HarnessError("--samples must be >= 1")
  if args.max_gen_toks is not None and args.max_gen_toks < 1:
    raise HarnessError(f"--max_gen_toks {args.max_gen_toks}: give at least 1 token (or leave "
                       "it out: the task's own)")
  pairs = [] if args.cells.strip() == "all" else [
      _cell_pair(p) for p in args.cells.split(",") if p.strip()]
  args.default_grid = not args.cells.strip()
  if pairs:  # the cells named run at their own lengths, whatever --lengths says
    args.lengths = sorted({n for _, n in pairs})
    args.tasks = [t for t in TASKS if any(t == u for u, _ in pairs)]
  for t in (t for t in args.tasks if t in RULER):
    check_ruler_lengths([t], sorted({n for u, n in pairs if u == t}) if pairs else args.lengths)
  if args.cells.strip() == "all":
    args.pairs = None
  elif pairs:
    args.pairs = set(pairs)
  else:  # the default grid (module docstring): what 2 CPU cores do in about 2 hours
    args.pairs = {(t, n) for t in args.tasks for n in args.lengths
                  if n <= SHORTEST or t in LONG_TASKS}
  args.model_args = {m: a.format(window=args.window) for m, a in METHODS.items()}
  for spec in (x.strip() for x in args.assets.split(",") if x.strip()):
    m, _, path = spec.partition("=")
    if m not in harness.WITH_ASSET or not path:
      raise HarnessError(f"--assets {spec!r}: give METHOD=DIR with METHOD one of "
                         f"{', '.join(harness.WITH_ASSET)}")
    args.model_args[m] = args.model_args[m].replace(f"asset=smollm2_{m}", f"asset={path}")
  skip = {(m, t, int(n)) for m, t, n in (s.split(":") for s in args.skip.split(",") if s.strip())}
  args.skipped = {c: args.skip_reason for c in skip}
  if args.default_grid:  # full attention is not a reader past the base's trained context
    args.skipped.update({(harness.PLAIN, t, n): PLAIN_PAST_CONTEXT for t, n in args.pairs
                         if n > TRAINED_POSITIONS and (harness.PLAIN, t, n) not in skip})
    args.skipped.update({(harness.FOCUS, t, n): FOCUS_PPL_LONG for t, n in args.pairs
                         if t == "perplexity" and n > FOCUS_PPL_MAX
                         and (harness.FOCUS, t, n) not in skip})
  return args


def _cell_pair(spec: str):
  from longjax.eval.harness import HarnessError
  task, _, length = spec.strip().partition(":")
  if task not in TASKS or not length.isdigit():
    raise HarnessError(f"--cells {spec.strip()!r}: give TASK:LENGTH with TASK one of "
                       f"{', '.join(TASKS)} (e.g. passkey:4096)")
  return task, int(length)


def main(argv=None):
  argv = sys.argv[1:] if argv is None else list(argv)
  from longjax.errors import LongjaxError, one_line
  try:
    args = parse(argv)
  except LongjaxError as e:
    print(f"error: {one_line(e)}", file=sys.stderr)
    return 2
  from longjax.eval.harness import LongjaxLM
  from lm_eval.utils import simple_parse_args_string
  out = Path(args.out)
  todo = [(m, t, n) for m in args.methods for t in args.tasks for n in args.lengths
          if args.pairs is None or (t, n) in args.pairs]
  done = lambda: [json.loads(p.read_text()) for p in sorted((out / "longctx_cells").glob("*.json"))]  # noqa: E731
  print(f"{len(todo)} cells, {sum(cell_path(out, *c).exists() for c in todo)} already done",
        flush=True)
  lm_cache = {}
  for k, (m, t, n) in enumerate([] if args.render else todo, 1):
    path = cell_path(out, m, t, n)
    if path.exists() and ("not_run" not in json.loads(path.read_text())
                          or (m, t, n) in args.skipped):
      continue  # done (a cell once skipped runs when this command no longer skips it)
    rec = dict(method=m, task=t, length=n)
    t0, load0 = time.time(), os.getloadavg()[0]
    try:
      if (m, t, n) in args.skipped:
        raise SkipCell(args.skipped[(m, t, n)])
      if t == "perplexity" and not args.ppl_data:
        raise SkipCell("no held-out long text given (--ppl_data)")
      if m not in lm_cache:
        from longjax.runtime import compile_cache
        compile_cache.enable("auto")  # a rerun loads its programs from disk
        lm_cache.clear()
        lm_cache[m] = LongjaxLM(**simple_parse_args_string(args.model_args[m]))
        t0 = time.time()
      lm = lm_cache[m]
      if t != "perplexity":  # a generation cell: answers logged as they come, reused by a rerun
        from longjax.eval.answer_log import AnswerLog
        lm.answer_log = AnswerLog(answer_log_path(out, m, t, n),
                                  answer_identity(lm, args.model_args[m]))
        if lm.answer_log.stale:
          print(f"  answers logged by another model set aside: {lm.answer_log.stale}", flush=True)
        if len(lm.answer_log):
          rec["resumed_answers"] = len(lm.answer_log)
          print(f"  {m} {t} {n}: {len(lm.answer_log)} answers logged before a stop, reused",
                flush=True)
      tok_dir = lm.parts.tokenizer.name
      extra = {}  # what a generation cell keeps besides its score: the answers
      if t in RULER:
        score, count, extra = run_ruler(lm, t, n, args.samples, tok_dir, args.max_gen_toks)
        if args.max_gen_toks is not None:
          extra["max_gen_toks"] = args.max_gen_toks  # a lower bound of the task's own score
      elif t == "passkey":
        score, count, extra = run_passkey(lm, n, args.samples)
      elif t == "heldout_qa":
        score, count, extra = run_heldout_qa(lm, n, args.samples)
      else:
        score, count = run_perplexity(lm, n, args.samples, args.ppl_data)
      rec.update(score=score, n=count, seconds=round(time.time() - t0, 1),
                 load=[round(load0, 2), round(os.getloadavg()[0], 2)], **extra)
    except SkipCell as e:
      rec.update(not_run=str(e))
    write_atomic(path, json.dumps(rec))
    if lm_cache.get(m) is not None and lm_cache[m].answer_log is not None:
      lm_cache[m].answer_log.discard()  # the cell is saved: its answers live there now
      lm_cache[m].answer_log = None
    print(f"[{k}/{len(todo)}] {m} {t} {n}: " + (f"not run: {rec['not_run']}" if "not_run" in rec
          else f"{rec['score']:.3g} (n={rec['n']}, {rec['seconds']:.0f} s)"), flush=True)
    render(out, done(), args)
  render(out, done(), args)
  print(f"wrote {out / 'longctx.md'}, {out / 'longctx.json'}, {out / 'longctx.png'}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
