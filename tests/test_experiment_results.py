"""The learning experiments' result files: a perplexity is only ever over all its documents."""
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))

import learn_passkey_real as lpr  # noqa: E402


def test_perplexity_of_a_stopped_run_is_marked_partial_not_reported():
  cell = dict(doc_nll=[2.0])
  lpr.set_ppl(cell, 4)
  assert "ppl" not in cell and cell["partial"].startswith("1 of 4 documents")
  cell["doc_nll"] += [2.5, 3.0, 2.5]
  lpr.set_ppl(cell, 4)  # resumed and finished: the mean over all four, the mark gone
  assert "partial" not in cell and math.isclose(cell["ppl"], math.exp(2.5))
