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


def test_a_finished_cell_replaces_its_stopped_version_in_the_file(tmp_path):
  """save() replaces an owned cell whole: the "partial" mark of a stopped run does not survive
  the run finishing (a merge kept it beside the final perplexity), and cells it does not own
  stay."""
  out = tmp_path / "r.json"
  lpr.save(out, {"other": {"x": 1}}, ("other",))
  res = lpr.load(out)
  cell = res.setdefault("perplexity", {}).setdefault("trained", dict(doc_nll=[2.0]))
  lpr.set_ppl(cell, 2)
  lpr.save(out, res, ("perplexity", "trained"))
  assert "partial" in lpr.load(out)["perplexity"]["trained"]
  cell["doc_nll"].append(3.0)
  lpr.set_ppl(cell, 2)
  lpr.save(out, {"perplexity": {"trained": cell}}, ("perplexity", "trained"))
  got = lpr.load(out)
  assert "partial" not in got["perplexity"]["trained"]
  assert math.isclose(got["perplexity"]["trained"]["ppl"], math.exp(2.5))
  assert got["other"] == {"x": 1}
