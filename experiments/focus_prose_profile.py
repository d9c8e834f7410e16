"""Where does FocusLLM's prose cost fall? (issue: FocusLLM learning round 2)

The perplexity protocol of ``learn_focus.py ppl`` scores the last ``--reserve`` tokens of each
held-out pydoc document: FocusLLM prefills on the rest and teacher-forces one decode step per
scored token (every step re-reads the chunks with the tokens so far), truncation reads BOS, the
last 256 context tokens and the scored tokens so far. Both see the same local tokens; FocusLLM
adds one candidate per chunk. This script keeps every token's NLL under both, so the cost can be
read per step (does it grow as the dynamic prompt grows?) and per token (a few large losses or
many small ones?).

Output: per document the two NLL lists ("method": the asset at its reading, and "truncation"),
then a summary: the mean NLL difference per block of ``--block`` steps, and the tokens where
FocusLLM loses or gains most.

  python experiments/focus_prose_profile.py --docs 8 --reserve 128 \\
      --out results/focus_prose_profile.json

``--reading candidate_gate=32,gate_threshold=0.3`` reads the asset at another setting (the
reading fields of docs/focusllm.md §4.5-4.6); ``--only_docs 1,6`` scores some documents only.

``--variants "b32:strength=32;cut1:cut=1"`` also scores every token under other gate biases on
the same chunk states (one host step per token; one local forward per variant that changes the
gate, while a variant that only votes reads the step's own): the keys of ``condense.gate_bias``
(strength, threshold, gain, peer_gain, top_k) and ``cut`` (a probe only: a candidate whose bias is
below ``-cut`` is masked, so a faded chunk leaks nothing), ``vote`` and
``vote_min`` (``FocusConfig.chunk_vote`` / ``vote_min``: the local distribution times the surest
chunk's own next-token distribution to the power ``vote``, where that chunk is at least
``vote_min`` sure) and ``vote_open`` (a probe only: only chunks the gate reads at full weight,
bias at least ``-vote_open``, may vote). The variant
``truncation`` masks every candidate: it must give truncation's NLL (a check of the harness).
"""
import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

import learn_passkey_real as lpr  # noqa: E402
from learn_focus import Focus, _tok  # noqa: E402

def truncation_nll(cfg, bos: int, window: int, params, ids, n: int) -> np.ndarray:
  """``[n]``: each of the last ``n`` tokens of ``ids`` scored by the plain base reading BOS, the
  ``window`` context tokens before them (FocusLLM's local window: the same local tokens) and the
  scored tokens before it (one causal forward)."""
  import jax
  import jax.numpy as jnp
  from longjax.models.decoder import CAUSAL_PREFILL, Decoder
  from longjax.models.head import head_nll
  toks = np.concatenate([[bos], ids[len(ids) - n - window:]]).astype(np.int32)
  model = Decoder(cfg, rule=CAUSAL_PREFILL)
  t = len(toks)
  hidden, _ = jax.jit(lambda p, x: model.apply({"params": p}, x, jnp.arange(t)[None],
                                               head=False))(params, jnp.asarray(toks)[None])
  h = hidden[0, t - 1 - n:t - 1]
  return np.asarray(head_nll(cfg, params, h, jnp.asarray(toks[t - n:])))


def focus_nll(model: Focus, ids, n: int) -> np.ndarray:
  """``[n]``: FocusLLM's protocol (``methods.Focus.suffix_nll``), kept per token."""
  from longjax.inference.teacher_forcing import teacher_forced_nll
  lm, params = model.lm, model.params
  ctx, tgt = ids[:len(ids) - n], ids[len(ids) - n:]
  logits, state = lm.prefill(params, ctx[None], np.array([len(ctx)], np.int32), n)
  return teacher_forced_nll(lm.device_plan(state, n - 1), params, logits, tgt[None])[0]


READING_FIELDS = {"candidate_gate": float, "gate_threshold": float, "gate_gain": float,
                  "gate_peer_gain": float, "gate_top_k": int, "chunk_overlap": int}
VARIANT_KEYS = {"strength": float, "threshold": float, "gain": float, "peer_gain": float,
                "top_k": int, "cut": float, "vote": float, "vote_min": float,
                "vote_open": float}
# variant keys that are no gate_bias argument
PROBE_ONLY = ("cut", "vote", "vote_min", "vote_open")
VOTE_ONLY = ("vote", "vote_min", "vote_open")


def parse_fields(body: str, types: dict, flag: str) -> dict:
  """``key=value,...`` -> ``{key: types[key](value)}``; anything else is one error naming
  ``flag`` and the keys it takes."""
  out = {}
  for item in filter(None, body.split(",")):
    k, _, v = item.partition("=")
    if k not in types or not v:
      raise SystemExit(f"{flag}: {item!r} is not KEY=VALUE with KEY one of {', '.join(types)}")
    out[k] = types[k](v)
  return out


