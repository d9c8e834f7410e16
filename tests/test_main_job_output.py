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
  from longjax.ckpts.atomic_dir import OutputOverlapsInput
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


def test_main_prints_the_table_and_writes_the_figure(job, tmp_path, monkeypatch, capsys):
  """main() end to end with the model stubbed: full attention finds every key, truncation none."""
  import json
  import types
  import longjax.ckpts.smollm2
  import transformers
  monkeypatch.setattr(longjax.ckpts.smollm2, "get", lambda: str(tmp_path / "hf"))
  monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained",
                      classmethod(lambda cls, *a, **k: None))

  class Tok:  # a prompt is its text; an answer's tokens are its characters
    def __init__(self, _):
      pass

    def prompt_ids(self, text, chat):
      return [text]

    def decode(self, tokens):
      return "".join(tokens)

  def depth_sample(tok, length, depth, info, question):
    return dict(text=info)

  def generate(method, params, prompts, **kw):
    key = prompts[0][0].split()[4].rstrip(".")  # INFO: "The pass key is KEY. ..."
    return types.SimpleNamespace(tokens=[list(f"The pass key is {key}." if method == "full"
                                              else "I do not know.")])

  g = job["main"].__globals__
  monkeypatch.setitem(g, "Tokenizer", Tok)
  monkeypatch.setitem(g, "passkey", types.SimpleNamespace(
      beacon_grid=job["passkey"].beacon_grid, depth_sample=depth_sample,
      INFO=job["passkey"].INFO, QUESTION=""))
  monkeypatch.setitem(g, "longjax", types.SimpleNamespace(generate=generate))
  monkeypatch.setitem(g, "build_methods", lambda hf_dir, window, *a: (
      types.SimpleNamespace(eos_token_id=0),
      {"full": ("full", None, None, "full attention", "the whole document"),
       "truncated": ("truncated", None, window, f"truncation to W = {window}", "the last W")}))
  out = tmp_path / "out"
  assert job["main"](["--out", str(out), "--methods", "full,truncated", "--compile_cache", "off",
                      "--lengths", "1024,2048"]) == 0
  printed = capsys.readouterr().out
  assert "Counted: keys found / keys asked (percent)" in printed
  rows = {line[:30].strip(): line[30:].split() for line in printed.splitlines()
          if line.startswith(("full attention ", "truncation to W = 256 "))}
  assert {k: v[:6] for k, v in rows.items()} == {
      "full attention": ["3/3", "(100", "%)", "3/3", "(100", "%)"],
      "truncation to W = 256": ["0/3", "(0", "%)", "0/3", "(0", "%)"]}
  assert "truncation to W = 256:      6 missed; e.g. the key" in printed
  assert f"figure: {out / 'passkey.png'} (the 2 conditions side by side)" in printed
  results = json.loads((out / "results.json").read_text())
  assert results["methods"]["full"]["per_length"] == {"1024": dict(found=3, asked=3),
                                                      "2048": dict(found=3, asked=3)}
  assert (out / "passkey.png").read_bytes()[:4] == b"\x89PNG"
  assert sorted(p.name for p in out.iterdir()) == ["passkey.png", "results.json"]
