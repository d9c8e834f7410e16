"""The ``config.eval`` section: official defaults (beacon.md §8, focusllm.md §6) and a tiny preset.

Used by the configs as ``c.eval = eval_config(method, preset)``; every field can be overridden on
the command line (``--config.eval.passkey.lengths="(300,600)"``). Importing this module is cheap
(ml_collections, numpy and the method registry, which imports its methods lazily).
"""
from __future__ import annotations

from typing import Optional

import ml_collections
import numpy as np

from longjax import methods
from longjax.eval.errors import EvalError
from longjax.method_names import FOCUS

TASKS = ("passkey", "needle", "perplexity", "longbench", "infbench")

# beacon.md §8: the needle string and question of eval_needle.py.
NEEDLE = ("\n\nThe best thing to do in San Francisco is sitting in Dolores Park and eating a "
          "hamburg on a sunny day.\n\n")
NEEDLE_QUESTION = "\n\nWhat is the best thing to do in San Francisco?\nAnswer:"


def _ints(a) -> tuple:
  return tuple(int(x) for x in np.asarray(a).round().astype(int))


def eval_config(method: Optional[str] = None, preset: str = "official", task: str = "passkey"
                ) -> ml_collections.ConfigDict:
  """``method``: a method's name (``longjax.methods``): its paper's protocol defaults
  (``Method.eval_protocols``; None: Activation Beacon's); ``preset``: ``official`` (the papers'
  grids) or ``tiny`` (CPU-sized grids for the tiny models)."""
  if preset not in ("official", "tiny"):
    raise EvalError(f"preset must be 'official' or 'tiny', got {preset!r}")
  paper = methods.get(method or methods.Beacon.name).eval_protocols
  focus = paper is FOCUS
  tiny = preset == "tiny"
  c = ml_collections.ConfigDict()
  c.task = task  # one of TASKS, a comma-separated list, or "all"
  c.method = ""  # "" = config.method; plain = the base model (truncation baseline)
  c.checkpoint = ""  # "" = config.model.checkpoint, else {workdir}/export_hf, else tiny random
  c.output_dir = ""  # "" = {workdir}/eval
  c.tag = ""  # file name prefix; "" = the method name
  c.resume = True  # skip samples already in the output files (same settings only)
  c.max_samples = 0  # per task (per LongBench/InfiniteBench sub-task); 0 = all
  c.chat_template = "auto"  # auto: the tokenizer's chat template where the protocol uses one; none
  c.truncate_to = 0  # plain baseline: input tokens kept (0 = max positions - max_new_tokens)
  c.model_max_length = 0  # cap on input + output tokens for beacon / focus (0 = what the model holds)

  c.passkey = ml_collections.ConfigDict(dict(
      protocol=paper.name,  # beacon: token-depth grid; focus: garbage chars
      # beacon protocol (eval_passkey.py): lengths in tokens x depths in percent
      lengths=_ints([320, 640]) if tiny else _ints(np.linspace(8192, 131072, 20)),
      depths=_ints([0, 50, 100]) if tiny else _ints(np.linspace(0, 100, 10)),
      max_new_tokens=24 if tiny else 50,
      seed=123,
      # focus protocol (generate_prompt_landmark): garbage characters x numpy seeds
      n_garbage=(200, 600) if tiny else (15000, 30000, 60000, 375000, 960000, 1500000),
      seeds=(0, 1, 2) if tiny else tuple(range(10)),
  ))
  c.needle = ml_collections.ConfigDict(dict(
      haystack_dir="",  # directory of *.txt files, concatenated in name order (PaulGrahamEssays)
      lengths=_ints([384, 768]) if tiny else _ints(np.linspace(8192, 131072, 10)),
      depths=_ints([0, 50, 100]) if tiny else _ints(np.linspace(0, 100, 10)),
      max_new_tokens=24 if tiny else 50,
      needle=NEEDLE,
      question=NEEDLE_QUESTION,
  ))
  c.perplexity = ml_collections.ConfigDict(dict(
      protocol="last" if focus else "sliding",  # sliding (beacon eval_lm) | last (FocusLLM/CEPE)
      data="",  # a .jsonl (field text_field), a .txt file or a directory of .txt files
      text_field="text",
      tfds_name="",  # e.g. "pg19": read with tfds.data_source from tfds_data_dir (array_record)
      tfds_data_dir="",
      tfds_split="test",
      max_docs=100,
      max_length=256 if tiny else (4096 if focus else 100000),
      stride=128 if tiny else (2048 if focus else 32768),
      last_n=64 if tiny else 256,  # protocol "last": tokens scored at the end of each window
  ))
  c.longbench = ml_collections.ConfigDict(dict(
      data_dir="",  # {data_dir}/{task}.jsonl in the published LongBench format
      tasks="all",  # "all" = the 14 English tasks, or a comma-separated list
      max_length=512 if tiny else (15500 if focus else 31500),  # middle truncation (tokens)
      chat_template=not focus,  # beacon: chat template except few-shot and code; FocusLLM: none
  ))
  c.infbench = ml_collections.ConfigDict(dict(
      data_dir="",  # {data_dir}/{task}.jsonl in the published InfiniteBench format
      tasks="longbook_choice_eng,passkey,number_string,kv_retrieval",
      max_length=0,  # 0: no truncation (official); the plain baseline is truncated anyway
      chat_template=False,
  ))
  return c
