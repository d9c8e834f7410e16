"""Cheap diagnostics that decide a beacon training recipe before any long run (issue: learning on
a real model, round 2). Every number lands in results/learn_smollm2.json (atomic, merged).

  start     perplexity of UNTRAINED beacons on held-out prose (pydoc_data.topics, never trained
            on), scored after the first window, per layout (interleave + full-coverage, append +
            step-expansion, append + full-coverage), ratio, embedding init and sink size: the
            least harmful start is where training should begin
  data      the overfit set: N two-window passkey documents (key in window 1, question and answer
            in window 2) as train.py jsonl, plus a twin of each with another key of the same
            length (same tokens otherwise: the memory-swap probe)
  overfit   on those documents: greedy answers in the inference layout (trained / untrained /
            truncation to W / full attention), teacher-forced NLL of the answer digits in the
            training and inference layouts, and the memory-swap difference
            delta = NLL(answer | twin's memory) - NLL(answer | own memory)
  curve     the swap probe and prose perplexity for every kept checkpoint of a run
  prose     does the memory carry prose? NLL of held-out prose in a document's last window after
            its own memory, another document's, none, and the plain model on the whole document
            and on the window alone, for the window's first tokens and the rest

  python experiments/learn_diagnostics.py start
  python experiments/learn_diagnostics.py data --out runs/overfit/train.jsonl
  python train.py --config=configs/smollm2_beacon.py --config.workdir=runs/overfit/run \\
      --config.data.sources=jsonl:runs/overfit/train.jsonl --config.data.loss_on=all \\
      --config.train.layout=inference --config.train.num_steps=200 --config.train.lr=5e-4
  python experiments/learn_diagnostics.py overfit --data runs/overfit/train.jsonl \\
      --workdir runs/overfit/run
"""
import argparse
import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

import learn_passkey_real as lpr  # noqa: E402  (results file, documents, model loading)

W = 256


def _tok():
  from longjax.data.tokenizers import Tokenizer
  from longjax.ckpts import smollm2
  from transformers import AutoTokenizer  # after longjax (it quiets transformers' torch notice)
  hf = smollm2.get()
  return hf, Tokenizer(AutoTokenizer.from_pretrained(hf, trust_remote_code=False))


def _bcfg(**kw):
  from longjax.beacon.config import BeaconConfig
  base = dict(window=W, stride=W, ratios=(2,), ratio_mix="step-random", pos="interleave",
              attn="full-coverage", param=("q", "k", "v"), sink_size=0, embed_init="eos",
              attend_prev=True)
  base.update(kw)
  return BeaconConfig(**base)


def prose_ppl(lm, params, docs) -> float:
  """Perplexity of every token after the first window of ``docs`` (the beacon model's own
  inference layout): what the memory adds to a model that reads W tokens."""
  nll = cnt = 0.0
  for ids in docs:
    ids = np.asarray(ids, np.int64)
    labels = ids.copy()
    labels[:W] = -100
    o = lm.forward(params, ids, labels=labels, training=False)
    nll += float(np.asarray(o.loss_sum)[0])
    cnt += float(np.asarray(o.loss_count)[0])
  return math.exp(nll / cnt)


# ------------------------------------------------------------------------------------------------
def cmd_start(args, res, out):
  import jax
  import jax.numpy as jnp
  from longjax.beacon import BeaconLM, load_beacon
  hf, tok = _tok()
  docs = lpr.real_text_docs(tok, args.docs, args.doc_tokens)
  table = res.setdefault("start_point", {})
  res["start_point_protocol"] = dict(
      text="pydoc_data.topics (held out)", docs=args.docs, doc_tokens=args.doc_tokens,
      scored=f"every token after the first window (W={W})", window=W, trained=False)
  grid = []
  for pos, attn in (("interleave", "full-coverage"), ("append", "step-expansion"),
                    ("append", "full-coverage")):
    for ratio in args.ratios:
      for sink in (0, 1):
        grid.append(dict(pos=pos, attn=attn, ratios=(ratio,), sink_size=sink, embed_init="eos"))
  for ratio in args.ratios:
    grid.append(dict(pos="interleave", attn="full-coverage", ratios=(ratio,), sink_size=1,
                     embed_init="bos"))
  for kw in grid:
    name = f"{kw['pos']}+{kw['attn']} r{kw['ratios'][0]} sink{kw['sink_size']} {kw['embed_init']}"
    if name in table:
      continue
    t0 = time.time()
    cfg, bcfg, params = load_beacon(hf, init="official", beacon=_bcfg(**kw), param_dtype="float32")
    params = jax.tree.map(jnp.asarray, params)
    lm = BeaconLM(cfg, bcfg, max_length=args.doc_tokens + W, progress=False)
    table[name] = dict(ppl=prose_ppl(lm, params, docs),
                       **{k: (list(v) if isinstance(v, tuple) else v) for k, v in kw.items()})
    lpr.save(out, res, ("start_point", name), ("start_point_protocol",))
    print(f"{name:45s} ppl {table[name]['ppl']:9.2f} ({time.time() - t0:.0f} s)", flush=True)


