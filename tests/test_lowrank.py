"""Trained projections stored as low-rank deltas from the base (longjax/ckpts/lowrank.py): the
codec against the Eckart-Young error of a truncated SVD (plain and calibrated on the inputs), the
calibration of a beacon asset (longjax/beacon/calibrate.py), the loaders on low-rank and
full-tensor assets, and the committed SmolLM2 assets."""
import json

import ml_dtypes
import numpy as np
import pytest

from hf_models import save_tiny
from longjax.beacon import BeaconConfig, load_beacon
from longjax.beacon.asset import load_beacon_asset, save_beacon_asset
from longjax.ckpts import lowrank
from longjax.ckpts.assets import AssetError

NAME = "model.layers.0.self_attn.beacon_q_proj.weight"
REF = "model.layers.0.self_attn.q_proj.weight"


def _matrices(rank_of_delta=None, seed=0):
  rng = np.random.default_rng(seed)
  base = rng.normal(0, 1, (48, 40)).astype(np.float32)
  if rank_of_delta is None:
    delta = rng.normal(0, 0.1, (48, 40))
  else:
    delta = rng.normal(0, 0.3, (48, rank_of_delta)) @ rng.normal(0, 0.3, (rank_of_delta, 40))
  return base, (base + delta).astype(np.float32)


def test_codec_error_is_the_truncated_spectrum():
  """fp32 factors: the reconstruction error is exactly the energy of the dropped singular values
  (Eckart-Young), and a delta of rank <= r comes back exactly; bf16 factors stay within bf16
  rounding of that; tensors with no base projection are stored as they are."""
  base, trained = _matrices()
  emb = np.arange(6, dtype=np.float32).reshape(1, 6)
  tensors = {NAME: trained, "model.beacon_embed_tokens.weight": emb}
  s = np.linalg.svd(trained.astype(np.float64) - base, compute_uv=False)
  for r in (4, 12):
    stored, entry = lowrank.compress(tensors, {REF: base}, r, "float32")
    assert stored[NAME + lowrank.U_SUFFIX].shape == (48, r)
    assert stored[NAME + lowrank.V_SUFFIX].shape == (40, r)
    np.testing.assert_array_equal(stored["model.beacon_embed_tokens.weight"], emb)
    assert entry["rank"] == r and entry["energy_kept"] == pytest.approx(
        (s[:r] ** 2).sum() / (s ** 2).sum(), abs=1e-4)
    full = lowrank.expand(stored, entry, {REF: base}, "t")
    err = np.linalg.norm(full[NAME].astype(np.float64) - trained)
    assert err == pytest.approx(np.sqrt((s[r:] ** 2).sum()), rel=1e-4)

  base, trained = _matrices(rank_of_delta=3)
  stored, entry = lowrank.compress({NAME: trained}, {REF: base}, 3, "float32")
  np.testing.assert_allclose(lowrank.expand(stored, entry, {REF: base}, "t")[NAME], trained,
                             atol=2e-6)
  stored, entry = lowrank.compress({NAME: trained}, {REF: base}, 3, "bfloat16")
  assert stored[NAME + lowrank.U_SUFFIX].dtype == ml_dtypes.bfloat16
  got = lowrank.expand(stored, entry, {REF: base}, "t")[NAME]
  delta = trained - base
  assert np.abs(got - trained).max() < 2 ** -7 * np.abs(delta).max()


