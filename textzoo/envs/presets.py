"""Named task settings: env arguments, the token budgets the roles need and a sampling temperature, as data.

A task module lists its presets in `PRESETS` (name -> `TaskPreset`; the module docstring says what
each one is, and docs/results/presets.md how a small model did on it). `TaskPreset.train_fields()`
gives the `TrainConfig` fields that apply one; pass the agent settings to get them back with the
preset's temperature:

    from textzoo.envs.debate_v0 import PRESETS
    cfg = TrainConfig(env="textzoo/Debate-v0", **PRESETS["sums-30"].train_fields(agent=AgentConfig(model=...)))
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from textzoo.errors import EnvError


@dataclass(frozen=True)
class TaskPreset:
    """Env arguments of a setting, each role's completion budget in tokens (`max_new_tokens`) and the
    sampling temperature of its rollouts."""

    env_kwargs: dict[str, Any]
    max_new_tokens: dict[str, int] = field(default_factory=dict)
    """Role -> tokens; the joint actor (centralized) gives each role's section the same budget."""
    temperature: float = 1.0
    """The rollouts' sampling temperature, chosen from the zero-shot probe (`benchmarks/preset_probe.py`):
    the one where the sampled episodes of the untrained team solve most often past greedy (pass@8)."""

    def __post_init__(self) -> None:
        if not self.temperature > 0:
            raise EnvError(f"a preset's temperature must be > 0, got {self.temperature}")

    def train_fields(self, collaboration: str = "decentralized", agent: Any = None) -> dict[str, Any]:
        """`env_kwargs`, the budgets as `agent_overrides` (decentralized) or `joint_max_new_tokens` and
        `joint_section_tokens` (centralized: each role's section keeps its budget), and, given `agent` (an
        `AgentConfig`), `agent` with the preset's temperature."""
        out: dict[str, Any] = {"env_kwargs": dict(self.env_kwargs)}
        if collaboration == "centralized":
            out["joint_max_new_tokens"] = sum(self.max_new_tokens.values())
            out["joint_section_tokens"] = dict(self.max_new_tokens)
        else:
            out["agent_overrides"] = {role: {"max_new_tokens": n} for role, n in self.max_new_tokens.items()}
        if agent is not None:
            out["agent"] = dataclasses.replace(agent, temperature=self.temperature)
        return out
