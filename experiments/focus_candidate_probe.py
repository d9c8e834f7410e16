"""Which candidates decide FocusLLM's first answer digit? (issue: FocusLLM learning round 2)

The trained candidates answer many of RULER ``niah_single_1``'s 7-digit needles at 4K with " 1."
(or a spurious leading 1). One explanation: the chunks that do not hold the needle each carry the
base model's generic guess, and together they outvote the one chunk that read it. It predicts
that, at the first digit (after the answer's leading space):

* with only the needle's chunk as a candidate the right digit wins, and "1" does not;
* with every candidate but the needle's, "1" wins as it does with all of them;
* the share of "1" grows with the number of chunks (the document's length).

For each RULER prompt (as lm-eval builds it: chat template, answer prefix) at each ``--lengths``
this condenses the chunks once (the prompt plus the answer's leading space, as a decode step
would see it) and reads the local model's next-token distribution under these candidate masks:
``all``, ``needle`` (only the chunk holding the needle's digits), ``others`` (all but that chunk)
and ``none``. Per mask: the right digit's probability and rank among the ten digits, the
probability of "1", and the greedy token. A needle inside the local context (no chunk holds it)
is reported as such. Per chunk, also what the frozen base predicts at the chunk row's candidate
slot (``chunk_reads``): whether the needle's chunk is the surest of its next token, a gate that
needs no labels, read under two more masks: ``surest`` (only the chunk the base is surest at)
and ``sure`` (the chunks where its top probability is at least ``SURE``). ``--gates`` also reads
every candidate under the soft candidate gate (docs/focusllm.md §4.5: each candidate's scores
biased by ``beta * log top_p``), one cell ``gate<beta>`` per strength. JSON lines to stdout, then
a summary per length and mask.

  python experiments/focus_candidate_probe.py --asset assets/smollm2_focus --samples 10 \\
      --lengths 1024,2048,4096 --out results/focus_candidate_probe.json
  python experiments/focus_candidate_probe.py --samples 10 --lengths 4096 --gates 1,2,4,8 \\
      --out results/focus_candidate_gate.json
"""
import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from experiments.digit_probe import log_softmax, ruler_prompts, write_whole  # noqa: E402

MASKS = ("all", "needle", "others", "none", "surest", "sure")
SURE = 0.5  # the "sure" mask's threshold on the base's top probability at a candidate slot


def find_needle(chunks, digits) -> int:
  """Index of the chunk holding the needle's digit tokens in order (-1: none does)."""
  n = len(digits)
  for i, c in enumerate(chunks):
    for s in range(len(c) - n + 1):
      if np.array_equal(c[s:s + n], digits):
        return i
  return -1


def masks(valid, needle: int, top_p) -> dict:
  """Candidate-validity rows ``[1, Cmax]`` for each mask of :data:`MASKS`: the last two need no
  label (the surest chunk by the base's own top probability; every chunk at least ``SURE``)."""
  def only(idx):
    m = np.zeros_like(valid)
    m[0, idx] = valid[0, idx]
    return m
  top_p = np.asarray(top_p)
  needle_only = only([needle] if needle >= 0 else [])
  return dict(all=valid, needle=needle_only, others=valid & ~needle_only,
              none=np.zeros_like(valid), surest=only([int(np.argmax(top_p))]),
              sure=only(np.flatnonzero(top_p >= SURE)))


def read(lp, right: int, one: int, digit_ids, decode) -> dict:
  dig = lp[digit_ids]
  return dict(p_right=round(float(np.exp(lp[right])), 4),
              rank_right=int(np.sum(dig > lp[right])) + 1,
              p_one=round(float(np.exp(lp[one])), 4), greedy=decode(int(np.argmax(lp))))


def gate_bias(top_p, cmax: int, beta: float, tau: float = 1.0):
  """``[1, Cmax]`` candidate score biases of the soft gate: ``beta * min(0, log(top_p / tau))``
  per chunk (the base's own top probability at the chunk row's candidate slot; ``tau``: the
  gate's threshold, docs/focusllm.md §4.5), 0 for empty slots."""
  b = np.zeros((1, cmax), np.float32)
  top = np.asarray(top_p, np.float64)
  b[0, :len(top)] = beta * np.minimum(np.log(np.maximum(top, 1e-6)) - np.log(tau), 0.0)
  return b


def gate_name(beta: float, tau: float) -> str:
  """``gate8``, or ``gate16@0.5`` with a threshold."""
  return f"gate{beta:g}" + (f"@{tau:g}" if tau != 1.0 else "")


def parse_gates(spec: str):
  """``"8,16@0.5"`` -> ``[(8.0, 1.0), (16.0, 0.5)]``; ``None`` when malformed (beta >= 0,
  0 < tau <= 1)."""
  out = []
  for item in (x.strip() for x in spec.split(",")):
    if not item:
      continue
    beta, _, tau = item.partition("@")
    try:
      beta, tau = float(beta), float(tau) if tau else 1.0
    except ValueError:
      return None
    if not (beta >= 0 and 0 < tau <= 1):
      return None
    out.append((beta, tau))
  return out


