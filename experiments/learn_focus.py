"""Does FocusLLM training teach SmolLM2-135M to read keys from chunks outside its local window?
The FocusLLM side of the learning diagnostics (issue: FocusLLM learns on SmolLM2). Every number
lands in results/learn_smollm2_focus.json (atomic, merged; the layout of learn_smollm2.json).

  overfit  on the twin passkey documents that ``learn_diagnostics.py data --twins`` writes (key in
           the first window, the question and answer in the last; each document has a twin with
           another key and the same tokens otherwise): greedy answers (trained / untrained; the
           plain model's truncation / full rows are the beacon file's, same documents) and the
           memory-swap probe: teacher-forced NLL of the answer digits with the document's own
           chunks vs its twin's (delta = swapped - own; > 0: the candidates carry the key)
  curve    the probe on fresh twin documents for every kept checkpoint of --workdir

Each answer digit is scored exactly as FocusLLM generates it: the chunks re-read with the answer's
earlier tokens appended to the dynamic prompt (``FocusLLM.forward(prompt, generated)``).

  python experiments/learn_diagnostics.py data --twins --out runs/overfit2/train.jsonl
  python train.py --config=configs/smollm2_focus.py --config.workdir=runs/focus_overfit/run \\
      --config.data.sources=jsonl:runs/overfit2/train.jsonl --config.train.num_steps=200 \\
      --config.train.lr=3e-4
  python experiments/learn_focus.py overfit --data runs/overfit2/train.jsonl \\
      --workdir runs/focus_overfit/run
"""
import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

import learn_passkey_real as lpr  # noqa: E402  (results file)

OUT = lpr.ROOT / "results" / "learn_smollm2_focus.json"


class Focus:
  def __init__(self, source, step):
    """``source``: a train.py run (its checkpoint ``step``; 0 = untrained) or an asset (``step``
    None = its tensors; 0 = untrained with its settings)."""
    import jax
    import jax.numpy as jnp
    from longjax.focus import FocusLLM
    from longjax.focus.asset import load_focus_asset, params_from_workdir
    if (Path(source) / "config.json").exists():
      cfg, fcfg, params, self.step, _ = params_from_workdir(source, step)
    else:
      cfg, fcfg, params = load_focus_asset(source)
      self.step = json.loads((Path(source) / "focus.json").read_text()).get("train_step", -1)
      if step == 0:
        from longjax.focus import focus_from_llama
        from longjax.ckpts import smollm2
        cfg, fcfg, params = focus_from_llama(smollm2.get(), fcfg, param_dtype="float32")
        self.step = 0
    self.params = jax.tree.map(jnp.asarray, params)
    self.lm = FocusLLM(cfg, fcfg)
    self.eos = int(cfg.eos_token_id)
    self.desc = (f"FocusLLM W=S={fcfg.local_window} prompt<={fcfg.prompt_cap} "
                 f"({'+'.join(fcfg.candidate_projections)}), "
                 + (f"trained ({Path(source).name} step {self.step})" if self.step
                    else "untrained (copies of q/k/v/o)"))

  def answer(self, tok, ids, max_new_tokens=12):
    import longjax
    from longjax.eval import scorers
    gen = longjax.generate(self.lm, self.params, [ids], max_new_tokens=max_new_tokens,
                           stop_ids=[self.eos]).tokens[0]
    text = tok.decode(gen)
    return text, scorers.first_int(text)

  def digit_nll(self, tok, prompt, ans) -> float:
    """Mean NLL of the answer's digit tokens, each scored after the answer's earlier tokens."""
    import jax
    out = []
    for i, t in enumerate(ans):
      if not tok.decode([t]).strip().isdigit():
        continue
      logits = self.lm.forward(self.params, np.asarray(prompt), generated=ans[:i]).logits[-1]
      out.append(-float(jax.nn.log_softmax(logits)[t]))
    return float(np.mean(out))


def _tok():
  from longjax.data.tokenizers import Tokenizer
  from longjax.ckpts import smollm2
  from transformers import AutoTokenizer  # after longjax (it quiets transformers' torch notice)
  return Tokenizer(AutoTokenizer.from_pretrained(smollm2.get(), trust_remote_code=False))


def _ids(tok, rec, key="input"):
  return tok.encode(rec[key]) + tok.encode("\n"), tok.encode(rec["output"])


