"""Asking a model about a text file: ``python -m longjax.beacon`` and ``python -m longjax.focus``
share all but the loading of their method (the text, the chat prompt, the streamed answer, the stop
ids, the time and memory report). The ``__main__`` programs look up the asset and the tokenizer
(``longjax.ckpts.assets``, ``longjax.data.tokenizers``) and hand them here."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable, List, Optional

from longjax.runtime.cli import COMPILE_CACHE_HELP, parser
from longjax.errors import LongjaxError


def ask_parser(prog: str, doc: Optional[str], method, known: List[str], assets_env: str, *,
               asset_required: bool = True) -> argparse.ArgumentParser:
  """The options both methods' question-answering commands take; ``method`` is the
  ``method_names.MethodName`` whose assets ``--asset`` names, ``known`` the names of its assets
  in the repository's ``assets/`` and ``assets_env`` the variable that names another folder
  (``longjax.ckpts.assets``: the caller looks them up, so this module needs no checkpoint code)."""
  ap = parser(prog, doc)
  ap.add_argument("--asset", metavar="NAME|DIR", required=asset_required,
                  help=f"trained {method.title} tensors: an asset directory, or the name of one in "
                       f"the repository's assets/ (${assets_env} names another directory)"
                       + (f"; here: {', '.join(known)}" if known else ""))
  ap.add_argument("--base", metavar="DIR",
                  help=f"the base model the asset loads on (default: the one its "
                       f"{method.name}.json names; 'smollm2' is fetched and converted once)")
  ap.add_argument("--text", required=True, metavar="FILE",
                  help="the (long) UTF-8 text file the question is about")
  ap.add_argument("--question", default="Summarise the text above.",
                  help="asked after the text, in the same user turn")
  ap.add_argument("--max_new_tokens", type=int, default=128,
                  help="the longest answer in tokens; it ends earlier at the model's end of turn")
  ap.add_argument("--dtype", choices=["auto", "float32", "bfloat16"], default="auto",
                  help="parameters and compute; auto: float32 for an asset (as it was evaluated), "
                       "bfloat16 for a HF checkpoint")
  ap.add_argument("--no_chat", action="store_true",
                  help="encode text and question as they are (default: one user turn of the "
                       "tokenizer's chat template, as the assets were trained and evaluated)")
  ap.add_argument("--chat", action="store_true",
                  help="use the chat template (the default already; kept for older command lines)")
  ap.add_argument("--debug", action="store_true", help="show the traceback of an error")
  ap.add_argument("--compile_cache", default="auto", help=COMPILE_CACHE_HELP)
  return ap


def check_ask_args(args) -> None:
  """The cheap checks of an ask command, before any model loads: ``--text`` is a file,
  ``--max_new_tokens`` at least 1, not both --chat and --no_chat."""
  from longjax.errors import PathNotFound
  text = Path(args.text)
  if not text.is_file():
    raise PathNotFound(f"--text {args.text}: no such file" if not text.exists() else
                       f"--text {args.text}: not a file")
  if args.max_new_tokens < 1:  # generate() needs one
    raise LongjaxError(f"--max_new_tokens must be >= 1, got {args.max_new_tokens}")
  if args.chat and args.no_chat:
    raise LongjaxError("--chat and --no_chat contradict each other: give one (chat is the default)")


def read_text(args) -> str:
  """The ``--text`` file as UTF-8 text (after :func:`check_ask_args`)."""
  try:
    return Path(args.text).read_text(encoding="utf-8")
  except UnicodeDecodeError as e:
    raise LongjaxError(f"--text {args.text} is not UTF-8 text ({e.reason} at byte {e.start})") \
        from None


def with_dtype(cfg, params, dtype: str):
  """``cfg`` computing in ``dtype`` with ``params`` cast to it (numpy leaves)."""
  import jax
  import numpy as np
  from longjax.models.config import dtype_of
  np_dtype = dtype_of(dtype)
  return (cfg.replace(dtype=dtype, param_dtype=dtype),
          jax.tree.map(lambda x: np.asarray(x).astype(np_dtype, copy=False), params))


def stop_ids(cfg, tok) -> List[int]:
  """The model's end of turn: its config's EOS id(s) and its tokenizer's (SmolLM2: ``<|im_end|>``,
  id 2, is both)."""
  ids = cfg.eos_token_id if isinstance(cfg.eos_token_id, (list, tuple)) else [cfg.eos_token_id]
  ids = list(ids) + [tok.eos_id]
  return sorted({int(i) for i in ids if i is not None})


def prompt_ids(tok, text: str, args):
  """``(ids, how)``: text and question as one user turn (chat template, generation prompt), or as
  they are with ``--no_chat`` or a tokenizer without a template; ``how`` says which."""
  chat = not args.no_chat and tok.has_chat_template
  ids = tok.prompt_ids(text + "\n\n" + args.question, chat=chat)
  return ids, ("one user turn of the chat template" if chat else
               "plain text (--no_chat)" if args.no_chat else
               "plain text (the tokenizer has no chat template)")


class Streamer:
  """``generate``'s callback: writes each new piece of the answer to ``out`` as it is decoded
  (the text of all tokens so far, so that a character spread over several tokens is written
  once it is whole), and nothing from a stop id on."""

  def __init__(self, tok, stops, out=None):
    self.tok, self.stops, self.out = tok, set(stops), out or sys.stdout
    self.ids: List[int] = []
    self.shown = ""
    self.stopped = False

  def __call__(self, step, tokens):
    del step
    if self.stopped:
      return
    t = int(tokens[0])
    if t in self.stops:
      self.stopped = True
      return
    self.ids.append(t)
    self._show(partial=True)

  def _show(self, partial: bool):
    text = self.tok.decode(self.ids)
    if partial and text.endswith("\ufffd"):  # a character whose last bytes are still to come
      return
    if text.startswith(self.shown):
      self.out.write(text[len(self.shown):])
      self.out.flush()
      self.shown = text

  def finish(self):
    self._show(partial=False)
    self.out.write("\n")
    self.out.flush()


def peak_rss_bytes() -> int:
  """This process's peak resident memory (``getrusage``: KiB on Linux, bytes on macOS)."""
  import resource
  peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
  return int(peak) if sys.platform == "darwin" else int(peak) * 1024


