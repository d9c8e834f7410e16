"""Compile the real programs for TPU pod slices on a CPU host (no TPU): memory and FLOPs.

With the ``libtpu`` wheel (``pip install -r requirements-tpu.txt``),
``jax.experimental.topologies.get_topology_desc`` gives compile-only TPU devices: a ``Mesh`` over
them, arguments as ``ShapeDtypeStruct`` with ``NamedSharding``, and ``jit(f).trace(...).lower()
.compile()`` runs Mosaic + XLA:TPU here. ``compiled.memory_analysis()`` gives the per-device
bytes (arguments, outputs, temporaries) and ``cost_analysis()`` the FLOPs. Nothing runs.

Programs (``PROGRAMS``):

* ``kernels``: every TPU Pallas kernel case of ``longjax.kernels.lowering`` on one chip.
* ``beacon_train``: the training step of ``configs/beacon_qwen2.py`` (Qwen2-7B shape, W = S =
  2048, bf16, remat, global batch 8 of its longest samples, the config's mesh ``fsdp = -1``), the
  very function the Trainer jits (``train.loop.step_functions``), its plans from the real planner.
* Not written yet: the 128K-token beacon prefill + decode step and the FocusLLM 128K condense +
  decode (Llama-2-7B shape).

Used by ``scripts/tpu_compile_report.py`` (the README's table) and ``tests/test_compile_only.py``.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

# Per chip: HBM bytes and peak bf16 FLOP/s (public datasheet numbers).
CHIPS = {
    "v4": dict(hbm=32 * 2**30, bf16=275e12),
    "v5e": dict(hbm=16 * 2**30, bf16=197e12),
    "v5p": dict(hbm=95 * 2**30, bf16=459e12),
    "v6e": dict(hbm=32 * 2**30, bf16=918e12),
}
# Named slices -> topology strings. v4 / v5p count TensorCores in the name (2 per chip).
SLICES = {"v4-8": "v4:2x2x1", "v5p-8": "v5p:2x2x1", "v5p-16": "v5p:2x2x2", "v5e-8": "v5e:2x4",
          "v5e-16": "v5e:4x4", "v6e-8": "v6e:2x4"}
# One host of each chip (the smallest topology libtpu describes); the kernels use its first chip.
HOST = {"v4": "v4:2x2x1", "v5e": "v5e:2x2", "v5p": "v5p:2x2x1", "v6e": "v6e:2x2"}

QWEN2_7B = dict(family="qwen2", hidden_size=3584, intermediate_size=18944, num_layers=28,
                num_heads=28, num_kv_heads=4, head_dim=128, vocab_size=152064, attention_bias=True,
                rope_theta=1e6, rms_norm_eps=1e-6, max_position_embeddings=131072)
LLAMA3_8B = dict(family="llama", hidden_size=4096, intermediate_size=14336, num_layers=32,
                 num_heads=32, num_kv_heads=8, head_dim=128, vocab_size=128256,
                 rope_theta=5e5, rms_norm_eps=1e-5, max_position_embeddings=8192)
SHAPES = {"beacon_qwen2": QWEN2_7B, "beacon_llama3": LLAMA3_8B}  # each training config's model


def libtpu_available() -> bool:
  try:
    import libtpu  # noqa: F401
    return True
  except Exception:
    return False


def topology(slice_name: str):
  from jax.experimental import topologies
  name = SLICES.get(slice_name, slice_name)
  return topologies.get_topology_desc(name, platform="tpu")


def chip_of(slice_name: str) -> str:
  return slice_name.split("-")[0].split(":")[0].split(" ")[0]


@dataclasses.dataclass
class Result:
  program: str
  slice: str
  devices: int
  ok: bool
  compile_s: float
  arg_bytes: int = 0
  out_bytes: int = 0
  temp_bytes: int = 0
  alias_bytes: int = 0
  flops: float = 0.0  # per device, as XLA counts them (cost_analysis)
  note: str = ""
  error: str = ""

  @property
  def peak_bytes(self) -> int:
    """Per-device bytes live at the peak: arguments + outputs + temporaries - donated aliases."""
    return self.arg_bytes + self.out_bytes + self.temp_bytes - self.alias_bytes

  def hbm(self) -> int:
    return CHIPS[chip_of(self.slice)]["hbm"]

  def fits(self) -> bool:
    return self.ok and self.peak_bytes <= self.hbm()

  def seconds_at_peak(self) -> float:
    return self.flops / CHIPS[chip_of(self.slice)]["bf16"]


def compile_program(fn: Callable, args, *, mesh, donate=(), out_shardings=None):
  """``(compiled, seconds)`` for ``jit(fn)(*args)`` (``args`` carry their shardings)."""
  t0 = time.time()
  with jax.set_mesh(mesh):
    jitted = jax.jit(fn, donate_argnums=donate, out_shardings=out_shardings)
    compiled = jitted.trace(*args).lower().compile()
  return compiled, time.time() - t0


def measure(program: str, slice_name: str, devices: int, build: Callable, note="") -> Result:
  """Compile ``build()`` (-> ``(fn, args, mesh, kwargs)``) and read its memory and cost."""
  t0 = time.time()
  try:
    fn, args, mesh, kw = build()
    compiled, secs = compile_program(fn, args, mesh=mesh, **kw)
  except Exception as e:  # noqa: BLE001 - reported in the table
    msg = str(e).strip().splitlines()
    return Result(program, slice_name, devices, False, time.time() - t0, note=note,
                  error=f"{type(e).__name__}: {msg[0] if msg else ''}"[:400])
  ma = compiled.memory_analysis()
  ca = compiled.cost_analysis()
  if isinstance(ca, (list, tuple)):
    ca = ca[0] if ca else {}
  ca = ca or {}
  return Result(program, slice_name, devices, True, secs,
                arg_bytes=int(getattr(ma, "argument_size_in_bytes", 0)),
                out_bytes=int(getattr(ma, "output_size_in_bytes", 0)),
                temp_bytes=int(getattr(ma, "temp_size_in_bytes", 0)),
                alias_bytes=int(getattr(ma, "alias_size_in_bytes", 0)),
                flops=float(ca.get("flops", 0.0)), note=note)


# ------------------------------------------------------------------------------------------------
# Helpers.
# ------------------------------------------------------------------------------------------------
def _sds(x, sharding):
  return jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=sharding)


def _mesh(slice_name: str, shape: dict):
  """The project's mesh (``train.sharding.make_mesh`` rules) over the slice's devices."""
  from jax.sharding import AxisType, Mesh
  from longjax.train import sharding as shd
  devs = np.asarray(topology(slice_name).devices)
  n = devs.size
  sizes = [int(shape.get(a, 1)) for a in shd.MESH_AXES]
  if -1 in sizes:
    rest = int(np.prod([s for s in sizes if s != -1]))
    sizes[sizes.index(-1)] = n // rest
  if int(np.prod(sizes)) != n:
    raise shd.MeshError(f"mesh {sizes} does not match {n} devices of {slice_name}")
  return Mesh(devs.reshape(sizes), shd.MESH_AXES, axis_types=(AxisType.Auto,) * 3)


def _model_config(shape: dict, **kw):
  from longjax.models.config import ModelConfig
  return ModelConfig(bos_token_id=1, eos_token_id=2, pad_token_id=0, **shape, **kw)


def _abstract_params(cfg, mesh, dtype):
  """The parameter tree of ``cfg`` as ``ShapeDtypeStruct`` with the project's shardings."""
  from longjax.models.decoder import param_shapes
  from longjax.train import sharding as shd
  shapes = param_shapes(cfg)
  shapes = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, dtype), shapes)
  sh = shd.param_shardings(shapes, mesh)
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), shapes, sh)


