"""Named task settings: env arguments and the token budgets the roles need, as data.

A task module lists its presets in `PRESETS` (name -> `TaskPreset`; the module docstring says what
each one is and how a small model did on it). `TaskPreset.train_fields()` gives the `TrainConfig`
fields that apply one:

    from textzoo.envs.planpath_v0 import PRESETS
    cfg = TrainConfig(env="textzoo/PlanPath-v0", **PRESETS["open-4x4"].train_fields(), ...)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class TaskPreset:
    """Env arguments of a setting, and each role's completion budget in tokens (`max_new_tokens`)."""

    env_kwargs: dict[str, Any]
    max_new_tokens: dict[str, int] = field(default_factory=dict)
    """Role -> tokens; the sum is the joint actor's budget (centralized)."""

    def train_fields(self, collaboration: str = "decentralized") -> dict[str, Any]:
        """`env_kwargs`, and the budgets as `agent_overrides` (decentralized) or `joint_max_new_tokens`."""
        out: dict[str, Any] = {"env_kwargs": dict(self.env_kwargs)}
        if collaboration == "centralized":
            out["joint_max_new_tokens"] = sum(self.max_new_tokens.values())
        else:
            out["agent_overrides"] = {role: {"max_new_tokens": n} for role, n in self.max_new_tokens.items()}
        return out
