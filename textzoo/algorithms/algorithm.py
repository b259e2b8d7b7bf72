"""What a registry entry is: one algorithm's family, builder, defaults and rules (plain data: no torch import).

Each family folder lists its entries in its `entries.py`; `textzoo.algorithms.registry` gathers them.
A builder imports its family (and so torch) only when a run builds it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from textzoo.errors import ConfigError

if TYPE_CHECKING:
    from textzoo.algorithms.family import Family
    from textzoo.algorithms.hooks import RolloutHook, Run
    from textzoo.config import TrainConfig
    from textzoo.models.team import Actor


def _no_check(cfg: TrainConfig) -> None:
    pass


def _no_team_check(cfg: TrainConfig, roles: list[str]) -> None:
    pass


def _no_hooks(cfg: TrainConfig, run: Run) -> list[RolloutHook]:
    return []


@dataclass(frozen=True)
class Algorithm:
    """One algorithm: the family that learns, its builder, and what it adds to the config."""

    family: str
    """The family, which is also the config section it reads (`cfg.reinforce`, `cfg.actor_critic`, `cfg.preference`)."""
    build: Callable[[TrainConfig, list[Actor]], Family] | None
    """The family over the team's actors (critics and frozen references included); None for an algorithm
    that learns with another registered one (`trains_with`)."""
    defaults: Mapping[str, Any] = field(default_factory=dict)
    """Fields of the family's config section set for this algorithm unless the user set them."""
    check: Callable[[TrainConfig], None] = _no_check
    """Rules across fields, run when the run is built (after the defaults), before any model is built."""
    check_team: Callable[[TrainConfig, list[str]], None] = _no_team_check
    """Rules on the env's agents, run by the trainer before any model is built."""
    hooks: Callable[[TrainConfig, Run], list[RolloutHook]] = _no_hooks
    """Stages the trainer runs between collection and `family.jobs` (the preference pipeline), built with the
    run they work in (each builds what it needs next to the run's models when it is constructed)."""
    trains_with: Callable[[TrainConfig], str] | None = None
    """The name of the online algorithm whose family learns for this one (marlhf: `preference.rl_algo`); the
    registry configures, checks and builds that one as well."""

    def configure(self, cfg: TrainConfig) -> None:
        """Fill this algorithm's defaults into `cfg`'s section of its family, then check its rules."""
        if self.defaults:
            setattr(cfg, self.family, with_defaults(getattr(cfg, self.family), self.defaults))
        self.check(cfg)


def with_defaults(section: Any, defaults: Mapping[str, Any]) -> Any:
    """`section` (a config dataclass) with `defaults` in the fields that still hold their class default."""
    base = {f.name: f.default for f in dataclasses.fields(section)}
    unknown = sorted(set(defaults) - set(base))
    if unknown:
        raise ConfigError(f"algorithm defaults name {unknown}, which {type(section).__name__} does not have")
    fill = {k: v for k, v in defaults.items() if getattr(section, k) == base[k]}
    return dataclasses.replace(section, **fill) if fill else section


# ---- rules several families share ------------------------------------------------------------------
def check_no_tree(cfg: TrainConfig) -> None:
    """Only AT-GRPO collects tree rollouts."""
    if cfg.reinforce.tree_rollout:
        raise ConfigError(f"reinforce.tree_rollout is AT-GRPO's rollout and {cfg.algo} ignores it: use algo='atgrpo'")


def check_acting_role(cfg: TrainConfig) -> None:
    """Self-play credit is the reinforce family's."""
    if cfg.credit == "acting_role":
        raise ConfigError(
            f"credit='acting_role' (self-play credit) is a reinforce-family setting; {cfg.algo} takes "
            "credit 'shared' or 'per_agent'"
        )
