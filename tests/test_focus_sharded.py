"""FocusLLM with the chunk axis sharded over 8 fake CPU devices == one device.

The pytest process already initialised JAX with one CPU device, so the 8-device run happens in a
subprocess (XLA_FLAGS set before JAX is imported). Both sides run the same checkpoint (written here
by save_focus) on a batch of prompts whose chunk counts (5 and 2, plus an unchunked one) do not
divide the device count: prefill, 3 cached decode steps, the closed form, generation (host and
device decode loops) and the training loss, also with the candidate gate on. A 3-device mesh runs
the decode path too: there the local context's capacity (bucket 16) is padded to a multiple of the
devices, which split it by position.
"""
from __future__ import annotations

import textwrap

import numpy as np

from longjax.focus import FocusLLM, load_focus, save_focus
from longjax.focus.losses import FocusLoss
from longjax.inference.generate import generate

from focus_helpers import (EIGHT_DEVICE_PREAMBLE, decode_logits, prompt, prompt_batch,
                           run_eight_devices, tiny_focus, tiny_model)

FEED = [[5, 17, 33], [9, 9, 41], [60, 2, 7]]
LOSS_IX = [dict(memory_len=76, local_start=76, local_size=20, stride=16),
           dict(memory_len=100, local_start=10, local_size=30, stride=8)]

WORKER = EIGHT_DEVICE_PREAMBLE + textwrap.dedent("""
    from test_focus_sharded import placement, run, run_decode, run_gated
    from longjax.focus import chunk_mesh
    assert jax.device_count() == 8, jax.devices()
    res = run({ckpt!r}, chunk_mesh(8))
    res.update({{"mesh3_" + k: v for k, v in run_decode({ckpt!r}, chunk_mesh(3)).items()}})
    res.update(placement({ckpt!r}, chunk_mesh(8)))
    res.update({{"gate_" + k: v for k, v in run_gated({ckpt!r}, chunk_mesh(8)).items()}})
    np.savez({out!r}, **res)
""")


def run(ckpt, mesh=None):
  """Everything the comparison looks at, as numpy arrays."""
  cfg, fcfg, params = load_focus(ckpt, prompt_cap=8, min_len_threshold=0)
  m = FocusLLM(cfg, fcfg, mesh=mesh, bucket=16, chunk_bucket=1)
  prompts, tokens, lengths = prompt_batch()
  res, state = decode_logits(m, params, tokens, lengths, 4, np.asarray(FEED).T)
  res["n_rows"] = np.asarray(state.cache_k.shape[1])  # the chunk rows (decode keeps them)
  res["closed"] = m.recompute(params, prompts, FEED)
  for loop in ("host", "device"):  # the device decode loop runs the sharded step too
    out = generate(m, params, [p.tolist() for p in prompts], max_new_tokens=4, loop=loop,
                   return_logits=True)
    res[f"generate_{loop}"] = np.stack(out.logits)
    res[f"generate_{loop}_tokens"] = np.asarray(out.tokens)
  res["forward"] = m.forward(params, prompts[0]).logits
  fl = FocusLoss(cfg, fcfg, mesh=mesh, bucket=16)
  batch = fl.plan([prompt(120, 3), prompt(120, 4)], LOSS_IX)
  value, grads = fl.value_and_grad(params, batch)
  res["loss"] = np.asarray(value)
  res["grad_alt_k"] = np.asarray(grads["layers"]["attn"]["alt_k_proj"]["kernel"])
  return res


def run_decode(ckpt, mesh=None):
  """The decode path only: prefill, cached steps, generation through the device loop."""
  cfg, fcfg, params = load_focus(ckpt, prompt_cap=8, min_len_threshold=0)
  m = FocusLLM(cfg, fcfg, mesh=mesh, bucket=16, chunk_bucket=1)
  prompts, tokens, lengths = prompt_batch()
  res, state = decode_logits(m, params, tokens, lengths, 4, np.asarray(FEED).T)
  res["local_capacity"] = np.asarray(state.local_tokens.shape[1])
  out = generate(m, params, [p.tolist() for p in prompts], max_new_tokens=4, loop="device",
                 return_logits=True)
  res["generate_device"] = np.stack(out.logits)
  res["generate_device_tokens"] = np.asarray(out.tokens)
  return res


