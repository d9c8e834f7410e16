"""Official Activation Beacon checkpoints <-> longjax.

Tensor names (docs/beacon.md §6.4): ``model.beacon_embed_tokens.weight`` and
``model.layers.{i}.self_attn.beacon_{q,k,v,o}_proj.{weight,bias}`` are rows of the shared
conversion table (``longjax.ckpts.table``), mapped to the decoder's ``alt_*`` parameters. The
``beacon_*`` fields of config.json become a ``BeaconConfig``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from longjax.beacon.config import BeaconConfig, BeaconConfigError
from longjax import method_names
from longjax.ckpts.hf import (CheckpointError, check_method, load_hf, method_stamp,
                                read_hf_config, save_hf, shard_map)
from longjax.ckpts.table import ALT_EMBEDDING_NAME, alt_proj_name

INITS = ("official",)


def load_beacon(hf_dir, *, init: Optional[str] = None, param_dtype: Optional[str] = None,
                beacon: Optional[BeaconConfig] = None, **beacon_overrides):
  """Load an HF checkpoint for Activation Beacon: ``(ModelConfig, BeaconConfig, params)``.

  Args:
    hf_dir: HF directory (config.json + safetensors), e.g.
      ``namespace-Pt/beacon-qwen-2-7b-instruct`` or a plain Qwen2 / LLaMA / Mistral checkpoint.
    init: ``"official"`` initialises beacon tensors the checkpoint lacks as the official
      ``from_pretrained`` does (``beacon_{p}_proj`` = copy of ``{p}_proj`` incl. bias, beacon
      embedding = ``embed_tokens[eos]`` or ``[bos]`` per ``embed_init``). ``None``: missing beacon
      tensors are an error.
    beacon: a full ``BeaconConfig`` to use instead of the checkpoint's ``beacon_*`` fields.
    beacon_overrides: ``BeaconConfig`` fields overriding the checkpoint's (e.g. ``ratios=(4,)``,
      ``ratio_mix="adapt-1024"``); official ``beacon_*`` names are accepted too.
  """
  if init not in (None,) + INITS:
    raise BeaconConfigError(f"init must be None or one of {INITS}, got {init!r}")
  hf = read_hf_config(hf_dir)
  check_method(hf, method_names.BEACON, hf_dir)
  bcfg = beacon if beacon is not None else BeaconConfig.from_hf(hf, **beacon_overrides)
  names = set(shard_map(hf_dir))
  want = [alt_proj_name(p) for p in bcfg.param] + [ALT_EMBEDDING_NAME]
  missing = [n for n in want if n not in names]
  if missing and init is None:
    raise CheckpointError(
        f"{hf_dir} has no beacon tensors for {sorted(missing)} (beacon_param {list(bcfg.param)}) "
        "and no init rule was given: pass init='official' to initialise them as the official "
        "from_pretrained does (copies of the q/k/v(/o) projections, embedding row from "
        f"{bcfg.embed_init}), or load a checkpoint trained with beacons")
  cfg, params = load_hf(hf_dir, param_dtype=param_dtype,
                        alt_init="copy" if init else None,
                        alt_embed_init=bcfg.embed_init if init else None,
                        alt_projections=tuple(bcfg.param), num_alt_embeddings=1)
  return cfg, bcfg, params


def save_beacon(out_dir, cfg, bcfg: BeaconConfig, params, **kw) -> Path:
  """Export with the official tensor names and ``beacon_*`` config fields (and ``longjax_method``,
  so that load_focus refuses it)."""
  if tuple(sorted(cfg.alt_projections)) != tuple(sorted(bcfg.param)):
    raise BeaconConfigError(f"model alt projections {cfg.alt_projections} != beacon param "
                            f"{bcfg.param}")
  return save_hf(out_dir, cfg, params, extra_config={**bcfg.to_hf(),
                                                  **method_stamp(method_names.BEACON)}, **kw)