def test_calibrated_codec_is_best_for_its_inputs(tmp_path):
  """With the inputs' second moment C = E[x x^T], the factors minimise the output error
  E|(W - W') x|^2 (the dropped singular values of delta C^1/2, checked by brute force against
  every other rank-r delta tried here), beat the plain truncation on those inputs, keep a delta
  of rank <= r exactly; and a calibration file missing a tensor, or of the wrong shape, is one
  error naming the fix."""
  rng = np.random.default_rng(3)
  base, trained = _matrices()
  delta = trained.astype(np.float64) - base
  # anisotropic inputs: a few directions carry most of the energy, as in an LLM's hidden states
  x = rng.normal(0, 1, (4000, 40)) * np.geomspace(30, 0.1, 40)
  moment = x.T @ x / len(x)

  def out_err(d):
    return float(np.einsum("oi,ij,oj->", d, moment, d))

  lam, q = np.linalg.eigh(moment)
  s = np.linalg.svd(delta @ (q * np.sqrt(lam)), compute_uv=False)
  for r in (4, 12):
    stored, entry = lowrank.compress({NAME: trained}, {REF: base}, r, "float32", {NAME: moment})
    assert entry["calibration"] and entry["energy_kept"] == pytest.approx(
        (s[:r] ** 2).sum() / (s ** 2).sum(), abs=1e-4)
    got = lowrank.expand(stored, entry, {REF: base}, "t")[NAME].astype(np.float64)
    err = out_err(trained - got)
    assert err == pytest.approx((s[r:] ** 2).sum(), rel=1e-3)
    plain, pe = lowrank.compress({NAME: trained}, {REF: base}, r, "float32")
    plain_err = out_err(trained - lowrank.expand(plain, pe, {REF: base}, "t")[NAME])
    assert err < 0.7 * plain_err
    for _ in range(20):  # no other rank-r delta nearby does better on these inputs
      u, v = stored[NAME + lowrank.U_SUFFIX], stored[NAME + lowrank.V_SUFFIX]
      other = (u + rng.normal(0, 0.02, u.shape)) @ (v + rng.normal(0, 0.02, v.shape)).T
      assert out_err(delta - other) >= err * (1 - 1e-9)
  base3, trained3 = _matrices(rank_of_delta=3)
  stored, entry = lowrank.compress({NAME: trained3}, {REF: base3}, 3, "float32", {NAME: moment})
  np.testing.assert_allclose(lowrank.expand(stored, entry, {REF: base3}, "t")[NAME], trained3,
                             atol=5e-5)

  with pytest.raises(AssetError, match="no input moment.*calibrate"):
    lowrank.compress({NAME: trained}, {REF: base}, 4, "float32", {})
  with pytest.raises(AssetError, match="wrong-shaped"):
    lowrank.compress({NAME: trained}, {REF: base}, 4, "float32", {NAME: moment[:5, :5]})
  bad = tmp_path / "calib.npz"
  np.savez(bad, **{NAME: np.ones((3, 4))})
  with pytest.raises(AssetError, match="not a finite square matrix"):
    lowrank.read_calibration(bad)
  good = tmp_path / "good.npz"
  np.savez(good, **{NAME: moment, lowrank.ABOUT: np.asarray("twelve documents")})
  got, about = lowrank.read_calibration(good)
  assert about == "twelve documents" and set(got) == {NAME}
  with pytest.raises(AssetError, match="cannot read the calibration file"):
    lowrank.read_calibration(tmp_path / "missing.npz")


def test_codec_refuses_what_it_cannot_reconstruct():
  base, trained = _matrices()
  stored, entry = lowrank.compress({NAME: trained}, {REF: base}, 4)
  assert lowrank.expand({NAME: trained}, None, {}, "t") == {NAME: trained}  # full-tensor asset
  with pytest.raises(AssetError, match="no 'lowrank' entry"):
    lowrank.expand(stored, None, {REF: base}, "t")
  with pytest.raises(AssetError, match="fingerprint"):
    lowrank.expand(stored, entry, {REF: base + 1e-3}, "t")
  with pytest.raises(AssetError, match="without"):
    lowrank.expand({NAME + lowrank.U_SUFFIX: stored[NAME + lowrank.U_SUFFIX]}, entry,
                   {REF: base}, "t")
  with pytest.raises(AssetError, match="do not make"):
    lowrank.expand(stored, entry, {REF: base[:, :30]}, "t")
  with pytest.raises(AssetError, match="base model has no"):
    lowrank.expand(stored, entry, {}, "t")
  with pytest.raises(AssetError, match="format-1"):
    lowrank.expand(stored, dict(entry, format=2), {REF: base}, "t")


