"""The main job's printed table and its side-by-side figure, from hand-made answers (no model)."""
import os
import runpy

import numpy as np
import pytest

from conftest import REPO
from longjax.eval import plots


@pytest.fixture(scope="module")
def job():
  return runpy.run_path(str(REPO / "scripts" / "smollm2_passkey.py"), run_name="imported")


def _recs():
  # 1K: keys found at depths 10 and 90, missed at 50; 2K: only depth 90 found
  out = []
  for n, found in ((1024, (1, 0, 1)), (2048, (0, 0, 1))):
    for d, f in zip((10.0, 50.0, 90.0), found):
      key = f"{n // 8 + int(d):05d}"
      answer = (f"The pass key is {key}." if f else
                "The pass key is 12345." if d == 10 else "The pass key is a\nsecret.")
      out.append(dict(length=n, depth=d, passkey=key, output=answer, acc=float(f)))
  return out


def test_table_counts_keys_found_over_keys_asked(job):
  recs = _recs()
  assert job["found_cell"](recs, 1024) == "2/3 (67 %)"
  assert job["found_cell"](recs, 2048) == "1/3 (33 %)"
  assert job["found_cell"](recs, 4096) == "-"
  header = job["table_header"]([1024, 2048], 256)
  row = job["table_row"]("truncation to W = 256", recs, [1024, 2048], 41.6)
  assert header.split() == ["condition", "1K", "(4", "x", "W)", "2K", "(8", "x", "W)", "time"]
  assert row.split() == ["truncation", "to", "W", "=", "256", "2/3", "(67", "%)", "1/3", "(33",
                         "%)", "42", "s"]
  # the columns line up under their headers
  assert row.index("2/3") == header.index("1K") and row.index("1/3") == header.index("2K")


def test_misses_and_figure_cells_say_what_was_answered(job):
  recs = _recs()
  line = job["a_miss"](recs)
  assert line.startswith("3 missed; e.g. the key 00178 at depth 50 % of 1K: ")
  assert "'The pass key is a secret.'" in line  # newlines folded: one line per condition
  assert job["a_miss"]([r for r in recs if r["acc"]]) == "no miss"
  assert job["cell_texts"](recs, [1024, 2048], [10.0, 50.0, 90.0]) == [
      ["found", "said 12345\n(key 00266)"], ["no number\n(key 00178)", "no number\n(key 00306)"],
      ["found", "found"]]


def test_asset_paths_are_shown_relative_to_the_repository(job, tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  assert job["_shown"](REPO / "assets" / "smollm2_beacon") == os.path.join("assets",
                                                                           "smollm2_beacon")
  assert job["_shown"](tmp_path / "mine") == "mine"


def test_side_by_side_heatmaps_share_one_colour_scale(tmp_path):
  import matplotlib.pyplot as plt
  lengths, depths = [1024, 2048], [10.0, 50.0, 90.0]
  panels = [dict(title="full attention", scores=np.ones((3, 2))),
            dict(title="FocusLLM", scores=np.array([[0.0, 0.5], [0.25, np.nan], [1.0, 0.0]]),
                 text=[["a", "b"], ["c", ""], ["e", "f"]])]
  fig = plots.heatmaps_figure(panels, lengths, depths, suptitle="x " * 200,
                              colorbar_ticks={0.0: "missed", 1.0: "found"})
  try:
    axes = [ax for ax in fig.axes if ax.images]
    assert [ax.get_title() for ax in axes] == ["full attention", "FocusLLM"]
    # one scale: an all-found panel is not stretched to its own range
    assert [ax.images[0].get_clim() for ax in axes] == [(0.0, 1.0), (0.0, 1.0)]
    assert len(fig.axes) == 3  # the two panels and one colour bar
    assert sorted(t.get_text() for t in axes[1].texts) == ["a", "b", "c", "e", "f"]
    # the long title is wrapped to the figure's width instead of running off both sides
    assert max(len(s) for s in fig._suptitle.get_text().split("\n")) <= fig.get_figwidth() / 0.1
  finally:
    plt.close(fig)
  path = plots.heatmaps(panels, lengths, depths, tmp_path / "fig.png")
  assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  assert sorted(p.name for p in tmp_path.iterdir()) == ["fig.png"]  # no partial file left
  with pytest.raises(ValueError, match=r"'FocusLLM': scores of shape \(2, 3\), expected \(3, 2\)"):
    plots.heatmaps_figure([dict(title="FocusLLM", scores=np.zeros((2, 3)))], lengths, depths)


def test_bad_methods_and_an_output_inside_an_asset_fail_before_the_model_loads(job, tmp_path,
                                                                               capsys):
  from longjax.atomic_dir import OutputOverlapsInput
  with pytest.raises(SystemExit) as e:
    job["main"](["--methods", "full,beacn", "--out", str(tmp_path / "o")])
  assert e.value.code == 2
  assert "--methods 'full,beacn': unknown beacn; choose among full,truncated,beacon,focus" in (
      capsys.readouterr().err)
  asset = tmp_path / "asset"
  asset.mkdir()
  with pytest.raises(OutputOverlapsInput, match="--out .* is inside the input --beacon_asset"):
    job["main"](["--out", str(asset / "out"), "--beacon_asset", str(asset)])
  assert sorted(asset.iterdir()) == [] and not (tmp_path / "o").exists()
