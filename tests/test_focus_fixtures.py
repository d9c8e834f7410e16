"""FocusLLM against the official reference outputs (../shared/fixtures/focusllm/<scenario>/).

Fixture root: ``$LONGJAX_FIXTURES`` if set, else the repository's sibling ``shared/fixtures``.
Every folder under ``<root>/focusllm/`` holding config.json, meta.json and weights is one scenario
(a new folder is a new test; the test id names it). Decoding is teacher-forced with the recorded
greedy tokens; ``generate`` is also run free (greedy) and must reproduce them.
"""
from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np
import pytest

from conftest import fixtures_root
from longjax.focus import FocusLLM, load_focus
from longjax.focus.losses import FocusLoss
from longjax.inference.generate import generate

LOGIT_TOL, LOSS_TOL = 1e-4, 1e-5


def _scenarios():
  base = fixtures_root() / "focusllm"
  if not base.is_dir():
    return [pytest.param(None, marks=pytest.mark.skip(
        reason=f"FocusLLM fixtures not found at {base} (set LONGJAX_FIXTURES)"), id="no-fixtures")]
  found = [d for d in sorted(base.iterdir()) if d.is_dir() and (d / "config.json").exists()
           and (d / "meta.json").exists() and list(d.glob("*.safetensors"))]
  if not found:
    return [pytest.param(None, marks=pytest.mark.skip(reason=f"no scenario folders in {base}"),
                         id="no-scenarios")]
  return [pytest.param(d, id=d.name) for d in found]


SCENARIOS = _scenarios()


@functools.lru_cache(maxsize=None)
def _load(folder: Path):
  meta = json.loads((folder / "meta.json").read_text())
  threshold = meta["settings"].get("min_len_threshold")
  over = {} if threshold is None else {"min_len_threshold": int(threshold)}
  cfg, fcfg, params = load_focus(folder, **over)
  return meta, cfg, fcfg, params, FocusLLM(cfg, fcfg)


@functools.lru_cache(maxsize=None)
def _prefill(folder: Path):
  _, _, _, params, m = _load(folder)
  return m.forward(params, np.load(folder / "input_ids.npy"))


@pytest.mark.parametrize("folder", SCENARIOS)
def test_layout_matches_meta(folder):
  meta, _, fcfg, _, m = _load(folder)
  x = np.load(folder / "input_ids.npy")
  row = m.plan(x)
  d = meta["derived"]
  assert row.n_chunks == d["n_chunks"] and row.chunk_lens == d["chunk_lens"]
  assert fcfg.prompt_len == d["dynamic_prompt_len"] and len(row.local) == d["local_len"] + 1


@pytest.mark.parametrize("folder", SCENARIOS)
def test_prefill_logits_and_candidate_kv(folder):
  out = _prefill(folder)
  ref = np.load(folder / "prefill_logits.npy")
  assert out.logits.shape == ref.shape
  assert np.abs(out.logits - ref).max() < LOGIT_TOL
  kv = np.load(folder / "candidate_kv_prefill.npy")  # [layers, K/V, C, heads, head_dim]
  np.testing.assert_allclose(out.cand_k, kv[:, 0], atol=1e-5)
  np.testing.assert_allclose(out.cand_v, kv[:, 1], atol=1e-5)


@pytest.mark.parametrize("folder", SCENARIOS)
def test_decode_cached_and_recomputed(folder):
  _, _, _, params, m = _load(folder)
  x = np.load(folder / "input_ids.npy")
  tokens, ref = np.load(folder / "tokens.npy"), np.load(folder / "step_logits.npy")
  logits, state = m.prefill(params, x[None].astype(np.int32), np.array([len(x)]), len(tokens))
  assert np.abs(np.asarray(logits)[0] - ref[0]).max() < LOGIT_TOL
  assert int(np.argmax(logits[0])) == tokens[0]
  for t in range(1, len(tokens)):
    logits, state = m.step(params, state, tokens[t - 1:t])  # teacher-forced
    assert np.abs(np.asarray(logits)[0] - ref[t]).max() < LOGIT_TOL, f"cached step {t}"
    assert int(np.argmax(logits[0])) == tokens[t]
    closed = m.recompute(params, [x], [tokens[:t]])
    assert np.abs(closed[0] - ref[t]).max() < LOGIT_TOL, f"closed-form step {t}"
    assert np.abs(closed[0] - np.asarray(logits)[0]).max() < 1e-5


@pytest.mark.parametrize("folder", SCENARIOS)
def test_generate_greedy(folder):
  _, _, _, params, m = _load(folder)
  x = np.load(folder / "input_ids.npy")
  tokens, ref = np.load(folder / "tokens.npy"), np.load(folder / "step_logits.npy")
  out = generate(m, params, x, max_new_tokens=len(tokens), return_logits=True)
  assert out.tokens[0] == tokens.tolist()
  assert np.abs(out.logits[0] - ref).max() < LOGIT_TOL


@pytest.mark.parametrize("folder", SCENARIOS)
def test_training_losses(folder):
  path = folder / "train_losses.json"
  if not path.exists():
    pytest.skip(f"{folder.name} records no training losses")
  _, cfg, fcfg, params, _ = _load(folder)
  x = np.load(folder / "input_ids.npy")
  fl = FocusLoss(cfg, fcfg)
  for name, rec in json.loads(path.read_text()).items():
    ix = dict(memory_len=rec["memory_len"], local_start=rec["local_query_start"],
              local_size=rec["local_size"], stride=rec["stride"])
    assert rec["target_index"] == ix["local_start"] + ix["local_size"]
    loss = float(fl.loss(params, fl.plan([x], [ix])))
    assert abs(loss - rec["loss"]) < LOSS_TOL, f"{name}: {loss} vs {rec['loss']}"


def _pallas_scenarios():
  """The first scenario with the Pallas kernels (interpret mode) by default; the others slow."""
  return [p if i == 0 or p.values[0] is None else
          pytest.param(*p.values, id=p.id, marks=pytest.mark.slow)
          for i, p in enumerate(SCENARIOS)]


@pytest.mark.parametrize("folder", _pallas_scenarios())
def test_fixture_pallas_interpret(folder, monkeypatch):
  """Prefill, candidate K/V and teacher-forced decoding with impl='pallas' (interpret mode)."""
  monkeypatch.setenv("LONGJAX_PALLAS_INTERPRET", "1")
  meta, cfg, fcfg, params, _ = _load(folder)
  m = FocusLLM(cfg, fcfg, impl="pallas")
  x = np.load(folder / "input_ids.npy")
  out = m.forward(params, x)
  assert np.abs(out.logits - np.load(folder / "prefill_logits.npy")).max() < LOGIT_TOL
  kv = np.load(folder / "candidate_kv_prefill.npy")
  np.testing.assert_allclose(out.cand_k, kv[:, 0], atol=1e-5)
  tokens, ref = np.load(folder / "tokens.npy"), np.load(folder / "step_logits.npy")
  logits, state = m.prefill(params, x[None].astype(np.int32), np.array([len(x)]), len(tokens))
  for t in range(1, len(tokens)):
    logits, state = m.step(params, state, tokens[t - 1:t])
    assert np.abs(np.asarray(logits)[0] - ref[t]).max() < LOGIT_TOL, f"step {t}"
    assert int(np.argmax(logits[0])) == tokens[t]
