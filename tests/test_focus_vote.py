"""FocusLLM's chunk vote (``FocusConfig.chunk_vote``, docs/focusllm.md "Chunk vote"): the
next-token distribution is the local model's times the surest chunk's own, that chunk found and
read by the frozen base over its row alone; the cached decode against the closed form; its
settings."""
from __future__ import annotations

import jax
import numpy as np
import pytest

from longjax.focus import FocusLLM
from longjax.focus.config import FocusError

from focus_helpers import padded, prompt, tiny_focus, tiny_model
from test_focus_gate import _last_logprobs

VOTE = 0.7


@pytest.fixture(scope="module")
def tiny():
  return tiny_model()


def _surest_rows(cfg, params, m, prompts):
  """Per prompt, the base's log-probabilities after its surest chunk row (the plain decoder
  over the row alone) and that row's top probability; None for a prompt without chunks."""
  out = []
  for x in prompts:
    cb, _, _ = m._pack([m.plan(x)], 0)
    gather, valid = np.asarray(cb.gather[0]), np.asarray(cb.cand_valid[0])
    rows = [np.asarray(cb.tokens[n, :int(cb.lengths[n])]) for n in gather[valid]]
    lps = [_last_logprobs(cfg, params, r) for r in rows]
    out.append(max(lps, key=lambda lp: lp.max()) if lps else None)
  return out


def _voted(local_logits, surest, weight, vote_min=0.0):
  local = np.asarray(jax.nn.log_softmax(np.asarray(local_logits, np.float64), axis=-1))
  add = [weight * s if s is not None and s.max() >= np.log(max(vote_min, 1e-300)) else 0.0
         for s in surest]
  return np.asarray(jax.nn.log_softmax(local + np.stack(
      [np.broadcast_to(a, local.shape[1:]) for a in add]), axis=-1))


@pytest.mark.parametrize("gate", [0.0, 3.0])
def test_prefill_is_the_local_model_times_the_surest_chunk(tiny, gate):
  cfg, params = tiny
  prompts = [prompt(100, 0), prompt(61, 1), prompt(20, 2)]  # 5, 3 and 0 chunks
  tokens, lengths = padded(prompts)
  voted = FocusLLM(cfg, tiny_focus(candidate_gate=gate, chunk_vote=VOTE), bucket=16)
  alone = FocusLLM(cfg, tiny_focus(candidate_gate=gate), bucket=16)
  got, _ = voted.prefill(params, tokens, lengths, 2)
  local, _ = alone.prefill(params, tokens, lengths, 2)
  surest = _surest_rows(cfg, params, alone, prompts)
  assert surest[2] is None and surest[0] is not None
  want = _voted(local, surest, VOTE)
  np.testing.assert_allclose(jax.nn.log_softmax(got, -1), want, atol=3e-5)
  assert np.abs(want[0] - np.asarray(jax.nn.log_softmax(local, -1)[0])).max() > 1e-2
  # a vote threshold above every chunk's confidence leaves the local model alone
  top = max(s.max() for s in surest if s is not None)
  mute = FocusLLM(cfg, tiny_focus(candidate_gate=gate, chunk_vote=VOTE,
                                  vote_min=float(np.exp(top)) + 1e-3), bucket=16)
  muted, _ = mute.prefill(params, tokens, lengths, 2)
  np.testing.assert_allclose(jax.nn.log_softmax(muted, -1), jax.nn.log_softmax(local, -1),
                             atol=3e-5)


def test_forward_last_row_is_the_voted_decode_distribution(tiny):
  """The closed form's last local row carries the vote: the cached decode after two steps equals
  it (each step against the closed form: test_focus_gate's cached-decode test, vote setting)."""
  cfg, params = tiny
  m = FocusLLM(cfg, tiny_focus(candidate_gate=3.0, gate_threshold=0.05, chunk_vote=VOTE,
                               vote_min=0.01), bucket=16)
  prompts = [prompt(100, 0), prompt(61, 1), prompt(20, 2)]
  tokens, lengths = padded(prompts)
  logits, state = m.prefill(params, tokens, lengths, 3)
  fed = np.random.default_rng(4).integers(3, 97, size=(2, 3))
  for g in fed:
    logits, state = m.step(params, state, g)
  out = m.forward(params, prompts[0], [int(t) for t in fed[:, 0]])
  np.testing.assert_allclose(out.logits[-1], np.asarray(logits[0]), atol=3e-5)
  alone = FocusLLM(cfg, tiny_focus(candidate_gate=3.0, gate_threshold=0.05), bucket=16)
  unvoted = alone.forward(params, prompts[0], [int(t) for t in fed[:, 0]])
  assert np.abs(out.logits[-1] - unvoted.logits[-1]).max() > 1e-3  # the vote was cast


