"""Loss building blocks shared by every family: policy gradient, aggregation, reference KL.

Every loss here is a pure function of tensors. A loss returns **per-sample contributions**
`c[m]` whose sum is the batch loss, so a runner may back-propagate any split of the batch
(micro-batches, or one sample at a time with `per_sample_backward`) and get the batched gradient.
The batch-level normaliser (samples in the batch, tokens in the batch) is passed in, never
recomputed from a micro-batch.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

Aggregation = Callable[[torch.Tensor, torch.Tensor, "BatchNorm"], torch.Tensor]


class BatchNorm:
    """Sizes of the whole (mini)batch a micro-batch belongs to: samples, tokens, token budget."""

    def __init__(self, num_samples: int, num_tokens: int, max_new_tokens: int):
        self.num_samples = max(int(num_samples), 1)
        self.num_tokens = max(int(num_tokens), 1)
        self.max_new_tokens = max(int(max_new_tokens), 1)

    @classmethod
    def of(cls, completion_mask: torch.Tensor, max_new_tokens: int) -> BatchNorm:
        return cls(completion_mask.shape[0], int(completion_mask.sum()), max_new_tokens)


def _seq_sum(token_loss: torch.Tensor, mask: torch.Tensor, n: BatchNorm) -> torch.Tensor:
    # sum over tokens, mean over samples (CoMLRL's aggregation)
    return (token_loss * mask).sum(-1) / n.num_samples  # [S]


def _seq_mean(token_loss: torch.Tensor, mask: torch.Tensor, n: BatchNorm) -> torch.Tensor:
    # mean over each sample's tokens, then over samples (GRPO paper)
    return (token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1) / n.num_samples  # [S]


def _token_mean(token_loss: torch.Tensor, mask: torch.Tensor, n: BatchNorm) -> torch.Tensor:
    # mean over every token of the batch (DAPO)
    return (token_loss * mask).sum(-1) / n.num_tokens  # [S]


def _constant(token_loss: torch.Tensor, mask: torch.Tensor, n: BatchNorm) -> torch.Tensor:
    # sum over tokens / (token budget x samples): a length-independent constant (Dr. GRPO)
    return (token_loss * mask).sum(-1) / (n.max_new_tokens * n.num_samples)  # [S]


AGGREGATIONS: dict[str, Aggregation] = {
    "seq_sum": _seq_sum,
    "seq_mean": _seq_mean,
    "token_mean": _token_mean,
    "constant": _constant,
}


def policy_gradient_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    norm: BatchNorm,
    aggregation: str = "seq_sum",
    clip_range: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-sample contributions of the REINFORCE / PPO-clip objective, and detached statistics.

    Without `clip_range`: token loss −A·ℓ_k (on-policy REINFORCE, Williams 1992).
    With `clip_range` ε: −min(ρ_k A, clip(ρ_k, 1−ε, 1+ε) A), ρ_k = exp(ℓ_k − ℓ_k^old)
    (PPO, Schulman et al. 2017, eq. 7). Shared by the reinforce and actor-critic families and
    by the joint actor, which is what makes their losses identical by construction.

    Shapes: logprobs, old_logprobs, mask [S, C]; advantages [S].
    """
    mask = mask.to(logprobs.dtype)
    adv = advantages.to(logprobs.dtype).unsqueeze(-1)  # [S, 1]
    log_ratio = (logprobs - old_logprobs.detach()) * mask  # [S, C]
    ratio = torch.exp(log_ratio)  # [S, C]
    if clip_range is None:
        token_loss = -adv * logprobs  # [S, C]
        clipped = torch.zeros_like(mask)
    else:
        unclipped = ratio * adv
        clipped_obj = torch.clamp(ratio, 1.0 - clip_range, 1.0 + clip_range) * adv
        token_loss = -torch.minimum(unclipped, clipped_obj)  # [S, C]
        clipped = (clipped_obj < unclipped).to(mask.dtype)
    contrib = AGGREGATIONS[aggregation](token_loss, mask, norm)  # [S]
    tokens = mask.sum().clamp(min=1)
    stats = {
        "clipfrac": ((clipped * mask).sum() / tokens).detach(),
        "approx_kl": ((((ratio - 1) - log_ratio) * mask).sum() / tokens).detach(),
    }
    return contrib, stats


def k3_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-sample KL(π‖π_ref) with the k3 estimator Σ_k [exp(ℓ_ref−ℓ) − (ℓ_ref−ℓ) − 1] (Schulman 2020).

    Shapes: logprobs, ref_logprobs, mask [S, C] -> [S].
    """
    d = (ref_logprobs - logprobs) * mask  # [S, C]
    return ((torch.exp(d) - d - 1) * mask).sum(-1)  # [S]


def entropy_bonus(entropy: torch.Tensor, mask: torch.Tensor, norm: BatchNorm, aggregation: str) -> torch.Tensor:
    """Per-sample contributions of −H (to minimise), aggregated like the policy loss. Shapes [S, C] -> [S]."""
    return AGGREGATIONS[aggregation](-entropy, mask.to(entropy.dtype), norm)
