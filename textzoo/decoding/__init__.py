"""How tokens are made: the plain-torch decoder (`fastlm`), the model backends, sampling, compiled decode
regions, mixed-dtype GEMMs, precision, and the rollout-engine seam with its local and vLLM engines.

It knows nothing of agents: a policy reaches it through the small protocols in `engine` and `inference`
(`textzoo.models` imports this package, never the other way). The names below are imported on first
use, so that `textzoo.decoding.settings` (plain data) loads without torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from textzoo.decoding.generation import Generation, GenerationConfig

_HOMES = {"Generation": "textzoo.decoding.generation", "GenerationConfig": "textzoo.decoding.generation"}

__all__ = ["Generation", "GenerationConfig"]


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        return getattr(importlib.import_module(_HOMES[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
