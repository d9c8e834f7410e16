r"""The input second moments of a beacon asset's trained projections, for activation-aware low rank.

A low-rank delta is judged by what it does to the projection's outputs, ``(W - W') x`` for the
inputs ``x`` the matrix actually sees, not by ``|W - W'|_F``: the hidden states of a decoder are
far from isotropic (a few directions carry most of their energy). This runs a beacon asset over
training documents and accumulates, for every trained projection (``beacon_{q,k,v,o}_proj`` of
every layer), ``E[x x^T]`` over the beacon tokens' inputs to it; ``python -m
longjax.ckpts.lowrank --calibration FILE`` then truncates each delta in the metric of those
inputs (the stored format does not change).

  python -m longjax.beacon.calibrate --asset assets/smollm2_beacon \
      --data runs/haystack/prose.jsonl,runs/haystack/train.jsonl --docs 6 --tokens 2048 \
      --out runs/lowrank/beacon_calib.npz

Use training documents only, never the held-out set the compressed asset is judged on. ``--data``
takes train.py's ``jsonl`` records (``{"text"}`` or ``{"input", "output"}``); the first ``--docs``
records of each file with at least ``--tokens`` tokens are read, cut to ``--tokens``.
"""
from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Sequence

import numpy as np

from longjax.errors import LongjaxError

PROG = "python -m longjax.beacon.calibrate"
# Flax path of a layer's attention in the per-layer (unrolled) decoder; a trained tensor's HF name.
_LAYER = re.compile(r"layers_(\d+)/attn$")
_HF = "model.layers.{}.self_attn.beacon_{}_proj.weight"


class CalibrationError(LongjaxError, ValueError):
  """Calibration data that cannot give the moments asked for."""


def input_moments(lm, params, documents: Sequence[Sequence[int]]) -> dict:
  """``{HF name: E[x x^T] (in, in) float64}`` of the inputs of every trained projection of the
  ``BeaconLM`` ``lm`` over ``documents`` (lists of token ids, read one at a time).

  Only the beacon tokens reach those projections (the ``alt`` slots); a step's unused slots are
  not counted (their rows are zeroed, and rows of zeros are dropped)."""
  import flax.linen as nn
  import jax
  import jax.numpy as jnp
  from longjax.models.decoder import Decoder
  from longjax.runtime import program_cache
  # A per-layer decoder (same parameters, unstacked), so that each input names its layer.
  model = Decoder(lm.model.cfg, rule=lm.model.rule, impl=lm.model.impl, layer_loop="unrolled")
  saved = lm.model, lm._static
  lm.model, lm._static = model, dict(lm._static, model=model)
  sums, counts = {}, {}

  def add(name, x):
    x = np.asarray(x, np.float64).reshape(-1, x.shape[-1])
    x = x[np.any(x != 0, axis=-1)]
    sums[name] = sums.get(name, 0.0) + x.T @ x
    counts[name] = counts.get(name, 0) + len(x)

  def interceptor(next_fun, args, kwargs, context):
    # Attention._project(which, x, alt, ...): the inputs of the tokens ``alt`` selects, without
    # the padding slots (indices >= T, which the projection gathers as a clipped copy).
    m = _LAYER.search("/".join(context.module.path)) if context.method_name == "_project" else None
    which, x, alt = args[:3] if m else (None, None, None)
    if m and alt is not None and which in lm.bcfg.param:
      if alt.dtype == jnp.bool_:
        rows = jnp.where(alt[..., None], x.reshape(x.shape[:2] + (-1,)), 0)
      else:
        t = x.shape[1]
        rows = x[jnp.arange(x.shape[0])[:, None], jnp.minimum(alt, t - 1)]
        rows = jnp.where((alt < t)[..., None], rows.reshape(rows.shape[:2] + (-1,)), 0)
      jax.debug.callback(lambda v, n=_HF.format(m.group(1), which): add(n, v), rows)
    return next_fun(*args, **kwargs)

  # Programs with host callbacks cannot be exported: trace them here, outside the program cache.
  cached = program_cache.directory()
  program_cache.enable(None)
  try:
    unrolled = model.prepare_params(params)
    with nn.intercept_methods(interceptor):
      for ids in documents:
        # collect_logits: every token through every layer (a reading forward would run the
        # last layer's queries and o projection for the last raw token only)
        out = lm.forward(unrolled, np.asarray(ids, np.int32)[None], use_scan=False,
                         collect_logits=True)
        jax.block_until_ready(out.next_logits)
        jax.effects_barrier()
  finally:
    lm.model, lm._static = saved
    program_cache.enable(cached)
  return {n: sums[n] / counts[n] for n in sums}


