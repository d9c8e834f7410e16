"""Pallas kernel calls on a multi-device mesh go through one ``jax.shard_map``
(``longjax.kernels.sharded``): which mesh axes split what, that the TPU lowering under an abstract
multi-chip mesh holds the kernel inside a manual computation, and that on 8 fake CPU devices
(interpret mode, a subprocess) the wrapped call gives the numbers of the unwrapped one, forward and
gradients, flash and decode. The compile for real multi-chip TPU topologies is
``tests/test_compile_only.py::test_flash_kernel_on_a_sharded_batch_compiles`` (``-m slow``).
"""
from __future__ import annotations

import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AbstractMesh, AxisType

from longjax.kernels import attention, flash, lowering, sharded
from longjax.kernels.mask import MaskRule, TokenMeta

from focus_helpers import EIGHT_DEVICE_PREAMBLE, run_eight_devices

AXES = ("data", "fsdp", "tensor")


def _mesh(sizes, names=AXES, types=None, kind=None):
  kw = {}
  if kind:
    kw["abstract_device"] = lowering.abstract_tpu_mesh(kind).abstract_device
  return AbstractMesh(tuple(sizes), tuple(names), types or (AxisType.Auto,) * len(sizes), **kw)


def test_axes_follow_the_training_mesh_rules():
  from longjax.train import sharding as shd
  rules = dict(shd.LOGICAL_RULES)
  assert tuple(rules["batch"]) == sharded.BATCH_AXES
  assert (rules["heads"],) == (rules["kv_heads"],) == sharded.HEAD_AXES


@pytest.mark.parametrize("sizes,batch,kv_heads,want", [
    ((1, 1, 1), 4, 4, None),                            # one device: the call is left as is
    ((1, 4, 1), 8, 4, (("fsdp",), ())),
    ((2, 2, 2), 4, 4, (("data", "fsdp"), ("tensor",))),
    ((2, 2, 2), 2, 4, (("data",), ("tensor",))),        # fsdp does not divide: replicated over it
    ((1, 8, 1), 1, 4, ((), ())),                         # decode, batch 1: every device, all rows
    ((1, 2, 8), 16, 4, (("fsdp", "tensor"), ())),       # 8 does not divide 4 KV heads: batch axis
])
def test_split_axes(sizes, batch, kv_heads, want):
  assert sharded.split_axes(_mesh(sizes), batch, kv_heads) == want


def test_manual_axes_are_not_split_again():
  inside = _mesh((8,), ("x",), (AxisType.Manual,))  # inside an enclosing shard_map over x
  assert sharded.split_axes(inside, 8, 4) is None
  part = _mesh((4, 2), ("x", "fsdp"), (AxisType.Manual, AxisType.Auto))
  assert sharded.split_axes(part, 8, 4) == (("fsdp",), ())
  assert sharded.split_axes(None, 8, 4) is None


def test_flash_lowers_for_tpu_inside_a_manual_computation():
  """Under an abstract 4-chip TPU mesh (data 2 x tensor 2) the Mosaic call sits in an
  ``sdy.manual_computation`` on its device's rows (2 of 4) and heads (14 of 28, 2 of 4 KV)."""
  from jax import export
  q, k, v = lowering.qkv_avals(4, 1024, 1024, 28, 4, 128, jnp.bfloat16)
  fn = lambda q, k, v, m: flash.flash_attention(q, k, v, m, scale=0.1, backend="tpu")  # noqa: E731
  mesh = _mesh((2, 1, 2), kind=lowering.TPU_KINDS["v5e"])
  with flash.target_platform("tpu"), jax.sharding.use_abstract_mesh(mesh):
    text = export.export(jax.jit(fn), platforms=("tpu",))(
        q, k, v, lowering.meta_avals(4, 1024, 1024)).mlir_module()
  manual = [line for line in text.splitlines() if "sdy.manual_computation" in line]
  assert manual and '[{"data"}, {}, {"tensor"}, {}]' in manual[0], manual[:1]
  assert "longjax_flash_tpu" in text
  assert "tensor<2x1024x14x128xbf16>" in text  # one device's block of q
  # One chip: no manual computation, as before.
  one = lowering.lower(fn, (q, k, v, lowering.meta_avals(4, 1024, 1024)), "tpu")
  assert "sdy.manual_computation" not in one


