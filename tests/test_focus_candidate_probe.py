"""experiments/focus_candidate_probe.py: the candidate sets it reads and what it reports."""
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))

import focus_candidate_probe as fp  # noqa: E402


def test_find_needle_wants_the_digits_in_order_inside_one_chunk():
  chunks = [np.array([5, 6, 7]), np.array([1, 2, 3, 4]), np.array([3, 2, 1])]
  assert fp.find_needle(chunks, np.array([2, 3])) == 1
  assert fp.find_needle(chunks, np.array([2, 1])) == 2
  assert fp.find_needle(chunks, np.array([7, 1])) == -1  # split over two chunks: none holds it


def test_masks_keep_only_valid_slots():
  valid = np.array([[True, True, True, True, False]])  # 4 chunks, one padding slot
  top_p = [0.3, 0.9, 0.6, 0.2]
  m = fp.masks(valid, 2, top_p)
  assert set(m) == set(fp.MASKS)
  assert m["all"].tolist() == valid.tolist()
  assert np.flatnonzero(m["needle"][0]).tolist() == [2]
  assert np.flatnonzero(m["others"][0]).tolist() == [0, 1, 3]
  assert not m["none"].any()
  assert np.flatnonzero(m["surest"][0]).tolist() == [1]
  assert np.flatnonzero(m["sure"][0]).tolist() == [1, 2]  # top p >= SURE (0.5)
  no_needle = fp.masks(valid, -1, top_p)
  assert not no_needle["needle"].any() and no_needle["others"].tolist() == valid.tolist()


def test_gate_bias_is_beta_log_top_p_on_the_chunks_and_zero_after():
  b = fp.gate_bias([0.5, 1.0, 0.25], 5, 2.0)
  np.testing.assert_allclose(b, [[2 * np.log(0.5), 0.0, 2 * np.log(0.25), 0.0, 0.0]], rtol=1e-6)
  assert b.shape == (1, 5) and b.dtype == np.float32
  assert not fp.gate_bias([0.5, 0.3], 3, 0.0).any()  # strength 0: the official method
  # a threshold: chunks at least tau sure are unbiased, the others biased from tau down
  t = fp.gate_bias([0.5, 1.0, 0.25], 4, 2.0, tau=0.5)
  np.testing.assert_allclose(t, [[0.0, 0.0, 2 * np.log(0.5), 0.0]], rtol=1e-6, atol=1e-7)
  assert fp.parse_gates("8, 16@0.5") == [(8.0, 1.0), (16.0, 0.5)]
  assert fp.gate_name(16.0, 0.5) == "gate16@0.5" and fp.gate_name(8.0, 1.0) == "gate8"
  for bad in ("2,x", "-1", "8@0", "8@1.5", "8@y"):
    assert fp.parse_gates(bad) is None, bad


def test_summary_counts_right_first_digits_answers_and_the_surest_chunk():
  cell = lambda rank, greedy, p: dict(p_right=p, rank_right=rank, p_one=0.3, greedy=greedy)  # noqa: E731
  rows = [dict(all=cell(1, "4", 0.6), needle=cell(1, "4", 0.9), none=cell(5, "1", 0.1),
               chunk_reads=dict(top_p=[0.3, 0.9], needle_rank=1, needle_p_right=0.9,
                                surest_other_p_right=0.1),
               answer_all=dict(text=" 41.", right=True), answer_surest=dict(text=" 4.",
                                                                         right=False)),
          dict(all=cell(3, "1", 0.2), none=cell(4, "1", 0.1),
               chunk_reads=dict(top_p=[0.5, 0.4]))]  # needle in the local window
  s = fp.summarise(rows)
  assert s["all"] == dict(n=2, right_first=1, greedy_one=1, mean_p_right=0.4, mean_p_one=0.3)
  assert s["needle"]["n"] == 1 and "others" not in s
  assert s["chunk_reads"] == dict(n=1, needle_surest=1, mean_needle_rank=1.0,
                                  mean_needle_p_right=0.9, mean_surest_other_p_right=0.1)
  assert s["answer_all"] == dict(n=1, right=1) and s["answer_surest"] == dict(n=1, right=0)
  rows[0]["gate4"] = cell(1, "4", 0.8)
  rows[0]["answer_gate4"] = dict(text=" 41.", right=True)
  s = fp.summarise(rows)
  assert s["gate4"]["right_first"] == 1 and s["answer_gate4"] == dict(n=1, right=1)


