"""Does the candidate gate need a reference? (issue: FocusLLM learning round 2)

The candidate gate (docs/focusllm.md §4.5) weighs chunk i's candidate by the frozen base's top
probability ``p_i`` at the chunk row's candidate slot. On RULER's needles that separates the
needle's chunk (p ~ 0.9) from the rest (~0.3). On prose it does not close: gated FocusLLM still
costs perplexity against truncation. One explanation: on prose the next token is often easy
whatever the chunk holds, so ``p_i`` is high for every chunk. A chunk that holds what the answer
needs makes the base *surer than it is without the chunk*; that asks for a reference ``r``:

* ``prompt``: the base reading the dynamic prompt alone (BOS first, as a chunk row without its
  chunk);
* ``local``: the local model with no candidate (truncation's own next-token distribution).

The *gain gate* keeps chunk i's full weight only where ``p_i >= max(tau, kappa * r)`` and biases
its scores by ``beta * min(0, log p_i - log max(tau, kappa * r))`` elsewhere (``kappa = 0``: the
plain gate with threshold ``tau``).

The gain gate compares the confidences of different tokens: a few digits into a RULER answer the
prompt alone is sure the number *ends* (``r`` near 1), and the needle's chunk, sure of the next
digit, fades too. The *same-token gain* (``--set same_token``) compares one token: with ``y_i``
chunk i's top token, ``p_i = p_i(y_i)`` against ``r_i = p_prompt(y_i)``, the prompt alone's
probability *of that token*; the bias is ``beta * min(0, log p_i - log max(tau, kappa * r_i))``.

The *peer reference* (``peerBETA@TAUxKAPPA``) adds the other chunks: ``r_i`` becomes the larger of
the prompt's probability of ``y_i`` and the median over the other chunks ``j`` of ``p_j(y_i)``. A
token that every chunk predicts comes from any context before the prompt (the document's style),
not from chunk i; the chunk that holds what the answer needs predicts what its peers do not.

The *distinctive token* (``distBETA@TAUxKAPPA``) replaces the chunk's top token by the one among
its top ``DIST_TOP_K`` with the largest gain ``log p_i(y) - log max(r(y), m_i(y))`` over both
references, and gates on that token's probability: a needle chunk whose first choice is the
prompt's own token (" a") may hold the key as its second.

The *unique token* (``uniqBETA@TAUxKAPPA``) is the distinctive token with the other chunks'
*largest* probability of the token as their reference instead of their median: a needle is in
one chunk, while a continuation that several chunks expect and the prompt does not (the same
name or phrase recurring through a document) is not what any one chunk alone knows.

The *runner-up* reading (``topkBETA@TAUxKAPPA``, the library's ``gate_top_k``) weighs each chunk
by the best margin ``log p_i(y) - log max(tau, kappa * ref(y))`` over its top ``DIST_TOP_K``
tokens, where the top token's peer reference is the other chunks' median (as ``peer``) and a
later token's is their largest (as ``uniq``): a chunk's first choice may be shared with other
chunks, a runner-up must be its own.

Two held-out sets, read with the committed candidates (no training):

* ``prose``: ``--docs`` pydoc documents of 3072 tokens, the last ``--reserve`` teacher-forced as
  FocusLLM's perplexity protocol does (every step re-reads the chunks with the tokens so far);
  per reading the perplexity (exp of the mean over documents of each document's mean NLL);
* ``ruler``: RULER ``niah_single_1`` at ``--length`` (lm-eval's prompts), the first answer
  digit after the answer's leading space; per reading how often it is the right one. With
  ``--whole_answer`` every answer token is read teacher-forced (one condensing per token) and a
  reading scores a sample when it predicts each of them: what greedy decoding would write, up to
  the needle's last token.

JSON lines per step/sample, then a summary; ``--out`` writes both.

  python experiments/focus_gate_reference_probe.py --overlap 32 --docs 8 --reserve 32 \\
      --samples 10 --out results/focus_gate_reference_probe.json
"""
import argparse
import json
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from experiments.digit_probe import log_softmax, ruler_prompts, write_whole  # noqa: E402

