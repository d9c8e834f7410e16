r"""Evaluate long-context models: passkey, needle, perplexity, LongBench, InfiniteBench.

  python eval.py --config=configs/tiny_beacon.py --config.eval.task=passkey
  python eval.py --config=configs/tiny_beacon.py --config.eval.task=passkey,needle \
      --config.eval.needle.haystack_dir=DIR
  python eval.py --config=configs/tiny_beacon.py --config.eval.method=plain   # truncation baseline

Tasks: passkey | needle | perplexity | longbench | infbench (comma-separated, or "all").
Results go to {config.workdir}/eval (or --config.eval.output_dir): {tag}_{task}.json,
{tag}_{task}.samples.jsonl (rerunning resumes), {tag}_{task}.png and {tag}_results.json.
Every setting and its default: longjax/run_config/eval_sections.py; the tasks, their protocols
and the results: docs/evaluation.md.

A known failure (bad config key or value, missing model or data file...) ends with one line on
stderr and exit status 1; --debug shows the traceback instead.
"""
import sys
from pathlib import Path

from absl import app, flags
from ml_collections import config_flags

sys.path.insert(0, str(Path(__file__).resolve().parent))
from longjax.runtime import cli  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", None,
                                          "ml_collections config file (configs/*.py)",
                                          lock_config=True)
_DEBUG = flags.DEFINE_bool("debug", False, "show the traceback of an error")
_COMPILE_CACHE = flags.DEFINE_string("compile_cache", "auto", cli.COMPILE_CACHE_HELP)


def main(argv):
  del argv
  config = _CONFIG.value
  if config is None:
    sys.exit("eval.py needs --config=configs/<name>.py (e.g. configs/tiny_beacon.py)")
  if "eval" not in config:
    sys.exit("eval.py: the config has no 'eval' section; add to its get_config():\n"
             "  from longjax.eval.config import eval_config\n"
             "  c.eval = eval_config(c.method)   # official grids; preset='tiny' for CPU smoke "
             "runs")
  sys.exit(cli.run("eval.py", lambda: _eval(config), debug=_DEBUG.value,
                   compile_cache=_COMPILE_CACHE.value))


def _eval(config) -> int:
  from longjax.eval.runner import parse_tasks, run
  from longjax.run_config import from_config
  run_config = from_config(config)  # the one typed, checked config of this run
  run(run_config, parse_tasks(run_config.eval.task))
  return 0


if __name__ == "__main__":
  app.run(main, flags_parser=cli.absl_flags_parser("eval.py"))
