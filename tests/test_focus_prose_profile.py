"""experiments/focus_prose_profile.py: what it parses and how it summarises per-token costs."""
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))

import focus_prose_profile as pp  # noqa: E402


def test_variants_parse_and_bad_keys_are_refused():
  got = pp.parse_variants("truncation;b32:strength=32,cut=1.5;k1:top_k=1")
  assert got == {"truncation": {}, "b32": {"strength": 32.0, "cut": 1.5}, "k1": {"top_k": 1}}
  assert isinstance(got["k1"]["top_k"], int)
  with pytest.raises(SystemExit, match="beta=2"):
    pp.parse_variants("x:beta=2")
  with pytest.raises(SystemExit, match="strength"):
    pp.parse_variants("x:strength=")
  assert pp.parse_reading("candidate_gate=32,gate_top_k=1") == {"candidate_gate": 32.0,
                                                               "gate_top_k": 1}
  with pytest.raises(SystemExit, match="gate_floor"):
    pp.parse_reading("gate_floor=1")


class _Tok:
  def decode(self, ids):
    return "".join(chr(97 + i) for i in ids)


def test_summary_blocks_readings_and_extremes():
  docs = [dict(doc=3, target=[0, 1, 2, 3], method=[1.0, 1.0, 3.0, 1.0], b=[1.0] * 4,
               truncation=[1.0, 2.0, 1.0, 1.0]),
          dict(doc=5, target=[4, 5, 6, 7], method=[1.0, 1.0, 1.0, 1.5], b=[2.0] * 4,
               truncation=[1.0, 1.0, 1.0, 1.0])]
  s = pp.summarise(docs, 2, _Tok())
  # method - truncation: doc 3 [0, -1, 2, 0], doc 5 [0, 0, 0, 0.5]
  assert s["per_block"] == pytest.approx({"0-1": -0.25, "2-3": 0.625})
  assert s["mean_diff"] == pytest.approx(1.5 / 8)
  assert s["per_reading"]["method"]["per_doc"] == pytest.approx([0.25, 0.125])
  assert s["per_reading"]["b"]["per_doc"] == pytest.approx([-0.25, 1.0])
  assert s["worst"][0] == dict(doc=3, step=2, token="c", method=3.0, truncation=1.0, diff=2.0)
  assert s["best"][0]["step"] == 1 and s["best"][0]["diff"] == -1.0
  assert s["tokens_worse_by_1_nat"] == 1 and s["tokens_better_by_1_nat"] == 0
  assert s["loss_mass_in_top10_tokens"] == pytest.approx(1.0)
  assert np.isfinite(s["mean_diff"])


def test_variant_readings_agree_with_the_methods_own_paths():
  """On a tiny random FocusLLM read through the gate: the probe's ``method`` column is the
  method's teacher-forced NLL (its device loop), a variant that restates the asset's reading
  gives the same numbers through the probe's own local forward, and ``truncation`` (every
  candidate masked) is the plain base reading the local window."""
  import jax
  import types
  from longjax import methods
  from longjax.focus import FocusConfig
  from longjax.models.config import ModelConfig
  from longjax.models.decoder import init_params
  cfg = ModelConfig(family="llama", vocab_size=64, hidden_size=32, intermediate_size=48,
                    num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8, rms_norm_eps=1e-5,
                    bos_token_id=0, eos_token_id=1, max_position_embeddings=512)
  fcfg = FocusConfig(local_window=24, chunk_stride=16, prompt_cap=8, min_len_threshold=0,
                     bos_id=0, candidate_gate=1.0, gate_threshold=0.15, gate_gain=2.0,
                     gate_peer_gain=4.0, gate_top_k=3, chunk_overlap=4)
  reg = methods.get("focus")
  params = jax.tree_util.tree_map_with_path(
      lambda p, a: np.asarray(a) * (8.0 if "kernel" in jax.tree_util.keystr(p) else 1.0),
      init_params(cfg, 0))
  cfg, params = methods.with_extra_params(reg, cfg, params, fcfg)
  params = jax.tree.map(jax.numpy.asarray, params)
  model = types.SimpleNamespace(lm=reg.inference_model(cfg, fcfg), params=params)
  ids = np.random.default_rng(0).integers(2, 64, 90).astype(np.int32)
  n = 6
  got = pp.focus_variant_scores(model, ids, n, {"same": {"strength": 1.0}, "truncation": {},
                                                "steep": {"strength": 16.0},
                                                "mute": {"vote": 1.0, "vote_min": 1.5},
                                                "vote": {"vote": 1.0}})
  np.testing.assert_allclose(got["method"][0], pp.focus_nll(model, ids, n), atol=1e-4)
  np.testing.assert_allclose(got["same"][0], got["method"][0], atol=1e-4)
  np.testing.assert_array_equal(got["same"][1], got["method"][1])
  np.testing.assert_allclose(got["truncation"][0],
                             pp.truncation_nll(cfg, 0, 24, params, ids, n), atol=1e-4)
  # a random model is unsure at every candidate slot: the mild gate (beta 1) reads the chunks,
  # a steep one fades them to truncation
  assert np.abs(got["method"][0] - got["truncation"][0]).max() > 1e-2
  np.testing.assert_allclose(got["steep"][0], got["truncation"][0], atol=1e-3)
  # a vote no chunk is sure enough to cast changes nothing; one that is cast does
  np.testing.assert_allclose(got["mute"][0], got["method"][0], atol=1e-4)
  assert np.abs(got["vote"][0] - got["method"][0]).max() > 1e-2
  # the vote column (read on the step's own local forward) is the method read with the vote
  import dataclasses
  voted = types.SimpleNamespace(
      lm=reg.inference_model(cfg, dataclasses.replace(fcfg, chunk_vote=1.0)), params=params)
  np.testing.assert_allclose(got["vote"][0], pp.focus_nll(voted, ids, n), atol=1e-4)
