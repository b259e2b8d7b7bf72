"""What an agent is: `Policy` (a causal LM that samples and scores), LoRA, prompting, critics, the team and
the joint actor, and model loading. How tokens are made is `textzoo.decoding`'s.

The names below are imported on first use, so that `textzoo.models.settings` (plain data) loads without torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from textzoo.models.policy import Policy
    from textzoo.models.tokenizer import byte_tokenizer

_HOMES = {
    "Policy": "textzoo.models.policy",
    "byte_tokenizer": "textzoo.models.tokenizer",
}

__all__ = ["Policy", "byte_tokenizer"]


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        return getattr(importlib.import_module(_HOMES[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