def read_documents(files: Sequence[str], tok, per_file: int, tokens: int) -> list:
  """The first ``per_file`` records of each jsonl file with at least ``tokens`` tokens, cut."""
  docs = []
  for f in files:
    got = 0
    with open(f) as fh:
      for line in fh:
        if got == per_file:
          break
        rec = json.loads(line)
        text = rec["text"] if "text" in rec else rec.get("input", "") + rec.get("output", "")
        ids = tok.encode(text)
        if len(ids) >= tokens:
          docs.append(ids[:tokens])
          got += 1
    if got < per_file:
      raise CalibrationError(f"{f} has {got} records of at least {tokens} tokens, fewer than "
                             f"--docs {per_file}: lower --docs or --tokens, or add data")
  return docs


def save_moments(moments: dict, out, about: str) -> None:
  """Write the moments as one ``.npz`` (float32) with ``about`` (what data gave them), all or
  nothing."""
  from longjax.ckpts.lowrank import ABOUT
  out = Path(out)
  out.parent.mkdir(parents=True, exist_ok=True)
  tmp = out.with_name(f".{out.name}.partial-{os.getpid()}.npz")
  try:
    np.savez(tmp, **{n: m.astype(np.float32) for n, m in moments.items()},
             **{ABOUT: np.asarray(about)})
    os.replace(tmp, out)
  finally:
    tmp.unlink(missing_ok=True)


def main(argv=None):
  from longjax.runtime import cli
  ap = cli.parser(PROG, __doc__)
  ap.add_argument("--asset", required=True, help="a beacon asset (directory or name in assets/)")
  ap.add_argument("--data", required=True, help="comma-separated training jsonl files")
  ap.add_argument("--docs", type=int, default=6, help="documents read from each file")
  ap.add_argument("--tokens", type=int, default=2048, help="tokens per document")
  ap.add_argument("--out", required=True, help="the .npz to write")
  ap.add_argument("--debug", action="store_true", help="show tracebacks")
  args = ap.parse_args(argv)

  def run():
    if not args.out.endswith(".npz"):
      raise CalibrationError(f"--out {args.out} must end in .npz (numpy writes that name)")
    if args.docs < 1 or args.tokens < 1:
      raise CalibrationError("--docs and --tokens must be positive")
    from longjax.beacon import BeaconLM
    from longjax.beacon.asset import META, base_of, load_beacon_asset
    from longjax.ckpts import assets
    from longjax.ckpts.atomic_dir import check_output_apart
    from longjax.data.tokenizers import tokenizer_of
    from longjax.method_names import BEACON
    files = args.data.split(",")
    asset = assets.find_asset(args.asset, BEACON)
    check_output_apart(args.out, "--out", {"--asset": asset,
                                           **{f"--data {f}": f for f in files}})
    tok = tokenizer_of(base_of(asset, assets.read_json(asset / META)))
    docs = read_documents(files, tok, args.docs, args.tokens)
    cfg, bcfg, params = load_beacon_asset(asset)
    lm = BeaconLM(cfg, bcfg, max_length=args.tokens + 2 * bcfg.window, progress=False,
                  remat=False)
    moments = input_moments(lm, params, docs)
    about = (f"beacon-token inputs over {len(docs)} documents of {args.tokens} tokens (the first "
             f"{args.docs} of {', '.join(Path(f).name for f in files)})")
    save_moments(moments, args.out, about)
    print(f"wrote {args.out}: input moments of {len(moments)} projections over {len(docs)} "
          f"documents of {args.tokens} tokens")
  return cli.run(PROG, run, debug=args.debug)


if __name__ == "__main__":
  sys.exit(main())
