"""Which beacons carry a passkey: memory surgery between twin documents.

Two passkey documents that differ only in their key (same filler, same depth, same length) are fed
up to a stride boundary after the key's block has been compressed. Some beacons of the key's block
are then copied from the twin's memory into the document's, the rest of the document is fed on
that memory, and the answer "The pass key is K." is scored teacher-forced. A group of beacons
carries a digit when, swapped in, it makes the twin's digit likely (low NLL) and the document's own
unlikely. The groups, by beacon index b in the key's stride block (beacon b summarises the first
(b+1)·r raw tokens of the block under step-expansion):

  block    all beacons of the block
  segment  the beacons whose own r-token segment holds a key digit
  before   the beacons before the segment (they never saw the key)
  after    the beacons after the segment, to the end of the block
  last     the block's last beacon only

Per key offset in its block (the first digit's position mod S) the results file gets the NLL of the
first digit and the mean NLL of the other four, own key and twin key, for each group
(``key_beacons`` in the results JSON). Stride S and ratio r come from the beacons (--ratios 8).

  python experiments/key_beacons.py --asset runs/candidate14 --offsets 20,40,60,80,88,96,100,108,116
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

import learn_passkey_real as lpr  # noqa: E402

GROUPS = ("own", "block", "segment", "before", "after", "last")


def twin_doc(tok, length: int, depth: float, key: int):
  """``(prompt ids, key digit positions, answer ids, index of the key's first digit in them)``."""
  from longjax.eval import passkey
  s = passkey.depth_sample(tok, length, depth, passkey.INFO.format(key=key), passkey.QUESTION)
  ids = list(tok.prompt_ids(s["text"], True))
  kid = tok.encode(str(key))
  occ = [i for i in range(len(ids) - len(kid) + 1) if ids[i:i + len(kid)] == kid]
  ans = tok.encode(f"The pass key is {key}.")
  first = [i for i in range(len(ans) - len(kid) + 1) if ans[i:i + len(kid)] == kid]
  if not occ or not first or len(kid) != 5:
    raise SystemExit(f"key {key}: expected 5 single-digit tokens in the document and the answer")
  return ids, occ, ans, first[0]


def depth_at(tok, length: int, position: int):
  """The depth (percent) that puts the key's first digit at token ``position``, or None."""
  for depth in np.linspace(0, 100, 4001):
    _, occ, _, _ = twin_doc(tok, length, float(depth), 11111)
    if occ[0] == position:
      return float(depth)
    if occ[0] > position:
      return None
  return None


def digit_nll(lm, params, state, rest, ans, first: int, digits) -> list:
  """Teacher-forced NLL of each key digit of ``ans`` after feeding ``rest`` on ``state``."""
  ids = np.asarray(list(rest) + list(ans), np.int32)
  out = lm.forward(params, ids, state=state, collect_logits=True)
  lg = np.asarray(out.raw_logits[0], np.float64)
  m = lg.max(-1, keepdims=True)
  logp = lg - m - np.log(np.exp(lg - m).sum(-1, keepdims=True))
  at = len(rest) + first - 1  # the logits after token i predict token i + 1
  return [float(-logp[at + i, d]) for i, d in enumerate(digits)]


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  src = ap.add_mutually_exclusive_group()
  src.add_argument("--asset", default=str(lpr.ROOT / "assets" / "smollm2_beacon"))
  src.add_argument("--workdir", default="")
  ap.add_argument("--step", type=int, default=None)
  ap.add_argument("--ratios", default="8", help="the one ratio the beacons run at")
  ap.add_argument("--length", type=int, default=1024)
  ap.add_argument("--block", type=int, default=2, help="the stride block that holds the key")
  ap.add_argument("--offsets", default="20,40,60,80,88,96,100,108,116")
  ap.add_argument("--seed", type=int, default=5, help="the twin keys")
  ap.add_argument("--out", default=str(lpr.ROOT / "results" / "learn_smollm2.json"))
  args = ap.parse_args(argv)
  if "," in args.ratios:
    ap.error("--ratios: one ratio (the block's beacons are counted at it)")
  args.stride, args.window, args.max_new_tokens = 0, 256, 16
  from longjax.beacon.memory import BeaconState
  models = lpr.Models(args)
  tok = models.tok
  lm, params, desc, bcfg = models.beacon("trained", args.step)
  r, s = int(bcfg.ratios[0]), int(bcfg.stride)
  per_block = s // r
  out = Path(args.out)
  res = lpr.load(out)
  table = res.setdefault("key_beacons", {}).setdefault(desc, {})
  res["key_beacons_protocol"] = dict(length=args.length, block=args.block, seed=args.seed,
                                     groups=list(GROUPS), doc=__doc__.split("\n\n")[1])
  rng = np.random.default_rng(args.seed)
  for off in (int(x) for x in args.offsets.split(",")):
    depth = depth_at(tok, args.length, args.block * s + off)
    ka, kb = (int(k) for k in rng.integers(10000, 100000, 2))
    if depth is None:
      print(f"offset {off}: no depth puts the key there; skipped", flush=True)
      continue
    ids_a, occ, ans_a, first = twin_doc(tok, args.length, depth, ka)
    ids_b, occ_b, ans_b, _ = twin_doc(tok, args.length, depth, kb)
    if len(ids_a) != len(ids_b) or occ != occ_b:
      raise SystemExit(f"offset {off}: the twins differ in more than their key")
    cut = s * (args.block + 3)  # the key's block and the next (its second mention) compressed
    if cut >= len(ids_a) - 8:
      raise SystemExit(f"--block {args.block} is too late for --length {args.length}")
    sa = lm.forward(params, np.asarray(ids_a[:cut], np.int32)).state
    sb = lm.forward(params, np.asarray(ids_b[:cut], np.int32)).state
    base = bcfg.sink_size + args.block * per_block
    seg0, seg1 = off // r, (off + 4) // r
    groups = dict(block=range(per_block), segment=range(seg0, seg1 + 1), before=range(seg0),
                  after=range(seg1 + 1, per_block), last=[per_block - 1])
    cell = dict(offset=off, depth=depth, key_positions=occ, memory=sa.sizes()[0].tolist())
    for name in GROUPS:
      st = sa
      if name != "own":
        idx = np.asarray([base + b for b in groups[name]], np.int32)
        cell[f"{name}_beacons"] = [int(b) for b in groups[name]]
        if not len(idx):
          continue
        st = BeaconState(sa.k.at[:, :, idx].set(sb.k[:, :, idx]),
                         sa.v.at[:, :, idx].set(sb.v[:, :, idx]), sa.rows)
      rest = ids_a[cut:]
      own = digit_nll(lm, params, st, rest, ans_a, first, tok.encode(str(ka)))
      twin = digit_nll(lm, params, st, rest, ans_b, first, tok.encode(str(kb)))
      cell[name] = dict(own_first=own[0], own_rest=float(np.mean(own[1:])),
                        twin_first=twin[0], twin_rest=float(np.mean(twin[1:])))
    table[str(off)] = cell
    lpr.save(out, res, ("key_beacons", desc), ("key_beacons_protocol",))
    print(f"offset {off:3d}: " + "  ".join(
        f"{g} {cell[g]['own_first']:.2f}/{cell[g]['own_rest']:.2f} twin "
        f"{cell[g]['twin_first']:.2f}/{cell[g]['twin_rest']:.2f}" for g in GROUPS if g in cell),
        flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
