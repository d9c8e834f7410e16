"""InfiniteBench: longbook_choice_eng, passkey, number_string, kv_retrieval (docs/focusllm.md §6,
beacon ``eval_infbench.py``).

Data: ``{infbench.data_dir}/{task}.jsonl`` in the published format (``context``, ``input``,
``answer`` (a string or a list), and ``options`` (4 strings) for longbook_choice_eng; ``id``
optional). Prompts: InfiniteBench's ``yarn-mistral`` templates (the official scripts' "infmem"
model); no chat template; no truncation for beacon / FocusLLM (official ``TRUNCATE_LEN`` unused;
``infbench.max_length`` > 0 middle-truncates), the plain baseline is middle-truncated to its limit.
Greedy with ``MAX_NEW_TOKENS`` (the FocusLLM spec's values; InfiniteBench's own
``DATA_NAME_TO_MAX_NEW_TOKENS`` gives 40 for longbook_choice_eng). Scores (``compute_scores.py``):
first integer == answer (passkey, number_string), the value among the output's words
(kv_retrieval), the option letter (longbook_choice_eng); task score = 100 x mean.
"""
from __future__ import annotations

import numpy as np

from longjax.eval import scorers, task_files
from longjax.eval.errors import EvalError
from longjax.eval.models import middle_truncate
from longjax.eval.task_files import read_task, validate_dir

TASKS = ("longbook_choice_eng", "passkey", "number_string", "kv_retrieval")

TEMPLATES = {
    "passkey": "There is an important info hidden inside a lot of irrelevant text. Find it and memorize them. I will quiz you about the important information there.\n\n{context}\n\n{input}\n\nThe pass key is",  # noqa: E501
    "number_string": "There is an important info hidden inside a lot of irrelevant text. Find it. I will quiz you about the important information there.\n\n{context}\n\n{input}\n\nThe sequence of digits is",  # noqa: E501
    "kv_retrieval": "Extract the value corresponding to the specified key in the JSON object below.\n\n{context}\n\n{input}",  # noqa: E501
    "longbook_choice_eng": "Read the book and answer the question.\n\n{context}\n\nQuestion: {question}\nA. {OPTION_A}\nB. {OPTION_B}\nC. {OPTION_C}\nD. {OPTION_D}\n\nThe letter of the correct answer is",  # noqa: E501
}

MAX_NEW_TOKENS = {"longbook_choice_eng": 6, "passkey": 6, "number_string": 12, "kv_retrieval": 50}


def task_list(spec) -> list:
  return task_files.task_list(spec, TASKS, "InfiniteBench")


def _answers(rec) -> list:
  a = rec["answer"]
  return [str(x) for x in a] if isinstance(a, list) else [str(a)]


def choice_letter(rec) -> str:
  ans = _answers(rec)[0]
  opts = [str(o) for o in rec["options"]]
  if ans in opts:
    return "ABCD"[opts.index(ans)]
  if ans.strip() in ("A", "B", "C", "D"):
    return ans.strip()
  raise EvalError(f"longbook_choice_eng sample {rec.get('id')}: answer {ans!r} is not one of its "
                  "options")


def load_task(data_dir, task: str, limit: int = 0) -> list:
  need = ("context", "input", "answer") + (("options",) if task == "longbook_choice_eng" else ())

  def check(rec, where):
    if task == "longbook_choice_eng":
      if not isinstance(rec["options"], list) or len(rec["options"]) != 4:
        raise EvalError(f"{where}: 'options' must be a list of 4 strings")
      rec["_letter"] = choice_letter(rec)

  return read_task(data_dir, task, need, f"InfiniteBench {task}", "id", limit, check)


def validate(ecfg):
  ib = ecfg.infbench
  validate_dir("infbench", ib.data_dir, task_list(ib.tasks), load_task, int(ecfg.max_samples or 0))


def build_prompt(task: str, rec: dict) -> str:
  if task == "longbook_choice_eng":
    o = rec["options"]
    return TEMPLATES[task].format(context=rec["context"], question=rec["input"], OPTION_A=o[0],
                                  OPTION_B=o[1], OPTION_C=o[2], OPTION_D=o[3])
  return TEMPLATES[task].format(context=rec["context"], input=rec["input"])


def score(task: str, pred: str, rec: dict) -> float:
  ans = _answers(rec)
  if task in ("passkey", "number_string"):
    return scorers.first_int_match(pred, ans[0])
  if task == "kv_retrieval":
    return scorers.kv_match(pred, ans[0])
  return scorers.choice_match(pred, rec["_letter"], ans[0])


def run(ctx) -> dict:
  ib, b = ctx.tcfg, ctx.built
  tasks = task_list(ib.tasks)
  data = {t: load_task(ib.data_dir, t, int(ctx.ecfg.max_samples or 0)) for t in tasks}
  chat = bool(ib.chat_template) and ctx.ecfg.chat_template != "none"
  prompts = {}
  for t in tasks:
    for rec in data[t]:
      ids = b.tokenizer.prompt_ids(build_prompt(t, rec), chat)
      if ib.max_length:
        ids = middle_truncate(ids, int(ib.max_length))
      prompts[rec["_key"]] = b.fit(ids, MAX_NEW_TOKENS[t])
  longest = max(len(prompts[r["_key"]]) + MAX_NEW_TOKENS[t] for t in tasks for r in data[t])
  b.check_fits(longest, f"InfiniteBench (longest prompt {longest} tokens incl. output)")
  store = ctx.open_store({})
  bar = ctx.progress(len(prompts))
  for t in tasks:
    stops = b.stop_ids()
    for rec in data[t]:
      k = rec["_key"]
      if k not in store:
        _, pred = b.generate(prompts[k], MAX_NEW_TOKENS[t], stops)
        store.add(k, dict(task=t, n_tokens=len(prompts[k]), pred=pred, answer=_answers(rec),
                          score=score(t, pred, rec)))
      bar.update(1)
  bar.close()
  recs = store.records
  per_task = {t: round(100 * float(np.mean([recs[r["_key"]]["score"] for r in data[t]])), 2)
              for t in tasks if data[t]}
  return dict(task="infbench", scores=per_task,
              average=round(float(np.mean(list(per_task.values()))), 2),
              n_samples={t: len(data[t]) for t in tasks}, samples_file=str(store.path))


def table(summary) -> str:
  from longjax.eval.runner import format_table
  rows = [[t, summary["n_samples"].get(t, 0), s] for t, s in summary["scores"].items()]
  rows.append(["average", sum(summary["n_samples"].values()), summary["average"]])
  return format_table(["InfiniteBench task", "samples", "score"], rows)
