"""Numeric precision of an agent: the dtype its weights (and so its optimizer state) are kept in, and
the dtype its forwards compute in.

- ``auto`` (the default): ``bf16-mixed`` for a model of at least `AUTO_MIN_PARAMETERS` parameters on a
  device that computes bfloat16 natively (`native_bf16`: a CPU with AVX512-BF16 or AMX-BF16, a CUDA GPU
  with bf16 support), else ``fp32``. Resolved when the model is built (`resolve`), from the model and
  its device; the run's config.json records what it resolved to.
- ``fp32``: float32 weights and compute.
- ``bf16-mixed``: float32 master weights and float32 AdamW state; forwards (sampling, scoring, the
  update's forward and its recomputations) run under ``torch.autocast`` in bfloat16, so matmuls read
  bfloat16 copies while gradients land on the float32 weights. What RL fine-tuning of 0.5B-8B models
  on GPUs usually wants: half the activation memory and bf16 tensor-core speed, no loss of small updates.
- ``bf16-weights``: the weights themselves in bfloat16 (so AdamW's moments too): half the weight memory,
  but updates smaller than a weight's bf16 resolution are lost.
- ``fp16-weights``: the same in float16.
"""

from __future__ import annotations

import functools
import os
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch

from textzoo.decoding.settings import AUTO


@dataclass(frozen=True)
class Precision:
    """Weights dtype and compute (autocast) dtype of one precision setting."""

    weights: torch.dtype
    compute: torch.dtype | None
    """The autocast dtype of forwards; None = compute in the weights' dtype."""


PRECISIONS: dict[str, Precision] = {
    "fp32": Precision(torch.float32, None),
    "bf16-mixed": Precision(torch.float32, torch.bfloat16),
    "bf16-weights": Precision(torch.bfloat16, None),
    "fp16-weights": Precision(torch.float16, None),
}
"""Precision name (`AgentConfig.precision`) -> what it means."""

AUTO_MIN_PARAMETERS = 20_000_000
"""Models smaller than this stay fp32 under ``auto``: their steps are bound by per-op overhead, not by
matmul throughput, so bf16 buys no speed there and would only cost precision (the tiny defaults)."""

ONEDNN_KERNEL_CACHE = 64
"""Compiled oneDNN kernels a process keeps (``ONEDNN_PRIMITIVE_CACHE_CAPACITY``; oneDNN's default is
1024). torch's bf16 CPU matmuls compile one per shape, and a run's shapes keep changing (each decode step's
key length, each micro-batch's width), so the default cache fills with ~1000 kernels of 0.25-0.6 MiB.
SmolLM2-135M, two agents, B=8, 3 steps (`benchmarks/real_model.py`'s config): peak RSS 5770 -> 5434
MiB, kernel compilation 0.25 -> 0.57 s in all (of ~60 s). Set at import, before torch's first oneDNN
kernel (the variable is read then); a value already in the environment wins."""
os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", str(ONEDNN_KERNEL_CACHE))

BF16_CPU_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})
"""/proc/cpuinfo flags of x86 CPUs with bfloat16 matrix instructions (oneDNN uses them for bf16 matmuls)."""


def autocast(device: torch.device, dtype: torch.dtype | None) -> AbstractContextManager:
    """``torch.autocast`` to ``dtype`` on ``device``'s type; a no-op context when ``dtype`` is None."""
    return nullcontext() if dtype is None else torch.autocast(device.type, dtype=dtype)


def native_bf16(device: torch.device) -> bool:
    """Whether ``device`` multiplies bfloat16 matrices natively (faster than float32): a CUDA GPU that
    supports bf16, or a CPU whose flags include AVX512-BF16 / AMX-BF16 with oneDNN in this torch."""
    if device.type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported(including_emulation=False)
    if device.type == "cpu":
        return torch.backends.mkldnn.is_available() and bool(cpu_flags() & BF16_CPU_FLAGS)
    return False


@functools.cache
def cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> frozenset[str]:
    """The CPU feature flags the kernel reports (empty where there is no /proc/cpuinfo, e.g. macOS)."""
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def resolve(name: str, model: torch.nn.Module, device: torch.device) -> str:
    """The precision ``name`` means for ``model`` on ``device``: itself, or for ``auto`` bf16-mixed on a
    native-bf16 device for a model of at least `AUTO_MIN_PARAMETERS` parameters, else fp32."""
    if name != AUTO:
        return name
    parameters = sum(p.numel() for p in model.parameters())
    return "bf16-mixed" if parameters >= AUTO_MIN_PARAMETERS and native_bf16(device) else "fp32"


def slow_bf16(name: str, device: torch.device) -> str | None:
    """Why precision ``name`` (as resolved) will be slow on ``device``, or None: bfloat16 compute on a CPU
    without bf16 matrix instructions (AVX2-only x86, say), where torch emulates it: measured on an
    AVX2-only EPYC at 1 thread, a 2048 x 2048 bf16 matmul ran at 0.3 GFLOP/s against 68-70 in fp32,
    and a SmolLM2 decode step 1.3 s against 0.4 s."""
    dtype = PRECISIONS[name].compute or PRECISIONS[name].weights
    if device.type != "cpu" or dtype != torch.bfloat16 or native_bf16(device):
        return None
    return (
        f"precision {name!r} computes in bfloat16, but this CPU has no bf16 matrix instructions "
        f"({' / '.join(sorted(BF16_CPU_FLAGS))} are not in /proc/cpuinfo): torch emulates them, several to "
        "hundreds of times slower than float32. Use precision 'fp32' (what 'auto' picks here)."
    )
