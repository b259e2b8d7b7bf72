"""Running models outside an update: eval mode (`textzoo.decoding.modes`), no gradients, a batch at a time.

`chunks` splits a batch of samples so that scoring a large batch never holds all its activations at
once; `score_no_grad` is the one scorer of old and reference log-probs.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

import torch
import torch.nn.functional as F

from textzoo.decoding.generation import Generation
from textzoo.decoding.modes import eval_mode


class Scorer(Protocol):
    """A model that scores completions (`textzoo.models.policy.Policy` is one): what `score_no_grad` reads."""

    model: torch.nn.Module

    @property
    def device(self) -> torch.device: ...

    def score(self, prompt_ids, prompt_mask, completion_ids, completion_mask, *, return_entropy=False) -> Any:
        """Token log-probs [S, C] of the completions after the prompts."""
        ...


CHUNK = 64
"""Samples per forward when a whole batch is scored without gradients."""


def chunks(gen: Generation, size: int = CHUNK) -> Iterator[Generation]:
    """`gen` as consecutive sub-batches of at most `size` samples (nothing for an empty batch)."""
    for start in range(0, len(gen), size):
        yield gen.select(torch.arange(start, min(start + size, len(gen))))


@torch.no_grad()
def score_no_grad(policy: Scorer, gen: Generation, chunk: int = CHUNK) -> torch.Tensor:
    """Token log-probs [S, C] of `gen`'s completions under `policy`, in eval mode (no dropout), without
    gradients, `chunk` samples at a time; on the policy's device, as wide as `gen`'s completions."""
    width = gen.completion_ids.shape[1]
    out = []
    with eval_mode(policy.model):
        for part in chunks(gen, chunk):
            lp = policy.score(part.prompt_ids, part.prompt_mask, part.completion_ids, part.completion_mask)
            out.append(F.pad(lp, (0, width - lp.shape[1])))  # [s, C]
    return torch.cat(out) if out else torch.zeros(0, width, device=policy.device)
