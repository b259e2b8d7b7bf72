"""Rollout hooks: pipeline stages the trainer runs between collecting a step's rollout and `family.jobs`.

A hook sees the run through `Run`, the few parts and services it may use (the team, its collector, the
item sampler; building a team, a learner or a collector; running an update job), never the trainer
itself, so hooks live with their family and import nothing from `textzoo.runners`. The preference
pipeline (`textzoo.algorithms.preference.rounds`) holds the hooks of madpo with a comparator and of
marlhf; an algorithm names its hooks in its registry entry (`textzoo.algorithms.algorithm.Algorithm`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from textzoo.algorithms.batch import Job, Rollout
from textzoo.models.team import Actor

if TYPE_CHECKING:
    import torch

    from textzoo.config import AgentConfig, TrainConfig


class Collects(Protocol):
    """Plays a team on items (`textzoo.runners.rollout.Collector`)."""

    def collect(self, items: Sequence[int], seeds: Sequence[int], group_size: int) -> Rollout: ...


class Cursor(Protocol):
    """A data cursor over the training items (`textzoo.runners.build.ItemSampler`)."""

    def next(self, n: int) -> list[int]: ...


class Learns(Protocol):
    """An optimizer over one model (`textzoo.runners.update.Learner`): what a checkpoint keeps of it."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class Run(Protocol):
    """What a rollout hook may use of the run it is attached to (the `Trainer` provides it)."""

    roles: list[str]
    """The env's agents."""
    actors: list[Actor]
    """The team (one actor per role, or one joint actor)."""
    env_fn: Callable[[], Any]
    """Builds a training env copy."""
    collector: Collects
    """Plays the team on training items."""
    sampler: Cursor
    """The training data cursor (a hook that draws extra items moves it, and resumes with it)."""
    step: int
    """Training steps done so far."""

    def build_team(self, cfg: TrainConfig) -> list[Actor]:
        """A team for the run's roles built from `cfg` (a comparator's)."""
        ...

    def build_learner(self, model: torch.nn.Module, settings: AgentConfig, total_steps: int) -> Learns:
        """An optimizer for `model` with `settings`' learning rate, schedule and clipping."""
        ...

    def collector_for(self, actors: list[Actor]) -> Collects:
        """A collector that plays `actors` on the run's training env."""
        ...

    def run_job(self, job: Job, learner: Learns) -> dict[str, float]:
        """Train `learner` on `job` with the run's update settings; the job's statistics."""
        ...


class RolloutHook(Protocol):
    """A stage between collection and the family: it may replace the rollout and adds statistics."""

    def before_jobs(
        self, run: Run, rollout: Rollout, items: list[int], seeds: list[int]
    ) -> tuple[Rollout, dict[str, float]]:
        """The rollout the family learns from, and statistics to log for this step."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """Everything an exact resume needs (the trainer checkpoints it beside the family's state)."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...
