"""Lower the Pallas kernels for TPU and GPU on a host that has neither.

* ``tpu``: ``jax.export`` with ``platforms=("tpu",)`` runs Pallas -> Mosaic (block tiling rules,
  Mosaic op verifiers). Ops that ask for the chip (the GQA index map's ``h // g``) need a TPU
  device kind: :func:`lower` traces inside ``jax.sharding.use_abstract_mesh`` with an abstract TPU
  device. Lowering does not check VMEM limits or Mosaic layouts: compiling does
  (``scripts/compile_only.py``, needs ``libtpu``).
* ``cuda``: ``jit(f).trace(...).lower(lowering_platforms=("cuda",))`` runs Pallas -> Triton IR on
  the CPU with jaxlib <= 0.10.2. Later jaxlibs compile the Triton module at lowering time through
  the CUDA plugin: without it :func:`cuda_unavailable_reason` says so and the tests skip.

Both run inside ``flash.target_platform`` so that the one attention entry point
(``longjax.kernels.attention``) picks the accelerator's kernels, exactly as on the device.
:func:`kernel_cases` lists what the test suite lowers: every Pallas kernel (flash forward,
backward through its custom VJP, decode), bf16 and fp32, GQA, padded lengths, every mask kind
the kernels take (traced metadata, host-built block lists, a kind table), at production blocks.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from longjax.kernels import flash
from longjax.kernels.attention import attention
from longjax.kernels.decode import decode_attention
from longjax.kernels.errors import KernelError
from longjax.kernels.mask import KernelMeta, MaskRule, TokenMeta, kernel_meta

# Device kinds as jax reports them, by the short names used for topologies (v5e:2x2, ...).
TPU_KINDS = {"v4": "TPU v4", "v5e": "TPU v5 lite", "v5p": "TPU v5", "v6e": "TPU v6 lite"}
PLATFORMS = ("tpu", "cuda")


def abstract_tpu_mesh(device_kind: str = TPU_KINDS["v5e"]):
  """A one-device abstract mesh whose device is a TPU of ``device_kind`` (no hardware needed)."""
  from jax.sharding import AbstractMesh, AxisType
  try:
    from jax.sharding import AbstractDevice
  except ImportError:  # jax 0.10: not exported yet
    from jax._src.mesh import AbstractDevice
  dev = AbstractDevice(device_kind=device_kind, num_cores=1, platform="tpu")
  return AbstractMesh((1,), ("x",), (AxisType.Explicit,), abstract_device=dev)


def cuda_unavailable_reason() -> Optional[str]:
  """``None`` when Pallas -> Triton lowering for ``cuda`` works on this host, else why not."""
  from longjax.kernels import pallas_gpu
  if not pallas_gpu.available():
    return "the Pallas Triton backend is not in this jax"
  import jaxlib
  version = tuple(int(x) for x in jaxlib.__version__.split(".")[:3] if x.isdigit())
  if version > (0, 10, 2):
    # Since jaxlib 0.10.3 the Triton lowering compiles the module with the Triton compiler of the
    # CUDA plugin (``jaxlib.gpu_triton.TritonKernel`` exists only when the plugin is installed).
    try:
      import jaxlib.gpu_triton as gpu_triton
      has_plugin = hasattr(gpu_triton, "TritonKernel")
    except Exception:
      has_plugin = False
    if not has_plugin:
      return (f"jaxlib {jaxlib.__version__} compiles Triton at lowering time through the CUDA "
              "plugin, which this host lacks (the CPU-side lowering stops at jaxlib 0.10.2)")
  return None


def lower(fn: Callable, args: Sequence, platform: str, *,
          device_kind: str = TPU_KINDS["v5e"]) -> str:
  """Lower ``jax.jit(fn)(*args)`` (``args``: arrays or ``ShapeDtypeStruct`` pytrees) for
  ``platform`` (``"tpu"`` or ``"cuda"``); returns the StableHLO text. Raises whatever the lowering
  raises."""
  if platform == "tpu":
    from jax import export
    with (flash.target_platform("tpu"),
          jax.sharding.use_abstract_mesh(abstract_tpu_mesh(device_kind))):
      return export.export(jax.jit(fn), platforms=("tpu",))(*args).mlir_module()
  if platform == "cuda":
    with flash.target_platform("gpu"):
      return jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
  raise KernelError(f"unknown platform {platform!r}; choose one of {PLATFORMS}")


def kernel_names(platform: str) -> tuple:
  """The ``pallas_call`` names a lowering for ``platform`` must contain."""
  return ("longjax_flash_tpu",) if platform == "tpu" else ("longjax_flash_gpu",)


# ------------------------------------------------------------------------------------------------
# Cases.
# ------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Case:
  """One program to lower: ``fn(*args)``; ``backend`` the kernel flavour (``tpu`` | ``gpu``)."""
  name: str
  backend: str
  fn: Callable
  args: tuple

  @property
  def platform(self) -> str:
    return "tpu" if self.backend == flash.Backend.TPU else "cuda"


def _sds(shape, dtype):
  return jax.ShapeDtypeStruct(shape, dtype)


def meta_avals(b, tq, tk, bias=False) -> KernelMeta:
  """Traced kernel metadata (as the decoder passes it, from inside ``jit`` / ``nn.scan``);
  ``bias``: with a key score bias (FocusLLM's candidate gate)."""
  i = lambda t: _sds((b, t), jnp.int32)
  return KernelMeta(q_lo=i(tq), q_hi=i(tq), q_seg=i(tq), q_kind=i(tq), k_order=i(tk), k_seg=i(tk),
                    k_kind=i(tk), k_bias=_sds((b, tk), jnp.float32) if bias else None)


def qkv_avals(b, tq, tk, hq, hkv, d, dtype):
  return _sds((b, tq, hq, d), dtype), _sds((b, tk, hkv, d), dtype), _sds((b, tk, hkv, d), dtype)


def beacon_meta(b, mem, win, ratio=8):
  """Concrete metadata of a beacon window (append mode: raw tokens, then beacons with a kind
  table) over ``mem`` memory keys: host-built block lists, block skipping in the grid."""
  raw = win - win // (ratio + 1)
  nb = win - raw
  win_order = np.concatenate([mem + np.arange(raw), mem + (np.arange(nb) + 1) * ratio - 1])
  win_kind = np.concatenate([np.zeros(raw), np.ones(nb)]).astype(np.int32)
  k_order = np.concatenate([np.arange(mem), win_order])[None].repeat(b, 0).astype(np.int32)
  k_kind = np.concatenate([np.zeros(mem, np.int32), win_kind])[None].repeat(b, 0)
  q_order = win_order[None].repeat(b, 0).astype(np.int32)
  q_valid = np.ones(q_order.shape, bool)
  q_valid[-1, -3:] = False  # a padded tail
  qm = TokenMeta.causal(q_order, valid=q_valid, kind=win_kind[None].repeat(b, 0))
  km = TokenMeta.causal(k_order, kind=k_kind)
  rule = MaskRule(True, kind_sees=(0b01, 0b11))
  return kernel_meta(qm, km, rule), rule


def _flash(backend, kind_sees=None, **kw):
  def fn(q, k, v, m):
    return flash.flash_attention(q, k, v, m, scale=q.shape[-1] ** -0.5, kind_sees=kind_sees,
                                 backend=backend, **kw)
  return fn


def _decode(backend, kind_sees=None, **kw):
  def fn(q, k, v, m):
    return decode_attention(q, k, v, m, scale=q.shape[-1] ** -0.5, kind_sees=kind_sees,
                            backend=backend, **kw)
  return fn


def _grad(fn):
  """``d loss / d(q, k, v)`` through the kernel's custom VJP (forward kernel + blockwise bwd)."""
  def loss(q, k, v, m):
    out, lse = fn(q, k, v, m)
    return jnp.sum(out.astype(jnp.float32)) + jnp.sum(jnp.where(jnp.isfinite(lse), lse, 0.0))
  return jax.grad(loss, argnums=(0, 1, 2))


def _entry(rule, impl="pallas"):
  """The one entry point, as the decoder calls it (window traced); the backend comes from the
  target platform."""
  def fn(q, k, v, qm, km, window):
    return attention(q, k, v, qm, km, rule, window=window, impl=impl, return_lse=True)
  return fn


def _token_avals(b, t, kind=False):
  i = _sds((b, t), jnp.int32)
  return TokenMeta(order=i, valid=_sds((b, t), jnp.bool_), segment=i, kind=i if kind else None)


def kernel_cases(backends=tuple(flash.Backend)) -> list:
  """Every Pallas kernel at production block sizes (see module docstring)."""
  bf16, f32 = jnp.bfloat16, jnp.float32
  cases = []
  for be in backends:
    # Qwen2-7B heads (28 q / 4 kv, D 128) and Llama-2-7B (32 / 32); lengths not block multiples.
    cases += [
        Case("flash_fwd_bf16_gqa7_padded", be, _flash(be),
             (*qkv_avals(2, 1000, 3000, 28, 4, 128, bf16), meta_avals(2, 1000, 3000))),
        Case("flash_fwd_fp32_mha_padded", be, _flash(be), (*qkv_avals(1, 700, 700, 8, 8, 128, f32),
                                                           meta_avals(1, 700, 700))),
        Case("flash_fwd_bf16_kind_table", be, _flash(be, kind_sees=(0b01, 0b11)),
             (*qkv_avals(1, 1152, 5248, 28, 4, 128, bf16), meta_avals(1, 1152, 5248))),
        Case("flash_fwd_bf16_d64_short", be, _flash(be), (*qkv_avals(2, 40, 100, 9, 3, 64, bf16),
                                                          meta_avals(2, 40, 100))),
        Case("flash_bwd_bf16_gqa", be, _grad(_flash(be)),
             (*qkv_avals(1, 1000, 3000, 28, 4, 128, bf16), meta_avals(1, 1000, 3000))),
        Case("flash_bwd_fp32_kind_table", be, _grad(_flash(be, kind_sees=(0b01, 0b11))),
             (*qkv_avals(1, 300, 900, 4, 2, 128, f32), meta_avals(1, 300, 900))),
        Case("decode_bf16_gqa7_splitk", be, _decode(be),
             (*qkv_avals(1, 1, 131_072 + 77, 28, 4, 128, bf16), meta_avals(1, 1, 131_072 + 77))),
        Case("decode_fp32_2tok_mha", be, _decode(be), (*qkv_avals(2, 2, 5000, 32, 32, 128, f32),
                                                       meta_avals(2, 2, 5000))),
        Case("decode_bwd_bf16", be, _grad(_decode(be)), (*qkv_avals(1, 2, 3000, 8, 2, 128, bf16),
                                                         meta_avals(1, 2, 3000))),
        # a key score bias (FocusLLM's candidate gate): one more key-side operand
        Case("flash_fwd_bf16_key_bias", be, _flash(be),
             (*qkv_avals(1, 600, 1400, 9, 3, 64, bf16), meta_avals(1, 600, 1400, bias=True))),
        Case("decode_bf16_key_bias", be, _decode(be),
             (*qkv_avals(1, 1, 9000, 9, 3, 64, bf16), meta_avals(1, 1, 9000, bias=True))),
    ]
    # Concrete metadata: block lists built on the host (grid as long as the longest list).
    km, rule = beacon_meta(2, 2048, 1152)
    cases.append(Case("flash_fwd_bf16_host_lists", be,
                      lambda q, k, v, _be=be, _km=km, _r=rule:
                          _flash(_be, kind_sees=_r.kind_sees)(q, k, v, _km),
                      qkv_avals(2, 1152, 2048 + 1152, 28, 4, 128, bf16)))
    # The entry point (dispatch by target platform): flash and decode, traced window.
    rule = MaskRule(True)
    cases.append(Case("entry_flash_window", be, _entry(rule),
                      (*qkv_avals(1, 1000, 1000, 28, 4, 128, bf16), _token_avals(1, 1000),
                       _token_avals(1, 1000), _sds((), jnp.int32))))
    cases.append(Case("entry_decode", be, _entry(rule),
                      (*qkv_avals(1, 1, 4099, 28, 4, 128, bf16), _token_avals(1, 1),
                       _token_avals(1, 4099), _sds((), jnp.int32))))
  return cases
