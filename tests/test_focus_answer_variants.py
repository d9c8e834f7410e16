"""experiments/focus_answer_variants.py: the answer it teacher-forces, where it marks the first
digit greedy decoding would get wrong, and its summary."""
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))

import focus_answer_variants as av  # noqa: E402


class _CharTok:
  """One token per character (SmolLM2 writes digits one per token too)."""

  def encode(self, text, special=False):
    assert special is False
    return [ord(c) for c in text]

  def decode(self, ids):
    return "".join(chr(i) for i in ids)


def test_first_wrong_digit_and_summary():
  tok = _CharTok()
  ans = av.answer_ids(tok, "3087")
  assert tok.decode(ans) == " 3087." and av.digit_steps(tok, ans) == [1, 2, 3, 4]
  nll = np.array([0.3, 0.1, 0.1, 1.2, 0.2, 0.4])
  right = np.array(ans)
  wrong = right.copy()
  wrong[3] = ord("1")  # " 301...": greedy leaves the answer at its third digit
  wrong[5] = ord("!")  # a wrong full stop does not change what RULER matches
  rec = av.sample_record(tok, 23, "3087", ans, {"method": (nll, wrong), "b32": (nll, right)})
  m, b = rec["readings"]["method"], rec["readings"]["b32"]
  assert (m["digits_greedy"], m["first_wrong"], m["greedy_there"]) == (False, 3, "1")
  assert (b["digits_greedy"], b["first_wrong"], b["greedy_there"]) == (True, None, None)
  assert m["digit_nll"] == np.mean([0.1, 0.1, 1.2, 0.2])
  assert rec["answer_tokens"] == [" ", "3", "0", "8", "7", "."]
  ok = av.sample_record(tok, 4, "3087", ans, {"method": (nll, right), "b32": (nll, right)})
  s = av.summarise([rec, ok])
  assert s["method"]["digits_greedy"] == 1 and s["method"]["missed"] == [23]
  assert s["b32"] == dict(digits_greedy=2, of=2, missed=[], mean_digit_nll=m["digit_nll"])