# ------------------------------------------------------------------------------------------------
def cmd_data(args, res, out):
  import passkey_data
  hf, tok = _tok()
  rng = np.random.default_rng(args.seed)
  recs = []
  while len(recs) < args.count:
    length = int(rng.integers(args.min, args.max + 1))
    key = int(rng.integers(10 ** (args.digits - 1), 10 ** args.digits))
    depth = float(rng.uniform(0, 100.0 * args.key_before / length))
    r = passkey_data.make(tok, rng, length, key, depth, bool(len(recs) % 2))
    other = key
    while other == key:
      other = int(rng.integers(10 ** (args.digits - 1), 10 ** args.digits))
    twin_input = r["input"].replace(str(key), str(other))
    a, b = tok.encode(r["input"]), tok.encode(twin_input)
    ids = sum(_answer_ids(tok, r), []) + [0]  # + EOS
    # the key must sit in window 1, outside the last W tokens of the prompt (what truncation
    # reads), and the answer in window 2 (two windows in all)
    where = [i for i in range(len(a)) if a[i] != b[i]] if len(a) == len(b) else []
    prompt_len = len(_answer_ids(tok, r)[0])
    if (not where or max(where) >= min(W, prompt_len - W)
        or not (W < len(ids) <= args.max_windows * W)):
      continue
    r.update(twin_input=twin_input, twin_key=other)
    recs.append(r)
    if args.twins:  # the twin trains too: only the memory tells the two keys apart
      recs.append(dict(r, input=twin_input, output=r["output"].replace(str(key), str(other)),
                       key=other, twin_input=r["input"], twin_key=key))
  path = Path(args.out)
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_name(path.name + ".partial")
  tmp.write_text("".join(json.dumps(r) + "\n" for r in recs))
  tmp.replace(path)
  print(f"wrote {len(recs)} documents to {path}")


def _answer_ids(tok, rec):
  """``(prompt ids, answer ids)`` as train.py tokenises a jsonl input/output record."""
  return tok.encode(rec["input"]) + tok.encode("\n"), tok.encode(rec["output"])


def _digit_labels(tok, prompt, ans):
  ids = np.asarray(prompt + ans, np.int64)
  labels = np.full_like(ids, -100)
  for i, t in enumerate(ans):
    if tok.decode([t]).strip().isdigit():
      labels[len(prompt) + i] = t
  return ids, labels


def _nll(lm, params, ids, labels, training):
  o = lm.forward(params, ids, labels=labels, training=training)
  return float(np.asarray(o.loss_sum)[0] / max(1, np.asarray(o.loss_count)[0]))


def probe(lm, params, tok, recs):
  """Teacher-forced NLL per answer digit in both layouts and the memory-swap delta."""
  own_t, own_i, swap_i = [], [], []
  for r in recs:
    prompt, ans = _answer_ids(tok, r)
    ids, labels = _digit_labels(tok, prompt, ans)
    own_t.append(_nll(lm, params, ids, labels, True))
    own_i.append(_nll(lm, params, ids, labels, False))
    twin = tok.encode(r["twin_input"]) + tok.encode("\n")
    tids, tlabels = _digit_labels(tok, twin, ans)  # the twin's memory, this document's answer
    swap_i.append(_nll(lm, params, tids, tlabels, False))
  return dict(digit_nll_training_layout=float(np.mean(own_t)),
              digit_nll_inference_layout=float(np.mean(own_i)),
              digit_nll_swapped_memory=float(np.mean(swap_i)),
              delta=float(np.mean(swap_i) - np.mean(own_i)))


def cmd_overfit(args, res, out):
  import longjax
  recs = [json.loads(x) for x in Path(args.data).read_text().splitlines() if x.strip()]
  ns = argparse.Namespace(workdir=args.workdir, asset=args.asset, window=W, max_new_tokens=12)
  models = lpr.Models(ns)
  tok = models.tok
  cell = res.setdefault("overfit", {})
  res["overfit_protocol"] = dict(documents=len(recs), window=W,
                                 data="two windows each: key in window 1, question + answer in 2",
                                 generation="greedy, inference layout, exact key in the answer")
  for cond in args.conditions:
    t0 = time.time()
    hits, outs = 0, []
    for r in recs:
      prompt, _ = _answer_ids(tok, r)
      text, pred = models.answer(cond, prompt, args.step)
      hits += pred == str(r["key"])
      outs.append(text)
    c = dict(correct=hits, n=len(recs), outputs=outs)
    if cond in ("trained", "untrained"):
      lm, params, desc, _ = models.beacon(cond, args.step)
      c.update(probe(lm, params, tok, recs), model=desc)
    cell[cond] = c
    lpr.save(out, res, ("overfit", cond), ("overfit_protocol",))
    extra = "" if "delta" not in c else (
        f"; digit NLL training layout {c['digit_nll_training_layout']:.3f}, inference "
        f"{c['digit_nll_inference_layout']:.3f}, swapped memory {c['digit_nll_swapped_memory']:.3f}"
        f" (delta {c['delta']:+.3f})")
    print(f"{cond:10s} {hits}/{len(recs)}{extra} ({time.time() - t0:.0f} s); e.g. {outs[0]!r}",
          flush=True)
  del longjax


