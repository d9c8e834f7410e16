"""LongBench, the 14 English tasks (beacon ``eval_longbench.py``; FocusLLM ``eval_longbench.py``).

Data: ``{longbench.data_dir}/{task}.jsonl`` in the published format (one JSON object per line with
``context``, ``input``, ``answers`` (list), and ``all_classes`` for trec; ``_id`` is used as the
sample id when present).

Per sample: the task's standard prompt (``PROMPTS``) -> middle truncation of the prompt to
``longbench.max_length`` tokens (token halves decoded and re-joined; the plain baseline: to its own
limit, which ever is smaller) -> chat template for every task except Few-Shot Learning and Code
Completion when ``longbench.chat_template`` (beacon: yes; FocusLLM: no) -> greedy decoding with the
task's ``MAX_NEW_TOKENS`` and, for ``NEWLINE_STOP`` tasks, ``"\\n"`` as an extra EOS. Scores: the
task metric (``METRICS``) maxed over the answers (trec, triviaqa, samsum: first line of the output
only), task score = 100 x mean; category averages and the average over tasks.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from longjax.eval import scorers, task_files
from longjax.eval.errors import EvalError
from longjax.eval.models import truncate_text_middle
from longjax.eval.task_files import read_task, validate_dir

TASKS = ("narrativeqa", "qasper", "multifieldqa_en", "hotpotqa", "2wikimqa", "musique",
         "gov_report", "qmsum", "multi_news", "trec", "triviaqa", "samsum", "lcc", "repobench-p")

# The standard prompts, as LongBench keeps them (its config/dataset2prompt.json): data beside the
# code, read once.
PROMPTS = json.loads(Path(__file__).with_name("longbench_prompts.json").read_text(encoding="utf-8"))

MAX_NEW_TOKENS = dict(zip(TASKS, (128, 128, 64, 32, 32, 32, 512, 512, 512, 64, 32, 128, 64, 64)))
NEWLINE_STOP = ("2wikimqa", "hotpotqa", "musique", "multifieldqa_en", "qasper", "narrativeqa",
                "samsum")
NO_CHAT = ("trec", "triviaqa", "samsum", "lcc", "repobench-p")  # Few-Shot Learning, Code
FIRST_LINE = ("trec", "triviaqa", "samsum")

METRICS = {
    "narrativeqa": scorers.qa_f1, "qasper": scorers.qa_f1, "multifieldqa_en": scorers.qa_f1,
    "hotpotqa": scorers.qa_f1, "2wikimqa": scorers.qa_f1, "musique": scorers.qa_f1,
    "gov_report": scorers.rouge_l_f, "qmsum": scorers.rouge_l_f, "multi_news": scorers.rouge_l_f,
    "trec": scorers.classification, "triviaqa": scorers.qa_f1, "samsum": scorers.rouge_l_f,
    "lcc": scorers.code_sim, "repobench-p": scorers.code_sim,
}

CATEGORIES = {
    "Single-Doc QA": ("narrativeqa", "qasper", "multifieldqa_en"),
    "Multi-Doc QA": ("hotpotqa", "2wikimqa", "musique"),
    "Summarization": ("gov_report", "qmsum", "multi_news"),
    "Few-Shot Learning": ("trec", "triviaqa", "samsum"),
    "Code Completion": ("lcc", "repobench-p"),
}


def task_list(spec) -> list:
  return task_files.task_list(spec, TASKS, "LongBench")


def load_task(data_dir, task: str, limit: int = 0) -> list:
  need = ("context", "input", "answers") + (("all_classes",) if task == "trec" else ())

  def check(rec, where):
    if not isinstance(rec["answers"], list):
      raise EvalError(f"{where}: 'answers' must be a list of strings")

  return read_task(data_dir, task, need, "LongBench", "_id", limit, check)


def validate(ecfg):
  lb = ecfg.longbench
  validate_dir("longbench", lb.data_dir, task_list(lb.tasks), load_task, int(ecfg.max_samples or 0))


def build_prompt(ctx, task: str, rec: dict):
  b, lb = ctx.built, ctx.tcfg
  prompt = PROMPTS[task].format(context=rec["context"], input=rec["input"])
  mnt = MAX_NEW_TOKENS[task]
  limit = int(lb.max_length)
  plain = b.input_limit(mnt)
  if plain:
    limit = min(limit, plain) if limit else plain
  prompt = truncate_text_middle(b.tokenizer, prompt, limit)
  chat = bool(lb.chat_template) and task not in NO_CHAT and ctx.ecfg.chat_template != "none"
  ids = b.tokenizer.prompt_ids(prompt, chat)
  if plain and len(ids) > plain:  # decode/re-encode or the template may add a few tokens
    ids = b.fit(ids, mnt)
  return ids


def score(task: str, pred: str, rec: dict) -> float:
  if task in FIRST_LINE:
    pred = pred.lstrip("\n").split("\n")[0]
  return scorers.best_of(METRICS[task], pred, rec["answers"], all_classes=rec.get("all_classes"))


def run(ctx) -> dict:
  lb, b = ctx.tcfg, ctx.built
  tasks = task_list(lb.tasks)
  data = {t: load_task(lb.data_dir, t, int(ctx.ecfg.max_samples or 0)) for t in tasks}
  if lb.max_length:
    b.check_fits(int(lb.max_length) + 16 + max(MAX_NEW_TOKENS[t] for t in tasks),
                 f"LongBench (max_length {lb.max_length})")
  store = ctx.open_store({})
  bar = ctx.progress(sum(len(v) for v in data.values()))
  for t in tasks:
    stops = b.stop_ids(newline=t in NEWLINE_STOP)
    for rec in data[t]:
      if rec["_key"] not in store:
        ids = build_prompt(ctx, t, rec)
        if not lb.max_length:
          b.check_fits(len(ids) + MAX_NEW_TOKENS[t], f"LongBench {t} sample {rec['_key']}")
        _, pred = b.generate(ids, MAX_NEW_TOKENS[t], stops)
        store.add(rec["_key"], dict(task=t, n_tokens=len(ids), pred=pred,
                                    answers=rec["answers"], score=score(t, pred, rec)))
      bar.update(1)
  bar.close()
  return summarize(ctx, tasks, data)


def summarize(ctx, tasks, data) -> dict:
  recs = ctx.store.records
  per_task = {t: round(100 * float(np.mean([recs[r["_key"]]["score"] for r in data[t]])), 2)
              for t in tasks if data[t]}
  cats = {c: round(float(np.mean([per_task[t] for t in ts])), 2)
          for c, ts in CATEGORIES.items() if all(t in per_task for t in ts)}
  avg = round(float(np.mean(list(per_task.values()))), 2) if per_task else float("nan")
  return dict(task="longbench", scores=per_task, categories=cats, average=avg,
              n_samples={t: len(data[t]) for t in tasks}, samples_file=str(ctx.store.path))


def table(summary) -> str:
  from longjax.eval.runner import format_table
  rows = [[t, summary["n_samples"].get(t, 0), s] for t, s in summary["scores"].items()]
  rows += [[f"[{c}]", "", s] for c, s in summary["categories"].items()]
  rows.append(["average (tasks)", sum(summary["n_samples"].values()), summary["average"]])
  return format_table(["LongBench task", "samples", "score"], rows)