def report(out, n_prompt: int) -> str:
  """One line: prompt and answer sizes, their time and rate, compiling, peak memory."""
  t = out.timings
  n_answer = len(out.tokens[0])
  rate = t.decode_tokens_per_s
  return (f"prompt {n_prompt} tokens: prefill {t.prefill_s:.2f} s "
          f"({n_prompt / t.prefill_s:.0f} tokens/s); answer {n_answer} tokens: decode "
          f"{t.decode_s:.2f} s" + (f" ({rate:.1f} tokens/s)" if rate else "")
          + f"; compiling {t.compile_s:.2f} s of these; peak RSS "
          f"{peak_rss_bytes() / 2 ** 30:.2f} GiB")


def answer(method, params, ids: List[int], tok, cfg, max_new_tokens: int, describe: str,
           after: Optional[Callable] = None):
  """Generate the answer to the prompt ``ids`` greedily, streamed to stdout; ``describe`` (what
  runs) before it and the :func:`report` line (plus ``after(output)``) after it go to stderr, so
  that stdout holds the answer alone."""
  from longjax.inference.generate import generate
  print(f"{len(ids)} prompt tokens; {describe}", file=sys.stderr, flush=True)
  stops = stop_ids(cfg, tok)
  stream = Streamer(tok, stops)
  # the device loop hands tokens back every 8 by default: 1 streams each as it comes (the token
  # count is a traced argument, so this costs a host round trip per token, not a compile)
  chunk = 1 if callable(getattr(method, "device_plan", None)) else None
  out = generate(method, params, [ids], max_new_tokens=max_new_tokens, stop_ids=stops,
                 callback=stream, chunk=chunk)
  stream.finish()
  extra = after(out) if after is not None else ""
  if not stream.stopped:  # said, so that a cut answer is not taken for a whole one
    extra = f"the answer was cut at --max_new_tokens {max_new_tokens}" + (f"; {extra}" if extra
                                                                          else "")
  print(f"[{report(out, len(ids))}{'; ' + extra if extra else ''}]", file=sys.stderr, flush=True)
  return out
