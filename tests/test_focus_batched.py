"""Bounded-memory FocusLLM condensing: chunk rows condensed ``chunk_batch_size`` at a time equal
the all-at-once forward (one device and 8 fake devices), and the batch size is validated."""
from __future__ import annotations

import textwrap

import jax
import numpy as np
import pytest

from longjax.focus import FocusError, FocusLLM, split_prompt
from longjax.focus import condense as C
from longjax.focus.planner import pack_chunks
from longjax.models.decoder import Decoder

from focus_helpers import (EIGHT_DEVICE_PREAMBLE, decode_logits, padded, prompt, prompt_batch,
                           run_eight_devices, tiny_focus, tiny_model)

ALL = 1 << 20  # a batch size above any row count: the all-at-once forward


@pytest.fixture(scope="module")
def tiny():
  return tiny_model()


def _real_rows(out, ref, real, t):
  """max |diff| of condense outputs on the real rows (padding rows are never read)."""
  diffs = []
  for o, r in zip(out, ref):
    o, r = np.asarray(o)[:, real], np.asarray(r)[:, real]
    if o.ndim == 5:
      o, r = o[:, :, :t], r[:, :, :t]
    diffs.append(float(np.abs(o - r).max()))
  return max(diffs)


def test_batched_condense_equals_all_at_once(tiny):
  """8 real chunk rows + 4 padding rows; batch sizes that do not divide 12 (the last batch is
  shifted back) or that leave an all-padding batch (skipped: it stays zero)."""
  cfg, params = tiny
  f = tiny_focus()
  rows = [split_prompt(prompt(100, 0), f), split_prompt(prompt(61, 1), f)]  # 5 + 3 chunks
  cb = pack_chunks(rows, row_multiple=12, length_multiple=32)
  args = (cb.tokens, cb.positions, cb.valid, cb.lengths)
  real = cb.lengths > 0
  assert cb.n_rows == 12 and real.sum() == 8
  model = Decoder(cfg)
  ref = jax.jit(lambda *a: C.condense(model, params, *a))(*args)
  t = cb.tokens.shape[1]
  for b in (1, 3, 5):
    out = jax.jit(lambda *a: C.condense(model, params, *a, batch_size=b, capacity=t + 8))(*args)
    assert out[2].shape == ref[2].shape[:2] + (t + 8,) + ref[2].shape[3:]
    assert _real_rows(out, ref, real, t) < 1e-5, b
    assert not np.asarray(out[2])[:, :, t:].any()  # beyond the rows: zero capacity
  # batch 3: rows 9..11 are one all-padding batch, skipped.
  out = jax.jit(lambda *a: C.condense(model, params, *a, batch_size=3))(*args)
  assert not np.asarray(out[2])[:, 9:].any() and np.asarray(out[2])[:, 8].any()


def test_batched_condense_gradients(tiny):
  """The batched loop stays differentiable (FocusLoss-style use) with the same gradients."""
  cfg, params = tiny
  f = tiny_focus()
  cb = pack_chunks([split_prompt(prompt(100, 0), f)], length_multiple=32)  # 5 rows
  model = Decoder(cfg)

  def loss(p, b):
    ck, cv, _, _ = C.condense(model, p, cb.tokens, cb.positions, cb.valid, cb.lengths,
                              batch_size=b)
    return (ck ** 2).sum() + (cv * 0.5).sum()

  g_all = jax.grad(loss)(params, None)["layers"]["attn"]["alt_k_proj"]["kernel"]
  g_two = jax.grad(loss)(params, 2)["layers"]["attn"]["alt_k_proj"]["kernel"]
  np.testing.assert_allclose(np.asarray(g_two), np.asarray(g_all), rtol=1e-5, atol=1e-5)


def _run(m, params):
  prompts, tokens, lengths = prompt_batch()  # 5 + 2 + 0 chunks
  res, _ = decode_logits(m, params, tokens, lengths, 3, [[5, 17, 33], [9, 9, 41]])
  res["forward"] = m.forward(params, prompts[0], [7, 8]).logits
  return res


def test_focusllm_chunk_batch_sizes_agree(tiny):
  cfg, params = tiny
  f = tiny_focus(prompt_cap=8)
  ref = _run(FocusLLM(cfg, f, bucket=16, chunk_bucket=1, chunk_batch_size=ALL), params)
  for b in (1, 3):  # 7 chunk rows: 3 does not divide them
    m = FocusLLM(cfg, f, bucket=16, chunk_bucket=1, chunk_batch_size=b)
    assert m.chunk_batch_size == b
    got = _run(m, params)
    for key, r in ref.items():
      assert float(np.abs(got[key] - r).max()) < 1e-5, (b, key)


def test_chunk_batch_size_default_and_validation(tiny):
  cfg, _ = tiny
  f = tiny_focus()
  assert FocusLLM(cfg, f).chunk_batch_size == C.default_batch_size(jax.devices()[0].platform)
  assert C.default_batch_size("cpu") == 1
  assert C.default_batch_size("gpu") == C.default_batch_size("tpu") == C.ACCELERATOR_BATCH_SIZE
  assert FocusLLM(cfg, f, chunk_batch_size=np.int64(4)).chunk_batch_size == 4
  for bad in (0, -2, 1.5, 2.0, "4", True):
    with pytest.raises(FocusError, match=r"chunk_batch_size must be a positive integer .*"
                                         r"pass e\.g\. chunk_batch_size=1"):
      FocusLLM(cfg, f, chunk_batch_size=bad)


# ------------------------------------------------------------------------------------------------
# 8 fake devices (a subprocess: this one already initialised JAX with one CPU device).
WORKER = EIGHT_DEVICE_PREAMBLE + textwrap.dedent("""
    from test_focus_batched import sharded_run
    assert jax.device_count() == 8, jax.devices()
    np.savez({out!r}, **sharded_run())
""")


def sharded_run():
  """18 + 5 chunk rows, padded to 8 devices x 4 rows; per device 3 rows per forward (the last
  batch shifted back; devices 6 and 7 hold only padding rows: skipped). Against one device, all
  rows at once."""
  from longjax.focus import chunk_mesh
  cfg, params = tiny_model(seed=2)
  f = tiny_focus(prompt_cap=8)
  tokens, lengths = padded([prompt(300, 5), prompt(100, 6)])
  res = {}
  for name, m in [("ref", FocusLLM(cfg, f, bucket=16, chunk_batch_size=ALL)),
                  ("sharded", FocusLLM(cfg, f, mesh=chunk_mesh(8), bucket=16, chunk_batch_size=3))]:
    logits, state = m.prefill(params, tokens, lengths, 2)
    res[f"{name}_prefill"] = np.asarray(logits)
    res[f"{name}_rows"] = np.asarray(state.cache_k.shape[1])
    logits, state = m.step(params, state, np.asarray([11, 12]))
    res[f"{name}_step"] = np.asarray(logits)
    real = np.asarray(state.row_valid)
    res[f"{name}_cand_k"] = np.asarray(state.cand_k)[:, real]
  return res


def test_sharded_batched_equals_single_device(tmp_path):
  res = run_eight_devices(WORKER, tmp_path)
  assert int(res["sharded_rows"]) == 32 and int(res["ref_rows"]) == 32
  for key in ("prefill", "step", "cand_k"):
    diff = float(np.abs(res[f"sharded_{key}"] - res[f"ref_{key}"]).max())
    assert diff < 1e-5, f"{key}: sharded+batched vs single-device max |diff| {diff}"
