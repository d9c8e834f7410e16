"""Real long prose for beacon training, offline, as train.py jsonl (issue: learning round 2).

Sources (Debian packages; ``apt-get install bible-kjv debian-handbook``):
  kjv        the King James Bible (``bible`` from bible-kjv, the whole text)
  handbook   The Debian Administrator's Handbook, English HTML, tags stripped
Held out, never written here: Python's ``pydoc_data.topics`` (the perplexity evaluation).

Kinds of record (``--kind``):
  prose      documents of --min..--max tokens cut from the sources ({"text": ...})
  copy       copy task: a document whose last window repeats a span of an earlier window after a
             cue ('The passage that begins "<first words>" reads: ' then the span), so the
             continuation can only be predicted from the memory ({"text": ...})

  python experiments/long_text_data.py --kind prose --out runs/campaign/prose.jsonl --count 2000
  python experiments/long_text_data.py --kind copy --out runs/campaign/copy.jsonl --count 1000
"""
import argparse
import html.parser
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

HANDBOOK = Path("/usr/share/doc/debian-handbook/html/en-US")


class _Text(html.parser.HTMLParser):
  SKIP = {"script", "style", "head", "nav"}

  def __init__(self):
    super().__init__()
    self.parts, self.skip = [], 0

  def handle_starttag(self, tag, attrs):
    self.skip += tag in self.SKIP
    if tag in ("p", "div", "li", "h1", "h2", "h3", "pre", "tr", "br"):
      self.parts.append("\n")

  def handle_endtag(self, tag):
    self.skip -= tag in self.SKIP and self.skip > 0

  def handle_data(self, data):
    if not self.skip:
      self.parts.append(data)


def handbook_text() -> str:
  if not HANDBOOK.is_dir():
    raise SystemExit(f"{HANDBOOK} not found: apt-get install debian-handbook")
  out = []
  for f in sorted(HANDBOOK.glob("*.html")):
    p = _Text()
    p.feed(f.read_text(encoding="utf-8", errors="replace"))
    t = re.sub(r"[ \t]+", " ", "".join(p.parts))
    out.append(re.sub(r"\n\s*\n+", "\n\n", t).strip())
  return "\n\n".join(out)


def kjv_text() -> str:
  exe = shutil.which("bible")
  if exe is None:
    raise SystemExit("the `bible` command is missing: apt-get install bible-kjv")
  t = subprocess.run([exe, "-l200", "Gen1:1-Rev22:21"], capture_output=True, text=True,
                     check=True, timeout=300).stdout
  return re.sub(r"^ +\d+ ", "", t, flags=re.M)  # drop verse numbers


def _tok():
  from longjax.data.tokenizers import Tokenizer
  from longjax.ckpts import smollm2
  from transformers import AutoTokenizer  # after longjax (it quiets transformers' torch notice)
  return Tokenizer(AutoTokenizer.from_pretrained(smollm2.get(), trust_remote_code=False))


def pieces(tok, texts, rng, count, lo, hi):
  """``count`` token spans of lo..hi tokens from random places of the texts (decoded back)."""
  ids = [np.asarray(tok.encode(t), np.int64) for t in texts]
  weights = np.asarray([len(x) for x in ids], float)
  for _ in range(count):
    src = ids[int(rng.choice(len(ids), p=weights / weights.sum()))]
    n = int(rng.integers(lo, hi + 1))
    s = int(rng.integers(0, len(src) - n))
    yield src[s:s + n]


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--kind", choices=("prose", "copy"), default="prose")
  ap.add_argument("--out", required=True)
  ap.add_argument("--count", type=int, default=2000)
  ap.add_argument("--min", type=int, default=600, help="shortest document (tokens)")
  ap.add_argument("--max", type=int, default=1100, help="longest document (tokens)")
  ap.add_argument("--window", type=int, default=256)
  ap.add_argument("--span", type=int, default=48, help="copy: tokens repeated from the memory")
  ap.add_argument("--sources", default="kjv,handbook")
  ap.add_argument("--seed", type=int, default=3)
  args = ap.parse_args(argv)
  texts = [{"kjv": kjv_text, "handbook": handbook_text}[s]() for s in args.sources.split(",")]
  tok = _tok()
  rng = np.random.default_rng(args.seed)
  out = Path(args.out)
  out.parent.mkdir(parents=True, exist_ok=True)
  tmp = out.with_name(out.name + ".partial")
  with open(tmp, "w") as f:
    for ids in pieces(tok, texts, rng, args.count, args.min, args.max):
      if args.kind == "prose":
        f.write(json.dumps(dict(text=tok.decode(ids.tolist()))) + "\n")
        continue
      # copy: the span lies before the last window; the tail asks for it back
      tail = 24 + args.span
      body = ids[:len(ids) - tail]
      s = int(rng.integers(0, max(1, len(body) - args.window - args.span)))
      span = body[s:s + args.span]
      cue = tok.decode(span[:8].tolist())
      text = (tok.decode(body.tolist()) + f'\n\nThe passage that begins "{cue}" reads: '
              + tok.decode(span.tolist()))
      f.write(json.dumps(dict(text=text)) + "\n")
  tmp.replace(out)
  print(f"wrote {args.count} {args.kind} records to {out}")


if __name__ == "__main__":
  main()