def probe(model: Focus, tok, recs) -> dict:
  own, swap = [], []
  for r in recs:
    prompt, ans = _ids(tok, r)
    own.append(model.digit_nll(tok, prompt, ans))
    swap.append(model.digit_nll(tok, _ids(tok, r, "twin_input")[0], ans))
  return dict(digit_nll=float(np.mean(own)), digit_nll_swapped_memory=float(np.mean(swap)),
              delta=float(np.mean(swap) - np.mean(own)))


def cmd_overfit(args, res):
  recs = [json.loads(x) for x in Path(args.data).read_text().splitlines() if x.strip()]
  tok = _tok()
  res["overfit_protocol"] = dict(
      documents=len(recs), window=256, data=f"{Path(args.data).parent.name}/{Path(args.data).name}:"
      " key in the first 256 tokens, question + answer in the last window, twins",
      generation="greedy FocusLLM generate, exact key in the answer",
      baselines="truncation / full: results/learn_smollm2.json overfit (same documents)")
  for cond in args.conditions:
    t0 = time.time()
    model = Focus(args.workdir, 0 if cond == "untrained" else args.step)
    hits, outs = 0, []
    for r in recs:
      text, pred = model.answer(tok, _ids(tok, r)[0])
      hits += pred == str(r["key"])
      outs.append(text)
    cell = dict(correct=hits, n=len(recs), outputs=outs, model=model.desc,
                **probe(model, tok, recs))
    res.setdefault("overfit", {})[cond] = cell
    lpr.save(args.out, res, ("overfit", cond), ("overfit_protocol",))
    print(f"{cond:10s} {hits}/{len(recs)}; digit NLL {cell['digit_nll']:.3f}, swapped "
          f"{cell['digit_nll_swapped_memory']:.3f} (delta {cell['delta']:+.3f}) "
          f"({time.time() - t0:.0f} s); e.g. {outs[0]!r}", flush=True)


def cmd_curve(args, res):
  """The probe (and, with --ppl_docs, perplexity on the first documents of ``ppl``) for step 0 and
  every --every'th checkpoint of --workdir, recorded at cumulative step --offset + step (a run
  started from an asset: its step 0 is the asset's last step, already on the curve)."""
  import orbax.checkpoint as ocp
  from longjax import methods
  recs = [json.loads(x) for x in Path(args.data).read_text().splitlines() if x.strip()]
  tok = _tok()
  curve = res.setdefault(args.key, {})
  res[args.key + "_protocol"] = dict(
      probe=f"{len(recs)} twin passkey documents ({Path(args.data).name}); delta = answer-digit "
            "NLL with the twin's chunks (another key) minus own",
      perplexity=f"the first {args.ppl_docs} documents of the ppl protocol (last {args.reserve} "
                 "tokens each)", steps="cumulative training steps")
  steps = sorted(ocp.CheckpointManager(Path(args.workdir).absolute() / "checkpoints").all_steps())
  docs = lpr.real_text_docs(tok, args.ppl_docs, 3072) if args.ppl_docs else []
  for step in ([0] if args.offset == 0 else []) + steps:
    at = str(args.offset + step)
    if at in curve or step % args.every:
      continue
    t0 = time.time()
    model = Focus(args.workdir, step)
    c = probe(model, tok, recs)
    c["workdir"], c["run_step"] = Path(args.workdir).parent.name, step
    if docs:
      nll = [methods.Focus().suffix_nll(model.lm, model.params, None, np.asarray(d, np.int32),
                                        args.reserve)[0] / args.reserve for d in docs]
      c["perplexity"] = float(np.exp(np.mean(nll)))
    curve[at] = c
    lpr.save(args.out, res, (args.key, at), (args.key + "_protocol",))
    print(f"step {at:>5s}: delta {c['delta']:+.3f}, digit NLL {c['digit_nll']:.3f}, ppl "
          f"{c.get('perplexity', float('nan')):.2f} ({time.time() - t0:.0f} s)", flush=True)


def _source(args):
  """``(workdir, step)`` of the trained candidates: --workdir [--step], else the asset."""
  return (args.workdir, args.step) if args.workdir else (args.asset, None)


