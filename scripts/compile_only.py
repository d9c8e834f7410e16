"""Compile the real programs for TPU pod slices on a CPU host (no TPU): memory and FLOPs.

With the ``libtpu`` wheel (``pip install -r requirements-tpu.txt``),
``jax.experimental.topologies.get_topology_desc`` gives compile-only TPU devices: a ``Mesh`` over
them, arguments as ``ShapeDtypeStruct`` with ``NamedSharding``, and ``jit(f).trace(...).lower()
.compile()`` runs Mosaic + XLA:TPU here. ``compiled.memory_analysis()`` gives the per-device
bytes (arguments, outputs, temporaries) and ``cost_analysis()`` the FLOPs. Nothing runs.

Programs (``PROGRAMS``):

* ``kernels``: every TPU Pallas kernel case of ``longjax.kernels.lowering`` on one chip.
* ``train_step``: the training step of ``configs/beacon_qwen2.py`` (Qwen2-7B shape, W = S =
  2048, bf16, remat, global batch 8 of its longest samples, the config's mesh ``fsdp = -1``), of
  ``beacon_llama3`` or of ``focus_llama2`` (Llama-2-7B shape, at its largest chunk layout), the
  very function the Trainer jits (``train.loop.step_functions``), its plans from the real planner.
* ``beacon_infer``: a 128K-token beacon prefill (its largest ``lax.scan`` call) and one decode
  step after it (Qwen2-7B shape, heads over ``tensor``).
* ``focus_infer``: the FocusLLM 128K prefill (condensing every chunk, chunk rows over every chip)
  and one cached decode step (Llama-2-7B shape).

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
          "v5e-16": "v5e:4x4", "v5e-32": "v5e:4x8", "v6e-8": "v6e:2x4"}
# One host of each chip (the smallest topology libtpu describes); the kernels use its first chip.
HOST = {"v4": "v4:2x2x1", "v5e": "v5e:2x2", "v5p": "v5p:2x2x1", "v6e": "v6e:2x2"}

QWEN2_7B = dict(family="qwen2", hidden_size=3584, intermediate_size=18944, num_layers=28,
                num_heads=28, num_kv_heads=4, head_dim=128, vocab_size=152064, attention_bias=True,
                rope_theta=1e6, rms_norm_eps=1e-6, max_position_embeddings=131072)
LLAMA3_8B = dict(family="llama", hidden_size=4096, intermediate_size=14336, num_layers=32,
                 num_heads=32, num_kv_heads=8, head_dim=128, vocab_size=128256,
                 rope_theta=5e5, rms_norm_eps=1e-5, max_position_embeddings=8192)
LLAMA2_7B = dict(family="llama", hidden_size=4096, intermediate_size=11008, num_layers=32,
                 num_heads=32, num_kv_heads=32, head_dim=128, vocab_size=32000,
                 rope_theta=1e4, rms_norm_eps=1e-5, max_position_embeddings=4096)
SHAPES = {"beacon_qwen2": QWEN2_7B, "beacon_llama3": LLAMA3_8B,  # each config's model
          "focus_llama2": LLAMA2_7B}


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
  pallas_calls: int = 0  # Mosaic kernel calls in the compiled program (tpu_custom_call)
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


def measure(program: str, slice_name: str, devices: int, build: Callable, note="",
            on_compiled: Optional[Callable] = None) -> Result:
  """Compile ``build()`` (-> ``(fn, args, mesh, kwargs)``) and read its memory and cost;
  ``on_compiled(compiled)`` sees the compiled program (e.g. for its output shardings)."""
  t0 = time.time()
  try:
    fn, args, mesh, kw = build()
    compiled, secs = compile_program(fn, args, mesh=mesh, **kw)
  except Exception as e:  # noqa: BLE001 - reported in the table
    msg = str(e).strip().splitlines()
    return Result(program, slice_name, devices, False, time.time() - t0, note=note,
                  error=f"{type(e).__name__}: {msg[0] if msg else ''}"[:400])
  if on_compiled is not None:
    on_compiled(compiled)
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
                flops=float(ca.get("flops", 0.0)), note=note,
                pallas_calls=compiled.as_text().count('custom_call_target="tpu_custom_call"'))


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


def train_step(slice_name: str, *, config: str = "beacon_qwen2", length: Optional[int] = None,
               shape: Optional[dict] = None, remat=None, global_batch: Optional[int] = None,
               impl: Optional[str] = None, mesh: Optional[dict] = None,
               focus_stride: Optional[int] = None) -> Result:
  """The training step of ``configs/<config>.py`` (a beacon or FocusLLM config) at ``shape``:
  global batch of the config, each sample ``length`` tokens (default the config's
  ``data.max_length``), on ``slice_name`` with the config's mesh; the very function the Trainer
  jits (``train.loop.step_functions``), its plans from the real planner. FocusLLM draws a chunk
  stride per step: ``focus_stride`` picks the step shape (default: the stride whose chunk rows
  hold the most tokens, the largest program)."""
  import importlib
  from longjax import method_names, methods
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
  is_focus = c.method == method_names.FOCUS.name
  if is_focus:
    focus = c.method_section()
    window = f"local window {focus.local_window}"
  else:
    window = f"W={c.beacon.window}"
  note = (f"{config}: {gb} x {length} tokens, {window}, remat={c.model.remat}, "
          f"attention {c.train.impl}, mesh {dataclasses.asdict(c.train.mesh)}")
  extra = {}

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
    if is_focus:
      plans, info = _focus_plans(task, ids, focus_stride)
      extra["note"] = info
    else:
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
  r = measure(f"{c.method}_train", slice_name, n, build, note=note)
  r.note += extra.get("note", "")
  return r


def _focus_plans(task, ids, stride: Optional[int]):
  """One global batch of FocusLLM training plans (``task.prepare``, the Trainer's host step) at
  the chunk stride ``stride`` (``None``: the one whose chunk rows hold the most tokens)."""
  import types
  from longjax.data import pipeline
  lengths = np.asarray([len(x) for x in ids])
  strides = tuple(int(x) for x in task.fc["strides"])
  if stride is None:
    def tokens(s):
      shp = task.static_shapes(len(ids), s, int(lengths.max()))
      return shp["rows"] * shp["length"]
    stride = max(strides, key=tokens)
  ds = types.SimpleNamespace(ids=ids, answer=[None] * len(ids), lengths=lengths)
  for step in range(1, 10000):  # the first step whose drawn stride is the one wanted
    if strides[int(pipeline.row_rng(task.seed, step, 0, salt=4).integers(len(strides)))] == stride:
      break
  prep = task.prepare(ds, np.arange(len(ids)), step)
  rows, width = prep["plans"]["chunks"]["tokens"].shape
  return prep["plans"], f"; stride {stride}: {rows} chunk rows x {width} tokens"


beacon_train = train_step  # the name the report used first


# ------------------------------------------------------------------------------------------------
# Inference at 128K tokens.
# ------------------------------------------------------------------------------------------------
def _config(config: str):
  import importlib
  from longjax.run_config import from_config
  return from_config(importlib.import_module(f"configs.{config}").get_config())


def _put(mesh, spec_of=None):
  """numpy / abstract leaf -> ``ShapeDtypeStruct`` on ``mesh`` (``spec_of(x)``: its spec; default
  replicated)."""
  def put(x):
    spec = spec_of(x) if spec_of is not None else P()
    return jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=NamedSharding(mesh, spec))
  return put


def _kv_spec(mesh, batch: int, kv_heads: int, batch_dim: int, head_dim: int, ndim: int) -> P:
  """A KV buffer's spec: batch over (data, fsdp) and KV heads over tensor where they divide."""
  from longjax.train import sharding as shd
  spec = [None] * ndim
  spec[batch_dim] = shd.batch_sharding(mesh, 1, 0, batch).spec[0] if batch > 1 else None
  if mesh.shape["tensor"] > 1 and kv_heads % mesh.shape["tensor"] == 0:
    spec[head_dim] = "tensor"
  return P(*spec)


def beacon_infer(slice_name: str, *, config: str = "beacon_qwen2", length: int = 131072,
                 batch: int = 1, new_tokens: int = 8, ratio: Optional[int] = 2,
                 impl: Optional[str] = None, mesh: Optional[dict] = None) -> list:
  """Activation Beacon inference at ``length`` tokens, the programs ``BeaconLM`` runs: the
  prefill's last (largest) ``lax.scan`` chunk (``scan_chunk`` = 8 windows at the memory bucket
  the prompt ends in; the prefill is ``length / (8 W)`` such calls at growing buckets) and one
  decode step after it (``decode_slots`` query slots at the final bucket). ``ratio`` 2 (the
  smallest of the config: the most memory) unless given; batch ``batch`` rows of random tokens.
  Mesh default ``{"tensor": 4, "fsdp": -1}``: heads and MLP over 4 chips (Qwen2-7B has 4 KV
  heads), the rest fsdp; parameters as the training mesh lays them out (bf16)."""
  from longjax import methods
  from longjax.beacon import BeaconLM
  from longjax.beacon.planner import RowState, stack
  from longjax.beacon.schedule import segments
  from longjax.beacon.step import Carry, scan_windows, window_step
  from longjax.kernels import flash
  c = _config(config)
  shape = SHAPES[config]
  mesh_shape = dict(mesh or {"data": 1, "fsdp": -1, "tensor": 4})
  impl = impl or "auto"
  method = methods.get(c.method)
  bcfg = method.settings(c)
  projections, n_embed, _ = method.extra_params(bcfg)
  cfg = _model_config(shape, alt_projections=projections, num_alt_embeddings=n_embed,
                      dtype="bfloat16", param_dtype="bfloat16")
  w = bcfg.window
  lm = BeaconLM(cfg, bcfg, max_length=-(-(length + new_tokens) // w) * w, ratio=ratio, impl=impl,
                progress=False)
  rng = np.random.default_rng(0)
  ids = [rng.integers(3, cfg.vocab_size, length).astype(np.int64) for _ in range(batch)]
  sch = lm.schedule
  call = sch.call(ids, None, None, tuple(RowState() for _ in range(batch)), False, ratio,
                  new_tokens)
  buckets = [sch.memory_bucket(n) for n in call.needs]
  chunks = segments(buckets, most=lm.scan_chunk)
  c0, c1, bucket = chunks[-1]
  plans = [sch.assemble(step, call.q_slots) for step in call.steps[c0:c1]]
  plans += [sch.assemble([None] * batch, call.q_slots)] * (lm.scan_chunk - len(plans))
  prefill_plan = stack(plans, [(lm.scan_chunk, bucket)], lm.capacity)
  dec = sch.call([[5]] * batch, None, None, call.rows, False, ratio, 0)
  dec_bucket = sch.memory_bucket(dec.needs[0])
  dec_plan = sch.assemble(dec.steps[0], dec.q_slots)
  n = len(topology(slice_name).devices)
  tag = f"{length // 1024}K" if length % 1024 == 0 else str(length)
  note = (f"{config}: {batch} x {tag} tokens, W={w}, ratio {ratio}, memory {lm.capacity} "
          f"entries/layer, attention {impl}, mesh {mesh_shape}")

  def args_for(plan):
    m = _mesh(slice_name, mesh_shape)
    params = _abstract_params(cfg, m, jnp.bfloat16)
    kv = _kv_spec(m, batch, cfg.num_kv_heads, 1, 3, 5)
    buf = jax.ShapeDtypeStruct((cfg.num_layers, batch, lm.capacity, cfg.num_kv_heads,
                                cfg.head_dim), jnp.bfloat16, sharding=NamedSharding(m, kv))
    rep = NamedSharding(m, P())
    carry = Carry(buf, buf, jax.ShapeDtypeStruct((batch, cfg.vocab_size), jnp.float32,
                                                 sharding=rep),
                  jax.ShapeDtypeStruct((batch,), jnp.float32, sharding=rep),
                  jax.ShapeDtypeStruct((batch,), jnp.int32, sharding=rep))
    return m, params, carry, jax.tree.map(_put(m), plan)

  def build_prefill():
    m, params, carry, plan = args_for(prefill_plan)

    def fn(params, carry, plan):
      with flash.target_platform("tpu"):
        return scan_windows(lm.model, lm.sink_cap, params, carry, plan, want_loss=False,
                            want_hidden=False)
    return fn, (params, carry, plan), m, {}

  def build_step():
    m, params, carry, plan = args_for(dec_plan)

    def fn(params, carry, plan):
      with flash.target_platform("tpu"):
        return window_step(lm.model, lm.sink_cap, params, carry, plan, mem_size=dec_bucket,
                           want_loss=False, want_hidden=False)
    return fn, (params, carry, plan), m, {}
  return [measure(f"beacon_prefill_{tag}", slice_name, n, build_prefill,
                  note=note + f"; the last of {len(chunks)} scan calls ({c1 - c0} windows, "
                  f"memory bucket {bucket})"),
          measure("beacon_decode_step", slice_name, n, build_step,
                  note=note + f"; {dec.q_slots} query slots over memory bucket {dec_bucket}")]


def focus_infer(slice_name: str, *, config: str = "focus_llama2", length: int = 131072,
                batch: int = 1, new_tokens: int = 8, impl: Optional[str] = None) -> list:
  """FocusLLM inference at ``length`` tokens, the programs ``FocusLLM`` runs: the prefill
  (condensing every chunk row ``chunk_batch_size`` = 8 rows per forward on each device, the chunk
  caches sized for ``new_tokens`` more, and the local forward) and one cached decode step (the
  2-token chunk step over every chunk cache, then the local forward). FocusLLM's own mesh: the
  chunk rows over every chip (``focus.chunk_mesh``); parameters replicated (bf16), as its
  ``shard_map`` takes them."""
  from jax.sharding import AxisType, Mesh
  from longjax import methods
  from longjax.focus import FocusLLM
  from longjax.kernels import flash
  from longjax.models.decoder import param_shapes
  c = _config(config)
  shape = SHAPES[config]
  impl = impl or "auto"
  method = methods.get(c.method)
  fcfg = method.settings(c, 1)
  projections, n_embed, _ = method.extra_params(fcfg)
  cfg = _model_config(shape, alt_projections=projections, num_alt_embeddings=n_embed,
                      dtype="bfloat16", param_dtype="bfloat16")
  devs = np.asarray(topology(slice_name).devices)
  mesh = Mesh(devs.reshape(-1), ("chunks",), axis_types=(AxisType.Auto,))
  fm = FocusLLM(cfg, fcfg, mesh=mesh, impl=impl)
  rng = np.random.default_rng(0)
  rows = [fm.plan(rng.integers(3, cfg.vocab_size, length).astype(np.int32))
          for _ in range(batch)]
  cb, lb, cap = fm._pack(rows, new_tokens)
  n = devs.size
  tag = f"{length // 1024}K" if length % 1024 == 0 else str(length)
  note = (f"{config}: {batch} x {tag} tokens, {cb.tokens.shape[0]} chunk rows x "
          f"{cb.tokens.shape[1]} tokens (stride {fcfg.chunk_stride}), cache {cap}/row, "
          f"local window {fcfg.local_window}, {fm.chunk_batch_size} rows per forward, "
          f"attention {impl}, mesh chunks={n}")
  rep = NamedSharding(mesh, P())
  params = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, jnp.bfloat16, sharding=rep),
                        param_shapes(cfg))
  state = {}

  def build_prefill():
    def fn(params, cb, lb):
      with flash.target_platform("tpu"):
        return fm._prefill_impl(params, cb, lb, cache_cap=cap, all_logits=False)
    args = (params, jax.tree.map(_put(mesh), cb), jax.tree.map(_put(mesh), lb))
    state["shapes"] = jax.eval_shape(fn, *args)[1]
    return fn, args, mesh, {}

  def keep(compiled):
    state["shardings"] = compiled.output_shardings[1]

  def build_step():
    s = jax.tree.map(lambda x, sh: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh),
                     state["shapes"], state["shardings"])
    tokens = jax.ShapeDtypeStruct((batch,), jnp.int32, sharding=rep)

    def fn(params, s, tokens):
      with flash.target_platform("tpu"):
        return fm._step_impl(params, s, tokens)
    return fn, (params, s, tokens), mesh, dict(donate=(1,))
  first = measure(f"focus_prefill_{tag}", slice_name, n, build_prefill, note=note,
                  on_compiled=keep)
  if not first.ok:
    return [first]
  return [first, measure("focus_decode_step", slice_name, n, build_step, note=note)]


PROGRAMS = ("kernels", "train_step", "beacon_infer", "focus_infer")