def test_voted_device_loop_equals_host_steps(tiny):
  import longjax
  from test_generate_device import _both
  cfg, params = tiny
  m = FocusLLM(cfg, tiny_focus(chunk_vote=VOTE), bucket=16)
  host, _ = _both(m, params, [list(prompt(100, 0)), list(prompt(40, 1))], max_new_tokens=5)
  plain = longjax.generate(FocusLLM(cfg, tiny_focus(), bucket=16), params,
                           [list(prompt(100, 0)), list(prompt(40, 1))], max_new_tokens=5,
                           loop="host", return_logits=True)
  assert np.max(np.abs(jax.nn.log_softmax(host.logits[0], -1)
                       - jax.nn.log_softmax(plain.logits[0], -1))) > 1e-3  # the vote was cast


@pytest.mark.parametrize("field,value", [("chunk_vote", -1.0), ("chunk_vote", float("nan")),
                                         ("chunk_vote", True), ("vote_min", 1.0),
                                         ("vote_min", -0.1), ("vote_min", "0.5")])
def test_vote_settings_are_checked(field, value):
  with pytest.raises(FocusError, match=field):
    tiny_focus(**{field: value})


def test_only_eligible_chunks_vote():
  """``condense.chunk_vote``: the surest of the eligible chunks votes; none eligible, none does."""
  import jax.numpy as jnp
  from longjax.focus import condense as C
  rng = np.random.default_rng(0)
  hidden = jnp.asarray(rng.normal(size=(3, 4)), jnp.float32)  # rows' hidden states, head = id
  own = np.asarray(jax.nn.log_softmax(hidden, -1))
  signal = C.GateSignal(log_conf=jnp.asarray(own.max(-1)), token=jnp.asarray(own.argmax(-1)),
                        hidden=hidden)
  gather, valid = jnp.asarray([[0, 1, 2]]), jnp.asarray([[True, True, True]])
  local = jnp.asarray(rng.normal(size=(1, 4)), jnp.float32)
  lp = np.asarray(jax.nn.log_softmax(local, -1))
  order = np.argsort(-own.max(-1))

  def vote(eligible=None):
    return np.asarray(C.chunk_vote(local, signal, gather, valid, lambda h: h, 1.0,
                                   eligible=eligible))

  np.testing.assert_allclose(vote(), jax.nn.log_softmax(lp + own[order[0]], -1), atol=1e-6)
  skip_best = jnp.asarray([[i != order[0] for i in range(3)]])
  np.testing.assert_allclose(vote(skip_best), jax.nn.log_softmax(lp + own[order[1]], -1),
                             atol=1e-6)
  np.testing.assert_allclose(vote(jnp.zeros((1, 3), bool)), lp, atol=1e-6)


def test_vote_open_lets_only_chunks_the_gate_reads_whole_vote(tiny):
  """With the gate at threshold tau and no references, the gate reads a chunk at full weight
  exactly where the base is at least tau sure of it: ``vote_open`` is then ``vote_min = tau``.
  tau lies between two prompts' surest chunks, so one prompt votes and the other does not."""
  cfg, params = tiny
  prompts = [prompt(100, 0), prompt(61, 1), prompt(20, 2)]
  tokens, lengths = padded(prompts)
  alone = FocusLLM(cfg, tiny_focus(candidate_gate=3.0), bucket=16)
  tops = [s.max() for s in _surest_rows(cfg, params, alone, prompts)[:2]]
  tau = float(np.exp(np.mean(tops)))
  gate = dict(candidate_gate=3.0, gate_threshold=tau, chunk_vote=VOTE)
  got, _ = FocusLLM(cfg, tiny_focus(vote_open=True, **gate), bucket=16).prefill(
      params, tokens, lengths, 2)
  want, _ = FocusLLM(cfg, tiny_focus(vote_min=tau, **gate), bucket=16).prefill(
      params, tokens, lengths, 2)
  np.testing.assert_allclose(jax.nn.log_softmax(got, -1), jax.nn.log_softmax(want, -1),
                             atol=3e-5)
  local, _ = FocusLLM(cfg, tiny_focus(candidate_gate=3.0, gate_threshold=tau), bucket=16).prefill(
      params, tokens, lengths, 2)
  moved = np.abs(np.asarray(jax.nn.log_softmax(got, -1) - jax.nn.log_softmax(local, -1))).max(-1)
  assert (moved > 1e-3).sum() == 1 and moved[2] < 1e-5  # one prompt voted; no chunks, no vote
  with pytest.raises(FocusError, match="vote_open"):
    tiny_focus(chunk_vote=1.0, vote_open=True)  # no gate to ask
  with pytest.raises(FocusError, match="vote_open"):
    tiny_focus(candidate_gate=3.0, chunk_vote=1.0, vote_open=1)
