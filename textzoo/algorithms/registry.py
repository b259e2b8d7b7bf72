"""The algorithm registry: each `--algo` name -> its family, how that family is built, its defaults and rules.

Each family folder lists its algorithms in `entries.py`; this module gathers them. The trainer calls
`configure` when it builds a run (defaults filled, rules checked, before any model is built), then builds
the family and the rollout hooks through `build_family` and `build_hooks`, and never names an algorithm.
Adding an algorithm is one `register_algorithm` call (CONTRIBUTING.md has the recipe). The registry and
the rules are plain data: the builders import the families (and so torch) when a run builds one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from textzoo import plugins
from textzoo.algorithms.actor_critic.entries import ENTRIES as ACTOR_CRITIC
from textzoo.algorithms.algorithm import Algorithm
from textzoo.algorithms.preference.entries import ENTRIES as PREFERENCE
from textzoo.algorithms.reinforce.entries import ENTRIES as REINFORCE
from textzoo.errors import ConfigError
from textzoo.plugins import load_entry_points, split_module

if TYPE_CHECKING:
    from textzoo.algorithms.family import Family
    from textzoo.algorithms.hooks import RolloutHook, Run
    from textzoo.config import TrainConfig
    from textzoo.models.team import Actor

ALGORITHMS: dict[str, Algorithm] = {**REINFORCE, **ACTOR_CRITIC, **PREFERENCE}
"""Algorithm name -> `Algorithm`. Aliases without the "ma" prefix are accepted (`grpo` = `magrpo`)."""


def register_algorithm(name: str, algorithm: Algorithm) -> None:
    """Make `algorithm` available as `--algo name` (and in benchmark grids)."""
    key = name.lower()
    if key in ALGORITHMS:
        raise ConfigError(f"algorithm {name!r} is already registered; pick another name")
    ALGORITHMS[key] = algorithm


def resolve_algorithm(name: str) -> Algorithm:
    """The registered algorithm called `name` (case-insensitive; the "ma" prefix may be left out).

    ``my_pkg.algos:myalgo`` imports ``my_pkg.algos`` first (its `register_algorithm` calls run); a name not
    found loads the packages that register algorithms through entry points (`textzoo.plugins`) and looks again.
    """
    key = split_module(name, ConfigError, "algo").lower()
    found = ALGORITHMS.get(key) or ALGORITHMS.get(f"ma{key}")
    if found is None and load_entry_points(plugins.ALGORITHMS, ConfigError):
        found = ALGORITHMS.get(key) or ALGORITHMS.get(f"ma{key}")
    if found is None:
        raise ConfigError(f"unknown algo {name!r}; choose one of {', '.join(algorithm_names())}")
    return found


def algorithm_names() -> list[str]:
    """Every registered algorithm's name, sorted (the packages that register through entry points loaded)."""
    load_entry_points(plugins.ALGORITHMS, ConfigError)
    return sorted(ALGORITHMS)


def learner_of(cfg: TrainConfig) -> Algorithm:
    """The algorithm whose family learns in a run of `cfg`: `cfg.algo`'s, or the online one it trains with."""
    algorithm = resolve_algorithm(cfg.algo)
    if algorithm.trains_with is None:
        return algorithm
    name = algorithm.trains_with(cfg)
    online = resolve_algorithm(name)
    if online.trains_with is not None or online.family == algorithm.family:
        raise ConfigError(
            f"{cfg.algo} trains with an online algorithm (magrpo, marloo, iac, ...): "
            f"preference.rl_algo={name!r} is not one"
        )
    return online


def configure(cfg: TrainConfig) -> Algorithm:
    """Fill `cfg.algo`'s defaults into `cfg` and check its rules (and those of the algorithm it trains
    with); returns the algorithm. Run when a run is built, before any model is."""
    algorithm = resolve_algorithm(cfg.algo)
    algorithm.configure(cfg)
    learner = learner_of(cfg)
    if learner is not algorithm:
        learner.configure(cfg)
    return algorithm


def check_team(cfg: TrainConfig, roles: list[str]) -> None:
    """The rules on the env's agents of `cfg.algo` (and of the algorithm it trains with)."""
    resolve_algorithm(cfg.algo).check_team(cfg, roles)
    if learner_of(cfg) is not resolve_algorithm(cfg.algo):
        learner_of(cfg).check_team(cfg, roles)


def build_family(cfg: TrainConfig, actors: list[Actor]) -> Family:
    """The family that learns in a run of `cfg`, over the team's actors."""
    return learner_of(cfg).build(cfg, actors)


def build_hooks(cfg: TrainConfig, run: Run) -> list[RolloutHook]:
    """The stages `cfg.algo` runs between collection and its family's jobs, built next to `run`'s models."""
    return resolve_algorithm(cfg.algo).hooks(cfg, run)