# (name, beta, tau, kappa, reference): the readings compared, per --set. reference: None (the
# plain gate), "prompt"/"local" (the gain against that reference's top probability), "same" (the
# same-token gain against the prompt alone's probability of the chunk's top token; "peer": the
# larger of that and the other chunks' median probability of it)
_PLAIN = [("all", 0, 1.0, 0.0, None), ("gate8", 8, 1.0, 0.0, None)]
READING_SETS = dict(
    reference=_PLAIN + [("gate16@0.5", 16, 0.5, 0.0, None)] + [
        (f"gain{b}@{t:g}x{k:g}:prompt", b, t, k, "prompt")
        for b, t, k in ((8, 0.5, 1.5), (8, 0.5, 2.0), (16, 0.5, 2.0), (8, 1.0, 2.0),
                        (8, 0.8, 2.0), (16, 0.8, 2.0), (8, 0.5, 3.0))]
    + [("gain8@0.5x2:local", 8, 0.5, 2.0, "local")],
    same_token=_PLAIN + [("gain16@0.8x2:prompt", 16, 0.8, 2.0, "prompt")] + [
        (f"same{b}@{t:g}x{k:g}", b, t, k, "same")
        for b, t, k in ((8, 0.5, 2.0), (16, 0.5, 2.0), (16, 0.8, 2.0), (8, 0.3, 2.0),
                        (16, 0.5, 4.0), (16, 1.0, 2.0))])
READINGS = READING_SETS["reference"]
_KINDS = {"gate": None, "gain": "prompt", "same": "same", "peer": "peer", "dist": "dist",
          "uniq": "uniq", "topk": "topk"}
DIST_TOP_K = 8  # the distinctive token is chosen among each chunk's top 8


def parse_reading(spec: str):
  """``all`` or ``{gate|gain|same|peer|dist|uniq|topk}BETA[@TAU[xKAPPA]]`` (``gate8@0.5``,
  ``same16@0.8x3``): a reading as in :data:`READING_SETS`; None when ``spec`` is not one."""
  m = re.fullmatch(r"(gate|gain|same|peer|dist|uniq|topk)(\d+(?:\.\d+)?)"
                   r"(?:@(\d*\.?\d+)(?:x(\d*\.?\d+))?)?", spec)
  if spec == "all":
    return ("all", 0, 1.0, 0.0, None)
  if not m:
    return None
  kind, beta, tau, kappa = m.group(1), float(m.group(2)), float(m.group(3) or 1), \
      float(m.group(4) or 0)
  if (kind == "gate") != (kappa == 0) or not 0 < tau <= 1:
    return None
  return (spec, beta, tau, kappa, _KINDS[kind])


