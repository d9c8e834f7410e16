"""Activation Beacon with stride < window (append): overlapping windows, a longjax extension.

After a full window the ``S / r`` beacons cover its first ``S`` raw tokens and its last ``W - S``
raw tokens stay raw for the next window (docs/beacon.md §2.1, ``raw_size_to_cache = W - S``; the
official code raises NameError there, so no official output exists). Pinned here: the layout by
hand, the first window against the plain decoder, and every way of feeding the same tokens (one
call, step by step, in pieces, token-by-token generation) against each other.
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

import longjax
from longjax.beacon import BeaconConfig, BeaconConfigError, BeaconLM, Planner, RowState
from longjax.models.decoder import Decoder
from tests.test_beacon import _ids, tiny_cfg, tiny_params

OVERLAP = BeaconConfig(window=16, stride=8, ratios=(2,), pos="append", attn="step-expansion",
                       sink_size=1)


@pytest.fixture(scope="module")
def model():
  cfg = tiny_cfg(alt=("q", "k", "v", "o"))
  return cfg, tiny_params(cfg, seed=3)


def test_config_accepts_append_overlap_only():
  assert OVERLAP.max_beacons_per_call == 4 and OVERLAP.query_slots == 20
  BeaconConfig(window=16, stride=8, ratios=(2, 4), pos="append")  # full-coverage too
  with pytest.raises(BeaconConfigError, match="stride == window"):
    BeaconConfig(window=16, stride=8, ratios=(2,))  # interleave
  with pytest.raises(BeaconConfigError, match="ratio 0"):
    BeaconConfig(window=16, stride=8, ratios=(0, 2), pos="append")


def test_planner_layout_by_hand():
  """W = 8, S = 4, r = 2, sink 1, 14 tokens then one token at a time (worked out by hand)."""
  bcfg = BeaconConfig(window=8, stride=4, ratios=(2,), pos="append", attn="step-expansion",
                      sink_size=1)
  steps, st = Planner(bcfg, 100, 512, 1000).plan_row(RowState(), np.arange(14) + 3)
  w0, w1, part = steps
  # window [0, 8): 8 raw tokens, then S / r = 2 beacons covering raw entries 0-1 and 0-3
  assert w0.ids.tolist() == [3, 4, 5, 6, 7, 8, 9, 10, 100, 100] and w0.full
  assert w0.pos.tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 2, 5]
  assert w0.order.tolist() == [0, 2, 4, 6, 8, 10, 12, 14, 3, 7]
  # memory keeps the 2 beacons (new slots 8, 9), then raw tokens 4-7 (slots 4-7) stay raw
  assert w0.src.tolist() == [-9, -10, -5, -6, -7, -8]
  # window [4, 12): raw region = tokens 4-7 (cached), 4 new tokens after sink + 2 beacons + 4 raw
  assert w1.ids.tolist() == [11, 12, 13, 14, 100, 100] and w1.full
  assert (w1.sink_len, w1.beacon_len, w1.raw_len) == (1, 2, 4)
  assert w1.pos.tolist() == [7, 8, 9, 10, 5, 8]
  assert w1.order.tolist() == [8, 10, 12, 14, 3, 7]  # the beacons cover cached tokens 4-7
  assert w1.src.tolist() == [-5, -6, -1, -2, -3, -4]  # beacons, then new tokens 8-11 stay raw
  assert part.ids.tolist() == [15, 16] and not part.full and part.pos.tolist() == [9, 10]
  assert st.sizes == (1, 4, 6) and st.start == 8
  # decoding: token 14 waits, token 15 completes window [8, 16)
  p = Planner(bcfg, 100, 512, 1000)
  (s14,), st = p.plan_row(st, [50])
  (s15,), st = p.plan_row(st, [51])
  assert not s14.full and s15.full and s15.ids.tolist() == [51, 100, 100]
  assert s15.src.tolist() == [-2, -3, 4, 5, 6, -1]  # beacons; raw entries 4-6 + the new token
  assert st.sizes == (1, 6, 4) and st.start == 12


def test_first_window_equals_plain_decoder(model):
  """Before any memory exists the raw tokens see exactly what the plain model sees."""
  cfg, params = model
  ids = _ids(40, 11)
  out = BeaconLM(cfg, OVERLAP, max_length=64).forward(params, ids, collect_logits=True)
  plain, _ = Decoder(cfg).apply({"params": params}, jnp.asarray(ids)[None],
                                jnp.arange(40, dtype=jnp.int32)[None])
  np.testing.assert_allclose(out.raw_logits[0][:16], plain[0, :16], atol=1e-4)
  # later tokens read beacons and a shifted window: not the plain model's logits
  assert np.max(np.abs(np.asarray(out.raw_logits[0][16:] - plain[0, 16:40]))) > 1e-2
  # and not the non-overlapping model's either
  flat = BeaconLM(cfg, OVERLAP.replace(stride=16), max_length=64).forward(
      params, ids, collect_logits=True)
  assert np.max(np.abs(np.asarray(out.raw_logits[0][16:] - flat.raw_logits[0][16:]))) > 1e-2
  assert out.state.sizes()[0].tolist() == [1, 16, 8]  # 4 full windows x 4 beacons; W - S raw


def test_every_way_of_feeding_agrees(model):
  cfg, params = model
  lm = BeaconLM(cfg, OVERLAP, max_length=128)
  ids = _ids(61, 12).tolist()
  whole = lm.forward(params, ids, collect_logits=True)
  steps = lm.forward(params, ids, collect_logits=True, use_scan=False)
  np.testing.assert_allclose(whole.raw_logits[0], steps.raw_logits[0], atol=1e-4)
  first = lm.forward(params, ids[:23])
  rest = lm.forward(params, ids[23:], state=first.state, collect_logits=True)
  np.testing.assert_allclose(rest.raw_logits[0], whole.raw_logits[0][23:], atol=1e-4)
  assert rest.state.rows == whole.state.rows
  np.testing.assert_allclose(rest.state.memory_kv(0)[0], whole.state.memory_kv(0)[0], atol=1e-4)
  # generation feeds its tokens one at a time across window boundaries (both loops)
  for loop in ("host", "device"):
    gen = longjax.generate(lm, params, ids[:19], max_new_tokens=24, return_logits=True,
                           loop=loop)
    toks = gen.tokens[0]
    again = lm.forward(params, ids[:19] + toks[:-1], collect_logits=True)
    np.testing.assert_allclose(gen.logits[0], again.raw_logits[0][18:], atol=1e-4)
    np.testing.assert_allclose(gen.state.sizes(), again.state.sizes())


def test_training_gradient_reaches_beacons_through_memory(model):
  """Training layout: the loss of later windows reads the beacons, so they get a gradient."""
  import jax
  cfg, params = model
  lm = BeaconLM(cfg, OVERLAP, max_length=64, training=True)
  ids = _ids(48, 13)
  loss, grads = jax.value_and_grad(lambda p: lm.loss(p, ids))(params)
  assert np.isfinite(float(loss))
  g = grads["layers"]["attn"]
  for p in ("q", "k", "v", "o"):
    assert float(jnp.abs(g[f"alt_{p}_proj"]["kernel"]).max()) > 0, p
  assert float(jnp.abs(grads["alt_embedding"]).max()) > 0


def test_loss_plan_runs_later_windows_narrow_and_agrees_with_forward(model):
  """The loss plan runs the steps after the first window with S + S / r query slots instead of
  W + S / r (``Schedule._width``); its loss equals the NLL of the full-width forward's logits,
  for rows of different lengths in one batch."""
  import jax
  cfg, params = model
  lm = BeaconLM(cfg, OVERLAP, max_length=128)
  rows = [_ids(61, 14).tolist(), _ids(45, 15).tolist()]
  plan = lm.schedule.plan(rows, rows)
  q = OVERLAP.query_slots
  widths = [s[2] for s in plan.segments]
  assert widths[0] == q and OVERLAP.stride_query_slots in widths[1:], plan.segments
  assert all(s[3] <= plan.labels.shape[-1] for s in plan.segments)
  total = count = 0.0
  for r in rows:
    logits = np.asarray(lm.forward(params, r, collect_logits=True).raw_logits[0])
    logp = np.asarray(jax.nn.log_softmax(jnp.asarray(logits), axis=-1))
    total += -logp[np.arange(len(r) - 1), np.asarray(r[1:])].sum()
    count += len(r) - 1
  padded = np.zeros((2, 61), np.int64)
  for i, r in enumerate(rows):
    padded[i, :len(r)] = r
  loss = lm.loss(params, padded, lengths=[61, 45])
  np.testing.assert_allclose(float(loss), total / count, rtol=1e-5)