def _trained_beacon(tmp_path):
  _, base = save_tiny(tmp_path, "llama2")
  bcfg = BeaconConfig(window=32, stride=32, ratios=(4,), param=("q", "k", "v", "o"))
  cfg, bcfg, params = load_beacon(base, init="official", beacon=bcfg, param_dtype="float32")
  rng = np.random.default_rng(0)  # "training": a rank-2 move of every beacon matrix
  attn = params["layers"]["attn"]
  for p in "qkvo":  # kernels (layers, in..., out...): o's input is (heads, head_dim)
    k = np.asarray(attn[f"alt_{p}_proj"]["kernel"])
    m = k.reshape(k.shape[0], -1, k.shape[-1]) if p == "o" else k.reshape(*k.shape[:2], -1)
    move = (rng.normal(0, 0.2, (m.shape[0], m.shape[1], 2))
            @ rng.normal(0, 0.2, (m.shape[0], 2, m.shape[2])))
    attn[f"alt_{p}_proj"]["kernel"] = k + move.reshape(k.shape).astype(np.float32)
  return base, cfg, bcfg, params


def test_low_rank_and_full_assets_load_the_same(tmp_path):
  """A rank-4 asset of a rank-2 move reconstructs the trained tensors within bf16 rounding of the
  delta, as the full-tensor (earlier format) asset of the same params loads; on another base
  of the same shapes it is refused by the fingerprint."""
  base, cfg, bcfg, params = _trained_beacon(tmp_path)
  small = save_beacon_asset(tmp_path / "small", cfg, bcfg, params, base=str(base), rank=4)
  full = save_beacon_asset(tmp_path / "full", cfg, bcfg, params, base=str(base))
  meta = json.loads((small / "beacon.json").read_text())
  assert meta["lowrank"]["rank"] == 4 and "lowrank" not in json.loads(
      (full / "beacon.json").read_text())
  assert ((small / "beacon.safetensors").stat().st_size
          < (full / "beacon.safetensors").stat().st_size)
  _, _, a = load_beacon_asset(small)
  _, _, b = load_beacon_asset(full)
  for p in "qkvo":
    want = np.asarray(params["layers"]["attn"][f"alt_{p}_proj"]["kernel"])
    delta = np.abs(want - np.asarray(params["layers"]["attn"][f"{p}_proj"]["kernel"])).max()
    err = lambda got: np.abs(np.asarray(got["layers"]["attn"][f"alt_{p}_proj"]["kernel"])  # noqa
                             - want).max()
    assert err(a) < 2 ** -6 * delta, p  # bf16 factors of the delta
    assert err(b) <= 2 ** -8 * np.abs(want).max(), p  # the whole tensor in bf16
  import shutil
  from safetensors.numpy import load_file, save_file
  other = tmp_path / "other"  # the same base with one projection changed
  shutil.copytree(base, other)
  weights = load_file(other / "model.safetensors")
  weights[REF.replace(".0.", ".1.")] = weights[REF.replace(".0.", ".1.")] * 1.01
  save_file(weights, str(other / "model.safetensors"), metadata={"format": "pt"})
  with pytest.raises(AssetError, match="fingerprint"):
    load_beacon_asset(small, other)


@pytest.mark.parametrize("stem", ["beacon", "focus"])
def test_committed_assets_are_small_and_reconstruct(smollm2_dir, stem):
  """assets/smollm2_{beacon,focus}: <= 8 MB, every trained matrix stored as rank-32 factors (the
  beacons' calibrated on their inputs), and the loaded tensor of a layer equals base + U @ V.T
  computed here from the files."""
  from safetensors import safe_open
  from conftest import REPO
  from longjax.beacon.asset import load_beacon_asset
  from longjax.ckpts.hf import hf_tensors
  from longjax.focus.asset import load_focus_asset
  asset = REPO / "assets" / f"smollm2_{stem}"
  assert sum(f.stat().st_size for f in asset.iterdir()) <= 8_000_000
  meta = json.loads((asset / f"{stem}.json").read_text())
  assert meta["lowrank"]["rank"] == lowrank.DEFAULT_RANK
  assert ("calibration" in meta["lowrank"]) == (stem == "beacon")
  load = load_beacon_asset if stem == "beacon" else load_focus_asset
  cfg, _, params = load(asset, smollm2_dir)
  loaded = dict(hf_tensors(cfg, params))
  name = "model.layers.7.self_attn.beacon_o_proj.weight"
  with safe_open(asset / f"{stem}.safetensors", framework="np") as f:
    assert not any(k.endswith("_proj.weight") for k in f.keys())  # all as factors
    u = f.get_tensor(name + lowrank.U_SUFFIX).astype(np.float64)
    v = f.get_tensor(name + lowrank.V_SUFFIX).astype(np.float64)
  with safe_open(f"{smollm2_dir}/model.safetensors", framework="np") as f:
    ref = f.get_tensor(name.replace("beacon_", "")).astype(np.float64)
  assert u.shape == (576, lowrank.DEFAULT_RANK) and v.shape == (576, lowrank.DEFAULT_RANK)
  np.testing.assert_allclose(loaded[name], ref + u @ v.T, atol=1e-5)


