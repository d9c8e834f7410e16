"""Trained FocusLLM candidate projections as a small asset: only the candidate tensors (official
names ``...self_attn.beacon_{q,k,v,o}_proj``, bf16, sharded into files of <= 40 MB with an index
when larger) plus the settings in ``focus.json``; the base model is loaded separately.

  cfg, fcfg, params = load_focus_asset("assets/smollm2_focus")        # base named in focus.json
  python -m longjax.focus.asset --workdir runs/focus_campaign/run --out assets/smollm2_focus

``--workdir`` reads the newest training checkpoint of a ``train.py`` FocusLLM run (it need not have
finished), so a long run can be shipped at any step.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional


from longjax.ckpts.atomic_dir import atomic_dir
from longjax.ckpts import assets, lowrank
from longjax.ckpts.assets import AssetError
from longjax.method_names import FOCUS

STEM = FOCUS.name  # focus.safetensors (or its shards)
META = f"{STEM}.json"
# focus.json's own fields (assets.COMMON_FIELDS besides) and their JSON types
# (assets.FIELD_KINDS): anything else is refused, a misspelt name included.
FIELDS = {"local_window": "int", "memory_stride": "ints", "beacon_param": "strs",
          "prompt_cap": "int?", "min_len_threshold": "int", "candidate_gate": "number>=0",
          "chunk_overlap": "int>=0", "gate_threshold": "number>=0", "gate_gain": "number>=0",
          "gate_peer_gain": "number>=0", "gate_top_k": "int>=1", "chunk_vote": "number>=0",
          "vote_min": "number>=0", "vote_open": "bool"}


def _is_candidate(name: str) -> bool:
  """The candidate projections (the unused ``beacon_embed_tokens`` is not part of an asset)."""
  return ".self_attn.beacon_" in name


def save_focus_asset(out_dir, cfg, fcfg, params, *, base: str, dtype: str = "bfloat16",
                     info: Optional[dict] = None, overwrite: bool = False,
                     max_file_bytes: int = assets.MAX_FILE_BYTES,
                     rank: Optional[int] = None) -> Path:
  """Write the candidate tensors of ``params`` (official HF names) and the settings; ``base``
  names the model the asset loads on (a directory or ``smollm2``); files of at most
  ``max_file_bytes`` each; ``rank``: the candidates as rank-``rank`` deltas from the base's
  q/k/v/o (ckpts/lowrank.py)."""
  tensors, lowrank_entry = lowrank.stored_tensors(cfg, params, _is_candidate, rank, dtype)
  if not tensors:
    raise AssetError("these params hold no FocusLLM candidate projections")
  if not str(base or "").strip():
    raise AssetError("a FocusLLM asset must name the base model it loads on (base=...); an empty "
                     "name would load whatever model sits in the current directory")
  meta = dict(base=str(base), dtype=dtype, **fcfg.to_hf(), prompt_cap=fcfg.prompt_cap,
              min_len_threshold=fcfg.min_len_threshold, **(info or {}))
  if fcfg.candidate_gate:  # the reading setting the asset ships with (absent: 0, the official)
    meta["candidate_gate"] = fcfg.candidate_gate
  if fcfg.gate_threshold != 1.0:  # likewise (absent: 1, the plain gate)
    meta["gate_threshold"] = fcfg.gate_threshold
  if fcfg.gate_gain:  # likewise (absent: 0, no reference row)
    meta["gate_gain"] = fcfg.gate_gain
  if fcfg.gate_peer_gain:  # likewise (absent: 0, no peer reference)
    meta["gate_peer_gain"] = fcfg.gate_peer_gain
  if fcfg.gate_top_k != 1:  # likewise (absent: 1, each chunk's top token)
    meta["gate_top_k"] = fcfg.gate_top_k
  if fcfg.chunk_overlap:  # likewise (absent: 0, the official chunks)
    meta["chunk_overlap"] = fcfg.chunk_overlap
  if fcfg.chunk_vote:  # likewise (absent: 0, no chunk votes)
    meta["chunk_vote"] = fcfg.chunk_vote
  if fcfg.vote_min:  # likewise (absent: 0, the surest chunk always votes)
    meta["vote_min"] = fcfg.vote_min
  if fcfg.vote_open:  # likewise (absent: false, any chunk may vote)
    meta["vote_open"] = True
  if lowrank_entry is not None:
    meta[lowrank.KEY] = lowrank_entry
  assets.check_replaceable(out_dir, overwrite, META, STEM, FOCUS.title)
  meta[assets.BASE_WEIGHTS_KEY] = assets.base_fingerprint(params)  # checked by train.init_from
  assets.check_settings(meta, META, FIELDS)  # what the loader will accept, before any work
  with atomic_dir(out_dir, overwrite) as tmp:
    assets.write_tensors(tmp, STEM, tensors, max_file_bytes)
    (tmp / META).write_text(json.dumps(meta, indent=2))
  return Path(out_dir)


def _settings(meta: dict, base: str):
  from longjax.focus.config import FocusConfig
  hf = json.loads((Path(base) / "config.json").read_text())
  return FocusConfig.from_hf(dict(meta, bos_token_id=hf.get("bos_token_id")),
                             prompt_cap=meta.get("prompt_cap"),
                             min_len_threshold=meta.get("min_len_threshold", 0),
                             candidate_gate=meta.get("candidate_gate", 0.0),
                             gate_threshold=meta.get("gate_threshold", 1.0),
                             gate_gain=meta.get("gate_gain", 0.0),
                             gate_peer_gain=meta.get("gate_peer_gain", 0.0),
                             gate_top_k=meta.get("gate_top_k", 1),
                             chunk_overlap=meta.get("chunk_overlap", 0),
                             chunk_vote=meta.get("chunk_vote", 0.0),
                             vote_min=meta.get("vote_min", 0.0),
                             vote_open=meta.get("vote_open", False))


def load_focus_asset(asset_dir, base_dir: Optional[str] = None):
  """``(ModelConfig, FocusConfig, params)``: the base (``base_dir``, default the one named in
  focus.json; ``smollm2`` is fetched) with the asset's candidate projections, in fp32.
  ``asset_dir``: a directory, or the name of one in the repository's assets/
  (``"smollm2_focus"``; see ``longjax.ckpts.assets.find_asset``)."""
  from longjax.focus.convert import focus_from_llama
  from longjax.ckpts.atomic_dir import restore_interrupted_swap
  restore_interrupted_swap(asset_dir)  # first: an overwrite killed midway leaves the path missing
  asset_dir = assets.find_asset(asset_dir, FOCUS)  # a path, or a name in assets/
  if not (asset_dir / META).exists() or not assets.has_tensors(asset_dir, STEM):
    raise AssetError(f"{asset_dir} is not a FocusLLM asset (needs {META} and "
                     f"{STEM}.safetensors or its shards)")
  meta = assets.read_json(asset_dir / META)
  assets.check_settings(meta, asset_dir / META, FIELDS)
  tensors = assets.read_tensors(asset_dir, STEM, meta.get("dtype"))  # before the (slow) base
  base = assets.base_of(asset_dir, meta, META, base_dir)
  cfg, fcfg, params = focus_from_llama(base, _settings(meta, base), param_dtype="float32")
  tensors = lowrank.expand(tensors, meta.get(lowrank.KEY), lowrank.base_reader(base),
                           str(asset_dir))
  assets.set_tensors(cfg, params, tensors, str(asset_dir), expected=_is_candidate)
  return cfg, fcfg, params


def params_from_workdir(workdir, step: Optional[int] = None):
  """Checkpoint ``step`` (default: the newest readable) of a train.py FocusLLM run on a named base,
  merged into it (``step=0``: the official init, copies of q/k/v/o):
  ``(ModelConfig, FocusConfig, params, step, base name)``."""
  from longjax.focus.config import FocusConfig
  from longjax.focus.convert import focus_from_llama
  from longjax.ckpts.smollm2 import resolve
  workdir = Path(workdir).absolute()
  c, method = assets.run_config(workdir, FOCUS)
  checkpoint = c.model.checkpoint if c is not None else None
  if c is None or not str(checkpoint or "").strip():
    raise AssetError(f"{workdir} is not a FocusLLM run on a named base model (method "
                     f"{method!r}, model.checkpoint {checkpoint!r})")
  base = resolve(c.model.checkpoint)
  hf = json.loads((Path(base) / "config.json").read_text())
  fcfg = FocusConfig.from_config(c.focus, hf.get("bos_token_id"))
  cfg, fcfg, params = focus_from_llama(base, fcfg, param_dtype="float32")
  if step != 0:
    trained, step = assets.restore_trained(workdir, step)
    assets.merge_trained(params, trained)
  return cfg, fcfg, params, int(step), c.model.checkpoint


PROG = "python -m longjax.focus.asset"


def build_parser():
  return assets.export_parser(PROG, __doc__, FOCUS.title, rank=lowrank.DEFAULT_RANK)


def main(argv=None):
  ap = build_parser()
  args = ap.parse_args(argv)

  def export():
    from longjax.ckpts.atomic_dir import check_output_apart
    from longjax.ckpts import campaign
    check_output_apart(args.out, "--out", {"--workdir": args.workdir})
    assets.check_replaceable(args.out, args.overwrite, META, STEM, FOCUS.title)  # before loading
    cfg, fcfg, params, step, base = params_from_workdir(args.workdir, args.step)
    save_focus_asset(args.out, cfg, fcfg, params, base=base,
                     info=dict(train_step=step, campaign=campaign.record(args.workdir, step)),
                     overwrite=args.overwrite, rank=args.rank or None)
    print(f"wrote {args.out} (step {step})")
  from longjax.runtime import cli
  return cli.run(PROG, export, debug=args.debug)


if __name__ == "__main__":
  sys.exit(main())
