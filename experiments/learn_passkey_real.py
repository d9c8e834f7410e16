"""Does beacon training teach SmolLM2-135M to read past its window? The evaluation side.

Subcommands (all append to one results JSON, --out, default results/learn_smollm2.json, written
atomically after every sample, so an interrupted run resumes where it stopped):

  passkey  exact 5-digit passkey accuracy (greedy, official prompt format through the chat template)
           on fresh documents: keys from --seed (training used seeds 7 and 11), depths evenly spread
           over 0-100 %, the official noise filler; per condition and length:
             truncation  the plain model given the last W tokens (what a W-token model reads)
             untrained   beacon with the official init (copies of the projections, EOS embedding)
             trained     beacon with the trained tensors (--asset, or --workdir [--step])
             full        the plain model on the whole document (upper bound, inside its 8K context)
  ppl      perplexity of the last --scored tokens of held-out real text (Python's own reference
           documentation, pydoc_data.topics: in every Python, never in the training data), split
           into documents of --doc_tokens tokens; truncation scores each token from at most W
           preceding tokens (W-token windows every W/2), local from the beacon window it follows
           (the plain model without the beacons' memory), full and beacon from the whole document
  curve    accuracy at --length on --samples documents (seed --curve_seed) for every kept
           checkpoint of --workdir not yet in the file (the learning curve)
  layout   NLL per key digit with the training layout (last window without beacons) vs the
           inference layout (the question's window with beacons), same documents
  plot     the learning curve PNG next to the JSON
  report   the results as a markdown table (README): exact-match accuracy, and in brackets the
           key digits right in place (chance 10 %)

  python experiments/learn_passkey_real.py curve --workdir runs/smollm2_beacon
  python experiments/learn_passkey_real.py passkey --asset assets/smollm2_beacon \\
      --conditions trained
  python experiments/learn_passkey_real.py ppl --asset assets/smollm2_beacon
"""
import argparse
import dataclasses
import json
import math
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CONDITIONS = ("truncation", "untrained", "trained", "full")
# ppl only: the plain model reading each beacon window on its own (what the beacon model reads
# without its memory): the memory helps exactly when the beacons score below this
PPL_ONLY = ("local",)


# ------------------------------------------------------------------------------------------------
# Results file: one JSON, rewritten atomically (never half-written).
def load(path: Path) -> dict:
  return json.loads(path.read_text()) if path.exists() else {}


