"""The one interface between the trainer and an algorithm family.

A family turns a `Rollout` into update `Job`s; the trainer executes them with `run_job`. Families
never touch optimizers, files or device placement, and the trainer never branches on the algorithm:
what a family needs beyond the plain rollout it declares in `needs`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch

from textzoo.agents.batch import Job, Rollout
from textzoo.agents.rlmath import AGGREGATIONS
from textzoo.errors import ConfigError


@dataclass(frozen=True)
class RolloutNeeds:
    """The extra rollouts a family asks the runner for, besides the B x G samples of each step."""

    greedy: bool = False
    """One greedy (argmax) rollout of each prompt, as `rollout.greedy` (ReMax's baseline)."""
    cross: bool = False
    """The reward of every combination of the actors' samples, as `rollout.cross_rewards` (joint mode cross)."""


class Family(Protocol):
    """What every algorithm family provides (see `ReinforceFamily` for the reference one)."""

    needs: RolloutNeeds
    """Extra rollouts the runner collects for this family each step."""

    def jobs(self, rollout: Rollout) -> tuple[list[Job], dict[str, float]]:
        """Update jobs for this batch (one per learner and objective) and statistics to log."""
        ...

    def trainable_models(self) -> dict[str, tuple[torch.nn.Module, Any]]:
        """Models the family trains besides the actors: name -> (module, AgentConfig-like settings)."""
        ...

    def frozen_models(self) -> dict[str, torch.nn.Module]:
        """Frozen models the family reads (reference copies): placement name -> module."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """State beyond weights that an exact resume needs (running baselines, pair stores)."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def check_policy_update(
    section: str, aggregation: str, clip_range: float | None, epochs: int, minibatches: int
) -> None:
    """The policy-update settings that the reinforce and actor-critic configs share, checked alike."""
    if aggregation not in AGGREGATIONS:
        raise ConfigError(f"{section}.loss_aggregation must be one of {sorted(AGGREGATIONS)}, got {aggregation!r}")
    if clip_range is not None and not 0 < clip_range < 1:
        raise ConfigError(f"{section}.clip_range must be in (0, 1) or None, got {clip_range}")
    if epochs < 1 or minibatches < 1:
        raise ConfigError(f"{section}.epochs and {section}.minibatches must be >= 1")
