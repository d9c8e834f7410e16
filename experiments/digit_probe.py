"""Where does a trained memory lose a long needle? The digit probe (issue: beacon learning round 3).

The committed beacons answer RULER's 7-digit needles with their first five digits (" 44305." for
4430567). Two explanations predict different teacher-forced distributions:

* a *length prior* (2,325 passkey steps with 5-digit keys taught the answer to stop there): after
  the five right digits the model puts its mass on "." although the memory holds the sixth digit,
  which still ranks high among the digits;
* a *capacity* limit (ratio 8 keeps digits only approximately): the later digits are near chance
  (rank ~5 of 10) even when the model is forced to continue.

For each of RULER ``niah_single_1``'s first ``--samples`` prompts at ``--length`` (as lm-eval
builds them, chat template and answer prefix included) this feeds prompt + the needle's digits in
one inference forward and reads, before each digit, the probability and rank (among the ten digit
tokens) of the right one, and the model's greedy choice. JSON to stdout, one line per sample,
then a summary per digit position.

  python experiments/digit_probe.py --method beacon --asset assets/smollm2_beacon --samples 10 \
      --out results/digit_probe_beacon.json
  python experiments/digit_probe.py --method plain --samples 10 \
      --out results/digit_probe_plain.json                    # the full-attention base
  python experiments/digit_probe.py --ratio 4 --samples 10 \
      --out results/digit_probe_beacon_ratio4.json            # the same beacons read at ratio 4

``--ratio`` reads the asset's beacons at another compression ratio than the one it ships with (the
tensors serve any ratio that divides the stride): is the memory's precision a matter of the ratio
alone, or of the ratio the beacons were trained at?
"""
import argparse
import dataclasses
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from longjax.eval.harness import BEACON, PLAIN  # noqa: E402


def ruler_prompts(lm, task: str, length: int, n: int, tok_dir: str):
  """``[(prompt, target)]``: the contexts lm-eval would send to ``generate_until``."""
  import lm_eval
  seen = []

  class Capture(type(lm)):
    def __init__(self):  # noqa: D107 -- shares the loaded model; only records the requests
      self.__dict__.update(lm.__dict__)

    def generate_until(self, requests, disable_tqdm=False):
      seen.extend(r.args[0] for r in requests)
      return [""] * len(requests)

  res = lm_eval.simple_evaluate(model=Capture(), tasks=[task], limit=n, apply_chat_template=True,
                                metadata={"tokenizer": tok_dir, "max_seq_lengths": [length]},
                                log_samples=True)
  targets = [s["target"] for s in res["samples"][task]]
  targets = [t[0] if isinstance(t, list) else t for t in targets]
  return list(zip(seen, targets))


def write_whole(path, obj) -> None:
  """``obj`` as indented JSON at ``path``, whole or not at all (a sibling temporary, renamed)."""
  tmp = Path(path).with_name(f".{Path(path).name}.tmp")
  tmp.write_text(json.dumps(obj, indent=1) + "\n")
  tmp.replace(path)


def digit_logits(lm, ids):
  """Next-token logits ``[len(ids), V]`` of every position (one inference forward)."""
  p = lm.parts
  p.model = p.registry.with_room_for(p.model, p.cfg, p.settings, len(ids) + 1)
  if p.method == BEACON:
    out = p.model.forward(p.params, np.asarray(ids, np.int32), training=False,
                          collect_logits=True)
    return np.asarray(out.raw_logits[0] if isinstance(out.raw_logits, list) else out.raw_logits)
  # the base with full attention: one forward, the LM head on the last 16 positions only
  import jax.numpy as jnp
  from longjax.models.decoder import CAUSAL_PREFILL, Decoder
  from longjax.models.head import lm_head
  t = len(ids)
  hidden, _ = Decoder(p.cfg, rule=CAUSAL_PREFILL).apply(
      {"params": p.params}, jnp.asarray(ids, jnp.int32)[None], jnp.arange(t)[None], head=False)
  tail = np.full((t, p.cfg.vocab_size), -np.inf, np.float32)
  tail[t - 16:] = np.asarray(lm_head(p.cfg, p.params, hidden[0, t - 16:]), np.float32)
  return tail


def log_softmax(logits):
  m = logits.max(-1, keepdims=True)
  return logits - m - np.log(np.sum(np.exp(logits - m), -1, keepdims=True))