# ------------------------------------------------------------------------------------------------
# 8 fake CPU devices: the wrapped call == the unwrapped one (interpret mode).
# ------------------------------------------------------------------------------------------------
WORKER = EIGHT_DEVICE_PREAMBLE + textwrap.dedent("""
    from test_kernels_sharded import run
    assert jax.device_count() == 8, jax.devices()
    np.savez({out!r}, **run())
""")


def _inputs(b, tq, tk, hq, hkv, d, seed=0):
  rng = np.random.default_rng(seed)
  q = rng.standard_normal((b, tq, hq, d)).astype(np.float32)
  k = rng.standard_normal((b, tk, hkv, d)).astype(np.float32)
  v = rng.standard_normal((b, tk, hkv, d)).astype(np.float32)
  valid = np.ones((b, tk), bool)
  valid[1, -5:] = False  # a row with padding at the end
  k_meta = TokenMeta.causal(np.arange(tk)[None].repeat(b, 0), valid=valid)
  q_meta = TokenMeta.causal(np.arange(tk - tq, tk)[None].repeat(b, 0))
  return q, k, v, q_meta, k_meta


def _program(backend):
  def loss(q, k, v, qm, km):
    out = attention(q, k, v, qm, km, MaskRule(), impl="pallas", interpret=True,
                    pallas_backend=backend)
    return jnp.sum(out * jnp.cos(out)), out

  def fn(q, k, v, qm, km):
    (_, out), grads = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(q, k, v, qm, km)
    return out, grads
  return jax.jit(fn)


def run():
  """Every result on the 8-device mesh (wrapped) and without a mesh (unwrapped)."""
  from jax.sharding import NamedSharding, PartitionSpec as P
  from longjax.train.sharding import make_mesh
  mesh = make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
  x_sh = NamedSharding(mesh, P(("data", "fsdp"), None, "tensor"))
  m_sh = NamedSharding(mesh, P(("data", "fsdp")))
  res = {}
  cases = {"flash_gpu": ("gpu", (4, 40, 40, 4, 2, 32)), "flash_tpu": ("tpu", (4, 40, 40, 4, 2, 32)),
           "decode": ("gpu", (4, 1, 40, 4, 2, 32))}
  for name, (backend, shape) in cases.items():
    q, k, v, qm, km = _inputs(*shape)
    prog = _program(backend)
    put = lambda x, s: jax.device_put(x, s)  # noqa: E731
    args = (put(q, x_sh), put(k, x_sh), put(v, x_sh), jax.tree.map(lambda a: put(a, m_sh), qm),
            jax.tree.map(lambda a: put(a, m_sh), km))
    res[f"{name}_shard_maps"] = np.asarray(str(prog.trace(*args).jaxpr).count("shard_map"))
    res[f"{name}_no_mesh_shard_maps"] = np.asarray(
        str(prog.trace(q, k, v, qm, km).jaxpr).count("shard_map"))
    for tag, a in (("wrapped", args), ("plain", (q, k, v, qm, km))):
      out, (dq, dk, dv) = prog(*a)
      res.update({f"{name}_{tag}_out": np.asarray(out), f"{name}_{tag}_dq": np.asarray(dq),
                  f"{name}_{tag}_dk": np.asarray(dk), f"{name}_{tag}_dv": np.asarray(dv)})
  return res


def test_eight_devices_wrapped_equals_unwrapped(tmp_path):
  res = run_eight_devices(WORKER, tmp_path)
  for name in ("flash_gpu", "flash_tpu", "decode"):
    assert res[f"{name}_shard_maps"] >= 1, name  # the kernel ran per shard
    assert res[f"{name}_no_mesh_shard_maps"] == 0, name  # without a mesh: unchanged
    for part in ("out", "dq", "dk", "dv"):
      np.testing.assert_allclose(res[f"{name}_wrapped_{part}"], res[f"{name}_plain_{part}"],
                                 rtol=1e-5, atol=1e-5, err_msg=f"{name} {part}")
