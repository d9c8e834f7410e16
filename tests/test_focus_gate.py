"""FocusLLM's candidate gate (``FocusConfig.candidate_gate``, docs/focusllm.md "Candidate gate"):
its signal against the base run on each chunk row alone, the gated prefill against the local
forward with the bias built from that reference, the cached decode against the closed form, and
its settings."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from longjax.focus import FocusLLM
from longjax.focus import condense as C
from longjax.focus.config import FocusError
from longjax.models.decoder import Decoder
from longjax.models.head import lm_head

from focus_helpers import padded, prompt, tiny_focus, tiny_model

BETA = 3.0


@pytest.fixture(scope="module")
def tiny():
  return tiny_model()


def _last_logprobs(cfg, params, ids):
  """The plain decoder (base weights only, no candidate slot) over ``ids`` alone: its
  next-token log-probabilities ``[V]`` after the last token."""
  toks = jnp.asarray(np.asarray(ids)[None])
  logits, _ = Decoder(cfg).apply({"params": params}, toks, jnp.arange(toks.shape[1])[None])
  return np.asarray(jax.nn.log_softmax(logits[0, -1]))


def _reference_reading(cfg, params, cb):
  """Per chunk row, the base over the row alone: (log of its top next-token probability, that
  token); (nan, -1) for an empty row."""
  conf, top = [], []
  for n in range(cb.tokens.shape[0]):
    length = int(cb.lengths[n])
    lp = _last_logprobs(cfg, params, cb.tokens[n, :length]) if length else None
    conf.append(np.nan if lp is None else float(lp.max()))
    top.append(-1 if lp is None else int(lp.argmax()))
  return np.array(conf), np.array(top)


def _reference_confidence(cfg, params, cb):
  return _reference_reading(cfg, params, cb)[0]


def _local_logits_with_bias(m, params, cb, lb, cap, level_gap):
  """The local model's next-token logits with each candidate's scores biased by ``BETA *
  level_gap`` of its chunk row (``level_gap [N]``: log confidence minus the gate's level,
  clipped at 0 where the gate keeps full weight): the reference the gated prefill must equal."""
  ck, cv, _, _ = m._condense(params, cb, cap)
  bias = np.where(cb.cand_valid, BETA * level_gap[np.asarray(cb.gather)], 0.0)
  return C.local_next_logits(m.model, params, ck, cv, cb.gather, cb.cand_valid, lb.tokens,
                             lb.lengths, lb.n_chunks, cand_bias=jnp.asarray(bias, jnp.float32))


def _assert_other_reading_differs(cfg, params, x, logits, **setting):
  """The gate at ``setting`` (strength ``BETA``) gives other prefill logits for prompt ``x``
  than ``logits``: the setting under test decides them."""
  other, _ = FocusLLM(cfg, tiny_focus(candidate_gate=BETA, **setting), bucket=16).prefill(
      params, x[None], np.array([len(x)], np.int32), 2)
  assert np.max(np.abs(np.asarray(logits) - np.asarray(other))) > 1e-3


def test_gated_prefill_reads_candidates_biased_by_the_base_confidence(tiny):
  cfg, params = tiny
  m = FocusLLM(cfg, tiny_focus(candidate_gate=BETA), bucket=16)
  x = prompt(100, 0)
  row = m.plan(x)
  cb, lb, cap = m._pack([row], 0)
  logits, state = m.prefill(params, x[None], np.array([len(x)], np.int32), 2)

  ref = _reference_confidence(cfg, params, cb)
  real = np.asarray(cb.lengths) > 0
  np.testing.assert_allclose(np.asarray(state.gate_signal.log_conf)[real], ref[real], atol=1e-5)
  assert np.ptp(ref[real]) > 0.05  # the rows differ: a bias that is not a constant shift

  want = _local_logits_with_bias(m, params, cb, lb, cap, np.nan_to_num(ref))
  np.testing.assert_allclose(logits, want, atol=2e-5, rtol=1e-5)
  official, _ = FocusLLM(cfg, tiny_focus(), bucket=16).prefill(params, x[None],
                                                              np.array([len(x)], np.int32), 2)
  assert np.max(np.abs(np.asarray(logits) - np.asarray(official))) > 1e-3


def test_gate_threshold_keeps_sure_chunks_at_full_weight(tiny):
  """``gate_threshold`` tau: the bias is ``beta * min(0, log p - log tau)``, so chunks at least
  tau sure are read unbiased; tau = 1 is the plain gate. tau is taken between the chunks' own
  confidences so that some rows are clipped and some are not."""
  cfg, params = tiny
  x = prompt(100, 0)
  plain = FocusLLM(cfg, tiny_focus(candidate_gate=BETA), bucket=16)
  cb, lb, cap = plain._pack([plain.plan(x)], 0)
  ref = _reference_confidence(cfg, params, cb)
  real = np.asarray(cb.lengths) > 0
  tau = float(np.exp(np.median(ref[real])))
  m = FocusLLM(cfg, tiny_focus(candidate_gate=BETA, gate_threshold=tau), bucket=16)
  logits, _ = m.prefill(params, x[None], np.array([len(x)], np.int32), 2)
  clipped = np.minimum(np.nan_to_num(ref) - np.log(tau), 0.0)
  assert (clipped[real] == 0).any() and (clipped[real] < -0.01).any()
  want = _local_logits_with_bias(m, params, cb, lb, cap, clipped)
  np.testing.assert_allclose(logits, want, atol=2e-5, rtol=1e-5)
  unclipped, _ = plain.prefill(params, x[None], np.array([len(x)], np.int32), 2)
  assert np.max(np.abs(np.asarray(logits) - np.asarray(unclipped))) > 1e-3


def test_gate_gain_measures_each_chunk_token_against_the_prompt_alone(tiny):
  """``gate_gain`` kappa: chunk i's level is ``max(log tau, log kappa + log r_i)``, ``r_i`` the
  probability that the base reading the dynamic prompt without a chunk (a reference row, not a
  candidate) gives chunk i's own top token. tau is low and kappa taken so that a chunk whose top
  token is not the prompt's keeps full weight, which a level from the prompt's own top
  probability would clip; the candidates are those of the plain gate (the reference row changes
  only the bias)."""
  cfg, params = tiny
  x = prompt(100, 0)
  plain = FocusLLM(cfg, tiny_focus(candidate_gate=BETA), bucket=16)
  row = plain.plan(x)
  cb, lb, cap = plain._pack([row], 0)
  conf, top = _reference_reading(cfg, params, cb)
  real = np.asarray(cb.lengths) > 0
  prompt_lp = _last_logprobs(cfg, params, row.prompt)
  same = np.where(real, prompt_lp[np.maximum(top, 0)], np.nan)  # log r_i per chunk row
  other = real & (top != prompt_lp.argmax())
  c = int(np.argmax(np.where(other, conf - same, -np.inf)))  # a chunk of another token
  assert other[c] and same[c] < prompt_lp.max()
  kappa = float(np.exp(conf[c] - (same[c] + prompt_lp.max()) / 2))
  tau = 1e-3
  m = FocusLLM(cfg, tiny_focus(candidate_gate=BETA, gate_threshold=tau, gate_gain=kappa),
               bucket=16)
  logits, state = m.prefill(params, x[None], np.array([len(x)], np.int32), 2)
  ref_row = int(np.asarray(state.ref_row)[0])
  assert ref_row == row.n_chunks  # after the prompt's chunk rows, and not among its candidates
  assert ref_row not in np.asarray(state.gather)[np.asarray(state.cand_valid)]
  np.testing.assert_array_equal(np.asarray(state.gate_signal.token)[real], top[real])

  level = np.maximum(np.log(tau), np.log(kappa) + same)
  assert (level[real] > np.log(tau)).all()  # the reference decides
  clipped = np.nan_to_num(np.minimum(conf - level, 0.0))
  assert clipped[c] == 0 and (clipped[real] < -0.01).any()
  assert conf[c] - np.log(kappa) - prompt_lp.max() < -0.01  # the prompt's top would clip it
  want = _local_logits_with_bias(plain, params, cb, lb, cap, clipped)  # plain's candidates
  np.testing.assert_allclose(logits, want, atol=2e-5, rtol=1e-5)
  unreferenced, _ = plain.prefill(params, x[None], np.array([len(x)], np.int32), 2)
  assert np.max(np.abs(np.asarray(logits) - np.asarray(unreferenced))) > 1e-3


def test_gate_gain_cached_decode_equals_the_closed_form(tiny):
  """The reference rows are stepped with the generated tokens like the chunk rows (prompts of
  5, 3 and 0 chunks: the last has no reference row)."""
  cfg, params = tiny
  m = FocusLLM(cfg, tiny_focus(candidate_gate=BETA, gate_threshold=0.01, gate_gain=1.5),
               bucket=16)
  prompts = [prompt(100, 0), prompt(61, 1), prompt(20, 2)]
  tokens, lengths = padded(prompts)
  logits, state = m.prefill(params, tokens, lengths, 3)
  assert np.asarray(state.ref_row).tolist()[2] == -1
  np.testing.assert_allclose(logits, m.recompute(params, prompts, [[]] * 3), atol=2e-5)
  fed = [[], [], []]
  for g in np.random.default_rng(1).integers(3, 97, size=(2, 3)):
    for i in range(3):
      fed[i].append(int(g[i]))
    logits, state = m.step(params, state, g)
    np.testing.assert_allclose(logits, m.recompute(params, prompts, fed), atol=2e-5)
    # the reference row reads the prompt alone with the tokens generated so far: its hidden
    # state gives that reading's whole distribution
    row = m.plan(prompts[0], fed[0])
    ref_h = np.asarray(state.gate_signal.hidden)[int(state.ref_row[0])]
    np.testing.assert_allclose(jax.nn.log_softmax(lm_head(cfg, params, jnp.asarray(ref_h))),
                               _last_logprobs(cfg, params, row.prompt), atol=1e-4)


def test_peer_reference_is_the_lower_median_of_the_other_chunks():
  """``peer_log_reference``: for slot i, the lower median over the prompt's *other valid* slots j
  of ``log p_j(y_i)``; -inf for a prompt's only chunk. Each row's distribution is given
  directly."""
  rng = np.random.default_rng(3)
  logp = np.log(rng.dirichlet(np.ones(6), size=7)).astype(np.float32)  # 7 rows, 6 tokens
  top = logp.argmax(-1)
  gather = np.array([[0, 1, 2, 3, 4], [5, 6, 0, 0, 0]], np.int32)
  valid = np.array([[1, 1, 1, 1, 1], [1, 0, 0, 0, 0]], bool)
  got = np.asarray(C.peer_log_reference(jnp.asarray(logp), jnp.asarray(top[gather], jnp.int32),
                                        jnp.asarray(gather), jnp.asarray(valid)))
  for i in range(5):
    others = sorted(logp[gather[0, j], top[gather[0, i]]] for j in range(5) if j != i)
    assert got[0, i] == pytest.approx(others[1], abs=1e-6)  # 4 others: the 2nd smallest
  assert got[1, 0] == -np.inf
  assert np.ptp(got[0]) > 0.1  # the slots differ: not one value for every chunk


def test_peer_reference_max_is_the_largest_of_the_other_chunks_for_each_of_k_tokens():
  """``statistic="max"`` with ``[B, Cmax, K]`` tokens: for slot i and each of its K tokens, the
  largest over the prompt's other valid slots j of ``log p_j(y)``; -inf for a prompt's only
  chunk; the median with K tokens equals the median of each token alone."""
  rng = np.random.default_rng(4)
  logp = np.log(rng.dirichlet(np.ones(6), size=7)).astype(np.float32)
  top3 = np.argsort(-logp, axis=-1)[:, :3]  # each row's 3 most likely tokens
  gather = np.array([[0, 1, 2, 3, 4], [5, 6, 0, 0, 0]], np.int32)
  valid = np.array([[1, 1, 1, 1, 1], [1, 0, 0, 0, 0]], bool)
  args = (jnp.asarray(logp), jnp.asarray(top3[gather], jnp.int32), jnp.asarray(gather),
          jnp.asarray(valid))
  got = np.asarray(C.peer_log_reference(*args, statistic="max"))
  assert got.shape == (2, 5, 3)
  for i in range(5):
    for k in range(3):
      y = top3[gather[0, i], k]
      want = max(logp[gather[0, j], y] for j in range(5) if j != i)
      assert got[0, i, k] == pytest.approx(want, abs=1e-6)
  assert (got[1, 0] == -np.inf).all()
  med = np.asarray(C.peer_log_reference(*args))
  for k in range(3):
    one = C.peer_log_reference(args[0], args[1][..., k], args[2], args[3])
    np.testing.assert_array_equal(med[..., k], np.asarray(one))
  assert (got[0] > med[0]).any()  # the largest is not the median


def _row_logprobs(cfg, params, cb):
  """Per chunk row, the base's next-token log-probabilities ``[V]`` over the row alone (nan
  for an empty row)."""
  return np.stack([_last_logprobs(cfg, params, cb.tokens[n, :int(cb.lengths[n])])
                   if int(cb.lengths[n]) else np.full(cfg.vocab_size, np.nan)
                   for n in range(cb.tokens.shape[0])])


def test_gate_peer_gain_measures_each_chunk_token_against_the_other_chunks(tiny):
  """``gate_peer_gain`` kappa_p: chunk i's level is ``max(log tau, log kappa_p + log m_i)``,
  ``m_i`` the median over the prompt's other chunks of their probability of chunk i's top
  token, each read by the base over its own row. kappa_p is taken so that some chunks keep full
  weight and some are clipped; no reference row is needed."""
  cfg, params = tiny
  x = prompt(100, 0)
  plain = FocusLLM(cfg, tiny_focus(candidate_gate=BETA), bucket=16)
  row = plain.plan(x)
  cb, lb, cap = plain._pack([row], 0)
  lp = _row_logprobs(cfg, params, cb)
  real = np.flatnonzero(np.asarray(cb.lengths) > 0)
  assert len(real) >= 4
  conf, top = lp[real].max(-1), lp[real].argmax(-1)
  peer = np.array([sorted(lp[real[j], top[i]] for j in range(len(real)) if j != i)[
      (len(real) - 2) // 2] for i in range(len(real))])
  gap = conf - peer
  kappa = float(np.exp(np.median(gap)))
  tau = 1e-3
  m = FocusLLM(cfg, tiny_focus(candidate_gate=BETA, gate_threshold=tau, gate_peer_gain=kappa),
               bucket=16)
  logits, state = m.prefill(params, x[None], np.array([len(x)], np.int32), 2)
  assert state.ref_row is None  # the peers need no reference row
  level = np.maximum(np.log(tau), np.log(kappa) + peer)
  clipped = np.zeros(cb.tokens.shape[0])
  clipped[real] = np.minimum(conf - level, 0.0)
  assert (clipped[real] == 0).any() and (clipped[real] < -0.01).any()
  want = _local_logits_with_bias(plain, params, cb, lb, cap, clipped)
  np.testing.assert_allclose(logits, want, atol=2e-5, rtol=1e-5)
  # the prompt's own reading as the reference instead gives other logits: the peers decide
  _assert_other_reading_differs(cfg, params, x, logits, gate_threshold=tau, gate_gain=kappa)


def test_gate_top_k_weighs_each_chunk_by_the_best_of_its_k_tokens(tiny):
  """``gate_top_k`` K: chunk i's bias is ``beta * min(0, max_k (log p_i(y_k) - level(y_k)))``
  over its K most likely tokens, ``level(y) = max(log tau, log kappa_p + log m_i(y))`` with
  ``m_i`` the other chunks' lower median of ``p_j(y)`` for the top token and their largest for a
  later one, each row read by the base alone. kappa_p is taken so that some chunk keeps full
  weight only through a token after its first."""
  cfg, params = tiny
  x = prompt(140, 2)  # 8 chunks
  plain = FocusLLM(cfg, tiny_focus(candidate_gate=BETA), bucket=16)
  cb, lb, cap = plain._pack([plain.plan(x)], 0)
  lp = _row_logprobs(cfg, params, cb)
  real = np.flatnonzero(np.asarray(cb.lengths) > 0)
  assert len(real) == 8
  k, tau = 3, 1e-3
  tops = np.argsort(-lp[real], axis=-1)[:, :k]  # [C, K]
  def peer(i, y, rank):  # the other chunks' lower median (the top token) or largest
    others = sorted(lp[real[j], y] for j in range(len(real)) if j != i)
    return others[(len(others) - 1) // 2] if rank == 0 else others[-1]

  gap = np.array([[lp[real[i], y] - peer(i, y, r) for r, y in enumerate(tops[i])]
                  for i in range(len(real))])  # [C, K]: log p_i(y) - log m_i(y)
  # kappa_p just under the best later gap of a chunk whose first is lower: that chunk keeps full
  # weight through a later token only, and the chunk clipping the most others is taken
  later = gap[:, 1:].max(-1) - 0.01
  fits = np.flatnonzero(later > gap[:, 0] + 0.01)
  i = int(fits[np.argmax([(gap.max(-1) < later[c]).sum() for c in fits])])
  kappa = float(np.exp(later[i]))
  m = FocusLLM(cfg, tiny_focus(candidate_gate=BETA, gate_threshold=tau, gate_peer_gain=kappa,
                               gate_top_k=k), bucket=16)
  logits, _ = m.prefill(params, x[None], np.array([len(x)], np.int32), 2)
  conf = np.take_along_axis(lp[real], tops, axis=-1)
  level = np.maximum(np.log(tau), np.log(kappa) + conf - gap)
  clipped = np.zeros(cb.tokens.shape[0])
  clipped[real] = np.minimum((conf - level).max(-1), 0.0)
  assert clipped[real][i] == 0 and (conf - level)[i, 0] < 0  # kept by a later token
  assert (clipped[real] < -0.01).sum() >= 2  # others are clipped
  want = _local_logits_with_bias(plain, params, cb, lb, cap, clipped)
  np.testing.assert_allclose(logits, want, atol=2e-5, rtol=1e-5)
  # its top token alone gives other logits: the later tokens decide
  _assert_other_reading_differs(cfg, params, x, logits, gate_threshold=tau, gate_peer_gain=kappa)


@pytest.mark.parametrize("value", [0, -1, 2.0, True, "3"])
def test_gate_top_k_must_be_a_positive_integer(value):
  with pytest.raises(FocusError, match="gate_top_k must be an integer >= 1"):
    tiny_focus(candidate_gate=1.0, gate_top_k=value)


@pytest.mark.parametrize("value", [-1.0, float("nan"), float("inf"), True, "2"])
def test_gate_peer_gain_must_be_a_finite_non_negative_number(value):
  with pytest.raises(FocusError, match="gate_peer_gain must be a finite number >= 0"):
    tiny_focus(candidate_gate=1.0, gate_peer_gain=value)


@pytest.mark.parametrize("value", [-1.0, float("nan"), float("inf"), True, "2"])
def test_gate_gain_must_be_a_finite_non_negative_number(value):
  with pytest.raises(FocusError, match="gate_gain must be a finite number >= 0"):
    tiny_focus(candidate_gate=1.0, gate_gain=value)


@pytest.mark.parametrize("value", [0.0, 1.5, -0.2, float("nan"), True, "0.5"])
def test_gate_threshold_must_be_in_zero_one(value):
  with pytest.raises(FocusError, match="gate_threshold must be a number in \\(0, 1\\]"):
    tiny_focus(candidate_gate=1.0, gate_threshold=value)


@pytest.mark.parametrize("setting,steps,seed", [
    (dict(), 3, 0),
    # both references: the prompt's row and the other chunks
    (dict(gate_threshold=0.01, gate_gain=1.5, gate_peer_gain=2.0), 2, 2),
    # and each chunk's best of its 3 most likely tokens
    (dict(gate_threshold=0.01, gate_gain=1.5, gate_peer_gain=2.0, gate_top_k=3), 2, 3),
    # and the chunk vote (docs/focusllm.md "Chunk vote") on the gated reading
    (dict(gate_threshold=0.05, chunk_vote=0.7, vote_min=0.01), 2, 4)])
def test_gated_cached_decode_equals_the_gated_closed_form(tiny, setting, steps, seed):
  """Each decode step equals the gated forward over the prompt and the tokens fed so far."""
  cfg, params = tiny
  m = FocusLLM(cfg, tiny_focus(candidate_gate=BETA, **setting), bucket=16)
  prompts = [prompt(100, 0), prompt(61, 1), prompt(20, 2)]  # 5, 3 and 0 chunks
  tokens, lengths = padded(prompts)
  logits, state = m.prefill(params, tokens, lengths, steps + 1)
  np.testing.assert_allclose(logits, m.recompute(params, prompts, [[]] * 3), atol=2e-5)
  fed = [[], [], []]
  for g in np.random.default_rng(seed).integers(3, 97, size=(steps, 3)):
    for i in range(3):
      fed[i].append(int(g[i]))
    logits, state = m.step(params, state, g)
    np.testing.assert_allclose(logits, m.recompute(params, prompts, fed), atol=2e-5)


def test_official_method_carries_no_gate(tiny):
  cfg, params = tiny
  x = prompt(100, 0)
  _, state = FocusLLM(cfg, tiny_focus(), bucket=16).prefill(params, x[None],
                                                            np.array([len(x)], np.int32), 1)
  assert state.gate_signal is None


@pytest.mark.parametrize("value", [-1.0, float("nan"), float("inf"), True, "2"])
def test_gate_strength_must_be_a_finite_non_negative_number(value):
  with pytest.raises(FocusError, match="candidate_gate"):
    tiny_focus(candidate_gate=value)


def test_gate_on_a_one_device_chunk_mesh_equals_no_mesh(tiny):
  """The sharded signal and step (``slot_gate_signal_sharded``) on a 1-device chunk mesh give
  the unsharded gated logits (tests/test_focus_sharded.py runs 8 devices in a subprocess)."""
  from focus_helpers import decode_logits, prompt_batch
  cfg, params = tiny
  _, tokens, lengths = prompt_batch()
  feeds = np.asarray([[5, 17, 33], [9, 9, 41]])
  ref, _ = decode_logits(FocusLLM(cfg, tiny_focus(candidate_gate=BETA), bucket=16), params,
                         tokens, lengths, 3, feeds)
  got, _ = decode_logits(FocusLLM(cfg, tiny_focus(candidate_gate=BETA), bucket=16,
                                  mesh=C.chunk_mesh(1)), params, tokens, lengths, 3, feeds)
  for key in ref:
    np.testing.assert_allclose(got[key], ref[key], atol=1e-5, rtol=0, err_msg=key)


def test_gated_dense_training_reads_the_inference_bias(tiny):
  """A dense training batch (docs/focusllm.md §5.3) under the gate: every local row's
  log-probabilities equal the inference functions' (whole-row condensing, local forward) with the
  bias built from the reference confidence; the gate moves them."""
  from longjax.focus.losses import DenseBatch, FocusLoss, pack_dense_targets
  from longjax.focus.planner import pack_chunks, pack_local, split_dense
  cfg, params = tiny
  f = tiny_focus(candidate_gate=BETA)
  xs, spans = [prompt(110, 5), prompt(75, 6)], [(60, 24), (33, 20)]
  rows = [split_dense(x, memory_len=a, local_size=ls, stride=f.chunk_stride,
                      prompt_cap=f.prompt_cap, bos_id=f.bos_id) for x, (a, ls) in zip(xs, spans)]
  lb = pack_local(rows, length_multiple=16)
  cb = pack_chunks(rows, length_multiple=16)
  batch = DenseBatch(cb, lb, pack_dense_targets(rows, lb.tokens.shape[1]))
  got = np.asarray(FocusLoss(cfg, f, bucket=16).dense_logq(params, batch))

  model = Decoder(cfg)
  ck, cv, _, _ = C.condense(C.row_decoder(model), params, cb.tokens, cb.positions, cb.valid,
                            cb.lengths)
  ref = np.nan_to_num(_reference_confidence(cfg, params, cb))
  bias = np.where(cb.cand_valid, BETA * ref[np.asarray(cb.gather)], 0.0).astype(np.float32)
  h = C.local_hidden(model, params, ck, cv, cb.gather, cb.cand_valid, lb.tokens, lb.lengths,
                     lb.n_chunks, cand_bias=jnp.asarray(bias))
  want = np.asarray(jax.nn.log_softmax(lm_head(cfg, params, h)))
  off = np.asarray(FocusLoss(cfg, tiny_focus(), bucket=16).dense_logq(params, batch))
  for b, (_, ls) in enumerate(spans):
    np.testing.assert_allclose(got[b, :ls + 1], want[b, :ls + 1], atol=1e-4)
    assert np.max(np.abs(got[b, :ls + 1] - off[b, :ls + 1])) > 1e-3