def _run_name(workdir) -> str:
  """A run's name without machine paths: ``runs/retr/run`` -> ``retr``."""
  w = Path(workdir)
  return w.parent.name if w.name == "run" else w.name


def cmd_curve(args, res, out):
  """For every kept checkpoint of --workdir (every --every steps; step 0 = the official init):
  the swap probe on fresh documents (--data, written by ``data`` with another seed) and the
  perplexity of the held-out prose after the first window. A run that continued a campaign from an
  asset (train.init_from) gives ``--offset`` (the asset's cumulative steps): its checkpoints are
  recorded at cumulative steps, and its step 0 (the asset) is left to the earlier run's curve."""
  import orbax.checkpoint as ocp
  recs = [json.loads(x) for x in Path(args.data).read_text().splitlines() if x.strip()]
  ns = argparse.Namespace(workdir=args.workdir, asset=args.asset, window=W, max_new_tokens=12)
  models = lpr.Models(ns)
  prose = lpr.real_text_docs(models.tok, args.docs, args.doc_tokens)
  curve = res.setdefault(args.key, {})
  res[f"{args.key}_protocol"] = dict(
      probe=f"{len(recs)} fresh passkey documents ({Path(args.data).name}), key outside the last "
            "window; delta = answer-digit NLL with a twin's memory (another key) minus own",
      ppl=f"{args.docs} x {args.doc_tokens} tokens of pydoc_data.topics, after the first window",
      runs="each point names its run (the workdir's folder) and that run's own step")
  steps = sorted(ocp.CheckpointManager(Path(args.workdir).absolute() / "checkpoints").all_steps())
  for step in ([] if args.offset else [0]) + steps:
    at = str(step + args.offset)  # cumulative steps of the campaign
    if at in curve or step % args.every:
      continue
    t0 = time.time()
    lm, params, desc, _ = models.beacon("trained" if step else "untrained", step or None)
    c = probe(lm, params, models.tok, recs)
    c["ppl"] = prose_ppl(lm, params, prose)
    c["run"], c["run_step"] = _run_name(args.workdir), step
    curve[at] = c
    lpr.save(out, res, (args.key, at), (f"{args.key}_protocol",))
    print(f"step {at:>5s}: delta {c['delta']:+.3f}, digit NLL {c['digit_nll_inference_layout']:.3f}"
          f", ppl {c['ppl']:.2f} ({time.time() - t0:.0f} s)", flush=True)


# ------------------------------------------------------------------------------------------------
HEAD = 32  # the first tokens of a window: the least raw context, where a memory can matter most


def _window_nll(lm, params, ids, first: int, span) -> tuple:
  """Summed NLL and count of the positions ``first + span`` of ``ids`` (beacon inference layout)."""
  labels = np.full(len(ids), -100, np.int64)
  sel = first + np.asarray(span)
  labels[sel] = np.asarray(ids)[sel]
  o = lm.forward(params, np.asarray(ids, np.int64), labels=labels, training=False)
  return float(np.asarray(o.loss_sum)[0]), float(np.asarray(o.loss_count)[0])


