"""Training documents for the real-model learning proof: passkeys in the official prompt format.

Each record is an ``input`` / ``output`` pair for ``train.py``'s jsonl source (the output is the
answer span; with ``data.loss_on="answer"`` only it is scored):

* input: the official Activation Beacon passkey prompt (``longjax.eval.passkey.depth_sample``:
  description, filler, "The pass key is K. Remember it. K is the pass key.", question) of a random
  length in tokens, key depth uniform in 0-100 %, wrapped as one user turn by the model's chat
  template up to the assistant header; the trailing newline of the header comes from the jsonl
  reader's input/output separator;
* output: "The pass key is K." (what SmolLM2 answers inside its window); EOS is appended.

The filler is the official noise sentence for half of the documents and shuffled sentences of
plain English prose (``FILLER`` below) for the other half, so the beacons do not learn one template.
Keys come from ``--seed``; evaluation uses other seeds (experiments/learn_passkey_real.py).

  python experiments/passkey_data.py --out runs/passkey_train.jsonl --count 4000 --min 768 \\
      --max 1536
"""
import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from longjax.eval import passkey  # noqa: E402

FILLER = """The river runs slowly past the old mill. A farmer walks his dog along the fence every
morning. Rain fell for three days and the roads turned to mud. The baker opens her shop before
sunrise. Children play in the square after school. The train to the city leaves at seven. A small
boat drifts near the harbour wall. The library keeps its oldest books in a locked room. Snow covers
the hills until late spring. The market sells apples, cheese and fresh bread. An old clock hangs
above the station door. The teacher writes the date on the board. Birds gather on the roof at dusk.
The bridge was rebuilt after the flood. A lamp burns in the window of the last house. The wind
turns the blades of the mill. The road climbs through the forest to the pass. Fishermen mend their
nets on the beach. The museum is closed on Mondays. A cat sleeps in the sun on the wall. The doctor
visits the village once a week. Bells ring from the church tower at noon. The garden is full of
roses in June. A letter arrived from the coast. The lake freezes in the coldest winters. Workers
repair the roof of the school. The shepherd counts his sheep at the gate. A storm broke the old oak
tree. The ferry crosses the bay twice a day. Lanterns hang along the street during the festival."""


def filler_ids(tok, rng, n):
  sentences = [s.strip() + "." for s in " ".join(FILLER.split()).split(".") if s.strip()]
  ids = []
  while len(ids) < n:
    ids += tok.encode(" " + " ".join(rng.permutation(sentences)))
  return ids[:n]


def make(tok, rng, length: int, key: int, depth: float, real_filler: bool) -> dict:
  noise = filler_ids(tok, rng, length) if real_filler else None
  s = passkey.depth_sample(tok, length, depth, passkey.INFO.format(key=key), passkey.QUESTION,
                           noise_ids=noise)
  prompt = tok.tok.apply_chat_template([{"role": "user", "content": s["text"]}],
                                       add_generation_prompt=True, tokenize=False)
  assert prompt.endswith("\n")
  return dict(input=prompt[:-1], output=f"The pass key is {key}.", key=key, depth=depth,
              length=length)


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--out", required=True)
  ap.add_argument("--count", type=int, default=4000)
  ap.add_argument("--min", type=int, default=768, help="shortest document (tokens)")
  ap.add_argument("--max", type=int, default=1536, help="longest document (tokens)")
  ap.add_argument("--seed", type=int, default=7)
  ap.add_argument("--digits", default="5",
                  help="key length in digits, or a range LO-HI drawn uniformly per document: a "
                       "longer key gives more retrieval targets per step (each digit is a token)")
  ap.add_argument("--before_last", type=float, default=0.0,
                  help="fraction of documents whose key is placed before the last --window tokens "
                       "(in a window that beacons must compress); the rest: depth uniform 0-100 %%")
  ap.add_argument("--window", type=int, default=256)
  ap.add_argument("--tokenizer", default="smollm2")
  args = ap.parse_args(argv)
  from transformers import AutoTokenizer
  from longjax.data.tokenizers import Tokenizer
  from longjax.ckpts import smollm2
  tok = Tokenizer(AutoTokenizer.from_pretrained(smollm2.resolve(args.tokenizer),
                                                trust_remote_code=False))
  rng = np.random.default_rng(args.seed)
  out = Path(args.out)
  out.parent.mkdir(parents=True, exist_ok=True)
  tmp = out.with_suffix(".partial")
  with open(tmp, "w") as f:
    lo, _, hi = args.digits.partition("-")
    lo, hi = int(lo), int(hi or lo)
    for i in range(args.count):
      length = int(rng.integers(args.min, args.max + 1))
      digits = int(rng.integers(lo, hi + 1))
      key = int(rng.integers(10 ** (digits - 1), 10 ** digits))
      top = 100.0
      if rng.uniform() < args.before_last:  # keep the key out of the (beacon-free) last window
        top = 100.0 * max(0.0, length - args.window - 64) / length
      rec = make(tok, rng, length, key, float(rng.uniform(0, top)), bool(i % 2))
      f.write(json.dumps(rec) + "\n")
  tmp.replace(out)
  print(f"wrote {args.count} documents to {out}")


if __name__ == "__main__":
  main()
