"""scripts/heldout_curve.py: one point per step, resumable, baselines measured once."""
from __future__ import annotations

import importlib.util
import json

from conftest import REPO


def _module():
  spec = importlib.util.spec_from_file_location("heldout_curve",
                                                REPO / "scripts" / "heldout_curve.py")
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


def test_curve_grows_point_by_point_and_resumes(tmp_path, monkeypatch):
  mod = _module()
  calls, exported = [], []
  monkeypatch.setattr(mod, "export", lambda m, w, step, out, a: exported.append(step))

  def measure(method, asset, cells, samples, where):
    calls.append((method, None if asset is None else asset.name))
    return {"passkey:1024": {"score": 0.1 * len(calls), "n": samples, "seconds": 1.0}}

  monkeypatch.setattr(mod, "measure", measure)
  out = tmp_path / "curve.json"
  (tmp_path / "start").mkdir()
  argv = ["--method", "focus", "--workdir", str(tmp_path / "run"), "--steps", "20,10",
          "--init", str(tmp_path / "start"), "--out", str(out), "--cells", "passkey:1024"]
  assert mod.main(argv) == 0
  assert calls == [("truncation", None), ("focus", "start"), ("focus", "asset_20"),
                   ("focus", "asset_10")]
  assert exported == [20, 10]
  curve = json.loads(out.read_text())
  assert [p["step"] for p in curve["points"]] == [0, 10, 20]
  assert set(curve["baselines"]) == {"truncation"} and out.with_suffix(".png").exists()
  assert mod.main(argv[:5] + ["30"] + argv[6:]) == 0  # a rerun measures only the new step
  assert calls[4:] == [("focus", "asset_30")]
  assert [p["step"] for p in json.loads(out.read_text())["points"]] == [0, 10, 20, 30]


def test_a_curve_keeps_its_yardstick(tmp_path, monkeypatch, capsys):
  """Resumed without the settings, a curve measures with its own; given other ones, it refuses."""
  import pytest
  mod = _module()
  seen = []
  monkeypatch.setattr(mod, "export", lambda *a: None)
  monkeypatch.setattr(mod, "measure", lambda m, a, cells, n, w: seen.append((cells, n)) or {})
  out = tmp_path / "c.json"
  base = ["--method", "beacon", "--workdir", str(tmp_path / "run"), "--out", str(out),
          "--baselines", ""]
  assert mod.main(base + ["--steps", "5", "--cells", "passkey:1024", "--samples", "3"]) == 0
  assert mod.main(base + ["--steps", "10"]) == 0
  assert seen == [("passkey:1024", 3)] * 2
  with pytest.raises(SystemExit):
    mod.main(base + ["--steps", "15", "--samples", "5"])
  assert "measured with 3" in capsys.readouterr().err


def test_step_0_with_init_is_the_starting_asset(tmp_path, monkeypatch):
  """``--steps 0 --init DIR`` measures DIR as step 0 and exports nothing from the workdir."""
  mod = _module()
  exported = []
  monkeypatch.setattr(mod, "export", lambda m, w, step, out, a: exported.append(step))
  monkeypatch.setattr(mod, "measure", lambda method, asset, cells, samples, where: {
      "passkey:1024": {"score": 0.5, "n": samples, "seconds": 1.0}})
  out = tmp_path / "curve.json"
  (tmp_path / "start").mkdir()
  assert mod.main(["--method", "beacon", "--workdir", str(tmp_path / "run"), "--steps", "0",
                   "--init", str(tmp_path / "start"), "--out", str(out),
                   "--cells", "passkey:1024"]) == 0
  assert exported == []
  assert [p["step"] for p in json.loads(out.read_text())["points"]] == [0]


