"""The names the algorithm families share, and their shared config rules, as plain data (no torch import).

The estimator and loss-aggregation registries live here: a config names an entry and is checked without
torch; the built-in functions are in `textzoo.algorithms.rlmath`, imported when a run computes with them.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, get_args

from textzoo.errors import ConfigError
from textzoo.plugins import ALGORITHMS, load_entry_points

Credit = Literal["shared", "per_agent", "acting_role"]
CREDITS: tuple[str, ...] = get_args(Credit)
"""Who is credited with a reward: the team (shared), each agent (per_agent), or the role each sample played
(acting_role, self-play: `rlmath.acting_role_returns`, read by the reinforce family from the rollout)."""
Ref = Callable[..., Any] | str
"""A registered function, or "module:name" for a built-in one (imported when a run first computes with it,
so that a config names it without importing torch)."""


def load(ref: Ref) -> Callable[..., Any]:
    """The function `ref` names."""
    if callable(ref):
        return ref
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


@dataclass(frozen=True)
class Estimator:
    """An advantage estimator of the reinforce family: ``fn(returns, mask, greedy_returns, running_mean)`` ->
    the advantages before scaling ([B, G, A, T] each; `textzoo.algorithms.rlmath.advantages` scales them),
    and what it needs: the samples of a group to compare (`group`), the greedy rollout's returns (`greedy`)."""

    fn: Ref
    group: bool = False
    greedy: bool = False


ESTIMATORS: dict[str, Estimator] = {
    "grpo": Estimator("textzoo.algorithms.rlmath:grpo_advantages", group=True),
    "rloo": Estimator("textzoo.algorithms.rlmath:rloo_advantages", group=True),
    "remax": Estimator("textzoo.algorithms.rlmath:remax_advantages", greedy=True),
    "reinforce": Estimator("textzoo.algorithms.rlmath:reinforce_advantages"),
}
"""The reinforce family's estimators by name (`register_estimator` adds one)."""
AGGREGATIONS: dict[str, Ref] = {
    "seq_sum": "textzoo.algorithms.rlmath:seq_sum",
    "seq_mean": "textzoo.algorithms.rlmath:seq_mean",
    "token_mean": "textzoo.algorithms.rlmath:token_mean",
    "constant": "textzoo.algorithms.rlmath:constant",
}
"""`loss_aggregation` name -> ``fn(token_loss [S, C], mask [S, C], norm: BatchNorm)`` -> each sample's share [S]
of the batch loss (`register_aggregation` adds one)."""


def register_estimator(name: str, fn: Callable[..., Any], *, group: bool = False, greedy: bool = False) -> None:
    """Make ``fn`` the reinforce family's estimator ``name`` (`Estimator`); an algorithm built on it is
    ``reinforce_algorithm(name)`` (`textzoo.algorithms.reinforce.entries`)."""
    if name in ESTIMATORS:
        raise ConfigError(f"estimator {name!r} is already registered; pick another name")
    ESTIMATORS[name] = Estimator(fn, group, greedy)


def register_aggregation(name: str, fn: Callable[..., Any]) -> None:
    """Make ``fn`` the loss aggregation ``name`` (`AGGREGATIONS`), for ``loss_aggregation`` of every family."""
    if name in AGGREGATIONS:
        raise ConfigError(f"aggregation {name!r} is already registered; pick another name")
    AGGREGATIONS[name] = fn


def _known(name: str, registry: dict[str, Any]) -> bool:
    """Whether `name` is registered, after loading the packages that register through entry points."""
    if name not in registry:
        load_entry_points(ALGORITHMS, ConfigError)
    return name in registry


def check_policy_update(section: str, clip_range: float | None, epochs: int, minibatches: int) -> None:
    """The policy-update settings that the reinforce and actor-critic configs share, checked alike."""
    if clip_range is not None and not 0 < clip_range < 1:
        raise ConfigError(f"{section}.clip_range must be in (0, 1) or None, got {clip_range}")
    if epochs < 1 or minibatches < 1:
        raise ConfigError(f"{section}.epochs and {section}.minibatches must be >= 1")


def check_aggregation(name: str, section: str) -> None:
    """`name` is a registered loss aggregation."""
    if not _known(name, AGGREGATIONS):
        raise ConfigError(
            f"{section}.loss_aggregation {name!r} is not registered; choose one of {', '.join(AGGREGATIONS)}"
        )


def check_estimator(estimator: str, group_size: int) -> None:
    """An estimator exists and has the group it needs (grpo and rloo compare samples of a group)."""
    if not _known(estimator, ESTIMATORS):
        raise ConfigError(f"unknown estimator {estimator!r}; choose one of {', '.join(ESTIMATORS)}")
    if ESTIMATORS[estimator].group and group_size < 2:
        raise ConfigError(f"{estimator} compares samples within a group: set group_size >= 2 (got {group_size})")
