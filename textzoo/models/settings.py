"""The agents' settings and the names they choose from, as plain data (no torch import).

`LoRAConfig` (an agent's adapter) and the names of prompt styles, joint formats and tiny models. The modules
that do the work (`lora`, `prompting`, `joint`, `build`) import these from here, so `textzoo.config` and
`textzoo train --help` never load torch. The sampling, precision and engine settings are
`textzoo.decoding.settings`'.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from textzoo.errors import ConfigError
from textzoo.typecheck import check_fields

PromptStyle = Literal["auto", "raw", "chat"]
PROMPT_STYLES: tuple[str, ...] = get_args(PromptStyle)
"""`AgentConfig.prompt_format` values (`textzoo.models.prompting`)."""
JointFormat = Literal["structured", "tags", "labels", "json"]
JOINT_FORMATS: tuple[str, ...] = get_args(JointFormat)
"""Joint formats of the centralized actor (`textzoo.models.joint`); the free-form ones are all but "structured"."""
TINY_MODELS = ("tiny", "tiny-gpt2", "tiny-llama")
"""Model names built locally from a config (byte-level tokenizers, no chat template)."""


@dataclass
class LoRAConfig:
    """A LoRA adapter trained on a frozen base that every LoRA agent with the same model shares (one copy of
    the base in memory; pip install textzoo[peft]); `rank` 0 = train the whole model."""

    rank: int = 0
    """> 0: train an adapter of this rank; 0 = train the whole model."""
    alpha: float = 16.0
    """Scaling numerator (the update is scaled by alpha / rank)."""
    dropout: float = 0.0
    """Dropout on the adapter's input."""
    target_modules: tuple[str, ...] = ()
    """Module names that get adapters, e.g. ("q_proj", "v_proj"); empty = peft's default for the architecture."""

    def __post_init__(self) -> None:
        check_fields(self, "agent.lora.")
        if self.rank < 0 or self.alpha <= 0 or not 0 <= self.dropout < 1:
            raise ConfigError(
                "agent.lora.rank must be >= 0, agent.lora.alpha > 0 and agent.lora.dropout in [0, 1); got "
                f"{self.rank}, {self.alpha}, {self.dropout}"
            )
        if isinstance(self.target_modules, str):
            raise ConfigError("agent.lora.target_modules must be a list of module names, not one string")
        self.target_modules = tuple(self.target_modules)
