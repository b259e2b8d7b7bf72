"""What the rest of textzoo reads of a policy: the `Policy` class and every stand-in (a test's toy softmax,
a scripted answerer) provide all of it, so no caller has to ask whether an attribute is there."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, Protocol, runtime_checkable

import torch

from textzoo.decoding.generation import Generation, GenerationConfig


@runtime_checkable
class PolicyInterface(Protocol):
    """A model that samples completions of prompts and scores completions it sampled."""

    model: torch.nn.Module
    """The trainable module (what optimizers, placement and checkpoints see)."""
    tokenizer: Any
    """The tokenizer its prompts are encoded with; None for a stand-in that reads no text."""
    generation: GenerationConfig
    """Its sampling settings, fixed when it is built."""
    pad_id: int
    """The id that pads prompts (left) and completions (right)."""
    eos_ids: tuple[int, ...]
    """Ids that end a completion."""
    engine: Any
    """The rollout engine client that samples for it (`textzoo.decoding.engine.EngineClient`), or None: it
    samples itself."""

    @property
    def device(self) -> torch.device: ...

    def generate(
        self, prompts: list[str], *, greedy: bool = False, generator: torch.Generator | None = None
    ) -> Generation:
        """One sampled (or greedy) completion per prompt, with its sampling log-probs."""
        ...

    def score(self, prompt_ids, prompt_mask, completion_ids, completion_mask, *, return_entropy=False) -> Any:
        """Token log-probs [S, C] of the completions ([S, C] right-padded after the [S, P] left-padded
        prompts), and their entropies [S, C] with `return_entropy`."""
        ...

    def prompt_cache(self) -> AbstractContextManager[None]:
        """A block in which scoring calls of one sample at a time share their prompt's work (or nothing)."""
        ...
