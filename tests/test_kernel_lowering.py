"""Every Pallas kernel lowers for TPU (Pallas -> Mosaic) and GPU (Pallas -> Triton) on this CPU.

No accelerator needed: ``longjax.kernels.lowering`` exports for ``tpu`` under an abstract TPU
device and lowers for ``cuda`` with ``lowering_platforms``. The cases are the production block
sizes (TPU 128 x 128, GPU 128 x 64), bf16 and fp32, GQA, padded lengths, traced metadata and
host-built block lists, a kind table, forward, backward (custom VJP) and decode. Lowering checks
the TPU tiling rules and the Mosaic / Triton op verifiers, not VMEM or shared-memory sizes: the
compile-only TPU checks (``tests/test_compile_only.py``, ``-m slow``, needs ``libtpu``) do that.
The whole file takes a few seconds.
"""
from __future__ import annotations

import jax.numpy as jnp
import pytest

from longjax.kernels import explain, flash, lowering, pallas_gpu, pallas_tpu
from longjax.kernels.attention import pallas_unsupported_reason

CASES = lowering.kernel_cases()
CUDA_SKIP = lowering.cuda_unavailable_reason()


def _skip_cuda(case):
  if case.platform == "cuda" and CUDA_SKIP:
    pytest.skip(CUDA_SKIP)


@pytest.mark.parametrize("case", CASES, ids=[f"{c.platform}-{c.name}" for c in CASES])
def test_kernel_lowers(case):
  _skip_cuda(case)
  text = lowering.lower(case.fn, case.args, case.platform)
  for name in lowering.kernel_names(case.platform):
    assert name in text, f"{name} missing: the program did not go through the Pallas kernel"


def test_cases_cover_every_kernel():
  names = {(c.backend, c.name.split("_")[0], c.name.split("_")[1]) for c in CASES}
  for be in ("tpu", "gpu"):
    for kind in [("flash", "fwd"), ("flash", "bwd"), ("decode", "bf16"), ("decode", "bwd"),
                 ("entry", "flash"), ("entry", "decode")]:
      assert (be, *kind) in names, (be, kind)
    for dtype in ("bf16", "fp32"):
      assert any(c.backend == be and f"_{dtype}" in c.name for c in CASES), (be, dtype)


@pytest.mark.parametrize("chip", sorted(lowering.TPU_KINDS))
def test_tpu_kernel_lowers_for_each_chip(chip):
  case = next(c for c in CASES if c.backend == "tpu" and c.name == "flash_fwd_bf16_gqa7_padded")
  text = lowering.lower(case.fn, case.args, "tpu", device_kind=lowering.TPU_KINDS[chip])
  assert "longjax_flash_tpu" in text


# ------------------------------------------------------------------------------------------------
# A broken block shape fails, first with the project's own message, then in Mosaic itself.
# ------------------------------------------------------------------------------------------------
BROKEN = dict(block_q=128, block_k=64)  # 64 key columns: not a multiple of 128 (TPU lanes)


def _broken_case():
  q, k, v = lowering.qkv_avals(1, 1000, 3000, 28, 4, 128, jnp.bfloat16)
  fn = lambda q, k, v, m: flash.flash_attention(q, k, v, m, scale=0.1, backend="tpu", **BROKEN)
  return fn, (q, k, v, lowering.meta_avals(1, 1000, 3000))


def test_broken_tpu_block_shape_is_refused_with_one_clear_error():
  fn, args = _broken_case()
  with pytest.raises(ValueError, match=r"TPU block rule: block_k=64 must be a multiple of 128"):
    lowering.lower(fn, args, "tpu")


def test_broken_tpu_block_shape_fails_the_lowering_itself(monkeypatch):
  """Without the project's check, Mosaic refuses the block: the lowering test would catch a
  broken block shape even if ``pallas_tpu.supported`` missed it."""
  monkeypatch.setattr(pallas_tpu, "supported", lambda *a, **k: None)
  fn, args = _broken_case()
  with pytest.raises(Exception, match=r"divisible by 8 and 128"):
    lowering.lower(fn, args, "tpu")


def test_broken_gpu_block_shape_is_refused():
  if CUDA_SKIP:
    pytest.skip(CUDA_SKIP)
  q, k, v = lowering.qkv_avals(1, 1000, 3000, 28, 4, 128, jnp.bfloat16)
  fn = lambda q, k, v, m: flash.flash_attention(q, k, v, m, scale=0.1, backend="gpu", block_q=128,
                                                block_k=48)
  with pytest.raises(ValueError, match=r"powers of two"):
    lowering.lower(fn, (q, k, v, lowering.meta_avals(1, 1000, 3000)), "cuda")


@pytest.mark.parametrize("tq,tk,bq,bk,bad", [
    (1000, 3000, None, None, None),          # production defaults (128, 128)
    (1000, 3000, 256, 512, None),
    (40, 100, None, None, None),             # one block spans each (padded) axis
    (1000, 3000, 128, 64, "block_k=64 must be a multiple of 128"),
    (1000, 3000, 16, 16, "block_k=16 must be a multiple of 128"),  # the interpret tests' blocks
    (1000, 3000, 4, 128, "block_q=4 must be a multiple of 8"),
])
def test_pallas_unsupported_reason_checks_tpu_blocks(tq, tk, bq, bk, bad):
  with flash.target_platform("tpu"):
    reason = pallas_unsupported_reason((1, tq, 28, 128), (1, tk, 4, 128), jnp.bfloat16,
                                       backend="tpu", block_q=bq, block_k=bk)
  if bad is None:
    assert reason is None
  else:
    assert reason.startswith("TPU block rule: ") and bad in reason, reason
  # Interpret mode has no tiling rules.
  assert pallas_unsupported_reason((1, tq, 28, 128), (1, tk, 4, 128), jnp.bfloat16, backend="tpu",
                                   block_q=bq, block_k=bk, interpret=True) is None


def test_target_platform_drives_dispatch(monkeypatch):
  monkeypatch.delenv("LONGJAX_PALLAS_INTERPRET", raising=False)
  monkeypatch.delenv("LONGJAX_PALLAS_BACKEND", raising=False)
  shapes = ((1, 1000, 28, 128), (1, 1000, 4, 128), jnp.bfloat16)
  assert explain(*shapes)[0] == "chunked"  # this CPU host
  with flash.target_platform("tpu"):
    assert explain(*shapes) == ("pallas_flash", "Pallas on tpu")
    assert explain((1, 1, 28, 128), (1, 5000, 4, 128), jnp.bfloat16)[0] == "pallas_decode"
    assert flash.resolve_backend() == "tpu"
  with flash.target_platform("gpu"):
    assert explain(*shapes) == ("pallas_flash", "Pallas on gpu")
    assert flash.resolve_backend() == "gpu"
  assert flash.platform() == "cpu"
  with pytest.raises(ValueError, match="unknown target platform"):
    with flash.target_platform("cuda"):
      pass


def test_gpu_supported_rules():
  assert pallas_gpu.supported(128, 128, 64) is None
  assert "power of two" in pallas_gpu.supported(80, 128, 64)
