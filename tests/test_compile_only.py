"""Compile-only TPU checks (``-m slow``; skipped without ``libtpu``: ``pip install -r
requirements-tpu.txt``). The whole Mosaic + XLA:TPU compiler runs on this CPU for compile-only
TPU devices (``jax.experimental.topologies``): VMEM overflows and layouts that lowering alone
accepts are caught here. ~25 s per chip kind.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("libtpu")

from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

from scripts import compile_only as co  # noqa: E402  (the library of the TPU report script)
from longjax.kernels import flash, lowering  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("chip", ["v4", "v5e", "v5p", "v6e"])
def test_every_tpu_kernel_compiles(chip):
  results = co.kernel_results(chip)
  assert len(results) == len(lowering.kernel_cases(("tpu",)))
  failed = [f"{r.program}: {r.error}" for r in results if not r.ok]
  assert not failed, failed
  assert all(r.fits() for r in results)


def test_vmem_overflow_is_caught_by_compiling_not_lowering():
  """2048 x 2048 blocks lower (the tiling rule holds) but overflow a v5e core's VMEM."""
  q, k, v = lowering.qkv_avals(1, 8192, 8192, 4, 2, 128, jnp.bfloat16)
  fn = lambda q, k, v, m: flash.flash_attention(q, k, v, m, scale=0.1, backend="tpu",  # noqa: E731
                                                block_q=2048, block_k=2048)
  args = (q, k, v, lowering.meta_avals(1, 8192, 8192))
  lowering.lower(fn, args, "tpu")  # lowering accepts it
  mesh = Mesh(np.asarray(co.topology(co.HOST["v5e"]).devices[:1]), ("x",))
  rep = NamedSharding(mesh, P())
  args = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=rep), args)
  with pytest.raises(Exception, match="(?i)vmem"):
    co.compile_program(fn, args, mesh=mesh)


def test_flash_kernel_on_a_sharded_batch_compiles():
  """Four v5e chips, the batch over fsdp: the Mosaic call runs per shard (one ``shard_map``,
  ``longjax.kernels.sharded``); XLA could not partition it."""
  mesh = Mesh(np.asarray(co.topology(co.HOST["v5e"]).devices), ("fsdp",))
  bsh = NamedSharding(mesh, P("fsdp"))
  q, k, v = lowering.qkv_avals(4, 1024, 1024, 28, 4, 128, jnp.bfloat16)
  args = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=bsh),
                      (q, k, v, lowering.meta_avals(4, 1024, 1024)))
  fn = lambda q, k, v, m: flash.flash_attention(q, k, v, m, scale=0.1, backend="tpu")  # noqa: E731
  compiled, _ = co.compile_program(fn, args, mesh=mesh)
  kernels = [l for l in compiled.as_text().splitlines() if "tpu_custom_call" in l]
  assert kernels and all("bf16[1,28,1024,128]" in l for l in kernels)  # one row per chip


def test_flash_gradient_with_sharded_heads_compiles():
  """The project's mesh axes (data 2 x tensor 2 on four v5e chips), heads sharded too, through
  the custom VJP (the backward is the blockwise jnp path, which XLA partitions)."""
  devs = np.asarray(co.topology(co.HOST["v5e"]).devices).reshape(2, 1, 2)
  mesh = Mesh(devs, ("data", "fsdp", "tensor"))
  xsh = NamedSharding(mesh, P("data", None, "tensor"))
  msh = NamedSharding(mesh, P("data"))
  q, k, v = lowering.qkv_avals(4, 1024, 1024, 28, 4, 128, jnp.bfloat16)
  args = (*[jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=xsh) for a in (q, k, v)],
          jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=msh),
                       lowering.meta_avals(4, 1024, 1024)))
  att = lambda q, k, v, m: flash.flash_attention(q, k, v, m, scale=0.1, backend="tpu")[0]  # noqa: E731
  fn = lambda q, k, v, m: jax.grad(  # noqa: E731
      lambda q, k, v: att(q, k, v, m).astype(jnp.float32).sum(), argnums=(0, 1, 2))(q, k, v)
  compiled, _ = co.compile_program(fn, args, mesh=mesh)
  assert "bf16[2,14,1024,128]" in compiled.as_text()  # 2 rows, 14 of 28 heads per chip


def test_inference_programs_compile_on_a_pod_slice():
  """The beacon prefill chunk + decode step (Qwen2-7B, heads over 4 chips) and the FocusLLM
  prefill + decode step (Llama-2-7B, chunk rows over 4 chips) compile for v5p-8 and fit, at 16K
  tokens (the 128K rows of docs/kernels.md come from scripts/tpu_compile_report.py --infer)."""
  results = (co.beacon_infer("v5p-8", length=16384) + co.focus_infer("v5p-8", length=16384))
  assert [r.program for r in results] == ["beacon_prefill_16K", "beacon_decode_step",
                                          "focus_prefill_16K", "focus_decode_step"]
  failed = [f"{r.program}: {r.error}" for r in results if not r.ok]
  assert not failed, failed
  assert all(r.fits() and r.pallas_calls for r in results)
