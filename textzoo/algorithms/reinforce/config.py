"""The REINFORCE family's config section (`TrainConfig.reinforce`), plain data: no torch import."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from textzoo.algorithms.settings import check_aggregation, check_policy_update
from textzoo.errors import ConfigError
from textzoo.typecheck import check_fields


@dataclass
class ReinforceConfig:
    """Settings of the group-relative REINFORCE family."""

    advantage_scale: Literal["std", "none"] = "std"
    """"std": divide by the group's std of returns (+1e-6); "none": leave unscaled (Dr. GRPO)."""
    std_floor: float = 0.0
    """Lower bound on the group std when scaling, so near-constant sparse rewards do not blow up."""
    loss_aggregation: str = "seq_sum"
    """How token losses make a sample's loss: seq_sum | seq_mean | token_mean | constant, or one added with
    `register_aggregation` (`textzoo.algorithms.settings.AGGREGATIONS`)."""
    clip_range: float | None = None
    """PPO ratio clip ε; None = plain on-policy REINFORCE gradient."""
    epochs: int = 1
    """Passes over each batch (>1 needs clip_range so the off-policy ratio is bounded)."""
    minibatches: int = 1
    """Optimizer steps per pass over a batch."""
    kl_coef: float = 0.0
    """β of the KL to a frozen copy of the initial policy (k1 in the reward, k3 in the loss: see kl_in);
    0 disables the reference copy."""
    kl_in: Literal["reward", "loss"] = "reward"
    """"reward": subtract β·Σ_k log(π/π_ref) (k1) from the turn's reward; "loss": add β·KL_k3 per token to the loss."""
    joint_mode: Literal["aligned", "cross"] = "aligned"
    """"aligned": sample g of every agent forms joint action g; "cross": all G^N combinations."""
    reinforce_baseline: Literal["none", "running_mean", "per_role"] = "none"
    """For estimator reinforce: "none", "running_mean" (mean of past returns, momentum 0.9) or "per_role"
    (RAE: an average of the returns of the role each sample played, momentum 0.95; for self-play)."""
    tree_rollout: bool = False
    """atgrpo only: after each turn keep each prompt's best branch (team reward of the turn; ties: the first)
    and copy it to the prompt's other G − 1 env copies, so every turn's G samples come from one state."""

    def __post_init__(self) -> None:
        check_fields(self, "reinforce.")
        check_policy_update("reinforce", self.clip_range, self.epochs, self.minibatches)
        check_aggregation(self.loss_aggregation, "reinforce")
        if self.epochs > 1 and self.clip_range is None:
            raise ConfigError("reinforce.epochs > 1 reuses samples off-policy: set reinforce.clip_range (e.g. 0.2)")
        if self.kl_coef < 0:
            raise ConfigError(f"reinforce.kl_coef must be >= 0, got {self.kl_coef}")
        if self.std_floor < 0:
            raise ConfigError(f"reinforce.std_floor must be >= 0, got {self.std_floor}")