def run_gated(ckpt, mesh=None):
  """The candidate gate on: each device reads its own chunk rows' signal (prefill and every cached
  step, the device loop) and the training condensing returns it split by row (2 decode steps per
  sample: the ``[N, J]`` signal), with its reference rows (``gate_gain``: one more row per
  prompt, split over the devices with the chunk rows), its peer reference (``gate_peer_gain``:
  every row's distribution, gathered per prompt across the devices) and each chunk's best of
  its 3 most likely tokens (``gate_top_k``)."""
  import dataclasses
  cfg, fcfg, params = load_focus(ckpt, prompt_cap=8, min_len_threshold=0)
  fcfg = dataclasses.replace(fcfg, candidate_gate=2.0, gate_threshold=0.01, gate_gain=1.5,
                             gate_peer_gain=2.0, gate_top_k=3)
  m = FocusLLM(cfg, fcfg, mesh=mesh, bucket=16, chunk_bucket=1)
  prompts, tokens, lengths = prompt_batch()
  res, _ = decode_logits(m, params, tokens, lengths, 4, np.asarray(FEED).T)
  out = generate(m, params, [p.tolist() for p in prompts], max_new_tokens=4, loop="device",
                 return_logits=True)
  res["generate_device"] = np.stack(out.logits)
  fl = FocusLoss(cfg, fcfg, mesh=mesh, bucket=16)
  value, grads = fl.value_and_grad(params, fl.plan([prompt(120, 3), prompt(120, 4)], LOSS_IX,
                                                   steps=2))
  res["loss"] = np.asarray(value)
  res["grad_alt_k"] = np.asarray(grads["layers"]["attn"]["alt_k_proj"]["kernel"])
  return res


def placement(ckpt, mesh):
  """FocusLLM.place_params on a mesh: replicated on every device, one copy per parameter tree,
  a replicated tree passed through."""
  import jax
  from jax.sharding import NamedSharding, PartitionSpec as P
  cfg, fcfg, params = load_focus(ckpt, prompt_cap=8, min_len_threshold=0)
  params = jax.device_put(params)
  m = FocusLLM(cfg, fcfg, mesh=mesh, bucket=16)
  placed = m.place_params(params)
  leaves = jax.tree.leaves(placed)
  return {"placed_replicated": np.asarray(all(
              x.sharding.is_equivalent_to(NamedSharding(mesh, P()), x.ndim) for x in leaves)),
          "placed_once": np.asarray(m.place_params(params) is placed),
          "placed_kept": np.asarray(m.place_params(placed) is placed),
          "placed_equal": np.asarray(all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in
                                         zip(jax.tree.leaves(params), leaves)))}


def test_eight_devices_equal_one(tmp_path):
  cfg, params = tiny_model(seed=1)
  save_focus(tmp_path / "ckpt", cfg, tiny_focus(), params)
  sharded = run_eight_devices(WORKER, tmp_path, ckpt=str(tmp_path / "ckpt"))
  single = run(tmp_path / "ckpt")
  single.update({"gate_" + k: v for k, v in run_gated(tmp_path / "ckpt").items()})
  assert np.abs(single["gate_prefill"] - single["prefill"]).max() > 1e-3  # the gate reads
  for key in ("placed_replicated", "placed_once", "placed_kept", "placed_equal"):
    assert bool(sharded.pop(key)), key
  mesh3 = {k[len("mesh3_"):]: sharded.pop(k) for k in list(sharded) if k.startswith("mesh3_")}
  # 3 devices: the local context (bucket 16) padded to a multiple of 48, split 3 ways.
  assert int(mesh3.pop("local_capacity")) % 48 == 0
  for key, value in mesh3.items():
    ref = single[key]
    if key.endswith("_tokens"):
      np.testing.assert_array_equal(value, ref, err_msg=f"3 devices: {key}")
    else:
      np.testing.assert_allclose(value, ref, atol=1e-5, rtol=0, err_msg=f"3 devices: {key}")
  for res in (sharded, single):
    np.testing.assert_array_equal(res["generate_device_tokens"], res["generate_host_tokens"])
    np.testing.assert_allclose(res["generate_device"], res["generate_host"], atol=1e-5, rtol=0)
  # 5 + 2 chunk rows: padded to 8 on the mesh, 7 on one device.
  assert int(sharded["n_rows"]) == 8 and int(single["n_rows"]) == 7
  diffs = {k: float(np.abs(sharded[k] - ref).max()) for k, ref in single.items() if k != "n_rows"}
  print("sharded vs single-device max |diff|:", diffs)
  for key, diff in diffs.items():
    assert diff < 1e-5, f"{key}: sharded vs single-device max |diff| {diff}"
