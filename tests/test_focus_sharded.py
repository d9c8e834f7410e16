"""FocusLLM with the chunk axis sharded over 8 fake CPU devices == one device.

The pytest process already initialised JAX with one CPU device, so the 8-device run happens in a
subprocess (XLA_FLAGS set before JAX is imported). Both sides run the same checkpoint (written here
by save_focus) on a batch of prompts whose chunk counts (5 and 2, plus an unchunked one) do not
divide the device count: prefill, 3 cached decode steps, the closed form, generation (host and
device decode loops) and the training loss.
"""
from __future__ import annotations

import textwrap

import numpy as np

from longjax.focus import FocusLLM, load_focus, save_focus
from longjax.focus.losses import FocusLoss
from longjax.generate import generate

from focus_helpers import (EIGHT_DEVICE_PREAMBLE, decode_logits, prompt, prompt_batch,
                           run_eight_devices, tiny_focus, tiny_model)

FEED = [[5, 17, 33], [9, 9, 41], [60, 2, 7]]
LOSS_IX = [dict(memory_len=76, local_start=76, local_size=20, stride=16),
           dict(memory_len=100, local_start=10, local_size=30, stride=8)]

WORKER = EIGHT_DEVICE_PREAMBLE + textwrap.dedent("""
    from test_focus_sharded import run
    from longjax.focus import chunk_mesh
    assert jax.device_count() == 8, jax.devices()
    np.savez({out!r}, **run({ckpt!r}, chunk_mesh(8)))
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


def test_eight_devices_equal_one(tmp_path):
  cfg, params = tiny_model(seed=1)
  save_focus(tmp_path / "ckpt", cfg, tiny_focus(), params)
  sharded = run_eight_devices(WORKER, tmp_path, ckpt=str(tmp_path / "ckpt"))
  single = run(tmp_path / "ckpt")
  for res in (sharded, single):
    np.testing.assert_array_equal(res["generate_device_tokens"], res["generate_host_tokens"])
    np.testing.assert_allclose(res["generate_device"], res["generate_host"], atol=1e-5, rtol=0)
  # 5 + 2 chunk rows: padded to 8 on the mesh, 7 on one device.
  assert int(sharded["n_rows"]) == 8 and int(single["n_rows"]) == 7
  diffs = {k: float(np.abs(sharded[k] - ref).max()) for k, ref in single.items() if k != "n_rows"}
  print("sharded vs single-device max |diff|:", diffs)
  for key, diff in diffs.items():
    assert diff < 1e-5, f"{key}: sharded vs single-device max |diff| {diff}"
