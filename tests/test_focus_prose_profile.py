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
