"""`check_env`: PettingZoo's conformance tests plus textzoo's bad-action checks, for any task."""


def check_env(env_fn, num_cycles: int = 1000) -> None:
    """Placeholder filled in by the foundation work."""
    raise NotImplementedError