def read_digits(lp, prompt_len: int, t_ids, digit_ids, decode) -> list:
  """Per answer token ``t_ids[j]`` (read from the log-probs ``lp [T, V]`` of the row before it):
  its probability, its rank among the ten digit tokens (None for a non-digit: the leading
  space) and the greedy token there."""
  per = []
  for j, tid in enumerate(t_ids):
    row = lp[prompt_len + j - 1]
    dig = row[digit_ids]
    hit = np.flatnonzero(digit_ids == tid)
    per.append(dict(token=decode(tid), p=float(np.exp(row[tid])),
                    rank=int(np.sum(dig > dig[hit[0]])) + 1 if hit.size else None,
                    greedy=decode(int(np.argmax(row)))))
  return per


def summarise(rows) -> list:
  """Per digit of the needle (the answer's leading space is not one): the right digit's mean
  probability, how often it ranks first among the ten digits, and the greedy tokens there."""
  per_digit = [[c for c in r["digits"] if c["rank"]] for r in rows]
  out = []
  for j in range(max(map(len, per_digit))):
    cells = [d[j] for d in per_digit if j < len(d)]
    out.append(dict(digit=j + 1, mean_p=round(float(np.mean([c["p"] for c in cells])), 3),
                    first_among_digits=sum(c["rank"] == 1 for c in cells), n=len(cells),
                    greedy="".join(c["greedy"] for c in cells)))
  return out


def _ratio_problem(asset: str, ratio: int):
  """Why ``ratio`` cannot read ``asset``'s beacons (None when it can), from its metadata alone."""
  from longjax.beacon.asset import META
  meta = Path(asset) / META
  if not meta.is_file():
    return f"--asset {asset}: no {META} (give an exported beacon asset)"
  stride = json.loads(meta.read_text())["beacon_stride"]
  if ratio < 1 or stride % ratio:
    return f"--ratio {ratio}: give a positive divisor of the asset's stride ({stride})"
  return None


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--method", choices=(BEACON, PLAIN), default=BEACON)
  ap.add_argument("--asset", default="assets/smollm2_beacon")
  ap.add_argument("--samples", type=int, default=10)
  ap.add_argument("--length", type=int, default=4096)
  ap.add_argument("--ratio", type=int, help="read the beacons at this compression ratio instead "
                  "of the asset's (a positive divisor of its stride)")
  ap.add_argument("--out", help="also write the samples and the summary to this JSON file")
  a = ap.parse_args(argv)
  bad = (f"--asset {a.asset}: no such directory (give an exported beacon asset)"
         if a.method == BEACON and not Path(a.asset).is_dir() else
         f"--samples {a.samples}: give at least 1" if a.samples < 1 else
         f"--ratio is a beacon reading setting; --method {a.method} has none"
         if a.ratio is not None and a.method != BEACON else
         _ratio_problem(a.asset, a.ratio) if a.ratio is not None else None)
  if bad:  # one line, before the model loads
    print(f"digit_probe.py: error: {bad}", file=sys.stderr)
    return 2
  from longjax.ckpts import smollm2
  from longjax.eval.harness import LongjaxLM
  base = str(smollm2.get())
  args = dict(method=a.method, checkpoint="smollm2")
  if a.method == BEACON:
    args["asset"] = a.asset
  lm = LongjaxLM(**args)
  if a.ratio is not None:
    p = lm.parts
    p.settings = dataclasses.replace(p.settings, ratios=(a.ratio,))
    p.model = p.registry.inference_model(p.cfg, p.settings)
  tok = lm.parts.tokenizer
  digits = [tok.encode(str(d), special=False) for d in range(10)]
  assert all(len(d) == 1 for d in digits), "one token per digit expected"
  digit_ids = np.array([d[0] for d in digits])
  decode = lambda i: tok.decode([int(i)])  # noqa: E731
  rows = []
  for prompt, target in ruler_prompts(lm, "niah_single_1", a.length, a.samples, base):
    p_ids = lm.tok_encode(prompt)
    # " ", "4", "4", ...: the space, then one token per digit
    t_ids = lm.tok_encode(prompt + " " + target)[len(p_ids):]
    ids = p_ids + t_ids
    lp = log_softmax(digit_logits(lm, ids))
    rec = dict(target=target, digits=read_digits(lp, len(p_ids), t_ids, digit_ids, decode),
               after_greedy=decode(int(np.argmax(lp[len(ids) - 1]))))
    rows.append(rec)
    print(json.dumps(rec), flush=True)
  summary = summarise(rows)
  result = dict(method=a.method, asset=a.asset if a.method == BEACON else None,
                ratio=tuple(lm.parts.settings.ratios) if a.method == BEACON else None,
                task="niah_single_1", length=a.length, summary=summary)
  print(json.dumps(result), flush=True)
  if a.out:
    write_whole(a.out, dict(result, samples=rows))


if __name__ == "__main__":
  sys.exit(main())
