"""FocusLLM's chunk overlap (``FocusConfig.chunk_overlap``, docs/focusllm.md §4.6): the chunk
layout it defines (inference, training, dense training), its settings, and the prefill against
the local forward over chunk rows cut by hand from that definition."""
from __future__ import annotations

import json

import numpy as np
import pytest

from longjax.ckpts.hf import save_hf
from longjax.focus import FocusLLM, split_prompt, split_training
from longjax.focus import condense as C
from longjax.focus.asset import AssetError, load_focus_asset, save_focus_asset
from longjax.focus.config import FocusConfig, FocusError
from longjax.focus.planner import pack_chunks, pack_local, split_dense

from focus_helpers import prompt, tiny_focus, tiny_model


def _chunks(memory, stride, overlap):
  """The definition: chunk i is ``memory[max(0, i*S-O) : (i+1)*S]``."""
  n = len(memory)
  return [memory[max(0, i * stride - overlap):min((i + 1) * stride, n)]
          for i in range(-(-n // stride))]


def test_layouts_follow_the_definition():
  x = prompt(400, 0)
  f = FocusConfig(local_window=128, chunk_stride=64, min_len_threshold=0, chunk_overlap=10)
  r = split_prompt(x, f)
  assert r.chunk_lens == [64, 74, 74, 74, 26]  # as many chunks as without the overlap
  for got, want in zip(r.chunks, _chunks(x[:272], 64, 10), strict=True):
    np.testing.assert_array_equal(got, want)
  official = split_prompt(x, f.replace(chunk_overlap=0))
  np.testing.assert_array_equal(r.prompt, official.prompt)  # the prompt and local context: same
  np.testing.assert_array_equal(r.local, official.local)
  t = split_training(x, memory_len=264, local_start=264, local_size=62, stride=64, overlap=7)
  for got, want in zip(t.chunks, _chunks(x[:264], 64, 7), strict=True):
    np.testing.assert_array_equal(got, want)
  d = split_dense(x, memory_len=200, local_size=50, stride=64, overlap=7)
  for got, want in zip(d.chunks, _chunks(x[:200], 64, 7), strict=True):
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("bad", [-1, 16, 100, 2.5, True, "4"])
def test_overlap_must_be_below_the_stride(bad):
  with pytest.raises(FocusError, match="chunk_overlap must be an integer in \\[0, chunk_stride=16"):
    tiny_focus(chunk_overlap=bad)


def test_prefill_reads_the_overlapping_rows():
  """The prefill's logits equal the local forward over candidates condensed from rows built
  here from the definition; the overlap moves the logits (the rows are not the official ones)."""
  cfg, params = tiny_model()
  f = tiny_focus(chunk_overlap=6)
  x = prompt(100, 3)
  m = FocusLLM(cfg, f, bucket=16)
  got = np.asarray(m.prefill(params, x[None], np.array([len(x)], np.int32), 0)[0])

  ref_plan = split_prompt(x, f.replace(chunk_overlap=0))
  ref_plan.chunks = _chunks(x[:len(x) - f.local_window], f.chunk_stride, 6)
  cb, lb = pack_chunks([ref_plan], length_multiple=16), pack_local([ref_plan], length_multiple=16)
  ck, cv, _, _ = C.condense(m.row_model, params, cb.tokens, cb.positions, cb.valid, cb.lengths)
  want = np.asarray(C.local_next_logits(m.model, params, ck, cv, cb.gather, cb.cand_valid,
                                        lb.tokens, lb.lengths, lb.n_chunks))
  np.testing.assert_allclose(got, want, atol=2e-5, rtol=0)
  official = np.asarray(FocusLLM(cfg, tiny_focus(), bucket=16).prefill(
      params, x[None], np.array([len(x)], np.int32), 0)[0])
  assert np.abs(got - official).max() > 1e-3


def test_asset_carries_its_overlap(tmp_path):
  """Written only when on (an official asset's focus.json is unchanged), read back, and
  refused when not an integer >= 0."""
  cfg, params = tiny_model()
  base_cfg, base_params = tiny_model(projections=())
  save_hf(tmp_path / "base", base_cfg, base_params)
  base = str(tmp_path / "base")
  save_focus_asset(tmp_path / "off", cfg, tiny_focus(), params, base=base)
  assert "chunk_overlap" not in json.loads((tmp_path / "off" / "focus.json").read_text())
  save_focus_asset(tmp_path / "on", cfg, tiny_focus(chunk_overlap=4), params, base=base)
  meta = json.loads((tmp_path / "on" / "focus.json").read_text())
  assert meta["chunk_overlap"] == 4
  assert load_focus_asset(tmp_path / "on")[1].chunk_overlap == 4
  assert load_focus_asset(tmp_path / "off")[1].chunk_overlap == 0
  for bad in (-1, 2.5, "4"):
    (tmp_path / "on" / "focus.json").write_text(json.dumps(dict(meta, chunk_overlap=bad)))
    with pytest.raises(AssetError, match="'chunk_overlap' must be an integer >= 0"):
      load_focus_asset(tmp_path / "on")