def parse_reading(spec: str) -> dict:
  """``field=value,...`` over :data:`READING_FIELDS` (empty: none)."""
  return parse_fields(spec, READING_FIELDS, "--reading")


def parse_variants(spec: str) -> dict:
  """``name:key=value,...;...`` -> ``{name: {key: value}}`` (``truncation``: no keys)."""
  out = {}
  for item in filter(None, spec.split(";")):
    name, _, body = item.partition(":")
    out[name] = parse_fields(body, VARIANT_KEYS, f"--variants {name!r}")
  return out


def focus_variant_nll(model: Focus, ids, n: int, variants: dict) -> dict:
  """``{name: [n]}``: the NLL of :func:`focus_variant_scores`."""
  return {k: v[0] for k, v in focus_variant_scores(model, ids, n, variants).items()}


def focus_variant_scores(model: Focus, ids, n: int, variants: dict) -> dict:
  """``{name: (nll [n], top [n])}``: each of the last ``n`` tokens' NLL and the greedy token at
  its step, under the asset's reading (``method``) and each variant, every token teacher-forced
  through host steps; the chunk states are the asset's reading's (the variants change only the
  candidates' bias in the local forward)."""
  import functools
  import jax
  import jax.numpy as jnp
  from longjax.focus import condense as C
  from longjax.models.head import lm_head
  lm, params = model.lm, model.params
  base = lm.fcfg.gate_reading
  if lm.fcfg.candidate_gate == 0:
    raise SystemExit("--variants needs an asset read with the candidate gate on")

  def bias_of(s, kw, params):
    if not kw:  # truncation: every candidate masked
      return jnp.where(s.cand_valid, -1e9, 0.0)
    reading = {**base, **{k: v for k, v in kw.items() if k not in PROBE_ONLY}}
    if reading["gain"] and s.ref_row is None:
      raise SystemExit("a variant with gain > 0 needs an asset read with gate_gain > 0")
    b = C.gate_bias(s.gate_signal, s.gather, s.cand_valid, ref_row=s.ref_row,
                    head=functools.partial(lm_head, lm.cfg, params), **reading)
    if "cut" in kw:
      b = jnp.where(b < -kw["cut"], -1e9, b)
    return b

  # a variant that only votes reads the asset's own local forward (the step's logits), unless
  # the asset votes itself: then every variant runs its own
  reuse = {k: lm.fcfg.chunk_vote == 0 and bool(kw) and set(kw) <= set(VOTE_ONLY)
           for k, kw in variants.items()}

  @jax.jit
  def logits_of(params, s, method_logits):
    out = []
    for name, kw in variants.items():
      bias = bias_of(s, kw, params)
      lg = method_logits if reuse[name] else C.local_next_logits(
          lm.model, params, s.cand_k, s.cand_v, s.gather, s.cand_valid, s.local_tokens,
          s.local_len, s.n_chunks, cand_bias=bias)
      if kw.get("vote"):  # FocusConfig.chunk_vote / vote_min, read on these chunk states
        lg = C.chunk_vote(lg, s.gate_signal, s.gather, s.cand_valid,
                          functools.partial(lm_head, lm.cfg, params), kw["vote"],
                          kw.get("vote_min", 0.0),
                          eligible=bias >= -kw["vote_open"] if "vote_open" in kw else None)
      out.append(lg)
    return out

  def score(logits, y):
    lp = np.asarray(jax.nn.log_softmax(jnp.asarray(logits[0], jnp.float32)))
    return float(-lp[y]), int(lp.argmax())

  ctx, tgt = ids[:len(ids) - n], ids[len(ids) - n:]
  logits, state = lm.prefill(params, ctx[None], np.array([len(ctx)], np.int32), n)
  out = {k: [] for k in ("method", *variants)}
  for t in range(n):
    out["method"].append(score(logits, tgt[t]))
    for name, lg in zip(variants, logits_of(params, state, logits)):
      out[name].append(score(lg, tgt[t]))
    if t + 1 < n:
      logits, state = lm.step(params, state, tgt[t:t + 1])
  return {k: (np.asarray([a for a, _ in v]), np.asarray([b for _, b in v], np.int64))
          for k, v in out.items()}


