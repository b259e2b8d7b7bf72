"""The agents' settings and the names they choose from, as plain data (no torch import).

The names of prompt styles, joint formats and tiny models. The modules that do the work (`prompting`,
`joint`, `loading`) import these from here, so `textzoo.config` and `textzoo train --help` never load
torch. The sampling, precision and engine names are `textzoo.decoding.settings`'.
"""

from __future__ import annotations

from typing import Literal, get_args

PromptStyle = Literal["auto", "raw", "chat"]
PROMPT_STYLES: tuple[str, ...] = get_args(PromptStyle)
"""`AgentConfig.prompt_format` values (`textzoo.models.prompting`)."""
JointFormat = Literal["structured", "tags", "labels", "json"]
JOINT_FORMATS: tuple[str, ...] = get_args(JointFormat)
"""Joint formats of the centralized actor (`textzoo.models.joint`); the free-form ones are all but "structured"."""
TINY_MODELS = ("tiny", "tiny-gpt2", "tiny-llama")
"""Model names built locally from a config (byte-level tokenizers, no chat template)."""