def test_bad_input_is_one_line_before_the_model_loads(tmp_path, capsys):
  for argv, said in ((["--asset", str(tmp_path / "none")], "no such directory"),
                     (["--asset", str(tmp_path), "--samples", "0"], "--samples 0: give at least"),
                     (["--asset", str(tmp_path), "--lengths", "4k"], "--lengths 4k: give"),
                     (["--asset", str(tmp_path), "--decode", "-1"], "--decode -1: give 0"),
                     (["--asset", str(tmp_path), "--gates", "2,x"], "--gates 2,x: give"),
                     (["--asset", str(tmp_path), "--gates", "-1"], "--gates -1: give")):
    assert fp.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert said in err and len(err.splitlines()) == 1, err


def test_gain_bias_of_the_reference_probe_is_the_models_level():
  """experiments/focus_gate_reference_probe.py: ``beta * min(0, log p_i - log max(tau, kappa *
  p_ref))`` per chunk (``p_ref`` one for every chunk, or one per chunk as ``FocusConfig.gate_gain``
  computes), 0 after the chunks and at beta 0."""
  import focus_gate_reference_probe as rp
  top = [0.9, 0.3, 0.6]
  b = rp.gain_bias(top, 0.4, 5, 8.0, 0.5, 2.0)  # level max(0.5, 0.8) = 0.8
  np.testing.assert_allclose(b[0, :3], [0.0, 8 * np.log(0.3 / 0.8), 8 * np.log(0.6 / 0.8)],
                             rtol=1e-6)
  assert b.shape == (1, 5) and not b[0, 3:].any()
  low = rp.gain_bias(top, 0.1, 3, 8.0, 0.5, 2.0)  # level max(0.5, 0.2): the threshold decides
  np.testing.assert_allclose(low[0], [0.0, 8 * np.log(0.3 / 0.5), 0.0], rtol=1e-6)
  assert not rp.gain_bias(top, 0.4, 3, 0, 0.5, 2.0).any()
  # the same-token reading: one reference per chunk (the prompt's probability of its token)
  same = rp.gain_bias(top, [0.1, 0.05, 0.45], 3, 8.0, 0.5, 2.0)  # levels 0.5, 0.5, 0.9
  np.testing.assert_allclose(same[0], [0.0, 8 * np.log(0.3 / 0.5), 8 * np.log(0.6 / 0.9)],
                             rtol=1e-6)


def test_peer_reference_of_the_probe_is_the_lower_median_of_the_other_chunks():
  """The probe's peer reference (its own numpy, independent of ``condense.peer_log_reference``):
  chunk i's is the lower median over the other chunks of their probability of i's top token."""
  import focus_gate_reference_probe as rp
  p = np.array([[0.7, 0.2, 0.1], [0.1, 0.6, 0.3], [0.5, 0.1, 0.4], [0.3, 0.3, 0.4]])
  top = p.argmax(-1)  # 0, 1, 0, 2
  got = rp.peer_reference(np.log(p), top)
  np.testing.assert_allclose(got, [0.3, 0.2, 0.3, 0.3], rtol=1e-9)
  assert rp.peer_reference(np.log(p[:1]), top[:1]).tolist() == [0.0]


def test_distinctive_token_is_the_top_k_token_with_the_largest_gain_over_both_references():
  """Chunk 0's first choice (token 0) is what the prompt and the other chunks expect; its second
  (token 1) is not: token 1 is chosen, with its own probability and the larger reference."""
  import focus_gate_reference_probe as rp
  p = np.array([[0.40, 0.35, 0.15, 0.10], [0.80, 0.01, 0.12, 0.07], [0.70, 0.02, 0.18, 0.10]])
  prompt = np.log(np.array([0.6, 0.004, 0.3, 0.096]))
  ps, refs, toks = rp.distinctive(np.log(p), prompt, k=2)
  # chunk 0: token 1 (0.35 over its peers' 0.01) beats token 0 (0.40 over the peers' 0.70);
  # chunks 1 and 2: their top token (0.8 and 0.7 over the prompt's 0.6) beats token 2 (< 0.3)
  assert toks == [1, 0, 0]
  np.testing.assert_allclose(ps, [0.35, 0.8, 0.7], rtol=1e-9)
  np.testing.assert_allclose(refs, [0.01, 0.6, 0.6], rtol=1e-9)


