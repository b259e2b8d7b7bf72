"""Shared test factories: the CPU-sized `TrainConfig` most training tests start from.

`tiny_config(**fields)` is `TINY` (two steps of 2 prompts x 2 samples, 2 held-out prompts, tiny agents
writing 8 tokens, no progress bar or plot) with `fields` on top, so a test names only what it is about.
A test that needs a field at `TrainConfig`'s own default (e.g. `eval_prompts=16`) passes it.
"""

from __future__ import annotations

from os import PathLike
from typing import Any

from textzoo.config import AgentConfig, TrainConfig

TINY: dict[str, Any] = {
    "steps": 2,
    "batch_prompts": 2,
    "group_size": 2,
    "eval_prompts": 2,
    "progress": False,
    "plot": False,
}
"""The fields every tiny run shares (the agent is `AgentConfig(max_new_tokens=8)` unless given)."""


def tiny_config(**fields: Any) -> TrainConfig:
    """`TINY` with `fields` on top; a `run_dir` path becomes a str."""
    if isinstance(fields.get("run_dir"), PathLike):
        fields["run_dir"] = str(fields["run_dir"])
    return TrainConfig(**{**TINY, "agent": AgentConfig(max_new_tokens=8), **fields})