def probe(lm, prompt: str, target: str, digit_ids, decode, gates=()) -> dict:
  import jax
  from longjax.focus import condense as C
  fm, params = lm.parts.model, lm.parts.params
  p_ids = lm.tok_encode(prompt)
  t_ids = lm.tok_encode(prompt + " " + target)[len(p_ids):]  # " ", then one token per digit
  row = fm.plan(np.asarray(p_ids), t_ids[:1])
  needle = find_needle(row.chunks, np.asarray(t_ids[1:]))
  cb, lb, cap = fm._pack([row], 0)
  cand_k, cand_v, _, _ = jax.jit(fm._condense, static_argnums=2)(params, cb, cap)
  local = jax.jit(lambda valid, bias=None: C.local_next_logits(
      fm.model, params, cand_k, cand_v, cb.gather, valid, lb.tokens, lb.lengths, lb.n_chunks,
      cand_bias=bias))
  valid = np.asarray(cb.cand_valid)
  out = dict(target=target, n_chunks=row.n_chunks, needle_chunk=needle,
             chunk_reads=chunk_reads(fm, params, cb, row.n_chunks, needle, t_ids[1]))
  for name, m in masks(valid, needle, out["chunk_reads"]["top_p"]).items():
    if name in ("needle", "others") and needle < 0:
      continue
    lp = log_softmax(np.asarray(local(m), np.float32)[0])
    out[name] = read(lp, t_ids[1], int(digit_ids[1]), digit_ids, decode)
  for beta, tau in gates:
    bias = gate_bias(out["chunk_reads"]["top_p"], valid.shape[1], beta, tau)
    lp = log_softmax(np.asarray(local(valid, bias), np.float32)[0])
    out[gate_name(beta, tau)] = read(lp, t_ids[1], int(digit_ids[1]), digit_ids, decode)
  return out


def chunk_reads(fm, params, cb, n: int, needle: int, right: int) -> dict:
  """What the frozen base itself predicts at each chunk row's candidate slot (the chunk, then the
  dynamic prompt): a gate needs no labels if the chunk that read the needle is the one sure of
  its next token. Per chunk the top probability; where the needle's chunk ranks by it (1: the
  surest), and the right digit's probability there and at the surest other chunk."""
  import jax.numpy as jnp
  from longjax.kernels.mask import TokenMeta
  last = np.maximum(np.asarray(cb.lengths) - 1, 0)[:n, None]
  logits, _ = fm.model.apply({"params": params}, cb.tokens[:n], cb.positions[:n],
                             q_meta=TokenMeta.causal(cb.positions[:n], valid=cb.valid[:n]),
                             head_rows=jnp.asarray(last, jnp.int32))
  lp = np.stack([log_softmax(np.asarray(x, np.float32)) for x in np.asarray(logits)[:, 0]])
  top = np.exp(lp.max(axis=1))
  out = dict(top_p=[round(float(x), 3) for x in top])
  if needle >= 0:
    others = [i for i in range(n) if i != needle]
    out.update(needle_rank=int(np.sum(top > top[needle])) + 1,
               needle_p_right=round(float(np.exp(lp[needle, right])), 4),
               surest_other_p_right=round(float(np.exp(lp[max(others, key=lambda i: top[i]),
                                                         right])), 4) if others else None)
  return out


def greedy(lm, p_ids, gate, steps: int, stop) -> list:
  """Greedy answer tokens, the chunks re-read with the tokens generated so far at every step (as
  FocusLLM decodes); ``gate``: ``None`` reads every candidate, ``"surest"`` only the candidate of
  the chunk the base is surest at (the ``surest`` mask), ``(beta, tau)`` every candidate under
  the soft gate :func:`gate_bias`."""
  import jax
  from longjax.focus import condense as C
  fm, params = lm.parts.model, lm.parts.params
  condense = jax.jit(fm._condense, static_argnums=2)
  local = jax.jit(lambda p, ck, cv, g, valid, toks, lens, n, bias: C.local_next_logits(
      fm.model, p, ck, cv, g, valid, toks, lens, n, cand_bias=bias))
  gen = []
  for _ in range(steps):
    row = fm.plan(np.asarray(p_ids), gen)
    cb, lb, cap = fm._pack([row], 0)
    cand_k, cand_v, _, _ = condense(params, cb, cap)
    valid, bias = np.asarray(cb.cand_valid), None
    if gate is not None:
      top = chunk_reads(fm, params, cb, row.n_chunks, -1, 0)["top_p"]
      if gate == "surest":
        valid = masks(valid, -1, top)["surest"]
      else:
        bias = gate_bias(top, valid.shape[1], *gate)
    lp = np.asarray(local(params, cand_k, cand_v, cb.gather, valid, lb.tokens, lb.lengths,
                          lb.n_chunks, bias), np.float32)[0]
    gen.append(int(np.argmax(lp)))
    if gen[-1] in stop:
      break
  return gen


