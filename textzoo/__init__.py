"""textzoo: train teams of language-model agents with reinforcement learning."""

import logging

from textzoo.errors import (
    CheckpointError,
    ConfigError,
    EnvError,
    ModelError,
    ResourceError,
    SandboxError,
    TextzooError,
)

logging.getLogger("textzoo").addHandler(logging.NullHandler())  # an application decides where records go

__version__ = "0.1.0"

__all__ = [
    "TextzooError",
    "ConfigError",
    "EnvError",
    "ModelError",
    "CheckpointError",
    "ResourceError",
    "SandboxError",
    "__version__",
]
