"""The one interface between the trainer and an algorithm family.

A family turns a `Rollout` into update `Job`s; the trainer executes them with `run_job`. Families
never touch optimizers, devices or files, and the trainer never branches on the algorithm.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from textzoo.agents.batch import Job, Rollout


class Family(Protocol):
    """What every algorithm family provides (see `ReinforceFamily` for the reference one)."""

    needs_greedy_baseline: bool
    """Ask the trainer for one extra greedy rollout per prompt (`rollout.greedy`)."""

    def jobs(self, rollout: Rollout) -> tuple[list[Job], dict[str, float]]:
        """Update jobs for this batch (one per learner and objective) and statistics to log."""
        ...

    def trainable_models(self) -> dict[str, tuple[torch.nn.Module, Any]]:
        """Models the family trains besides the actors: name -> (module, AgentConfig-like settings)."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """State beyond weights that an exact resume needs (running baselines, pair stores)."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...
