"""Rollout hooks: pipeline stages the trainer runs between collecting a step's rollout and `family.jobs`.

A hook sees the run through `Run`, the few parts it may use (the team, its collector, the item
sampler), never the trainer itself. The preference pipeline (`textzoo.algorithms.preference.rounds`) is the
hook of madpo with a comparator and of marlhf; an algorithm names its hooks in the registry
(`textzoo.algorithms.registry`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from textzoo.algorithms.batch import Rollout
from textzoo.models.team import Actor
from textzoo.runners.build import ItemSampler
from textzoo.runners.rollout import Collector


class Run(Protocol):
    """What a rollout hook may use of the run it is attached to (the `Trainer` provides it)."""

    roles: list[str]
    """The env's agents."""
    actors: list[Actor]
    """The team (one actor per role, or one joint actor)."""
    env_fn: Callable[[], Any]
    """Builds a training env copy."""
    collector: Collector
    """Plays the team on training items."""
    sampler: ItemSampler
    """The training data cursor (a hook that draws extra items moves it, and resumes with it)."""
    step: int
    """Training steps done so far."""


class RolloutHook(Protocol):
    """A stage between collection and the family: it may replace the rollout and adds statistics."""

    def attach(self, run: Run) -> None:
        """Build what the hook needs next to the run's models (once, before the first step)."""
        ...

    def before_jobs(
        self, run: Run, rollout: Rollout, items: list[int], seeds: list[int]
    ) -> tuple[Rollout, dict[str, float]]:
        """The rollout the family learns from, and statistics to log for this step."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """Everything an exact resume needs (the trainer checkpoints it beside the family's state)."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...
