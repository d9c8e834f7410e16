"""The persistent compilation cache of the CLIs (``longjax.runtime.compile_cache``): where it goes,
how it is turned off, and that a second process finds what the first compiled."""
from conftest import run_python

from longjax.runtime import compile_cache as cc


def test_resolve_default_env_and_off(monkeypatch, tmp_path):
  monkeypatch.delenv(cc.ENV, raising=False)
  monkeypatch.setenv("LONGJAX_CACHE", str(tmp_path / "home"))
  assert cc.resolve() == tmp_path / "home" / "jax_compile"
  assert cc.resolve("auto") == tmp_path / "home" / "jax_compile"
  monkeypatch.setenv(cc.ENV, str(tmp_path / "env"))
  assert cc.resolve() == tmp_path / "env"
  assert cc.resolve(str(tmp_path / "flag")) == tmp_path / "flag"  # the flag wins
  assert cc.resolve("off") is None and cc.resolve("OFF") is None
  monkeypatch.setenv(cc.ENV, "off")
  assert cc.resolve() is None


_PROBE = """
import sys, time
from longjax.runtime import compile_cache
compile_cache.enable(sys.argv[1], min_compile_s=0)
import jax, jax.numpy as jnp
f = jax.jit(lambda x: jnp.tanh(x @ x.T).sum())
t0 = time.perf_counter()
f(jnp.ones((64, 64))).block_until_ready()
print("first", time.perf_counter() - t0)
"""


def test_a_second_process_reads_what_the_first_compiled(tmp_path):
  cache = tmp_path / "jit"
  run_python("-c", _PROBE, str(cache), env={"JAX_PLATFORMS": "cpu"}, check=True)
  entries = sorted(p.name for p in cache.iterdir())
  assert entries, "the first process wrote nothing to the cache"
  before = {p.name: p.stat().st_mtime for p in cache.iterdir()}
  run_python("-c", _PROBE, str(cache), env={"JAX_PLATFORMS": "cpu"}, check=True)
  after = {p.name: p.stat().st_mtime for p in cache.iterdir()}
  assert after == before  # a hit: nothing compiled and stored again (names and times unchanged)


def test_auto_uses_the_cache_home_and_off_writes_nothing(tmp_path):
  probe = _PROBE.replace("sys.argv[1]", "'auto'")
  env = {"JAX_PLATFORMS": "cpu", "LONGJAX_CACHE": str(tmp_path / "on")}
  run_python("-c", probe, env=env, check=True)
  assert any((tmp_path / "on" / "jax_compile").iterdir())
  env = {"JAX_PLATFORMS": "cpu", "LONGJAX_CACHE": str(tmp_path / "off"), cc.ENV: "off"}
  run_python("-c", probe, env=env, check=True)
  assert not (tmp_path / "off").exists()