# ------------------------------------------------------------------------------------------------
# Programs.
# ------------------------------------------------------------------------------------------------
def kernel_results(chip: str) -> list:
  """Every TPU kernel case compiled for one chip of ``chip``."""
  from jax.sharding import Mesh
  from longjax.kernels import flash, lowering
  slice_name = f"{chip} (1 chip)"
  dev = topology(HOST[chip]).devices[0]
  mesh = Mesh(np.asarray([dev]), ("x",))
  rep = NamedSharding(mesh, P())
  out = []
  for case in lowering.kernel_cases(("tpu",)):
    def build(case=case):
      args = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=rep), case.args)
      return case.fn, args, mesh, {}
    with flash.target_platform("tpu"):
      out.append(measure(f"kernel:{case.name}", slice_name, 1, build))
  return out


def beacon_train(slice_name: str, *, config: str = "beacon_qwen2", length: Optional[int] = None,
                 shape: Optional[dict] = None, remat=None, global_batch: Optional[int] = None,
                 impl: Optional[str] = None, mesh: Optional[dict] = None) -> Result:
  """The training step of ``configs/<config>.py`` at ``shape``: global batch of the config, each
  sample ``length`` tokens (default the config's ``data.max_length``), on ``slice_name`` with the
  config's mesh."""
  import importlib
  from longjax import methods
  from longjax.kernels import flash
  from longjax.models.config import remat_mode
  from longjax.run_config import from_config
  from longjax.train import loop, sharding as shd
  c = importlib.import_module(f"configs.{config}").get_config()
  shape = shape or SHAPES[config]
  if remat is not None:
    c.model.remat = remat
  if global_batch is not None:
    c.train.global_batch = global_batch
  if impl is not None:
    c.train.impl = impl
  if mesh is not None:
    c.train.mesh.update(mesh)
  c = from_config(c)  # the overrides above in, then typed and checked once
  length = int(length or c.data.max_length)
  gb = int(c.train.global_batch)
  note = (f"{config}: {gb} x {length} tokens, W={c.beacon.window}, remat={c.model.remat}, "
          f"attention {c.train.impl}, mesh {dataclasses.asdict(c.train.mesh)}")

  def build():
    method = methods.get(c.method)
    settings = method.settings(c)
    projections, n_embed, _ = method.extra_params(settings)
    cfg = _model_config(shape, alt_projections=projections, num_alt_embeddings=n_embed,
                        dtype=c.model.dtype, param_dtype=c.model.param_dtype,
                        remat=remat_mode(c.model.remat))
    mesh = _mesh(slice_name, dataclasses.asdict(c.train.mesh))
    with flash.target_platform("tpu"):
      task = method.make_task(c, cfg, settings, max_length=length)
    params = _abstract_params(cfg, mesh, jnp.dtype(c.model.param_dtype))
    tr, fr = loop.split_params(params, method)
    tr = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, jnp.float32, sharding=x.sharding), tr)
    opt, _ = loop.make_optimizer(c.train, 1000)
    opt_state = jax.eval_shape(opt.init, tr)
    by_shape = {(x.shape, str(jnp.float32)): x.sharding for x in jax.tree.leaves(tr)}
    rep = shd.replicated(mesh)
    opt_state = jax.tree.map(lambda x: jax.ShapeDtypeStruct(
        x.shape, x.dtype, sharding=by_shape.get((x.shape, str(x.dtype)), rep)), opt_state)
    # The plans of one global batch of random tokens, from the real planner (host).
    rng = np.random.default_rng(0)
    ids = [rng.integers(3, cfg.vocab_size, length).astype(np.int64) for _ in range(gb)]
    from longjax.beacon.planner import RowState
    rows = [RowState.seeded(np.random.default_rng(i)) for i in range(gb)]
    plans = task.lm.schedule.plan(ids, ids, rows=rows, training=True,
                                  steps_multiple=task.step_bucket)
    ax = method.plan_batch_axis

    def put(x):
      x = np.asarray(x)
      s = rep if x.ndim <= ax else shd.batch_sharding(mesh, x.ndim, ax, x.shape[ax])
      return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s)
    plans = jax.tree.map(put, plans)
    _, _, fused = loop.step_functions(task, opt)
    tr_sh = jax.tree.map(lambda x: x.sharding, tr)
    opt_sh = jax.tree.map(lambda x: x.sharding, opt_state)

    def fn(*a):
      with flash.target_platform("tpu"):
        return fused(*a)
    return fn, (tr, opt_state, fr, plans), mesh, dict(donate=(0, 1),
                                                     out_shardings=(tr_sh, opt_sh, None))
  n = topology(slice_name).devices.__len__()
  return measure("beacon_train", slice_name, n, build, note=note)


PROGRAMS = ("kernels", "beacon_train")
