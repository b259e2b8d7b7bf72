"""Numeric precision of an agent: the dtype its weights (and so its optimizer state) are kept in, and
the dtype its forwards compute in.

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

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import torch


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


def autocast(device: torch.device, dtype: torch.dtype | None) -> AbstractContextManager:
    """``torch.autocast`` to ``dtype`` on ``device``'s type; a no-op context when ``dtype`` is None."""
    return nullcontext() if dtype is None else torch.autocast(device.type, dtype=dtype)
