"""Asking a model about a text file (``python -m longjax.beacon`` / ``python -m longjax.focus``):
assets found by name, the answer streamed as ``generate`` decodes it and cut at the end of turn,
one line for a wrong asset; and the README's API block run as written from another directory."""
from __future__ import annotations

import os
import re

import jax
import numpy as np
import pytest

import longjax
from longjax.inference import ask
from longjax.beacon import BeaconConfig, BeaconLM, load_beacon
from longjax.beacon.asset import load_beacon_asset, save_beacon_asset
from longjax.ckpts import assets
from longjax.ckpts.hf import save_hf
from longjax.data.tokenizers import get_tokenizer
from longjax.focus import FocusConfig, FocusLLM
from longjax.focus.asset import load_focus_asset, save_focus_asset
from longjax.method_names import BEACON, FOCUS
from longjax.models.config import ModelConfig
from longjax.models.decoder import init_params

from conftest import REPO, run_python
from hf_models import byte_level_tokenizer

# A tiny random LLaMA whose vocabulary holds the byte-level tokenizer's 258 ids (EOS = 1).
CFG = ModelConfig(family="llama", vocab_size=260, hidden_size=32, intermediate_size=48,
                  num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8, rms_norm_eps=1e-5,
                  bos_token_id=0, eos_token_id=1)
TEXT = "The pass key is 4711. " * 12


@pytest.fixture(scope="module")
def base(tmp_path_factory):
  d = tmp_path_factory.mktemp("ask") / "base"
  params = jax.tree.map(lambda a: np.asarray(a) * 8.0, init_params(CFG, 0))  # non-uniform logits
  save_hf(d, CFG, params)
  byte_level_tokenizer().save_pretrained(str(d))
  return d


@pytest.fixture(scope="module")
def beacon_asset(base):
  bcfg = BeaconConfig(window=32, stride=32, ratios=(4,), param=("q", "k", "v"))
  cfg, bcfg, params = load_beacon(base, init="official", beacon=bcfg, param_dtype="float32")
  return save_beacon_asset(base.parent / "beacon_asset", cfg, bcfg, params, base=str(base))


@pytest.fixture(scope="module")
def focus_asset(base):
  from longjax.focus.convert import focus_from_llama
  fcfg = FocusConfig(local_window=24, chunk_stride=16, prompt_cap=8, min_len_threshold=0)
  cfg, fcfg, params = focus_from_llama(str(base), fcfg, param_dtype="float32")
  return save_focus_asset(base.parent / "focus_asset", cfg, fcfg, params, base=str(base))


def _ask(main, asset, tmp_path, capsys, *extra):
  f = tmp_path / "text.txt"
  f.write_text(TEXT)
  rc = main(["--asset", str(asset), "--text", str(f), "--question", "What is the pass key?",
             "--max_new_tokens", "6", "--compile_cache", "off", *extra])
  out, err = capsys.readouterr()
  assert rc == 0, err
  return out, err


def _prompt(tok):
  """The CLI's prompt for TEXT (this tokenizer has no chat template: text, blank line, question)."""
  return tok.encode(TEXT + "\n\nWhat is the pass key?", special=True)


def _reference(method, params, ids, tok):
  """What ``generate`` itself answers (greedy, the CLI's stop ids: config's and tokenizer's EOS)."""
  stops = sorted({int(CFG.eos_token_id), int(tok.eos_id)})
  return longjax.generate(method, params, [ids], max_new_tokens=6, stop_ids=stops,
                          tokenizer=tok).text[0]


def test_beacon_cli_streams_what_generate_answers(beacon_asset, base, tmp_path, capsys):
  from longjax.beacon.__main__ import main
  out, err = _ask(main, beacon_asset, tmp_path, capsys)
  tok = get_tokenizer(str(base))
  ids = _prompt(tok)
  cfg, bcfg, params = load_beacon_asset(beacon_asset)
  lm = BeaconLM(cfg, bcfg, max_length=len(ids) + 6 + bcfg.window)  # the CLI's default
  text = _reference(lm, params, ids, tok)
  assert text and out == text + "\n", (out, text)
  assert f"{len(ids)} prompt tokens" in err and "peak RSS" in err and "tokens/s" in err, err
  assert "plain text (the tokenizer has no chat template)" in err


def test_focus_cli_streams_what_generate_answers(focus_asset, base, tmp_path, capsys):
  from longjax.focus.__main__ import main
  out, err = _ask(main, focus_asset, tmp_path, capsys)
  tok = get_tokenizer(str(base))
  ids = _prompt(tok)
  cfg, fcfg, params = load_focus_asset(focus_asset)
  text = _reference(FocusLLM(cfg, fcfg), params, ids, tok)
  assert text and out == text + "\n", (out, text)
  assert f"{len(ids)} prompt tokens" in err and "peak RSS" in err, err