def test_reuse_copies_baselines_and_the_same_starting_point(tmp_path, monkeypatch, capsys):
  """``--reuse`` copies a same-yardstick curve's baselines, and its step 0 only when it started
  from an asset with the same bytes; another yardstick is refused."""
  import pytest
  mod = _module()
  monkeypatch.setattr(mod, "export", lambda *a: None)
  calls = []
  monkeypatch.setattr(mod, "measure", lambda method, asset, cells, samples, where: calls.append(
      method if asset is None else asset.name) or {"passkey:1024": {"score": 0.5, "n": samples}})
  start = tmp_path / "start"
  start.mkdir()
  (start / "w.safetensors").write_bytes(b"one")
  base = ["--method", "beacon", "--workdir", str(tmp_path / "run"), "--init", str(start),
          "--cells", "passkey:1024", "--baselines", "truncation,plain"]
  first = tmp_path / "first.json"
  assert mod.main(base + ["--steps", "10", "--out", str(first)]) == 0
  assert calls == ["truncation", "plain", "start", "asset_10"]
  assert json.loads(first.read_text())["init"] == mod.fingerprint(start)
  calls.clear()
  second = tmp_path / "second.json"  # the cells are left out: the reused curve's are taken
  assert mod.main(base[:6] + base[8:] + ["--steps", "20", "--out", str(second), "--reuse",
                                         str(first)]) == 0
  assert calls == ["asset_20"]  # baselines and step 0 copied
  curve = json.loads(second.read_text())
  assert [p["step"] for p in curve["points"]] == [0, 20]
  assert set(curve["baselines"]) == {"truncation", "plain"}
  (start / "w.safetensors").write_bytes(b"two")  # another starting asset: step 0 measured anew
  calls.clear()
  third = tmp_path / "third.json"
  assert mod.main(base + ["--steps", "30", "--out", str(third), "--reuse", str(first)]) == 0
  assert calls == ["start", "asset_30"]
  with pytest.raises(SystemExit, match="same yardstick"):
    mod.main(base + ["--steps", "40", "--out", str(tmp_path / "fourth.json"), "--reuse",
                     str(first), "--samples", "7"])


def test_reuse_finds_the_starting_asset_among_the_measured_steps(tmp_path, monkeypatch):
  """A run started from another run's exported step reuses that step's point as its step 0
  (every point records the sha256 of the asset it measured)."""
  mod = _module()

  def export(method, workdir, step, out, asset_args):
    out.mkdir(parents=True, exist_ok=True)
    (out / "w.safetensors").write_bytes(f"{workdir.name} {step}".encode())

  monkeypatch.setattr(mod, "export", export)
  calls = []
  monkeypatch.setattr(mod, "measure", lambda method, asset, cells, samples, where: calls.append(
      asset.name) or {"passkey:1024": {"score": 0.25 * len(calls), "n": samples}})
  start = tmp_path / "start"
  start.mkdir()
  (start / "w.safetensors").write_bytes(b"asset")
  first = tmp_path / "first.json"
  assert mod.main(["--method", "beacon", "--workdir", str(tmp_path / "run1"), "--init",
                   str(start), "--cells", "passkey:1024", "--baselines", "", "--steps", "20",
                   "--out", str(first)]) == 0
  assert calls == ["start", "asset_20"]
  step20 = tmp_path / "curve_run1" / "asset_20"
  calls.clear()
  second = tmp_path / "second.json"
  assert mod.main(["--method", "beacon", "--workdir", str(tmp_path / "run2"), "--init",
                   str(step20), "--baselines", "", "--steps", "10", "--reuse", str(first),
                   "--out", str(second)]) == 0
  assert calls == ["asset_10"]  # run1's step 20 is run2's step 0: not measured again
  points = json.loads(second.read_text())["points"]
  assert [(p["step"], p["cells"]["passkey:1024"]["score"]) for p in points] == [(0, 0.5),
                                                                                (10, 0.25)]


def test_a_missing_start_or_reused_curve_is_one_line_before_measuring(tmp_path, monkeypatch,
                                                                      capsys):
  import pytest
  mod = _module()
  measured = []
  monkeypatch.setattr(mod, "measure", lambda *a: measured.append(a) or {})
  base = ["--method", "beacon", "--workdir", str(tmp_path / "run"), "--steps", "10",
          "--out", str(tmp_path / "c.json")]
  with pytest.raises(SystemExit):
    mod.main(base + ["--init", str(tmp_path / "nowhere")])
  assert "no such asset directory" in capsys.readouterr().err
  (tmp_path / "bad.json").write_text("{not json")
  for path, msg in ((tmp_path / "absent.json", "not a readable curve"),
                    (tmp_path / "bad.json", "not a readable curve")):
    with pytest.raises(SystemExit, match=msg):
      mod.main(base + ["--reuse", str(path)])
  (tmp_path / "other.json").write_text('{"rows": []}')
  with pytest.raises(SystemExit, match="not a curve of this script"):
    mod.main(base + ["--reuse", str(tmp_path / "other.json")])
  assert measured == [] and not (tmp_path / "c.json").exists()
