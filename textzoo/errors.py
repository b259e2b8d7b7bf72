"""The one exception family users see: every error a user can cause is a `TextzooError`."""


class TextzooError(Exception):
    """A problem the user can fix; the message says what went wrong and what to do."""


class ConfigError(TextzooError, ValueError):
    """A configuration value is invalid; the message names the field."""


class EnvError(TextzooError):
    """An environment id, its arguments or its data are invalid."""


class ModelError(TextzooError):
    """A model or tokenizer cannot be loaded or built."""


class EngineError(ModelError):
    """A rollout engine could not start, or failed, timed out or lost its weights (the message names it and the fix)."""


class CheckpointError(TextzooError):
    """A checkpoint is missing, corrupt, or does not match the run."""


class SandboxError(TextzooError):
    """The sandbox cannot run programs as configured (a required isolation is missing, or it broke)."""


class ResourceError(TextzooError):
    """A resource ran out (disk space, a file-size limit, GPU memory); the message names it and the fix."""
