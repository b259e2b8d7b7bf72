"""The median family's config section (`TrainConfig.median`), plain data: no torch import."""

from __future__ import annotations

from dataclasses import dataclass

from textzoo.errors import ConfigError
from textzoo.typecheck import check_fields


@dataclass
class MedianConfig:
    """Settings of the median-baseline family."""

    min_group: int = 3
    """Fewest samples per prompt the median is taken over."""

    def __post_init__(self) -> None:
        check_fields(self, "median.")  # every value of the type its annotation names
        if self.min_group < 2:
            raise ConfigError(f"median.min_group must be >= 2, got {self.min_group}")
