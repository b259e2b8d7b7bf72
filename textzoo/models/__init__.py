"""LLM policies and the algorithm families.

The names below are imported on first use, so that `textzoo.models.settings` (the config sections,
plain data) loads without torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from textzoo.models.policy import Generation, GenerationConfig, Policy
    from textzoo.models.tokenizer import byte_tokenizer

_HOMES = {
    "Generation": "textzoo.models.policy",
    "GenerationConfig": "textzoo.models.policy",
    "Policy": "textzoo.models.policy",
    "byte_tokenizer": "textzoo.models.tokenizer",
}

__all__ = ["Generation", "GenerationConfig", "Policy", "byte_tokenizer"]


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        return getattr(importlib.import_module(_HOMES[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