def summarise(rows) -> dict:
  s = {}
  gates = sorted({k for r in rows for k in r if k.startswith("gate")})
  for name in MASKS + tuple(gates):
    cells = [r[name] for r in rows if name in r]
    if cells:
      s[name] = dict(n=len(cells), right_first=sum(c["rank_right"] == 1 for c in cells),
                     greedy_one=sum(c["greedy"] == "1" for c in cells),
                     mean_p_right=round(float(np.mean([c["p_right"] for c in cells])), 3),
                     mean_p_one=round(float(np.mean([c["p_one"] for c in cells])), 3))
  for name in sorted({k for r in rows for k in r if k.startswith("answer_")}):
    got = [r[name] for r in rows if name in r]
    if got:
      s[name] = dict(n=len(got), right=sum(g["right"] for g in got))
  reads = [r["chunk_reads"] for r in rows if "needle_rank" in r.get("chunk_reads", {})]
  if reads:
    mean = lambda key: round(float(np.mean([c[key] for c in reads])), 3)  # noqa: E731
    s["chunk_reads"] = dict(n=len(reads), needle_surest=sum(c["needle_rank"] == 1 for c in reads),
                            mean_needle_rank=mean("needle_rank"),
                            mean_needle_p_right=mean("needle_p_right"),
                            mean_surest_other_p_right=mean("surest_other_p_right"))
  return s


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--asset", default="assets/smollm2_focus")
  ap.add_argument("--samples", type=int, default=10)
  ap.add_argument("--lengths", default="4096",
                  help="comma-separated RULER lengths, e.g. 1024,2048,4096")
  ap.add_argument("--decode", type=int, default=0,
                  help="also decode up to this many answer tokens greedily, with all candidates "
                       "and with the surest chunk's only (RULER's check: the needle in the answer)")
  ap.add_argument("--gates", default="",
                  help="comma-separated soft-gate strengths beta, each optionally @tau (a "
                       "threshold in (0, 1]): also read (and decode) with every candidate's "
                       "scores biased by beta * min(0, log(the base's top probability at its "
                       "slot / tau))")
  ap.add_argument("--out", help="also write the samples and the summary to this JSON file")
  a = ap.parse_args(argv)
  try:
    lengths = [int(x) for x in a.lengths.split(",")]
  except ValueError:
    lengths = []
  gates = parse_gates(a.gates)
  bad = (f"--asset {a.asset}: no such directory (give an exported FocusLLM asset)"
         if not Path(a.asset).is_dir() else
         f"--samples {a.samples}: give at least 1" if a.samples < 1 else
         f"--decode {a.decode}: give 0 (none) or more answer tokens" if a.decode < 0 else
         f"--gates {a.gates}: give comma-separated numbers >= 0, each optionally @tau with "
         "0 < tau <= 1" if gates is None else
         f"--lengths {a.lengths}: give comma-separated positive integers"
         if not lengths or min(lengths) < 1 else None)
  if bad:  # one line, before the model loads
    print(f"focus_candidate_probe.py: error: {bad}", file=sys.stderr)
    return 2
  from longjax.ckpts import smollm2
  from longjax.eval.harness import FOCUS, LongjaxLM
  base = str(smollm2.get())
  lm = LongjaxLM(method=FOCUS, checkpoint="smollm2", asset=a.asset)
  tok = lm.parts.tokenizer
  digits = [tok.encode(str(d), special=False) for d in range(10)]
  assert all(len(d) == 1 for d in digits), "one token per digit expected"
  digit_ids = np.array([d[0] for d in digits])
  decode = lambda i: tok.decode([int(i)])  # noqa: E731
  result = dict(asset=a.asset, task="niah_single_1", per_length={})
  samples = {}
  for length in lengths:
    rows = []
    for prompt, target in ruler_prompts(lm, "niah_single_1", length, a.samples, base):
      rec = probe(lm, prompt, target, digit_ids, decode, gates)
      if a.decode:
        stop = {int(x) for x in tok.encode(".", special=False)} | {int(lm.eot_token_id)}
        ways = [("answer_all", None), ("answer_surest", "surest")]
        ways += [("answer_" + gate_name(*g), g) for g in gates]
        for name, gate in ways:
          text = tok.decode(greedy(lm, lm.tok_encode(prompt), gate, a.decode, stop))
          rec[name] = dict(text=text, right=target.lower() in text.lower())
      rows.append(rec)
      print(json.dumps(dict(rec, length=length)), flush=True)
    result["per_length"][str(length)] = summarise(rows)
    samples[str(length)] = rows
    print(json.dumps({length: result["per_length"][str(length)]}), flush=True)
  if a.out:
    write_whole(a.out, dict(result, samples=samples))


if __name__ == "__main__":
  sys.exit(main())