def peer_reference(chunk_lp, top_tok):
  """``[C]``: for each chunk i, the median over the other chunks j of ``p_j(y_i)`` (the lower
  median; 0 with no other chunk). ``chunk_lp [C, V]`` each chunk row's log-probabilities,
  ``top_tok [C]`` each row's top token ``y_i``."""
  p = np.exp(np.asarray(chunk_lp, np.float64)[:, np.asarray(top_tok)])  # [j, i] = p_j(y_i)
  c = p.shape[0]
  out = np.zeros(c)
  for i in range(c):
    others = np.sort(np.delete(p[:, i], i))
    out[i] = others[(len(others) - 1) // 2] if len(others) else 0.0
  return out


def distinctive(chunk_lp, prompt_lp, k: int = DIST_TOP_K, peers: str = "median"):
  """Per chunk i: ``(p_i(y*), ref(y*), y*)`` lists, ``y*`` the token among chunk i's top ``k``
  with the largest ``log p_i(y) - log max(p_prompt(y), m_i(y))``, ``m_i(y)`` the lower median
  (``peers="max"``: the largest) over the other chunks of ``p_j(y)`` (0 with none)."""
  lp = np.asarray(chunk_lp, np.float64)
  c = lp.shape[0]
  ps, refs, toks = [], [], []
  for i in range(c):
    cand = np.argsort(-lp[i])[:k]
    best = None
    for y in cand:
      others = np.sort(np.exp(np.delete(lp[:, y], i)))
      m = (0.0 if not len(others) else others[-1] if peers == "max"
           else others[(len(others) - 1) // 2])
      ref = max(float(np.exp(prompt_lp[y])), float(m))
      gain = lp[i, y] - np.log(max(ref, 1e-30))
      if best is None or gain > best[0]:
        best = (gain, float(np.exp(lp[i, y])), ref, int(y))
    ps.append(best[1])
    refs.append(best[2])
    toks.append(best[3])
  return ps, refs, toks


def runner_up(chunk_lp, prompt_lp, tau: float, kappa: float, k: int = DIST_TOP_K):
  """Per chunk i: ``(margin, p_i(y*), level(y*), y*)`` lists, ``y*`` the token among chunk i's
  top ``k`` with the largest ``margin = log p_i(y) - log max(tau, kappa * max(p_prompt(y),
  m_i(y)))``, ``m_i`` the other chunks' lower median for chunk i's top token and their largest
  for a later one (0 with no other chunk)."""
  lp = np.asarray(chunk_lp, np.float64)
  c = lp.shape[0]
  out = []
  for i in range(c):
    best = None
    for rank, y in enumerate(np.argsort(-lp[i])[:k]):
      others = np.sort(np.exp(np.delete(lp[:, y], i)))
      m = (0.0 if not len(others) else others[(len(others) - 1) // 2] if rank == 0
           else others[-1])
      level = max(tau, kappa * max(float(np.exp(prompt_lp[y])), float(m)))
      margin = lp[i, y] - np.log(level)
      if best is None or margin > best[0]:
        best = (float(margin), float(np.exp(lp[i, y])), level, int(y))
    out.append(best)
  return [list(x) for x in zip(*out)] if out else [[], [], [], []]


def gain_bias(top_p, ref, cmax: int, beta: float, tau: float, kappa: float):
  """``[1, Cmax]``: ``beta * min(0, log p_i - log max(tau, kappa * ref_i))`` per chunk, 0 for
  empty slots (``beta = 0``: none). ``ref``: one reference for every chunk, or one per chunk."""
  b = np.zeros((1, cmax), np.float32)
  if beta:
    top = np.log(np.maximum(np.asarray(top_p, np.float64), 1e-9))
    level = np.maximum(tau, kappa * np.asarray(ref, np.float64))
    b[0, :len(top_p)] = beta * np.minimum(top - np.log(level), 0.0)
  return b


class Reader:
  """Condenses one prompt's chunks and reads the local model's next-token log-probabilities
  under any candidate bias, with the gate's signals."""

  def __init__(self, lm, readings=None):
    import jax
    self.readings = READINGS if readings is None else readings
    from longjax.focus import condense as C
    self.fm, self.params = lm.parts.model, lm.parts.params
    fm, params = self.fm, self.params
    self._condense = jax.jit(fm._condense, static_argnums=2)
    self._local = jax.jit(lambda ck, cv, g, valid, toks, lens, n, bias: C.local_next_logits(
        fm.model, params, ck, cv, g, valid, toks, lens, n, cand_bias=bias))
    self._top = jax.jit(self._top_logprob)

  def _top_logprob(self, tokens, valid, last):
    """The base's log-probabilities ``[R, V]`` after row r's token ``last[r]`` (causal rows
    from 0)."""
    import jax
    import jax.numpy as jnp
    from longjax.kernels.mask import TokenMeta
    pos = jnp.broadcast_to(jnp.arange(tokens.shape[1], dtype=jnp.int32), tokens.shape)
    logits, _ = self.fm.model.apply({"params": self.params}, tokens, pos,
                                    q_meta=TokenMeta.causal(pos, valid=valid),
                                    head_rows=last[:, None])
    return jax.nn.log_softmax(logits[:, 0].astype(jnp.float32), axis=-1)

  def read(self, ids, generated=()):
    row = self.fm.plan(np.asarray(ids), list(generated))
    cb, lb, cap = self.fm._pack([row], 0)
    ck, cv, _, _ = self._condense(self.params, cb, cap)
    valid = np.asarray(cb.cand_valid)
    none = np.zeros_like(valid)
    n = row.n_chunks
    last = np.maximum(np.asarray(cb.lengths) - 1, 0)[:n].astype(np.int32)
    chunk_lp = np.asarray(self._top(cb.tokens[:n], cb.valid[:n], last))
    top_tok = chunk_lp.argmax(-1)
    top = [float(x) for x in np.exp(chunk_lp.max(-1))]
    local = lambda m, b: log_softmax(np.asarray(  # noqa: E731
        self._local(ck, cv, cb.gather, m, lb.tokens, lb.lengths, lb.n_chunks, b), np.float32)[0])
    zero = np.zeros(valid.shape, np.float32)
    out = dict(n_chunks=row.n_chunks, top_p=top, none=local(none, zero))
    prompt_lp = self._prompt_logprobs(row.prompt)
    refs = dict(prompt=float(np.exp(prompt_lp.max())), local=float(np.exp(out["none"].max())))
    # the prompt alone's probability of each chunk's top token
    same = np.exp(prompt_lp[top_tok]).tolist()
    peer = peer_reference(chunk_lp, top_tok).tolist()
    both = np.maximum(same, peer).tolist()
    for kind, peers in (("dist", "median"), ("uniq", "max")):
      if any(r[4] == kind for r in self.readings):
        out[f"{kind}_p"], out[f"{kind}_ref"], out[f"{kind}_tok"] = distinctive(
            chunk_lp, prompt_lp, peers=peers)
    for name, beta, tau, kappa, ref in self.readings:
      if ref == "topk":
        margin, out["topk_p"], out["topk_ref"], _ = runner_up(chunk_lp, prompt_lp, tau, kappa)
        b = np.zeros((1, valid.shape[1]), np.float32)
        b[0, :len(margin)] = beta * np.minimum(margin, 0.0)
        out[name] = local(valid, b)
        continue
      p, r = top, (same if ref == "same" else both if ref == "peer" else 0.0 if ref is None
                   else (out[f"{ref}_ref"] if ref in ("dist", "uniq") else refs[ref]))
      if ref in ("dist", "uniq"):
        p = out[f"{ref}_p"]
      out[name] = local(valid, gain_bias(p, r, valid.shape[1], beta, tau, kappa))
    out["refs"] = refs
    out["same_ref"] = same
    out["peer_ref"] = peer
    return out

  def _prompt_logprobs(self, prompt) -> np.ndarray:
    """The base's next-token log-probabilities ``[V]`` reading the dynamic prompt alone (padded
    to a multiple of 64 tokens: few compiled shapes)."""
    t = -(-len(prompt) // 64) * 64
    toks = np.zeros((1, t), np.int32)
    toks[0, :len(prompt)] = prompt
    valid = np.arange(t)[None] < len(prompt)
    return np.asarray(self._top(toks, valid, np.array([len(prompt) - 1], np.int32))[0])


def token_records(r):
  """The distinctive, unique and runner-up tokens' probabilities and references (the runner-up's
  level, its threshold included), where read."""
  return {f"{k}_{f}": [round(x, 4) for x in r[f"{k}_{f}"]]
          for k in ("dist", "uniq", "topk") if f"{k}_p" in r for f in ("p", "ref")}


def names(readings):
  return ["none"] + [r[0] for r in readings]


def prose(reader, tok, n_docs: int, reserve: int, only=None):
  from experiments.learn_passkey_real import real_text_docs
  keys = names(reader.readings)
  doc_nll = {k: [] for k in keys}
  for d, ids in enumerate(real_text_docs(tok, n_docs, 3072)):
    if only is not None and d not in only:
      continue
    ids = np.asarray(ids, np.int32)
    ctx, tgt = ids[:len(ids) - reserve], ids[len(ids) - reserve:]
    nll = {k: [] for k in keys}
    for t in range(reserve):
      r = reader.read(ctx, tgt[:t])
      for k in keys:
        nll[k].append(-float(r[k][tgt[t]]))
      print(json.dumps(dict(set="prose", doc=d, step=t, refs=r["refs"],
                            top_p=[round(x, 4) for x in r["top_p"]],
                            same_ref=[round(x, 4) for x in r["same_ref"]],
                            peer_ref=[round(x, 4) for x in r["peer_ref"]],
                            **token_records(r),
                            nll={k: round(v[-1], 3) for k, v in nll.items()})), flush=True)
    for k in keys:
      doc_nll[k].append(float(np.mean(nll[k])))
  return {k: dict(ppl=round(float(np.exp(np.mean(v))), 3), doc_nll=[round(x, 4) for x in v])
          for k, v in doc_nll.items()}


def answers(reader, lm, items, whole: bool = False, kind: str = "ruler"):
  """``items``: ``(prompt, prefix, target)``; the answer ``prefix + target`` is read
  teacher-forced after the prompt, scored from the first token after ``prefix``: that one, or with
  ``whole`` every target token (while some reading is still right)."""
  tok = lm.parts.tokenizer
  keys = names(reader.readings)
  right = {k: 0 for k in keys}
  rows = []
  for prompt, prefix, target in items:
    p_ids = lm.tok_encode(prompt)
    start = len(lm.tok_encode(prompt + prefix)) - len(p_ids)
    t_ids = lm.tok_encode(prompt + prefix + target)[len(p_ids):]
    r = reader.read(p_ids, t_ids[:start])
    rec = dict(set=kind, target=target, refs=r["refs"], top_p=r["top_p"],
               same_ref=[round(x, 4) for x in r["same_ref"]],
               peer_ref=[round(x, 4) for x in r["peer_ref"]],
               **token_records(r),
               first={k: tok.decode([int(np.argmax(r[k]))]) for k in keys})
    ok = {k: int(np.argmax(r[k]) == t_ids[start]) for k in keys}
    if whole:  # the rest of the answer, teacher-forced, while some reading is still right
      said = {k: tok.decode([int(np.argmax(r[k]))]) for k in keys}
      for t in range(start + 1, len(t_ids)):
        if not any(ok.values()):
          break
        r = reader.read(p_ids, t_ids[:t])
        for k in keys:
          if ok[k]:
            said[k] += tok.decode([int(np.argmax(r[k]))])
            ok[k] = int(np.argmax(r[k]) == t_ids[t])
      rec["said"] = said
    for k in keys:
      right[k] += ok[k]
    rows.append(rec)
    print(json.dumps(rec), flush=True)
  return dict(n=len(rows), **{"right_whole" if whole else "right_first": right}), rows


def ruler_items(lm, length: int, n: int, base: str):
  """RULER ``niah_single_1``: the answer's leading space, then the number."""
  for prompt, target in ruler_prompts(lm, "niah_single_1", length, n, base):
    yield prompt, " ", target


def passkey_items(lm, length: int, n: int, seed: int = 2024):
  """The project's passkey as ``scripts/longctx_report.py`` asks it (keys at the middles of n
  depth bins, chat template): the answer full attention gives, "The pass key is" then the key."""
  from longjax.eval import passkey
  depths = [round(100 * (i + 0.5) / n, 2) for i in range(n)]
  for cell in passkey.beacon_grid([length], depths, seed=seed):
    s = passkey.depth_sample(lm.parts.tokenizer, cell["length"], cell["depth"],
                             passkey.INFO.format(key=cell["key"]), passkey.QUESTION)
    prompt = lm.apply_chat_template([{"role": "user", "content": s["text"]}])
    yield prompt, "The pass key is", f" {cell['key']}"


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--asset", default="assets/smollm2_focus")
  ap.add_argument("--overlap", type=int, default=32, help="chunk_overlap to read with")
  ap.add_argument("--docs", type=int, default=8, help="prose documents (0: skip prose)")
  ap.add_argument("--reserve", type=int, default=32, help="prose: scored tokens per document")
  ap.add_argument("--only_docs", default="",
                  help="prose: read only these of the --docs documents (comma list of indices)")
  ap.add_argument("--samples", type=int, default=10, help="RULER samples (0: skip RULER)")
  ap.add_argument("--length", type=int, default=4096, help="RULER length")
  ap.add_argument("--passkey", type=int, default=0,
                  help="also read the project's passkey: this many depths at --passkey_length")
  ap.add_argument("--passkey_length", type=int, default=1024)
  ap.add_argument("--only_samples", default="",
                  help="RULER and passkey: read only these samples (comma list of indices)")
  ap.add_argument("--whole_answer", action="store_true",
                  help="RULER: score every answer token (teacher-forced), not the first digit")
  ap.add_argument("--set", default="reference", choices=sorted(READING_SETS),
                  help="which readings to compare")
  ap.add_argument("--readings", default="",
                  help="compare these readings instead of --set's (comma list: all, gate8, "
                       "gate16@0.5, gain16@0.8x2 (top against the prompt's top), same16@0.8x3 "
                       "(the same-token gain), peer16@0.3x4 (and the other chunks' median), "
                       "dist16@0.15x4 (the chunk's most distinctive token), uniq16@0.15x4 (against "
                       "the other chunks' largest probability), topk16@0.3x4 (the best of each "
                       "chunk's top 8, a later token against the other chunks' largest))")
  ap.add_argument("--out", help="also write the summary to this JSON file")
  a = ap.parse_args(argv)
  bad = (f"--asset {a.asset}: no such directory (give an exported FocusLLM asset)"
         if not Path(a.asset).is_dir() else
         f"--overlap {a.overlap}: give 0 or more" if a.overlap < 0 else
         f"--docs {a.docs}/--samples {a.samples}/--passkey {a.passkey}: give 0 or more"
         if min(a.docs, a.samples, a.passkey) < 0 else
         f"--reserve {a.reserve}: give 1 or more" if a.reserve < 1 else None)
  readings = [parse_reading(x.strip()) for x in a.readings.split(",") if x.strip()]
  if not bad and None in readings:
    wrong = [x for x, r in zip(a.readings.split(","), readings) if r is None]
    bad = (f"--readings: {wrong[0].strip()!r} is not a reading (all, gateBETA[@TAU], "
           "gainBETA@TAUxKAPPA, sameBETA@TAUxKAPPA, peerBETA@TAUxKAPPA, distBETA@TAUxKAPPA, "
           "uniqBETA@TAUxKAPPA or topkBETA@TAUxKAPPA, "
           "TAU in (0, 1], KAPPA > 0)")
  if bad:
    print(f"focus_gate_reference_probe.py: error: {bad}", file=sys.stderr)
    return 2
  from longjax.ckpts import smollm2
  from longjax.eval.harness import FOCUS, LongjaxLM
  base = str(smollm2.get())
  lm = LongjaxLM(method=FOCUS, checkpoint="smollm2", asset=a.asset, chunk_overlap=a.overlap)
  reader = Reader(lm, readings or READING_SETS[a.set])
  res = dict(asset=a.asset, chunk_overlap=a.overlap, set="custom" if readings else a.set,
             readings={n: dict(beta=b, tau=t, kappa=k, reference=r)
                       for n, b, t, k, r in reader.readings})
  t0 = time.time()
  pick = {int(x) for x in a.only_samples.split(",") if x.strip()} or None
  chosen = lambda items: (x for i, x in enumerate(items) if pick is None or i in pick)  # noqa: E731
  if a.samples:
    res["ruler"], res["ruler_samples"] = answers(
        reader, lm, chosen(ruler_items(lm, a.length, a.samples, base)), a.whole_answer)
    res["ruler"]["length"] = a.length
    print(json.dumps(dict(ruler=res["ruler"], seconds=round(time.time() - t0))), flush=True)
  if a.passkey:
    res["passkey"], res["passkey_samples"] = answers(
        reader, lm, chosen(passkey_items(lm, a.passkey_length, a.passkey)), a.whole_answer,
        "passkey")
    res["passkey"]["length"] = a.passkey_length
    print(json.dumps(dict(passkey=res["passkey"], seconds=round(time.time() - t0))), flush=True)
  if a.docs:
    only = {int(x) for x in a.only_docs.split(",") if x.strip()} or None
    res["prose"] = prose(reader, lm.parts.tokenizer, a.docs, a.reserve, only)
    res["prose_protocol"] = dict(docs=a.docs, doc_tokens=3072, reserve=a.reserve,
                                 only_docs=sorted(only) if only else "all")
    print(json.dumps(dict(prose={k: v["ppl"] for k, v in res["prose"].items()},
                          seconds=round(time.time() - t0))), flush=True)
  if a.out:
    write_whole(a.out, res)


if __name__ == "__main__":
  sys.exit(main())
