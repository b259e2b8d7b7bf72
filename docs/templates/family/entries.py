"""The median family's registry entries (plain data: the builder imports the family when a run builds it)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from textzoo.algorithms.algorithm import Algorithm, check_acting_role
from textzoo.errors import ConfigError

if TYPE_CHECKING:
    from textzoo.config import TrainConfig
    from textzoo.models.team import Actor


def build_median(cfg: TrainConfig, actors: list[Actor]):
    """The median family over the team (its loss settings are the reinforce section's)."""
    from .family import MedianFamily  # in a textzoo folder: textzoo.algorithms.<family>.family

    return MedianFamily(cfg.reinforce, actors, cfg.gamma, cfg.credit)


def check_median(cfg: TrainConfig) -> None:
    """Rules across fields, checked when the run is built (before any model is)."""
    check_acting_role(cfg)
    if cfg.group_size < cfg.median.min_group:
        raise ConfigError(
            f"mamedian takes the median of at least median.min_group={cfg.median.min_group} samples: "
            f"set group_size >= {cfg.median.min_group} (got {cfg.group_size})"
        )


ENTRIES: dict[str, Algorithm] = {"mamedian": Algorithm("median", build_median, check=check_median)}