def summarise(docs: list, block: int, tok) -> dict:
  diffs = np.array([np.asarray(d["method"]) - np.asarray(d["truncation"]) for d in docs])
  names = [k for k in docs[0] if k not in ("doc", "target", "truncation")]
  per_reading = {k: dict(mean_diff=float(np.mean([np.mean(np.asarray(d[k]) - d["truncation"])
                                                  for d in docs])),
                         per_doc=[float(np.mean(np.asarray(d[k]) - d["truncation"]))
                                  for d in docs])
                 for k in names}
  n = diffs.shape[1]
  blocks = {f"{a}-{min(a + block, n) - 1}": float(diffs[:, a:a + block].mean())
            for a in range(0, n, block)}
  flat = [(float(diffs[i, j]), i, j) for i in range(len(docs)) for j in range(n)]
  flat.sort()

  def row(x):
    d, i, j = x
    return dict(doc=docs[i]["doc"], step=j, token=tok.decode([docs[i]["target"][j]]),
                method=round(docs[i]["method"][j], 3),
                truncation=round(docs[i]["truncation"][j], 3), diff=round(d, 3))

  pos = diffs[diffs > 0].sum()
  return dict(
      per_reading=per_reading, mean_diff=float(diffs.mean()),
      per_doc=[float(x) for x in diffs.mean(1)],
      per_block=blocks,
      loss_mass_in_top10_tokens=float(sum(max(x[0], 0) for x in flat[-10:]) / max(pos, 1e-9)),
      tokens_worse_by_1_nat=int((diffs > 1).sum()), tokens_better_by_1_nat=int((diffs < -1).sum()),
      worst=[row(x) for x in flat[::-1][:15]], best=[row(x) for x in flat[:10]])


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--asset", default=str(lpr.ROOT / "assets" / "smollm2_focus"))
  ap.add_argument("--docs", type=int, default=8)
  ap.add_argument("--reserve", type=int, default=128)
  ap.add_argument("--block", type=int, default=16)
  ap.add_argument("--reading", default="",
                  help="field=value,...: read the asset at another gate/overlap setting")
  ap.add_argument("--variants", default="", help="name:key=value,...;... (see above)")
  ap.add_argument("--only_docs", default="", help="comma-separated document indices")
  ap.add_argument("--out", type=Path, required=True)
  args = ap.parse_args(argv)
  reading = parse_reading(args.reading)
  only = {int(x) for x in args.only_docs.split(",") if x}
  variants = parse_variants(args.variants)
  if args.out.resolve().is_relative_to(Path(args.asset).resolve()):
    raise SystemExit(f"--out {args.out} is inside the asset {args.asset}: write it elsewhere")
  from longjax.runtime import compile_cache
  compile_cache.enable("auto")  # a rerun loads its programs from disk
  tok = _tok()
  model = Focus(args.asset, None)
  if reading:
    import dataclasses
    from longjax.focus import FocusLLM
    model.lm = FocusLLM(model.lm.cfg, dataclasses.replace(model.lm.fcfg, **reading))
  res = dict(asset=lpr._display(args.asset), desc=model.desc, reserve=args.reserve,
             reading=reading or "the asset's focus.json", variants=variants,
             text="pydoc_data.topics, documents of 3072 tokens (learn_focus.py ppl's)", docs=[])
  if args.out.exists():
    old = json.loads(args.out.read_text())
    if all(old.get(k) == res[k] for k in ("reserve", "asset", "reading", "variants")):
      res["docs"] = old["docs"]
  done = {d["doc"] for d in res["docs"]}
  docs = lpr.real_text_docs(tok, args.docs, 3072)
  for i, ids in enumerate(docs):
    if i in done or (only and i not in only):
      continue
    ids = np.asarray(ids, np.int32)
    t0 = time.time()
    scores = (focus_variant_nll(model, ids, args.reserve, variants) if variants
              else dict(method=focus_nll(model, ids, args.reserve)))
    scores = {("probe_truncation" if k == "truncation" else k): v for k, v in scores.items()}
    scores["truncation"] = truncation_nll(model.lm.cfg, int(model.lm.fcfg.bos_id),
                                          model.lm.fcfg.local_window, model.params, ids,
                                          args.reserve)
    res["docs"].append(dict(doc=i, target=[int(x) for x in ids[-args.reserve:]],
                            **{k: [float(x) for x in v] for k, v in scores.items()}))
    print(f"doc {i}: " + " ".join(f"{k} {v.mean():.4f}" for k, v in scores.items())
          + f" ({time.time() - t0:.0f} s)", flush=True)
    res["summary"] = summarise(res["docs"], args.block, tok)
    _write(args.out, res)
  print(json.dumps({k: v for k, v in res["summary"].items() if k not in ("worst", "best")},
                   indent=1))


def _write(path: Path, obj):
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_name(path.name + ".tmp")
  tmp.write_text(json.dumps(obj, indent=1))
  tmp.replace(path)


if __name__ == "__main__":
  main()