# ------------------------------------------------------------------------------------------------
class _Pieces:
  """A tokenizer whose ids are UTF-8 bytes: a character may span several tokens."""
  eos_id = 0

  def decode(self, ids):
    return bytes(ids).decode("utf-8", errors="replace")


def test_streamer_writes_whole_characters_and_stops_at_the_stop_id():
  import io
  buf = io.StringIO()
  s = ask.Streamer(_Pieces(), stops=[0], out=buf)
  seen = []
  for t, byte in enumerate("ok é€!".encode() + b"\x00" + b"after"):
    s(t, np.array([byte]))
    seen.append(buf.getvalue())
  s.finish()
  assert buf.getvalue() == "ok é€!\n" and s.stopped
  assert not any("\ufffd" in v for v in seen)  # never half a character


def test_generate_text_leaves_the_stop_id_out():
  """``out.text`` is the answer: the stop id ends it but is not decoded into it (SmolLM2's
  ``<|im_end|>`` printed after "Paris." before)."""
  from longjax.plain import PlainLM
  params = jax.tree.map(lambda a: np.asarray(a) * 8.0, init_params(CFG, 0))
  lm, ids = PlainLM(CFG), list(range(5, 25))
  free = longjax.generate(lm, params, [ids], max_new_tokens=4)
  stop = free.tokens[0][2]
  tok = _Ids()
  out = longjax.generate(lm, params, [ids], max_new_tokens=4, stop_ids=[stop], tokenizer=tok)
  k = free.tokens[0].index(stop)
  assert out.tokens[0] == free.tokens[0][:k + 1]  # the stop id is still in the tokens
  assert out.text[0] == tok.decode(free.tokens[0][:k])


class _Ids:
  def decode(self, ids):
    return " ".join(f"<{i}>" for i in ids)


# ------------------------------------------------------------------------------------------------
def test_assets_by_name_and_wrong_kind(beacon_asset, focus_asset, monkeypatch):
  monkeypatch.setenv(assets.ASSETS_ENV, str(beacon_asset.parent))
  assert assets.find_asset("beacon_asset", BEACON) == beacon_asset
  assert assets.find_asset(str(focus_asset), FOCUS) == focus_asset
  cfg, bcfg, _ = load_beacon_asset("beacon_asset")  # the name, from any working directory
  assert bcfg.window == 32
  with pytest.raises(assets.AssetError, match="asset of FocusLLM, not of Activation Beacon"):
    load_beacon_asset("focus_asset")
  with pytest.raises(assets.AssetError, match="asset of Activation Beacon, not of FocusLLM"):
    load_focus_asset(str(beacon_asset))
  with pytest.raises(assets.AssetError) as e:
    assets.find_asset("no_such", FOCUS)
  assert "beacon_asset (Activation Beacon), focus_asset (FocusLLM)" in str(e.value)
  assert "\n" not in str(e.value)


def test_the_repository_assets_are_found_by_name(monkeypatch):
  monkeypatch.delenv(assets.ASSETS_ENV, raising=False)
  assert assets.find_asset("smollm2_beacon", BEACON) == REPO / "assets" / "smollm2_beacon"
  assert assets.find_asset("smollm2_focus", FOCUS) == REPO / "assets" / "smollm2_focus"


def test_cli_wrong_asset_is_one_line(focus_asset, tmp_path, capsys):
  from longjax.beacon.__main__ import main
  f = tmp_path / "t.txt"
  f.write_text("x")
  assert main(["--asset", str(focus_asset), "--text", str(f)]) == 1
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith("python -m longjax.beacon: error: ") \
      and "python -m longjax.focus" in err[0], err


# ------------------------------------------------------------------------------------------------
def _readme_api_block() -> str:
  readme = (REPO / "README.md").read_text()
  section = readme[readme.index("## The API in brief"):]
  m = re.search(r"```python\n(.*?)```", section, re.S)
  return m.group(1)


def test_readme_api_block_runs_as_written_from_another_directory(smollm2_dir, tmp_path):
  """The README's block, copied out of README.md, run in an empty directory on the real model:
  the three answers printed, each cut at <|im_end|> (which is not printed)."""
  (tmp_path / "api.py").write_text(_readme_api_block())
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO),
             # the suite's persistent compilation cache: a rerun loads its programs
             JAX_COMPILATION_CACHE_DIR=str(jax.config.jax_compilation_cache_dir),
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0.5")
  env.pop(assets.ASSETS_ENV, None)
  r = run_python("api.py", cwd=tmp_path, env=env, timeout=900)
  assert r.returncode == 0, r.stderr[-3000:]
  lines = r.stdout.strip().splitlines()
  assert len(lines) == 3 and all(ln.strip() for ln in lines), r.stdout
  assert "Paris" in lines[0] and not any("<|im_end|>" in ln for ln in lines), lines