def cmd_passkey(args, res):
  """50 fresh documents per length, the beacon file's (same seed, same builder): keys anywhere,
  the question at the end; FocusLLM reads the last W tokens locally and the rest as chunks."""
  tok = _tok()
  table = res.setdefault("passkey", {})
  res["passkey_protocol"] = dict(seed=args.seed, samples=args.samples, window=256,
                                 lengths=args.lengths, max_new_tokens=16,
                                 baselines="truncation / full: results/learn_smollm2.json passkey "
                                           "(the same documents)")
  for cond in args.conditions:
    model = Focus(*_source(args)) if cond == "trained" else Focus(args.workdir or args.asset, 0)
    for length in args.lengths:
      docs = lpr.passkey_docs(tok, length, args.samples, args.seed)
      cell = table.setdefault(cond, {}).setdefault(str(length), dict(samples=[]))
      done = {(d["key"], d["depth"]) for d in cell["samples"]}
      t0 = time.time()
      for d in docs:
        if (d["key"], d["depth"]) in done:
          continue
        text, pred = model.answer(tok, d["ids"], 16)
        cell["samples"].append(dict(key=d["key"], depth=d["depth"], output=text,
                                    correct=pred == d["key"]))
        cell.update(accuracy=float(np.mean([x["correct"] for x in cell["samples"]])),
                    n=len(cell["samples"]), model=model.desc)
        lpr.save(args.out, res, ("passkey", cond, str(length)), ("passkey_protocol",))
      print(f"{cond:10s} {length:5d}: {cell.get('accuracy', float('nan')):6.1%} of "
            f"{cell.get('n', 0)} ({time.time() - t0:.0f} s)", flush=True)


def _plain_nll(model: Focus, ids, n: int) -> float:
  """Mean NLL of the last ``n`` of ``ids`` under the plain base (FocusLLM's base params; BOS
  first, as FocusLLM's local context starts)."""
  from longjax.plain import suffix_nll
  ids = [int(model.lm.fcfg.bos_id)] + [int(x) for x in ids]
  return suffix_nll(model.lm.cfg, model.params, np.asarray(ids, np.int32), n)[0] / n


def cmd_ppl(args, res):
  """Held-out prose (pydoc_data.topics, never trained on): --docs documents of 3072 tokens, the
  last --reserve held out and scored. FocusLLM's protocol (``inference_ppl_forward``, reserve
  128): prefill on the rest, then teacher-forced decode steps, every step re-reading the chunks
  with the tokens so far (one device loop per document). Truncation: the plain base reading BOS,
  the last W context tokens and the held-out tokens so far (FocusLLM's local context without
  candidates); full: the plain base over the whole document. PPL = exp(mean over documents of
  each document's mean NLL), as ``evaluate_perplexity``."""
  from longjax import methods
  tok = _tok()
  docs = lpr.real_text_docs(tok, args.docs, 3072)
  table = res.setdefault("perplexity", {})
  res["perplexity_protocol"] = dict(
      text="pydoc_data.topics (sorted keys, joined; held out: no training data)", docs=args.docs,
      doc_tokens=3072, scored=f"the last {args.reserve} tokens of each document", window=256,
      focus="prefill on the context, teacher-forced decode over the held-out tokens (the "
            f"official inference_ppl_forward, which reserves 128; here {args.reserve})",
      truncation="plain base: BOS + the last 256 context tokens + the held-out tokens so far",
      full="plain base: BOS + the whole document")
  n = args.reserve
  for cond in args.conditions:
    model = Focus(*_source(args)) if cond == "trained" else Focus(args.workdir or args.asset, 0)
    cell = table.setdefault(cond, dict(doc_nll=[]))
    if cell.get("reserve") != n:
      cell.clear()
      cell.update(doc_nll=[], reserve=n)
    cell["model"] = (model.desc if cond in ("trained", "untrained")
                     else f"SmolLM2-135M-Instruct, {cond}")
    t0 = time.time()
    for ids in docs[len(cell["doc_nll"]):]:
      ids = np.asarray(ids, np.int32)
      if cond == "truncation":
        nll = _plain_nll(model, ids[len(ids) - n - 256:], n)
      elif cond == "full":
        nll = _plain_nll(model, ids, n)
      else:
        nll = methods.Focus().suffix_nll(model.lm, model.params, None, ids, n)[0] / n
      cell["doc_nll"].append(float(nll))
      lpr.set_ppl(cell, len(docs))
      lpr.save(args.out, res, ("perplexity", cond), ("perplexity_protocol",))
    print(f"{cond:10s} ppl {cell['ppl']:.2f} ({time.time() - t0:.0f} s)", flush=True)


