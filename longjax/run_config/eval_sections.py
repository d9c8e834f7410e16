"""The ``eval`` section of a run config as frozen dataclasses, and its defaults: the two papers'
protocols (docs/beacon.md §8, docs/focusllm.md §6) on their official grids, or CPU-sized ones
(``tiny``).

:func:`eval_defaults` is the one home of these defaults: ``longjax.eval.config.eval_config`` turns
its result into the config files' ``c.eval``, and a key an eval section leaves out takes its value
from it (the official grids of the run's method).
"""
from __future__ import annotations

import dataclasses
from typing import Tuple

import numpy as np

from longjax.method_names import BEACON, FOCUS, MethodName

TASKS = ("passkey", "needle", "perplexity", "longbench", "infbench")
PRESETS = ("official", "tiny")

# docs/beacon.md §8: the needle string and question of eval_needle.py.
NEEDLE = ("\n\nThe best thing to do in San Francisco is sitting in Dolores Park and eating a "
          "hamburg on a sunny day.\n\n")
NEEDLE_QUESTION = "\n\nWhat is the best thing to do in San Francisco?\nAnswer:"


def _ints(a) -> tuple:
  return tuple(int(x) for x in np.asarray(a).round().astype(int))


@dataclasses.dataclass(frozen=True)
class PasskeySection:
  protocol: str = BEACON.name  # beacon: token-depth grid; focus: garbage chars
  # beacon protocol (eval_passkey.py): lengths in tokens x depths in percent
  lengths: Tuple[int, ...] = _ints(np.linspace(8192, 131072, 20))
  depths: Tuple[int, ...] = _ints(np.linspace(0, 100, 10))
  max_new_tokens: int = 50
  seed: int = 123
  # focus protocol (generate_prompt_landmark): garbage characters x numpy seeds
  n_garbage: Tuple[int, ...] = (15000, 30000, 60000, 375000, 960000, 1500000)
  seeds: Tuple[int, ...] = tuple(range(10))


@dataclasses.dataclass(frozen=True)
class NeedleSection:
  haystack_dir: str = ""  # directory of *.txt files, concatenated in name order (PaulGrahamEssays)
  lengths: Tuple[int, ...] = _ints(np.linspace(8192, 131072, 10))
  depths: Tuple[int, ...] = _ints(np.linspace(0, 100, 10))
  max_new_tokens: int = 50
  needle: str = NEEDLE
  question: str = NEEDLE_QUESTION


@dataclasses.dataclass(frozen=True)
class PerplexitySection:
  protocol: str = "sliding"  # sliding (beacon eval_lm) | last (FocusLLM/CEPE)
  data: str = ""  # a .jsonl (field text_field), a .txt file or a directory of .txt files
  text_field: str = "text"
  tfds_name: str = ""  # e.g. "pg19": read with tfds.data_source from tfds_data_dir (array_record)
  tfds_data_dir: str = ""
  tfds_split: str = "test"
  max_docs: int = 100
  max_length: int = 100000
  stride: int = 32768
  last_n: int = 256  # protocol "last": tokens scored at the end of each window


@dataclasses.dataclass(frozen=True)
class LongBenchSection:
  data_dir: str = ""  # {data_dir}/{task}.jsonl in the published LongBench format
  tasks: str = "all"  # "all" = the 14 English tasks, or a comma-separated list
  max_length: int = 31500  # middle truncation (tokens)
  chat_template: bool = True  # beacon: chat template except few-shot and code; FocusLLM: none


@dataclasses.dataclass(frozen=True)
class InfBenchSection:
  data_dir: str = ""  # {data_dir}/{task}.jsonl in the published InfiniteBench format
  tasks: str = "longbook_choice_eng,passkey,number_string,kv_retrieval"
  max_length: int = 0  # 0: no truncation (official); the plain baseline is truncated anyway
  chat_template: bool = False


@dataclasses.dataclass(frozen=True)
class EvalSection:
  """``eval``: what eval.py runs (``task``), on which model, where it writes; one section per
  task."""
  task: str = "passkey"  # one of TASKS, a comma-separated list, or "all"
  method: str = ""  # "" = config.method; plain = the base model (truncation baseline)
  checkpoint: str = ""  # "" = config.model.checkpoint, else {workdir}/export_hf, else tiny random
  output_dir: str = ""  # "" = {workdir}/eval
  tag: str = ""  # file name prefix; "" = the method name
  resume: bool = True  # skip samples already in the output files (same settings only)
  max_samples: int = 0  # per task (per LongBench/InfiniteBench sub-task); 0 = all
  # auto: the tokenizer's chat template where the protocol uses one; none
  chat_template: str = "auto"
  truncate_to: int = 0  # plain baseline: input tokens kept (0 = max positions - max_new_tokens)
  model_max_length: int = 0  # cap on input + output tokens for beacon / focus (0 = what it holds)
  passkey: PasskeySection = PasskeySection()
  needle: NeedleSection = NeedleSection()
  perplexity: PerplexitySection = PerplexitySection()
  longbench: LongBenchSection = LongBenchSection()
  infbench: InfBenchSection = InfBenchSection()

  def task_section(self, task: str):
    """The settings of ``task`` (one of TASKS)."""
    return getattr(self, task)


def eval_defaults(paper: MethodName = BEACON, preset: str = "official",
                  task: str = "passkey") -> EvalSection:
  """``paper``: whose protocols (``Method.eval_protocols``); ``preset``: ``official`` (the
  papers' grids) or ``tiny`` (CPU-sized grids for the tiny models)."""
  focus, tiny = paper is FOCUS, preset == "tiny"
  e = EvalSection(task=task)
  passkey = dataclasses.replace(e.passkey, protocol=paper.name)
  perplexity = dataclasses.replace(e.perplexity, protocol="last" if focus else "sliding",
                                   max_length=4096 if focus else 100000,
                                   stride=2048 if focus else 32768)
  longbench = dataclasses.replace(e.longbench, max_length=15500 if focus else 31500,
                                  chat_template=not focus)
  needle = e.needle
  if tiny:
    passkey = dataclasses.replace(passkey, lengths=(320, 640), depths=(0, 50, 100),
                                  max_new_tokens=24, n_garbage=(200, 600), seeds=(0, 1, 2))
    needle = dataclasses.replace(needle, lengths=(384, 768), depths=(0, 50, 100),
                                 max_new_tokens=24)
    perplexity = dataclasses.replace(perplexity, max_length=256, stride=128, last_n=64)
    longbench = dataclasses.replace(longbench, max_length=512)
  return dataclasses.replace(e, passkey=passkey, needle=needle, perplexity=perplexity,
                             longbench=longbench)
