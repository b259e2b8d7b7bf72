"""Running models outside an update: eval mode (`textzoo.models.modes`), no gradients, a batch at a time.

`chunks` splits a batch of samples so that scoring a large batch never holds all its activations at
once; `score_no_grad` is the one scorer of old and reference log-probs.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from textzoo.models.generation import Generation
from textzoo.models.modes import eval_mode

if TYPE_CHECKING:
    from textzoo.models.policy import Policy

CHUNK = 64
"""Samples per forward when a whole batch is scored without gradients."""


def chunks(gen: Generation, size: int = CHUNK) -> Iterator[Generation]:
    """`gen` as consecutive sub-batches of at most `size` samples (nothing for an empty batch)."""
    for start in range(0, len(gen), size):
        yield gen.select(torch.arange(start, min(start + size, len(gen))))


@torch.no_grad()
def score_no_grad(policy: Policy, gen: Generation, chunk: int = CHUNK) -> torch.Tensor:
    """Token log-probs [S, C] of `gen`'s completions under `policy`, in eval mode (no dropout), without
    gradients, `chunk` samples at a time; on the policy's device, as wide as `gen`'s completions."""
    width = gen.completion_ids.shape[1]
    out = []
    with eval_mode(policy.model):
        for part in chunks(gen, chunk):
            lp = policy.score(part.prompt_ids, part.prompt_mask, part.completion_ids, part.completion_mask)
            out.append(F.pad(lp, (0, width - lp.shape[1])))  # [s, C]
    return torch.cat(out) if out else torch.zeros(0, width, device=policy.device)
