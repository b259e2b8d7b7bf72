"""The actor-critic family's config section (`TrainConfig.actor_critic`), plain data: no torch import."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from textzoo.algorithms.settings import check_aggregation, check_policy_update
from textzoo.errors import ConfigError
from textzoo.typecheck import check_fields


@dataclass
class ActorCriticConfig:
    """Settings of the actor-critic family (IAC, MAAC, IPPO, MAPPO)."""

    critic_type: Literal["v", "q"] = "v"
    """"v": V(s) at the last prompt token; "q": Q(s, a) at the last completion token."""
    critic_model: str = ""
    """Critic trunk: "" = a copy of the actor's model (IAC) / of `agent.model` (MAAC); "actor" = a value
    head on the actor's own trunk (IAC/IPPO: no second model; only the head learns from the value
    loss, on features read once per batch); else a model spec."""
    critic_lr: float | None = None
    """AdamW learning rate of the critics; None = the agent's lr."""
    value_head_hidden: int = 0
    """Width of a hidden tanh layer in the value head (0 = a linear head)."""
    value_head_init_std: float = 0.0
    """Std of the value head's output weights at init (0 = zeros: every value starts at 0)."""
    critic_max_tokens: int = 1024
    """Longest critic input (the model's position limit caps it); longer inputs keep their last tokens."""
    gae_lambda: float = 1.0
    """GAE λ over turns: 1 = Monte Carlo returns minus V, 0 = one-step TD."""
    value_coef: float = 1.0
    """c_v, the weight of the critic's squared error."""
    value_clip: float | None = None
    """ε_v of PPO-style value clipping around the old value; None = no clipping."""
    entropy_coef: float = 0.0
    """Weight of the actor's entropy bonus (0 = off)."""
    loss_aggregation: str = "seq_sum"
    """How token losses make a sample's loss: seq_sum | seq_mean | token_mean | constant, or one added with
    `register_aggregation` (`textzoo.algorithms.settings.AGGREGATIONS`)."""
    clip_range: float | None = None
    """PPO ratio clip ε of the actor loss; None = on-policy gradient. ippo / mappo default it to 0.2."""
    epochs: int | None = None
    """Passes over each batch, actors and critics alike (>1 needs clip_range); None = the algorithm's
    default: 1, or 2 for ippo / mappo."""
    minibatches: int = 1
    """Optimizer steps per pass over a batch."""

    def __post_init__(self) -> None:
        check_fields(self, "actor_critic.")
        check_aggregation(self.loss_aggregation, "actor_critic")
        if self.critic_lr is not None and self.critic_lr <= 0:
            raise ConfigError(f"actor_critic.critic_lr must be > 0 (or None for the agent's lr), got {self.critic_lr}")
        if self.value_head_hidden < 0:
            raise ConfigError(
                f"actor_critic.value_head_hidden must be >= 0 (0 = linear head), got {self.value_head_hidden}"
            )
        if self.value_head_init_std < 0:
            raise ConfigError(f"actor_critic.value_head_init_std must be >= 0, got {self.value_head_init_std}")
        if self.critic_max_tokens < 1:
            raise ConfigError(f"actor_critic.critic_max_tokens must be >= 1, got {self.critic_max_tokens}")
        if not 0 <= self.gae_lambda <= 1:
            raise ConfigError(f"actor_critic.gae_lambda must be in [0, 1], got {self.gae_lambda}")
        if self.value_coef <= 0:
            raise ConfigError(f"actor_critic.value_coef must be > 0, got {self.value_coef}")
        if self.value_clip is not None and self.value_clip <= 0:
            raise ConfigError(f"actor_critic.value_clip must be > 0 or None, got {self.value_clip}")
        if self.entropy_coef < 0:
            raise ConfigError(f"actor_critic.entropy_coef must be >= 0, got {self.entropy_coef}")
        epochs = 1 if self.epochs is None else self.epochs  # None: the algorithm's default
        check_policy_update("actor_critic", self.clip_range, epochs, self.minibatches)


def check_actor_critic(config: ActorCriticConfig, centralized: bool, credit: str) -> None:
    """The actor-critic rules across fields (checked when the run is built)."""
    if (config.epochs or 1) > 1 and config.clip_range is None:
        raise ConfigError("actor_critic.epochs > 1 reuses samples off-policy: set actor_critic.clip_range (e.g. 0.2)")
    if centralized and credit != "shared":
        raise ConfigError(
            "maac/mappo's centralized critic estimates the team's return: use credit='shared' "
            "(or iac/ippo, whose per-agent critics follow credit='per_agent')"
        )
    if centralized and config.critic_model == "actor":
        raise ConfigError(
            "actor_critic.critic_model='actor' puts a value head on each actor's trunk: use it with "
            "iac/ippo (maac/mappo's critic reads the whole state, not one actor's prompt)"
        )
