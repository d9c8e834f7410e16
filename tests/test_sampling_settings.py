"""Sampling settings and ``generate`` arguments that cannot silently corrupt output: temperatures
and top_p below their floors (which overflow / round to 0 in float32) are refused, the settings
at the floors give the greedy tokens; the ``return_logits`` buffer is size-checked before the
prefill; ``stop_ids`` may be a jax.Array; a bad seed and a ``BeaconLM`` whose memory cannot fit
are one line each, before anything runs."""
from __future__ import annotations


import jax.numpy as jnp
import numpy as np
import pytest

from longjax.beacon import BeaconConfig, BeaconLM
from longjax.beacon.schedule import CapacityError
from longjax.inference.generate import GenerateError, generate
from longjax.models import ModelConfig, init_params
from longjax.plain import PlainLM
from longjax.inference.sampling import SamplingConfig, SamplingError

V = 97
from longjax.inference import generate as gen  # noqa: E402  (the module; longjax.generate is the function)


@pytest.fixture(scope="module")
def plain():
  cfg = ModelConfig(vocab_size=V, hidden_size=32, intermediate_size=48, num_layers=1, num_heads=4,
                    num_kv_heads=2, head_dim=8)
  return PlainLM(cfg), init_params(cfg, 0)


# Below the floor, logits / t overflows float32 (temperature) or top_p rounds to 0 (every token
# masked): the samples were noise / all 0 where greedy gives real tokens.
@pytest.mark.parametrize("kw", [dict(temperature=1e-40), dict(temperature=1e-300),
                                dict(temperature=5e-7),  # half the floor
                                dict(temperature=1.0, top_p=1e-40),
                                dict(temperature=1.0, top_p=1e-46),
                                dict(temperature=1.0, top_p=1e-300)])
def test_settings_below_the_floor_are_refused(plain, kw):
  with pytest.raises(SamplingError, match="below the floor .* pass temperature=0 for greedy"):
    SamplingConfig(**kw)
  lm, params = plain
  with pytest.raises(SamplingError, match="below the floor"):
    generate(lm, params, [5, 6], max_new_tokens=2, **kw)


def test_settings_at_the_floor_give_the_greedy_tokens(plain):
  """The floors are where the arithmetic still holds: sampling there is greedy, on both loops."""
  from longjax.inference.sampling import MIN_TEMPERATURE, MIN_TOP_P
  lm, params = plain
  greedy = generate(lm, params, [5, 6, 7], max_new_tokens=12).tokens
  for loop in ("host", "device"):
    for kw in (dict(temperature=MIN_TEMPERATURE), dict(temperature=1.0, top_p=MIN_TOP_P)):
      got = generate(lm, params, [5, 6, 7], max_new_tokens=12, seed=3, loop=loop, **kw).tokens
      assert got == greedy, (loop, kw)


def test_return_logits_buffer_is_size_checked_before_the_prefill(plain, monkeypatch):
  """[B, N, V] float32 logits (rounded up to the device loop's buffer) against what the device
  holds; the KV cache of the same call fits, so only the logits check can refuse it."""
  lm, params = plain
  monkeypatch.setattr(gen, "memory_limit_bytes", lambda: 1 << 20)  # a 1 MiB device
  n = 1000  # logits: 2 x 1024 x 97 x 4 B = 0.76 MiB; 3 rows: 1.1 MiB (KV: 3 x 1.0 K x 64 B)
  generate(lm, params, [[5, 6], [7, 8]], max_new_tokens=n, return_logits=True, stop_ids=[])

  def prefill(*a, **k):
    raise AssertionError("the prefill ran before the logits buffer was checked")
  monkeypatch.setattr(lm, "prefill", prefill)
  for loop in ("host", "device"):
    with pytest.raises(GenerateError, match=r"return_logits=True .* \[3, 1024, 97\] float32 "
                                            r"logits buffer .* drop return_logits"):
      generate(lm, params, [[5, 6], [7, 8], [9]], max_new_tokens=n, return_logits=True, loop=loop)


def test_stop_ids_as_a_jax_array(plain):
  lm, params = plain
  free = generate(lm, params, [5, 6, 7], max_new_tokens=8).tokens[0]
  stop = free[3]
  want = generate(lm, params, [5, 6, 7], max_new_tokens=8, stop_ids=[stop]).tokens
  assert want[0][-1] == stop and len(want[0]) <= 4
  got = generate(lm, params, [5, 6, 7], max_new_tokens=8, stop_ids=jnp.array([stop])).tokens
  assert got == want
  # the suggestion for a bare id is one that works
  with pytest.raises(GenerateError, match=rf"e\.g\. \[{stop}\] for one"):
    generate(lm, params, [5, 6, 7], max_new_tokens=8, stop_ids=stop)


@pytest.mark.parametrize("seed", [1.5, 2**70, -2**63 - 1, "a", True, None])
def test_bad_seed_is_one_line(plain, seed):
  lm, params = plain
  with pytest.raises(GenerateError, match=r"seed must be an integer in \[-2\*\*63, 2\*\*63\)"):
    generate(lm, params, [5, 6], max_new_tokens=2, temperature=1.0, seed=seed)


def test_good_seeds(plain):
  lm, params = plain
  a = generate(lm, params, [5, 6], max_new_tokens=4, temperature=1.0, seed=np.int64(7)).tokens
  assert generate(lm, params, [5, 6], max_new_tokens=4, temperature=1.0, seed=7).tokens == a
  generate(lm, params, [5, 6], max_new_tokens=2, temperature=1.0, seed=2**63 - 1)


def test_beacon_max_length_beyond_the_device_is_refused_at_construction(monkeypatch):
  cfg = ModelConfig(vocab_size=V, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4,
                    num_kv_heads=2, head_dim=8, alt_projections=("q", "k", "v"),
                    num_alt_embeddings=1)
  bcfg = BeaconConfig(window=16, stride=16, ratios=(2,))
  with pytest.raises(CapacityError, match=r"BeaconLM\(max_length=10000000000\) needs a memory of "
                                          r".* lower max_length \(at most about \d+ tokens"):
    BeaconLM(cfg, bcfg, max_length=10**10)
  with pytest.raises(CapacityError, match="max_length must be an integer >= 1, got 100.5"):
    BeaconLM(cfg, bcfg, max_length=100.5)
  # the limit it names is one that constructs, and a batch is checked when its state is made
  from longjax.models import inputs
  monkeypatch.setattr(inputs, "memory_limit_bytes", lambda: 1 << 20)
  with pytest.raises(CapacityError) as e:
    BeaconLM(cfg, bcfg, max_length=10**6)
  fits = int(str(e.value).split("at most about ")[1].split()[0])
  lm = BeaconLM(cfg, bcfg, max_length=fits)
  assert lm.state_bytes(1) <= 1 << 20
  with pytest.raises(CapacityError):  # and it is the most that fits (one window more does not)
    BeaconLM(cfg, bcfg, max_length=fits + bcfg.stride)
  with pytest.raises(CapacityError, match="for 4 rows"):
    lm.init_state(4)