def save(path: Path, res: dict, *owned: tuple):
  """Write the cells of ``res`` at the key paths ``owned`` into the file, under a lock.
  Evaluations of different conditions may run at once, each process owning its cells: the file
  is re-read and only the owned cells are replaced, whole (the rest of ``res`` may be stale; a
  merge would keep keys the process has dropped since, e.g. a finished run's "partial" mark)."""
  import fcntl
  path.parent.mkdir(parents=True, exist_ok=True)
  with open(path.with_name(path.name + ".lock"), "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    merged = load(path)
    for keys in owned:
      src, dst = res, merged
      for k in keys[:-1]:
        src = src[k]
        if not isinstance(dst.get(k), dict):
          dst[k] = {}
        dst = dst[k]
      dst[keys[-1]] = src[keys[-1]]
    tmp = path.with_name(path.name + ".partial")
    tmp.write_text(json.dumps(merged, indent=1, sort_keys=True))
    os.replace(tmp, path)


# ------------------------------------------------------------------------------------------------
# Documents.
def passkey_docs(tok, length: int, n: int, seed: int) -> list:
  """``n`` passkey prompts of ``length`` tokens (before the chat template): keys from ``seed``
  (mixed with the length, so lengths do not share keys), depths evenly over 0-100 %."""
  from longjax.eval import passkey
  rng = np.random.default_rng([seed, length])
  docs = []
  for depth in np.linspace(0, 100, n):
    key = int(rng.integers(10000, 100000))
    s = passkey.depth_sample(tok, length, float(depth), passkey.INFO.format(key=key),
                             passkey.QUESTION)
    docs.append(dict(ids=tok.prompt_ids(s["text"], True), key=str(key),
                     depth=round(float(depth), 2)))
  return docs


def real_text_docs(tok, n_docs: int, doc_tokens: int, text: str = "pydoc") -> list:
  """``n_docs`` consecutive pieces of ``doc_tokens`` tokens of the held-out text (``pydoc``:
  Python's reference topics), or of a training text (``handbook``, ``kjv``: the Debian
  packages, for an in-domain comparison only)."""
  if text == "pydoc":
    from pydoc_data.topics import topics
    text_str = "\n\n".join(topics[k] for k in sorted(topics))
  else:
    import long_text_data
    text_str = {"handbook": long_text_data.handbook_text, "kjv": long_text_data.kjv_text}[text]()
  ids = tok.encode(text_str)
  if len(ids) < n_docs * doc_tokens:
    raise SystemExit(f"{text} has {len(ids)} tokens, fewer than {n_docs} x {doc_tokens}")
  return [ids[i * doc_tokens:(i + 1) * doc_tokens] for i in range(n_docs)]


def _display(path) -> str:
  """A path as results may record it: relative to the repository, else its last component."""
  p = Path(path).absolute()
  return str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else p.name


# ------------------------------------------------------------------------------------------------
# Models.
class Models:
  """The frozen base and the beacon variants, built on first use (compiles are cached per shape)."""

  def __init__(self, args):
    from longjax.data.tokenizers import Tokenizer
    from longjax.ckpts import smollm2
    from transformers import AutoTokenizer  # after longjax (it quiets transformers' torch notice)
    self.args = args
    self.hf_dir = smollm2.get()
    self.tok = Tokenizer(AutoTokenizer.from_pretrained(self.hf_dir, trust_remote_code=False))
    self._base = None
    self._beacon = {}

  def base(self):
    if self._base is None:
      import jax
      import jax.numpy as jnp
      from longjax.ckpts import load_hf
      import longjax
      cfg, params = load_hf(self.hf_dir)
      # one PlainLM for the whole run: its jitted prefill/decode are cached on the object
      self._base = (cfg, jax.tree.map(jnp.asarray, params), longjax.PlainLM(cfg))
    return self._base

  def beacon(self, which: str, step=None):
    """``(BeaconLM, params, description)``; ``which`` is trained or untrained."""
    key = (which, step)
    if key not in self._beacon:
      import jax
      import jax.numpy as jnp
      from longjax.beacon import BeaconLM, load_beacon
      from longjax.beacon.asset import load_beacon_asset, params_from_workdir
      a = self.args
      if a.workdir:
        cfg, bcfg, params, step, _ = params_from_workdir(a.workdir, step)
        src = f"run {Path(a.workdir).name} step {step}"  # no machine paths in the results
      else:
        cfg, bcfg, params = load_beacon_asset(a.asset, self.hf_dir)
        src = _display(a.asset)
      if which == "untrained":
        cfg, bcfg, params = load_beacon(self.hf_dir, init="official", beacon=bcfg,
                                        param_dtype="float32")
        src = "official init"
      # another reading of the same tensors than trained: ratios (beacons are shared across
      # ratios), stride (S < W, append: the last W - S raw tokens stay raw), attention pattern
      reading = {}
      if getattr(a, "ratios", ""):
        reading["ratios"] = tuple(int(r) for r in a.ratios.split(","))
      if getattr(a, "stride", 0):
        reading["stride"] = a.stride
      if getattr(a, "attn", ""):
        reading["attn"] = a.attn
      bcfg = dataclasses.replace(bcfg, **reading)
      attn = f" {bcfg.attn}" if "attn" in reading else ""
      desc = (f"beacon W={bcfg.window}"
              f"{f' S={bcfg.stride}' if bcfg.stride != bcfg.window else ''} "
              f"ratio {'/'.join(map(str, bcfg.ratios))}{attn} "
              f"({'+'.join(bcfg.param)}), {which} ({src})")
      lm = BeaconLM(cfg, bcfg, max_length=16 * bcfg.window + 512, progress=False)
      self._beacon = {key: (lm, jax.tree.map(jnp.asarray, params), desc, bcfg)}  # one at a time
    return self._beacon[key]

  def answer(self, cond: str, ids, step=None) -> str:
    import longjax
    from longjax.eval import scorers
    cfg, params, plain = self.base()
    stops = [int(cfg.eos_token_id)]
    if cond in ("truncation", "full"):
      method = plain
      if cond == "truncation":
        ids = ids[-self.args.window:]
    else:
      method, params, _, _ = self.beacon(cond, step)
    gen = longjax.generate(method, params, [ids], max_new_tokens=self.args.max_new_tokens,
                           stop_ids=stops).tokens[0]
    text = self.tok.decode(gen)
    return text, scorers.first_int(text)


# ------------------------------------------------------------------------------------------------
def cmd_passkey(args, models: Models, res: dict, out: Path):
  table = res.setdefault("passkey", {})
  res["passkey_protocol"] = dict(seed=args.seed, samples=args.samples, window=args.window,
                                 lengths=args.lengths, max_new_tokens=args.max_new_tokens)
  for cond in args.conditions:
    for length in args.lengths:
      cell = table.setdefault(cond, {}).setdefault(str(length), dict(samples=[]))
      docs = passkey_docs(models.tok, length, args.samples, args.seed)
      # only this document set counts (another --samples spreads the depths differently)
      wanted = {(d["key"], d["depth"]) for d in docs}
      cell["samples"] = [s for s in cell["samples"] if (s["key"], s["depth"]) in wanted]
      done = {(s["key"], s["depth"]) for s in cell["samples"]}
      t0 = time.time()
      for d in docs:
        if (d["key"], d["depth"]) in done:
          continue
        text, pred = models.answer(cond, d["ids"])
        cell["samples"].append(dict(key=d["key"], depth=d["depth"], output=text,
                                    correct=pred == d["key"]))
        cell["accuracy"] = float(np.mean([s["correct"] for s in cell["samples"]]))
        cell["n"] = len(cell["samples"])
        if cond in ("trained", "untrained"):
          cell["model"] = models.beacon(cond)[2]
        save(out, res, ("passkey", cond, str(length)), ("passkey_protocol",))
      print(f"{cond:10s} {length:5d}: {cell.get('accuracy', float('nan')):6.1%} of "
            f"{cell.get('n', 0)} ({time.time() - t0:.0f} s)", flush=True)


def set_ppl(cell: dict, n_docs: int):
  """A perplexity only over all ``n_docs`` documents: a run stopped part-way keeps its per-document
  NLLs (the next run resumes from them) under ``partial`` instead of a ``ppl`` over fewer."""
  done = len(cell["doc_nll"])
  if done >= n_docs:
    cell.pop("partial", None)
    cell["ppl"] = math.exp(float(np.mean(cell["doc_nll"])))
  else:
    cell.pop("ppl", None)
    cell["partial"] = f"{done} of {n_docs} documents scored; rerun the same command to finish"


def cmd_ppl(args, models: Models, res: dict, out: Path):
  from longjax import methods
  from longjax.eval.models import EvalModel
  cfg, params, plain = models.base()
  w = args.window
  docs = real_text_docs(models.tok, args.docs, args.doc_tokens, args.text)
  table = res.setdefault("perplexity", {})
  res["perplexity_protocol"] = dict(text="pydoc_data.topics (sorted keys, joined)"
                                    if args.text == "pydoc" else f"{args.text} (training text)",
                                    docs=args.docs, doc_tokens=args.doc_tokens,
                                    scored=args.scored, window=w)
  for cond in args.conditions:
    cell = table.setdefault(cond, dict(doc_nll=[]))
    if len(cell["doc_nll"]) >= len(docs):
      continue
    if cond in ("truncation", "full", "local"):
      built = EvalModel(methods.Plain.name, plain, params, models.tok, None, cfg)
    else:
      lm, bparams, desc, bcfg = models.beacon(cond)
      built = EvalModel(methods.Beacon.name, lm, bparams, models.tok, None, lm.cfg, extra=bcfg)
      cell["model"] = desc
    t0 = time.time()
    for ids in docs[len(cell["doc_nll"]):]:
      n = len(ids)
      if cond == "truncation":  # W-token windows every W/2: each token sees W/2..W-1 tokens
        nll = cnt = 0
        for end in range(n - args.scored + w // 2, n + 1, w // 2):
          s, c = built.suffix_nll(ids[max(0, end - w):end], w // 2)
          nll, cnt = nll + s, cnt + c
      elif cond == "local":  # token t read from the beacon window holding t - 1, no memory
        nll = cnt = 0
        first = n - args.scored
        for s0 in range((first - 1) // w * w, n - 1, w):
          end = min(s0 + w + 1, n)
          s, c = built.suffix_nll(ids[s0:end], end - max(s0 + 1, first))
          nll, cnt = nll + s, cnt + c
      else:
        nll, cnt = built.suffix_nll(ids, args.scored)
      cell["doc_nll"].append(nll / cnt)
      set_ppl(cell, len(docs))
      save(out, res, ("perplexity", cond), ("perplexity_protocol",))
    print(f"{cond:10s} ppl {cell['ppl']:.3f} over {len(cell['doc_nll'])} documents "
          f"({time.time() - t0:.0f} s)", flush=True)


def cmd_curve(args, models: Models, res: dict, out: Path):
  import orbax.checkpoint as ocp
  curve = res.setdefault("curve", {})
  res["curve_protocol"] = dict(seed=args.curve_seed, samples=args.samples, length=args.length,
                               workdir=Path(args.workdir).name)
  steps = sorted(ocp.CheckpointManager(Path(args.workdir).absolute() / "checkpoints").all_steps())
  docs = passkey_docs(models.tok, args.length, args.samples, args.curve_seed)
  # step 0: the official init (what training starts from)
  for step in [0] + steps:
    if str(step) in curve or step % args.every:
      continue
    t0 = time.time()
    outs = [models.answer("trained" if step else "untrained", d["ids"], step or None)
            for d in docs]
    curve[str(step)] = dict(
        accuracy=float(np.mean([p == d["key"] for (_, p), d in zip(outs, docs)])),
        example=outs[0][0])
    save(out, res, ("curve", str(step)), ("curve_protocol",))
    print(f"step {step:5d}: {curve[str(step)]['accuracy']:6.1%} at {args.length} "
          f"({time.time() - t0:.0f} s; e.g. {outs[0][0]!r} for {docs[0]['key']})", flush=True)


def cmd_layout(args, models: Models, res: dict, out: Path):
  """Spec 6.5: training gives the last window no beacons, inference gives the question's partial
  window beacons. Teacher-forced NLL per key digit of the answer "The pass key is K." under
  both layouts, same documents and weights: if they differ, training's layout is not what
  inference sees."""
  table = res.setdefault("layout", {})
  for cond in [c for c in args.conditions if c in ("trained", "untrained")]:
    lm, params, desc, _ = models.beacon(cond, args.step)
    cell = table.setdefault(cond, {})
    for length in args.lengths:
      nll = {"training": [], "inference": []}
      for d in passkey_docs(models.tok, length, args.samples, args.seed):
        ans = models.tok.encode(f"The pass key is {d['key']}.")
        ids = np.asarray(d["ids"] + ans, np.int64)
        labels = np.full_like(ids, -100)
        for i, t in enumerate(ans):
          if models.tok.decode([t]).strip().isdigit():
            labels[len(d["ids"]) + i] = t
        for name, training in (("training", True), ("inference", False)):
          o = lm.forward(params, ids, labels=labels, training=training)
          nll[name].append(float(np.asarray(o.loss_sum)[0] / np.asarray(o.loss_count)[0]))
      cell[str(length)] = {k: float(np.mean(v)) for k, v in nll.items()}
      cell["model"] = desc
      save(out, res, ("layout", cond))
      print(f"{cond:10s} {length:5d}: NLL per key digit, training layout "
            f"{cell[str(length)]['training']:.3f} vs inference layout "
            f"{cell[str(length)]['inference']:.3f} (chance ln 10 = 2.303)", flush=True)


def digit_accuracy(samples) -> float:
  """Fraction of key digits right in place in the first number of each output (chance 10 %):
  partial credit that tells "reads some of the key" from "answers with some number"."""
  import re
  hits = []
  for s in samples:
    m = re.search(r"\d+", s["output"])
    got = m.group(0) if m else ""
    hits += [i < len(got) and got[i] == ch for i, ch in enumerate(s["key"])]
  return float(np.mean(hits)) if hits else float("nan")


def cmd_report(args, res: dict, out: Path):
  """Markdown: passkey accuracy per condition and length, perplexity per condition."""
  pk, pp = res.get("passkey", {}), res.get("perplexity", {})
  lengths = sorted({int(n) for c in pk.values() for n in c})
  lines = ["| condition | " + " | ".join(f"passkey {n}" for n in lengths) + " | perplexity |",
           "|---|" + "---|" * (len(lengths) + 1)]
  for cond in CONDITIONS:
    if cond not in pk and cond not in pp:
      continue
    cells = []
    for n in lengths:
      c = pk.get(cond, {}).get(str(n))
      cells.append(f"{c['accuracy']:.0%} ({sum(s['correct'] for s in c['samples'])}/{c['n']}; "
                   f"digits {digit_accuracy(c['samples']):.0%})" if c and c.get("n") else "–")
    ppl = pp.get(cond, {}).get("ppl")
    lines.append(f"| {cond} | " + " | ".join(cells) + f" | {ppl:.2f} |" if ppl else
                 f"| {cond} | " + " | ".join(cells) + " | – |")
  print("\n".join(lines))


def train_curve(metrics: Path, block: int = 10) -> dict:
  """Median answer loss per key digit over blocks of ``block`` steps, charging the whole answer
  loss to the digits (an upper bound: "The pass key is", "." and EOS are 6 tokens the model gets
  right), from a run's metrics.jsonl."""
  recs = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
  steps, vals = [], []
  for i in range(0, len(recs) - block + 1, block):
    chunk = recs[i:i + block]
    per = [r["loss"] * r["label_tokens"] / max(r["label_tokens"] - 6, 1) for r in chunk]
    steps.append(chunk[-1]["step"])
    vals.append(float(np.median(per)))
  return dict(step=steps, nats_per_digit=vals, block=block)


def cmd_plot(args, res: dict, out: Path):
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  curve = res.get("curve", {})
  if not curve:
    raise SystemExit(f"{out} has no learning curve yet (run the curve subcommand)")
  steps = sorted(int(s) for s in curve)
  p = res.get("curve_protocol", {})
  fig, ax = plt.subplots(figsize=(6, 3.5))
  ax.plot(steps, [100 * curve[str(s)]["accuracy"] for s in steps], "o-",
          label=f"beacon, {p.get('samples')} documents (seed {p.get('seed')})")
  # The fresh evaluation set at the same length: official init (step 0) and the shipped asset.
  fresh = res.get("passkey", {})
  meta = Path(args.asset) / "beacon.json"
  final = json.loads(meta.read_text()).get("train_step") if meta.exists() else None
  pts = [(0, fresh.get("untrained", {}).get(str(p.get("length")))),
         (final, fresh.get("trained", {}).get(str(p.get("length"))))]
  pts = [(s, c) for s, c in pts if s is not None and c and c.get("n")]
  if pts:
    ax.plot([s for s, _ in pts], [100 * c["accuracy"] for _, c in pts], "s", color="C3",
            label=f"beacon, fresh set ({'/'.join(str(c['n']) for _, c in pts)} documents)")
  for cond, style in (("full", "--"), ("truncation", ":")):
    cell = res.get("passkey", {}).get(cond, {}).get(str(p.get("length")))
    if cell and "accuracy" in cell:
      ax.axhline(100 * cell["accuracy"], ls=style, color="gray", label=f"{cond} (fresh set)")
  ax.set(xlabel="training step", ylabel=f"passkey exact match at {p.get('length')} (%)",
         ylim=(-3, 103), title="SmolLM2-135M + Activation Beacon (W=256)")
  ax.legend(loc="center left", bbox_to_anchor=(0.15, 0.3), fontsize=7)
  if args.workdir:  # the answer loss of the run, kept in the JSON so the PNG needs only the JSON
    res["train_curve"] = train_curve(Path(args.workdir) / "metrics.jsonl")
    save(out, res, ("train_curve",))
  tc = res.get("train_curve")
  if tc:
    ax2 = ax.twinx()
    ax2.plot(tc["step"], tc["nats_per_digit"], color="C2", lw=1,
             label="train answer loss, nats/digit (median of 10 steps)")
    ax2.axhline(math.log(10), color="C2", ls=":", lw=1)
    ax2.set(ylabel="nats per key digit (chance ln 10)", ylim=(0, 4.5))
    ax2.legend(loc="upper right", fontsize=7)
  fig.tight_layout()
  png = out.with_suffix(".png")
  fig.savefig(png, dpi=120)
  print(f"wrote {png}")


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("command", choices=("passkey", "ppl", "curve", "layout", "plot",
                                          "report"))
  ap.add_argument("--out", default=str(ROOT / "results" / "learn_smollm2.json"))
  src = ap.add_mutually_exclusive_group()
  src.add_argument("--asset", default=str(ROOT / "assets" / "smollm2_beacon"),
                   help="trained beacon tensors (assets/...; default)")
  src.add_argument("--workdir", default="", help="a train.py beacon run instead of the asset")
  ap.add_argument("--step", type=int, default=None, help="with --workdir: that checkpoint")
  ap.add_argument("--conditions", default=",".join(CONDITIONS))
  ap.add_argument("--lengths", default="1024,2048,4096")
  ap.add_argument("--samples", type=int, default=50)
  ap.add_argument("--seed", type=int, default=99, help="passkey keys (training used 7 and 11)")
  ap.add_argument("--curve_seed", type=int, default=98)
  ap.add_argument("--length", type=int, default=2048, help="curve: document length")
  ap.add_argument("--every", type=int, default=50,
                  help="curve: checkpoints whose step divides by it")
  ap.add_argument("--max_new_tokens", type=int, default=16)
  ap.add_argument("--window", type=int, default=256, help="W: what truncation keeps")
  ap.add_argument("--ratios", default="", help="beacon ratios to evaluate at (default: as trained)")
  ap.add_argument("--stride", type=int, default=0,
                  help="beacon stride S to evaluate at (default: as trained; S < W keeps W - S "
                       "raw)")
  ap.add_argument("--attn", default="", choices=("", "step-expansion", "full-coverage"),
                  help="beacon attention pattern to evaluate at (default: as trained)")
  ap.add_argument("--text", default="pydoc", choices=("pydoc", "handbook", "kjv"),
                  help="ppl: the held-out text (default) or a training text, in-domain check only")
  ap.add_argument("--docs", type=int, default=4, help="ppl: documents")
  ap.add_argument("--doc_tokens", type=int, default=3072, help="ppl: tokens per document")
  ap.add_argument("--scored", type=int, default=1024, help="ppl: last tokens scored")
  args = ap.parse_args(argv)
  args.conditions = [c.strip() for c in args.conditions.split(",") if c.strip()]
  known = CONDITIONS + (PPL_ONLY if args.command == "ppl" else ())
  bad = sorted(set(args.conditions) - set(known))
  if bad:
    ap.error(f"unknown condition(s) {bad} for {args.command}; choose from {list(known)}")
  args.lengths = [int(x) for x in args.lengths.split(",")]
  if args.command == "curve" and not args.workdir:
    ap.error("curve needs --workdir (a train.py run with checkpoints)")
  out = Path(args.out)
  res = load(out)
  if args.command in ("plot", "report"):
    return (cmd_plot if args.command == "plot" else cmd_report)(args, res, out)
  models = Models(args)
  cmds = {"passkey": cmd_passkey, "ppl": cmd_ppl, "curve": cmd_curve, "layout": cmd_layout}
  cmds[args.command](args, models, res, out)
  return 0


if __name__ == "__main__":
  sys.exit(main())