def test_calibration_reads_the_beacon_inputs_and_feeds_the_codec(tmp_path):
  """longjax.beacon.calibrate: one input moment per trained projection; at layer 0 every beacon
  token's q/k/v input is the normalised beacon embedding (computed here from the HF tensors),
  so that moment is its outer product: no raw token and no padding slot is counted. The file
  written, given to compress_asset, gives an asset that records the calibration and loads."""
  from longjax.beacon import BeaconLM
  from longjax.beacon import calibrate
  from longjax.ckpts.hf import hf_tensors
  base, cfg, bcfg, params = _trained_beacon(tmp_path)
  lm = BeaconLM(cfg, bcfg, max_length=256, progress=False, remat=False)
  rng = np.random.default_rng(1)
  docs = [rng.integers(3, cfg.vocab_size, n).tolist() for n in (96, 77)]  # 77: a partial window
  moments = calibrate.input_moments(lm, params, docs)
  names = {n for n, _ in hf_tensors(cfg, params) if lowrank.reference_name(n)
           and n.endswith("_proj.weight")}
  assert set(moments) == names and len(names) == 4 * cfg.num_layers
  hf = dict(hf_tensors(cfg, params))
  emb = np.asarray(hf["model.beacon_embed_tokens.weight"], np.float64)[0]
  n = emb / np.sqrt(np.mean(emb ** 2) + cfg.rms_norm_eps)
  n = n * np.asarray(hf["model.layers.0.input_layernorm.weight"], np.float64)
  for p in "qkv":
    np.testing.assert_allclose(moments[f"model.layers.0.self_attn.beacon_{p}_proj.weight"],
                               np.outer(n, n), rtol=1e-4, atol=1e-6 * np.abs(n).max() ** 2)
  o = moments["model.layers.1.self_attn.beacon_o_proj.weight"]
  assert o.shape == (cfg.num_heads * cfg.head_dim,) * 2
  assert np.linalg.eigvalsh(o).min() > -1e-6 * np.abs(o).max()
  calib = tmp_path / "calib.npz"
  calibrate.save_moments(moments, calib, "random ids")
  full = save_beacon_asset(tmp_path / "full", cfg, bcfg, params, base=str(base))
  entry = lowrank.compress_asset(full, tmp_path / "aa", rank=2, calibration=calib)
  assert entry["calibration"] == "activation-aware: random ids"
  assert entry["energy_kept"] > 0.999  # the move is of rank 2
  _, _, got = load_beacon_asset(tmp_path / "aa")
  for p in "qkvo":
    want = np.asarray(params["layers"]["attn"][f"alt_{p}_proj"]["kernel"])
    delta = np.abs(want - np.asarray(params["layers"]["attn"][f"{p}_proj"]["kernel"])).max()
    assert np.abs(np.asarray(got["layers"]["attn"][f"alt_{p}_proj"]["kernel"]) - want).max() \
        < 2 ** -5 * delta, p
  with pytest.raises(calibrate.CalibrationError, match="fewer than --docs"):
    calibrate.read_documents([str(tmp_path / "d.jsonl")] if (tmp_path / "d.jsonl").write_text(
        '{"text": "a b"}\n') else [], _ByteTok(), 1, 100)


class _ByteTok:
  def encode(self, text):
    return list(text.encode())
