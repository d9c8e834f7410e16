"""Where does FocusLLM lose a RULER needle's digits, and which gate term keeps them? (issue:
FocusLLM learning round 2)

At 16K and 32K the shipped reading finds the needle's chunk and then loses or repeats a later
digit (" 1782832." for 1784832). This teacher-forces the right answer (" " + the needle + ".")
after each RULER ``niah_single_1`` prompt, as lm-eval builds it (chat template, greedy), and
keeps, per answer token, its NLL and the greedy token at that step: under the asset's reading
(``method``) and under other gate biases read on the same chunk states (``--variants``, the
syntax of ``focus_prose_profile.py``). Greedy decoding follows the teacher-forced path while every
greedy token is the right one, so "every digit is the greedy token" is the answer greedy decoding
writes; the ``method`` column of a sample agrees with that sample's RULER cell unless greedy opens
with another token than the space.

  python experiments/focus_answer_variants.py --length 32768 --samples 25 --only 2,4,7 \\
      --variants "b32:strength=32;top1:top_k=1" --out results/focus_answer_variants_32k.json

Per sample: the target, the answer tokens, per reading the NLLs and greedy tokens and whether
the digits are all greedy. Summary per reading: the samples whose digits are all greedy, the
first wrong digit's step, the mean NLL of the digits. The file is rewritten after every sample
and a rerun with the same settings skips the samples it holds.
"""
import argparse
import json
import sys
import time
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

from digit_probe import ruler_prompts, write_whole  # noqa: E402
from focus_prose_profile import focus_variant_scores, parse_variants  # noqa: E402

TASK = "niah_single_1"


def answer_ids(tok, target: str) -> list:
  """The answer as the model writes it: a space, the needle's digits, a full stop."""
  return [int(i) for i in tok.encode(f" {target}.", special=False)]


def digit_steps(tok, ids) -> list:
  """The answer steps whose token holds a digit (the ones RULER's match depends on)."""
  return [j for j, t in enumerate(ids) if any(ch.isdigit() for ch in tok.decode([t]))]


def sample_record(tok, index: int, target: str, ids: list, scores: dict) -> dict:
  digits = digit_steps(tok, ids)
  rec = dict(sample=index, target=target, answer_tokens=[tok.decode([t]) for t in ids],
             readings={})
  for name, (nll, top) in scores.items():
    wrong = [j for j in digits if top[j] != ids[j]]
    rec["readings"][name] = dict(
        digits_greedy=not wrong, first_wrong=wrong[0] if wrong else None,
        greedy_there=tok.decode([int(top[wrong[0]])]) if wrong else None,
        digit_nll=float(np.mean([nll[j] for j in digits])),
        nll=[round(float(x), 4) for x in nll], top=[int(x) for x in top])
  return rec


def summarise(samples: list) -> dict:
  names = list(samples[0]["readings"]) if samples else []
  out = {}
  for k in names:
    rs = [s["readings"][k] for s in samples]
    out[k] = dict(digits_greedy=sum(r["digits_greedy"] for r in rs), of=len(rs),
                  missed=[s["sample"] for s, r in zip(samples, rs) if not r["digits_greedy"]],
                  mean_digit_nll=float(np.mean([r["digit_nll"] for r in rs])))
  return out


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--asset", default="smollm2_focus")
  ap.add_argument("--length", type=int, required=True)
  ap.add_argument("--samples", type=int, default=25, help="lm-eval's limit: its first N samples")
  ap.add_argument("--only", default="", help="comma-separated sample indices (default: all)")
  ap.add_argument("--variants", default="", help="name:key=value,...;... (focus_prose_profile)")
  ap.add_argument("--out", type=Path, required=True)
  args = ap.parse_args(argv)
  variants = parse_variants(args.variants)
  only = sorted({int(x) for x in args.only.split(",") if x})
  if any(i >= args.samples or i < 0 for i in only):
    raise SystemExit(f"--only {args.only}: indices must lie in 0..{args.samples - 1}")
  from longjax.eval.harness import FOCUS, LongjaxLM
  from longjax.runtime import compile_cache
  compile_cache.enable("auto")
  lm = LongjaxLM(method=FOCUS, asset=args.asset, checkpoint="smollm2")
  tok = lm.parts.tokenizer
  model = types.SimpleNamespace(lm=lm.parts.model, params=lm.parts.params)
  res = dict(task=TASK, length=args.length, limit=args.samples, asset=args.asset,
             reading=dict(lm.parts.settings.gate_reading,
                          chunk_overlap=lm.parts.settings.chunk_overlap),
             variants=variants, samples=[])
  if args.out.exists():
    old = json.loads(args.out.read_text())
    if all(old.get(k) == res[k] for k in ("length", "limit", "asset", "reading", "variants")):
      res["samples"] = old["samples"]
  done = {s["sample"] for s in res["samples"]}
  prompts = ruler_prompts(lm, TASK, args.length, args.samples, tok.name)
  for i, (prompt, target) in enumerate(prompts):
    if i in done or (only and i not in only):
      continue
    t0 = time.time()
    ans = answer_ids(tok, target)
    ids = np.asarray(lm.tok_encode(prompt) + ans, np.int32)
    scores = focus_variant_scores(model, ids, len(ans), variants)
    rec = sample_record(tok, i, target, ans, scores)
    res["samples"].append(rec)
    res["samples"].sort(key=lambda s: s["sample"])
    res["summary"] = summarise(res["samples"])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_whole(args.out, res)
    print(f"sample {i} ({target}, {time.time() - t0:.0f} s): " + " ".join(
        f"{k} {'ok' if r['digits_greedy'] else r['greedy_there']!r}@{r['first_wrong']}"
        for k, r in rec["readings"].items()), flush=True)
  print(json.dumps(res.get("summary", {}), indent=1))


if __name__ == "__main__":
  main()
