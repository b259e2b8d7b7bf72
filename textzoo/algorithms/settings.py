"""The names the algorithm families share, and their shared config rules, as plain data (no torch import)."""

from __future__ import annotations

from typing import Literal, get_args

from textzoo.errors import ConfigError

Credit = Literal["shared", "per_agent", "acting_role"]
CREDITS: tuple[str, ...] = get_args(Credit)
"""Who is credited with a reward: the team (shared), each agent (per_agent), or the role each sample played
(acting_role, self-play: `rlmath.acting_role_returns`, read by the reinforce family from the rollout)."""
ESTIMATORS = ("grpo", "rloo", "remax", "reinforce")
"""Baselines of the reinforce family (`textzoo.algorithms.rlmath.advantages`)."""
GROUP_ESTIMATORS = ("grpo", "rloo")
"""Estimators that compare the samples of a group (they need group_size >= 2)."""
Aggregation = Literal["seq_sum", "seq_mean", "token_mean", "constant"]
AGGREGATION_NAMES: tuple[str, ...] = get_args(Aggregation)
"""`loss_aggregation` names (`textzoo.algorithms.rlmath.AGGREGATIONS` holds their functions)."""


def check_policy_update(section: str, clip_range: float | None, epochs: int, minibatches: int) -> None:
    """The policy-update settings that the reinforce and actor-critic configs share, checked alike."""
    if clip_range is not None and not 0 < clip_range < 1:
        raise ConfigError(f"{section}.clip_range must be in (0, 1) or None, got {clip_range}")
    if epochs < 1 or minibatches < 1:
        raise ConfigError(f"{section}.epochs and {section}.minibatches must be >= 1")


def check_estimator(estimator: str, group_size: int) -> None:
    """An estimator exists and has the group it needs (grpo and rloo compare samples of a group)."""
    if estimator not in ESTIMATORS:
        raise ConfigError(f"unknown estimator {estimator!r}; choose one of {ESTIMATORS}")
    if estimator in GROUP_ESTIMATORS and group_size < 2:
        raise ConfigError(f"{estimator} compares samples within a group: set group_size >= 2 (got {group_size})")