def cmd_prose(args, res, out):
  """Does the memory carry prose? The last window of held-out prose documents, scored
  (a) after the document's own memory, (b) after another document's memory (same lengths: the
  first windows of the next document), (c) with no memory (the window alone), and the plain model
  on (d) the whole document and (e) the window alone; separately for the window's first HEAD
  tokens and the rest (the window's first token is predicted in the window before, and left out)."""
  ns = argparse.Namespace(workdir=args.workdir, asset=args.asset, window=W, max_new_tokens=12)
  models = lpr.Models(ns)
  from longjax import methods
  from longjax.eval.models import EvalModel
  cfg, base_params, plain = models.base()
  built = EvalModel(methods.Plain.name, plain, base_params, models.tok, None, cfg)
  docs = [np.asarray(d, np.int64) for d in lpr.real_text_docs(models.tok, args.docs + 1,
                                                                args.doc_tokens)]
  n = args.doc_tokens
  parts = dict(head=np.arange(1, HEAD + 1), rest=np.arange(HEAD + 1, W))
  name = "untrained" if args.conditions == ["untrained"] else "trained"
  lm, params, desc, _ = models.beacon(name, args.step)
  sums = {c: {p: [0.0, 0.0] for p in parts} for c in ("own", "swapped", "no_memory",
                                                      "full", "local")}
  t0 = time.time()
  for i in range(args.docs):
    a, other = docs[i], docs[i + 1]
    swapped = np.concatenate([other[:n - W], a[n - W:]])
    for part, span in parts.items():
      for cond, ids, first in (("own", a, n - W), ("swapped", swapped, n - W),
                               ("no_memory", a[n - W:], 0)):
        s_, c_ = _window_nll(lm, params, ids, first, span)
        sums[cond][part][0] += s_
        sums[cond][part][1] += c_
      last = n - W + int(span[-1]) + 1  # plain model: the same positions, by suffix
      for cond, lo in (("full", 0), ("local", n - W)):
        s_, c_ = built.suffix_nll(a[lo:last], len(span))
        sums[cond][part][0] += s_
        sums[cond][part][1] += c_
  cell = {c: {p: v[0] / max(v[1], 1) for p, v in d.items()} for c, d in sums.items()}
  cell.update(model=desc, delta_swap={p: cell["swapped"][p] - cell["own"][p] for p in parts},
              delta_no_memory={p: cell["no_memory"][p] - cell["own"][p] for p in parts})
  key = ("official init" if name == "untrained" else f"{_run_name(args.workdir)} step {args.step}"
         if args.workdir else lpr._display(args.asset))
  res.setdefault("prose_memory", {})[key] = cell
  res["prose_memory_protocol"] = dict(
      text="pydoc_data.topics (held out)", docs=args.docs, doc_tokens=n, window=W,
      scored=f"the last window: positions 1..{HEAD} (head) and {HEAD + 1}..{W - 1} (rest), NLL "
             "per token", conditions="own / swapped (another document's memory) / no_memory "
             "(the window alone) with beacons; full / local (the window alone) plain")
  lpr.save(out, res, ("prose_memory", key), ("prose_memory_protocol",))
  for c in sums:
    print(f"{c:10s} head {cell[c]['head']:.3f}  rest {cell[c]['rest']:.3f}")
  print(f"delta swap {cell['delta_swap']}, delta no memory {cell['delta_no_memory']} "
        f"({time.time() - t0:.0f} s)", flush=True)


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("cmd", choices=("start", "data", "overfit", "curve", "prose"))
  ap.add_argument("--out", default=None, help="results JSON (data: the jsonl to write)")
  ap.add_argument("--docs", type=int, default=1)
  ap.add_argument("--doc_tokens", type=int, default=1024)
  ap.add_argument("--ratios", type=lambda s: tuple(int(x) for x in s.split(",")),
                  default=(2, 8, 32))
  ap.add_argument("--count", type=int, default=8)
  ap.add_argument("--min", type=int, default=420)
  ap.add_argument("--max", type=int, default=500)
  ap.add_argument("--digits", type=int, default=5)
  ap.add_argument("--key_before", type=int, default=120, help="key within the first N tokens")
  ap.add_argument("--seed", type=int, default=5)
  ap.add_argument("--max_windows", type=int, default=2, help="data: longest document in windows")
  ap.add_argument("--every", type=int, default=50, help="curve: checkpoints every N steps")
  ap.add_argument("--key", default="campaign_curve", help="curve: the results key it fills")
  ap.add_argument("--offset", type=int, default=0,
                  help="curve: cumulative steps before this run (its init_from asset's)")
  ap.add_argument("--twins", action="store_true",
                  help="data: also write each document's twin (same text, another key) for "
                       "training, so that memorising a document cannot give its key")
  ap.add_argument("--data", default="runs/overfit/train.jsonl")
  ap.add_argument("--workdir", default="")
  ap.add_argument("--asset", default=str(lpr.ROOT / "assets" / "smollm2_beacon"))
  ap.add_argument("--step", type=int, default=None)
  ap.add_argument("--conditions", type=lambda s: s.split(","),
                  default=["trained", "untrained", "truncation", "full"])
  args = ap.parse_args(argv)
  if args.cmd == "data":
    if not args.out:
      raise SystemExit("data: --out PATH.jsonl is required")
    return cmd_data(args, None, None)
  out = Path(args.out or lpr.ROOT / "results" / "learn_smollm2.json")
  res = lpr.load(out)
  {"start": cmd_start, "overfit": cmd_overfit, "curve": cmd_curve,
   "prose": cmd_prose}[args.cmd](args, res, out)


if __name__ == "__main__":
  main()
