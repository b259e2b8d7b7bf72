"""textzoo: train teams of language-model agents with reinforcement learning."""

from textzoo.errors import CheckpointError, ConfigError, EnvError, ModelError, TextzooError

__version__ = "0.1.0"

__all__ = ["TextzooError", "ConfigError", "EnvError", "ModelError", "CheckpointError", "__version__"]