def test_unique_token_is_measured_against_the_other_chunks_largest_probability():
  """Chunks 0 and 1 both expect token 1, which the prompt and chunk 2 do not: against the peers'
  median (with two peers, the lower one) token 1 is distinctive for both; against their largest
  it is not, and each chunk falls back to its token with the best gain over the largest peer."""
  import focus_gate_reference_probe as rp
  p = np.array([[0.30, 0.50, 0.15, 0.05], [0.35, 0.45, 0.12, 0.08], [0.80, 0.01, 0.09, 0.10]])
  prompt = np.log(np.array([0.7, 0.01, 0.1, 0.19]))
  _, _, med = rp.distinctive(np.log(p), prompt, k=3)
  assert med[:2] == [1, 1]
  ps, refs, toks = rp.distinctive(np.log(p), prompt, k=3, peers="max")
  # chunk 0: token 1 0.50 / 0.45 (chunk 1), token 0 0.30 / 0.80, token 2 0.15 / 0.12 (chunk
  # 1): token 2 wins; chunk 1: token 1 0.45 / 0.50, token 0 0.35 / 0.80, token 2 0.12 / 0.15:
  # token 1 wins; chunk 2: token 0 0.80 / 0.70 (the prompt) beats tokens 3 and 2
  assert toks == [2, 1, 0]
  np.testing.assert_allclose(ps, [0.15, 0.45, 0.80], rtol=1e-9)
  np.testing.assert_allclose(refs, [0.12, 0.50, 0.70], rtol=1e-9)


def test_runner_up_reading_weighs_each_chunk_by_its_best_margin():
  """``topk``: each of a chunk's top k tokens against ``max(tau, kappa * max(prompt, peers))``,
  the peers' lower median for the top token and their largest for a later one; the best margin
  is the chunk's. Chunk 0's top token (0.40) is what the others expect (median 0.7); its second
  (0.35) has the peers' largest 0.02 and wins; chunks 1 and 2 keep their top token."""
  import focus_gate_reference_probe as rp
  p = np.array([[0.40, 0.35, 0.15, 0.10], [0.80, 0.01, 0.12, 0.07], [0.70, 0.02, 0.18, 0.10]])
  prompt = np.log(np.array([0.6, 0.004, 0.3, 0.096]))
  margin, ps, levels, toks = rp.runner_up(np.log(p), prompt, tau=0.01, kappa=2.0, k=2)
  assert toks == [1, 0, 0]
  np.testing.assert_allclose(ps, [0.35, 0.80, 0.70], rtol=1e-9)
  # chunk 0: 2 x the peers' largest 0.02 (their median, 0.01, would give 0.02); chunks 1 and 2:
  # 2 x the prompt's 0.6 (above their peers' median 0.4)
  np.testing.assert_allclose(levels, [0.04, 1.2, 1.2], rtol=1e-9)
  np.testing.assert_allclose(margin, np.log([0.35 / 0.04, 0.8 / 1.2, 0.7 / 1.2]), rtol=1e-9)


@pytest.mark.parametrize("spec,want", [
    ("all", ("all", 0, 1.0, 0.0, None)), ("gate8", ("gate8", 8.0, 1.0, 0.0, None)),
    ("gate16@0.5", ("gate16@0.5", 16.0, 0.5, 0.0, None)),
    ("gain16@0.8x2", ("gain16@0.8x2", 16.0, 0.8, 2.0, "prompt")),
    ("same16@0.8x3", ("same16@0.8x3", 16.0, 0.8, 3.0, "same")),
    ("peer16@0.3x4", ("peer16@0.3x4", 16.0, 0.3, 4.0, "peer")), ("peer8", None),
    ("dist16@0.15x4", ("dist16@0.15x4", 16.0, 0.15, 4.0, "dist")),
    ("uniq16@0.15x4", ("uniq16@0.15x4", 16.0, 0.15, 4.0, "uniq")), ("uniq16", None),
    ("topk16@0.15x4", ("topk16@0.15x4", 16.0, 0.15, 4.0, "topk")),
    ("same16", None), ("gate8@0.5x2", None), ("same16@1.5x2", None), ("same16@0x2", None),
    ("bogus", None)])
def test_reference_probe_parses_readings(spec, want):
  """``--readings``: a gain needs a threshold and kappa, the plain gate takes none, tau is in
  (0, 1]; anything else is not a reading (the probe then exits with one error line)."""
  import focus_gate_reference_probe as rp
  assert rp.parse_reading(spec) == want
