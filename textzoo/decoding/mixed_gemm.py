"""``total += a.T @ b`` with bfloat16 ``a``, ``b`` and a float32 ``total``, in one GEMM on CPU.

A bf16 linear layer's weight gradient is ``grad.T @ x`` over the rows of a batch. torch 2.13 on CPU
computes it in bf16 (``mm`` has no float32 output there: ``out_dtype`` is not implemented for CPU and
mixed-dtype ``addmm_`` is refused), and adding it to a float32 ``.grad`` then costs a cast and a read
and write of the gradient per weight per backward pass, and rounds each micro-batch's gradient to bf16.
MKL, which torch's CPU wheels link, has the mixed GEMM (``cblas_gemm_bf16bf16f32``: bf16 operands,
float32 accumulation and output, AMX kernels where the CPU has them); its symbol is exported from
``libtorch_cpu``, so ctypes reaches it without a build step. Measured on SmolLM2-135M's shapes (345
rows, 1 thread, Intel AMX): gate/up [3072, 576] 1.15 ms vs 2.89 ms for bf16 ``mm`` then ``add_``,
the tied 49,152 x 576 head 52 vs 171 ms (timed in place: docs/results/retired-update_ops.md). Without AMX
MKL runs it at about float32 speed, slower than the bf16 product and add (`fast`).
"""

from __future__ import annotations

import ctypes
import functools
import os

import torch
from torch.utils.flop_counter import register_flop_formula

from textzoo.decoding.precision import cpu_flags

_ROW_MAJOR, _NO_TRANS, _TRANS = 101, 111, 112  # MKL's CBLAS_LAYOUT and CBLAS_TRANSPOSE values


@functools.cache
def _gemm() -> ctypes._CFuncPtr | None:
    """MKL's ``cblas_gemm_bf16bf16f32`` in this torch's CPU library (LP64: 32-bit sizes), or None."""
    if not torch.backends.mkl.is_available():
        return None
    try:
        lib = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so"))
        fn = lib.cblas_gemm_bf16bf16f32
    except (OSError, AttributeError):
        return None
    i, f, p = ctypes.c_int, ctypes.c_float, ctypes.c_void_p
    fn.argtypes = [i, i, i, i, i, i, f, p, i, p, i, f, p, i]
    fn.restype = None
    return fn if _agrees(fn) else None


def _agrees(gemm: ctypes._CFuncPtr) -> bool:
    """Whether one small product matches torch's exactly (a build that took other sizes would not)."""
    a = torch.arange(6.0).reshape(3, 2).bfloat16()
    b = torch.arange(12.0).reshape(3, 4).bfloat16()
    total = torch.ones(2, 4)
    gemm(_ROW_MAJOR, _TRANS, _NO_TRANS, 2, 4, 3, 1.0, a.data_ptr(), 2, b.data_ptr(), 4, 1.0, total.data_ptr(), 4)
    return torch.equal(total, 1 + a.float().T @ b.float())


def available() -> bool:
    """Whether `add_product` can run here (a CPU torch built with MKL that exports the mixed GEMM)."""
    return _gemm() is not None


def fast() -> bool:
    """Whether the mixed GEMM runs here and beats a bf16 product, cast and add: on CPUs with AMX (``amx_bf16``),
    where MKL has matrix-unit kernels for it. Elsewhere MKL runs it at about float32 speed: AMD EPYC with
    avx512_bf16 and no AMX, 345 rows, 1 thread, 2026-12-04: gate/up [3072, 576] 13.8 ms vs 6.8 ms for the
    bf16 ``mm`` and ``add_``, the tied 49,152 x 576 head 213 vs 171 ms."""
    return available() and "amx_bf16" in cpu_flags()


def _rows(t: torch.Tensor) -> bool:
    """Whether ``t`` ([n, m]) has contiguous rows: its row stride is the GEMM's leading dimension."""
    return t.dim() == 2 and t.stride(1) == 1 and t.stride(0) >= max(t.shape[1], 1)


def add_product(total: torch.Tensor, a: torch.Tensor, b: torch.Tensor, accumulate: bool = True) -> None:
    """``total += a.T @ b`` in place (``total = a.T @ b`` without ``accumulate``: its contents are not
    read): ``a`` [n, m] and ``b`` [n, k] bfloat16 on CPU (rows contiguous, e.g. a column slice),
    ``total`` [m, k] float32 contiguous. Each product and sum in float32. A torch op
    (``torch.ops.textzoo.add_product``), so profilers, dispatch modes and FLOP counters see it."""
    if not available():
        raise RuntimeError("this torch has no MKL bf16 x bf16 -> fp32 GEMM; check `mixed_gemm.available()` first")
    n, m = a.shape
    k = b.shape[1]
    if b.shape[0] != n or total.shape != (m, k):
        shapes = f"total {tuple(total.shape)} += a.T {tuple(a.shape)} @ b {tuple(b.shape)}"
        raise ValueError(f"shapes do not match: {shapes}")
    if a.dtype != torch.bfloat16 or b.dtype != torch.bfloat16 or total.dtype != torch.float32:
        raise ValueError(f"needs bfloat16 a and b and a float32 total, got {a.dtype}, {b.dtype}, {total.dtype}")
    if a.device.type != "cpu" or b.device.type != "cpu" or total.device.type != "cpu":
        raise ValueError("add_product runs on CPU tensors")
    if not (_rows(a) and _rows(b) and total.is_contiguous()):
        raise ValueError("add_product needs a and b with contiguous rows and a contiguous total")
    torch.ops.textzoo.add_product(total, a, b, accumulate)


@torch.library.custom_op("textzoo::add_product", mutates_args=("total",), device_types="cpu")
def _add_product(total: torch.Tensor, a: torch.Tensor, b: torch.Tensor, accumulate: bool) -> None:
    n, m = a.shape
    k = b.shape[1]
    if m == 0 or k == 0:
        return
    if n == 0:
        if not accumulate:
            total.zero_()
        return
    # row-major C[m, k] = A^T B + beta C, with A = a [n, m] (transposed) and B = b [n, k]
    beta = 1.0 if accumulate else 0.0
    gemm = _gemm()
    gemm(_ROW_MAJOR, _TRANS, _NO_TRANS, m, k, n, 1.0, a.data_ptr(), a.stride(0), b.data_ptr(), b.stride(0),
         beta, total.data_ptr(), k)  # fmt: skip


@register_flop_formula(torch.ops.textzoo.add_product)
def _flop(total_shape, a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
    """Multiply-adds of ``a.T @ b`` times 2 (as torch counts ``mm``)."""
    return 2 * a_shape[0] * a_shape[1] * b_shape[1]