def cmd_layout(args, res):
  """Where FocusLLM's prose cost comes from: the held-out tokens of the first --docs ppl documents
  scored in one local forward behind the candidates of the context (fixed: not re-read per token,
  unlike the protocol), with the candidates (a) as computed, (b) masked out but the local context
  still at positions C.. (the official layout's offset), (c) masked and the local context from
  position 0: truncation. (a) - (b) is the candidates' content, (b) - (c) the position offset."""
  import dataclasses
  import jax
  tok = _tok()
  docs = lpr.real_text_docs(tok, args.docs, 3072)
  n = args.reserve
  out = res.setdefault("layout_probe", {})
  res["layout_probe_protocol"] = dict(docs=args.docs, scored=f"the last {n} tokens",
                                      note=cmd_layout.__doc__.split("\n\n")[0])
  for cond in args.conditions:
    model = Focus(*_source(args)) if cond == "trained" else Focus(args.workdir or args.asset, 0)
    lm, nll = model.lm, {"candidates": [], "masked, offset": [], "masked, from 0": []}
    for ids in docs:
      ctx, tgt = np.asarray(ids[:-n]), np.asarray(ids[-n:], np.int32)
      row = lm.plan(ctx)
      cb, lb, cap = lm._pack([row], n)
      u = len(row.local)
      tokens = np.asarray(lb.tokens).copy()
      tokens[0, u:u + n - 1] = tgt[:-1]
      lb = dataclasses.replace(lb, tokens=tokens, lengths=np.asarray(lb.lengths) + n - 1)
      off = dataclasses.replace(cb, cand_valid=np.zeros_like(np.asarray(cb.cand_valid)))
      zero = dataclasses.replace(lb, n_chunks=np.zeros_like(np.asarray(lb.n_chunks)))
      for name, c, l in (("candidates", cb, lb), ("masked, offset", off, lb),
                         ("masked, from 0", off, zero)):
        logits, _ = lm._prefill_jit(model.params, c, l, cache_cap=cap, all_logits=True)
        logp = jax.nn.log_softmax(np.asarray(logits[0, u - 1:u + n - 1], np.float32), -1)
        nll[name].append(float(-np.mean(np.asarray(logp)[np.arange(n), tgt])))
    out[cond] = {k: dict(doc_nll=v, ppl=float(np.exp(np.mean(v)))) for k, v in nll.items()}
    lpr.save(args.out, res, ("layout_probe", cond), ("layout_probe_protocol",))
    print(cond, {k: round(v["ppl"], 2) for k, v in out[cond].items()}, flush=True)


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("cmd", choices=("overfit", "curve", "passkey", "ppl", "layout"))
  ap.add_argument("--out", type=Path, default=OUT)
  ap.add_argument("--data", default="runs/overfit2/train.jsonl")
  ap.add_argument("--workdir", default="", help="a train.py FocusLLM run (else --asset)")
  ap.add_argument("--asset", default=str(lpr.ROOT / "assets" / "smollm2_focus"))
  ap.add_argument("--lengths", type=lambda s: [int(x) for x in s.split(",")],
                  default=[1024, 2048, 4096])
  ap.add_argument("--samples", type=int, default=50)
  ap.add_argument("--seed", type=int, default=99)
  ap.add_argument("--step", type=int, default=None)
  ap.add_argument("--every", type=int, default=50)
  ap.add_argument("--key", default="overfit_curve", help="curve: the results key")
  ap.add_argument("--offset", type=int, default=0, help="curve: cumulative steps before the run")
  ap.add_argument("--ppl_docs", type=int, default=0, help="curve: perplexity documents")
  ap.add_argument("--conditions", type=lambda s: s.split(","), default=["untrained", "trained"])
  ap.add_argument("--docs", type=int, default=8, help="ppl: documents of 3072 tokens")
  ap.add_argument("--reserve", type=int, default=128, help="ppl: held-out tokens per document")
  args = ap.parse_args(argv)
  res = lpr.load(args.out)
  {"overfit": cmd_overfit, "curve": cmd_curve, "passkey": cmd_passkey,
   "ppl": cmd_ppl, "layout": cmd_layout}[args.cmd](args, res)


if __name__ == "__main__":
  main()
