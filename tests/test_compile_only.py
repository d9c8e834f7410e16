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

from longjax import compile_only as co  # noqa: E402
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


@pytest.mark.xfail(strict=True, reason="known limit: a Pallas TPU call on operands sharded over "
                   "several devices needs a shard_map wrapper (not written yet); until then "
                   "multi-device TPU programs use impl='blockwise' (see README)")
def test_flash_kernel_on_a_sharded_batch_compiles():
  mesh = Mesh(np.asarray(co.topology(co.HOST["v5e"]).devices), ("fsdp",))
  bsh = NamedSharding(mesh, P("fsdp"))
  q, k, v = lowering.qkv_avals(4, 1024, 1024, 28, 4, 128, jnp.bfloat16)
  args = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=bsh),
                      (q, k, v, lowering.meta_avals(4, 1024, 1024)))
  fn = lambda q, k, v, m: flash.flash_attention(q, k, v, m, scale=0.1, backend="tpu")  # noqa: E731
  co.compile_program(fn, args, mesh=mesh)
