"""The data a policy samples with and produces: `GenerationConfig` (how) and `Generation` (what)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields

import torch
import torch.nn.functional as F

from textzoo.decoding.settings import SamplingConfig
from textzoo.errors import ConfigError


@dataclass
class GenerationConfig(SamplingConfig):
    """How a policy samples completions: the sampling settings, plus the token ids it may produce."""

    allowed_tokens: tuple[int, ...] | None = None
    """Restrict sampling and scoring to these token ids (EOS is always allowed); None = all."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.allowed_tokens is not None:
            self.allowed_tokens = tuple(int(t) for t in self.allowed_tokens)
            if not self.allowed_tokens or min(self.allowed_tokens) < 0:
                raise ConfigError(
                    "generation.allowed_tokens must be a non-empty list of token ids >= 0 (or None), "
                    f"got {self.allowed_tokens!r}"
                )


@dataclass
class Generation:
    """A batch of S sampled completions; all tensors on the policy's device.

    ``completion_mask`` is 1 on every sampled token up to and including the one that ended the
    sample (EOS, the token that completed a stop string, or the last token of the budget). A scripted
    completion (`Policy.generate_script`) also holds forced tokens: context, with mask 0.
    ``texts`` are the decoded completions without the EOS; a stop string is kept and anything the
    final token added after it is cut.
    """

    prompt_ids: torch.Tensor  # [S, P] left-padded
    prompt_mask: torch.Tensor  # [S, P] 1 on real prompt tokens
    completion_ids: torch.Tensor  # [S, C] right-padded
    completion_mask: torch.Tensor  # [S, C] 1 on scored tokens
    logprobs: torch.Tensor  # [S, C] sampling log-probs, 0 where the mask is 0
    texts: list[str] = field(default_factory=list)
    """The decoded completions (empty when a batch was built from ids alone)."""
    prompt_features: torch.Tensor | None = None
    """[S, d] the model's final hidden state at each prompt's last token, when the sampling pass
    produced it (the plain-torch decoder does): what a value head on this model's trunk reads."""
    engine_logprobs: torch.Tensor | None = None
    """[S, C] a rollout engine's own sampling log-probs of the completion tokens (0 where the mask is 0),
    when an engine sampled them and ``logprobs`` hold the trainer's re-scoring (`textzoo.decoding.engine`);
    None for the policy's own decoder. What truncated importance sampling weighs the losses with."""

    def __len__(self) -> int:
        """The number of samples S (the rows of the tensors, whether or not ``texts`` were decoded)."""
        return self.prompt_ids.shape[0]

    def select(self, index: Sequence[int] | torch.Tensor) -> Generation:
        """The sub-batch at ``index`` (padding columns that became all-pad are dropped)."""
        idx = torch.as_tensor(index, dtype=torch.long, device=self.prompt_ids.device).reshape(-1)  # [S']
        prompt_mask = self.prompt_mask[idx]  # [S', P]
        completion_mask = self.completion_mask[idx]  # [S', C]
        first = first_used_column(prompt_mask)
        last = last_used_column(completion_mask)
        return Generation(
            prompt_ids=self.prompt_ids[idx, first:],
            prompt_mask=prompt_mask[:, first:],
            completion_ids=self.completion_ids[idx, :last],
            completion_mask=completion_mask[:, :last],
            logprobs=self.logprobs[idx, :last],
            texts=[self.texts[i] for i in idx.tolist()] if self.texts else [],
            prompt_features=None if self.prompt_features is None else self.prompt_features[idx],
            engine_logprobs=None if self.engine_logprobs is None else self.engine_logprobs[idx, :last],
        )

    def to(self, device: torch.device | str) -> Generation:
        """A copy with every tensor on ``device``."""
        tensors = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "texts"}
        moved = {name: None if t is None else t.to(device) for name, t in tensors.items()}
        return Generation(**moved, texts=list(self.texts))

    @staticmethod
    def cat(items: list[Generation], pad_id: int) -> Generation:
        """Concatenate batches: prompts re-padded on the left, completions on the right. ``engine_logprobs``
        are kept when any batch has them (a batch without them contributes its ``logprobs``: weight 1)."""
        if not items:
            raise ValueError("Generation.cat needs at least one batch")
        P = max(g.prompt_ids.shape[1] for g in items)
        C = max(g.completion_ids.shape[1] for g in items)

        def left(t: torch.Tensor, value: float) -> torch.Tensor:
            return F.pad(t, (P - t.shape[1], 0), value=value)

        def right(t: torch.Tensor, value: float) -> torch.Tensor:
            return F.pad(t, (0, C - t.shape[1]), value=value)

        return Generation(
            prompt_ids=torch.cat([left(g.prompt_ids, pad_id) for g in items]),  # [S, P]
            prompt_mask=torch.cat([left(g.prompt_mask, 0) for g in items]),  # [S, P]
            completion_ids=torch.cat([right(g.completion_ids, pad_id) for g in items]),  # [S, C]
            completion_mask=torch.cat([right(g.completion_mask, 0) for g in items]),  # [S, C]
            logprobs=torch.cat([right(g.logprobs, 0.0) for g in items]),  # [S, C]
            texts=[t for g in items for t in g.texts] if all(len(g.texts) == len(g) for g in items) else [],
            prompt_features=None
            if any(g.prompt_features is None for g in items)
            else torch.cat([g.prompt_features for g in items]),
            engine_logprobs=None
            if all(g.engine_logprobs is None for g in items)
            else torch.cat([right(g.logprobs if g.engine_logprobs is None else g.engine_logprobs, 0.0) for g in items]),
        )


def first_used_column(mask: torch.Tensor) -> int:
    """Index of the first column of a left-padded mask with any 1 (its width when none)."""
    used = mask.any(0).nonzero()
    return int(used[0]) if len(used) else mask.shape[1]


def last_used_column(mask: torch.Tensor) -> int:
    """One past the last column of a right-padded mask with any 1 (0 when none)."""
    used = mask.any(0).nonzero()
    return int(used[-1]) + 1 if len(used) else 0


def left_padded(rows: Sequence[Sequence[int]], pad_id: int, min_width: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of token ids as left-padded ids and mask ([S, P], P = the longest row, at least `min_width`):
    the one encoder of prompts (`Policy.encode`, `PromptFormat.encode`) and of critic texts."""
    P = max((len(r) for r in rows), default=0)
    P = max(P, min_width)
    ids = torch.full((len(rows), P), pad_id, dtype=torch.long)  # [S, P]
    mask = torch.zeros((len(rows), P), dtype=torch.long)  # [S, P]
    for i, r in enumerate(rows):
        if len(r):
            ids[i, P - len(r) :] = torch.as_tensor(list(r), dtype=torch.long)
            mask[i, P - len(r) :] = 1
    return ids, mask
