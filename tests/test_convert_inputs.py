"""convert_weights.py on hostile inputs: FIFOs, symlink loops, impossible shard sizes and a full
disk each end in one line, leaving nothing behind."""
import contextlib
import errno
import os
import threading
from pathlib import Path

import pytest

from test_untrusted_files import _tiny_longjax, _tree


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
  from longjax.ckpts import checkpoint
  from longjax.ckpts import save_hf
  d = tmp_path_factory.mktemp("src")
  lj = _tiny_longjax(d / "lj")
  cfg, params, _ = checkpoint.load(lj)
  hf = save_hf(d / "hf", cfg, params)
  return Path(lj), Path(hf)


@contextlib.contextmanager
def _fifo(path):
  """A FIFO at ``path`` with a writer that feeds it garbage should anything open it, so that code
  which reads it fails instead of blocking the test forever (as it would for a user)."""
  os.mkfifo(path)

  def feed():
    try:
      with open(path, "wb") as w:
        w.write(b"{garbage")
    except OSError:
      pass
  writer = threading.Thread(target=feed, daemon=True)
  writer.start()
  try:
    yield path
  finally:  # release the writer if nothing read the FIFO: a reader open while it writes
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    writer.join()
    os.close(fd)


@pytest.mark.parametrize("name", ["model.safetensors", "config.json"])
def test_fifo_input_is_refused_not_read(sources, tmp_path, capsys, name):
  from convert_weights import main
  _, hf = sources
  (tmp_path / "hf").mkdir()
  for f in hf.iterdir():
    if f.name != name:
      (tmp_path / "hf" / f.name).write_bytes(f.read_bytes())
  with _fifo(tmp_path / "hf" / name):
    assert main(["--hf_dir", str(tmp_path / "hf"), "--out", str(tmp_path / "out")]) == 1
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "is not a regular file" in err[0] and name in err[0], err
  assert not (tmp_path / "out").exists()


def test_longjax_config_fifo_is_refused(sources, tmp_path):
  import shutil
  from longjax.ckpts import checkpoint
  from longjax.models.config import ModelConfigError
  lj, _ = sources
  shutil.copytree(lj, tmp_path / "lj")
  (tmp_path / "lj" / "config.json").unlink()
  with _fifo(tmp_path / "lj" / "config.json"):
    with pytest.raises(ModelConfigError, match="not a regular file"):
      checkpoint.load(tmp_path / "lj")


def test_out_symlink_loop_is_one_line(sources, tmp_path, capsys):
  from convert_weights import main
  lj, _ = sources
  loop = tmp_path / "loop"
  os.symlink(loop, loop)
  assert main(["--longjax_dir", str(lj), "--hf_out", str(loop)]) == 1
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "symlink loop" in err[0], err


@pytest.mark.parametrize("gb", ["nan", "inf", "-1", "0", "x"])
def test_impossible_shard_size_is_refused(sources, tmp_path, capsys, gb):
  from convert_weights import main
  lj, _ = sources
  with pytest.raises(SystemExit) as e:
    main(["--longjax_dir", str(lj), "--hf_out", str(tmp_path / "o"), f"--max_shard_gb={gb}"])
  assert e.value.code == 2 and "not a positive number of GiB" in capsys.readouterr().err
  assert not (tmp_path / "o").exists()


def _full(*a, **k):
  raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_disk_full_is_one_line_and_leaves_nothing(sources, tmp_path, capsys, monkeypatch):
  """A full disk while writing shards (safetensors' OSError) or a longjax checkpoint
  (tensorstore reports it as a ValueError): one line, no partial output."""
  import orbax.checkpoint as ocp
  from convert_weights import main
  from longjax.ckpts import hf as hf_mod
  lj, hf = sources
  out = tmp_path / "out"
  out.mkdir()
  real_save = hf_mod.save_file

  def save_then_full(tensors, path, **kw):  # a shard half written, then the disk is full
    real_save(tensors, path, **kw)
    Path(path).write_bytes(Path(path).read_bytes()[:100])
    _full()
  monkeypatch.setattr(hf_mod, "save_file", save_then_full)
  assert main(["--longjax_dir", str(lj), "--hf_out", str(out / "hf")]) == 1
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "No space left on device" in err[0] and "nothing was written" in err[0]

  def tensorstore_full(*a, **k):
    raise ValueError("OUT_OF_RANGE: Error writing local file: [OS error 28: No space left on "
                     "device]\nmore detail")
  monkeypatch.setattr(ocp.StandardCheckpointer, "save", tensorstore_full)
  assert main(["--hf_dir", str(hf), "--out", str(out / "lj")]) == 1
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "No space left on device" in err[0], err
  assert _tree(out) == []  # no partial of either output
