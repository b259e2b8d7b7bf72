"""The REINFORCE family's registry entries: magrpo, marloo, maremax, mareinforce and atgrpo.

Each entry names its builder (which imports the family, and so torch, only when a run builds it), and
the rules its config must follow, checked when the run is built.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

from textzoo.algorithms.algorithm import Algorithm, check_acting_role, check_no_tree
from textzoo.algorithms.settings import ESTIMATORS, check_estimator
from textzoo.errors import ConfigError

if TYPE_CHECKING:
    from textzoo.algorithms.reinforce.atgrpo import ATGRPOFamily
    from textzoo.algorithms.reinforce.family import ReinforceFamily
    from textzoo.config import TrainConfig
    from textzoo.models.team import Actor

MAX_CROSS_AGENTS = 6
"""joint_mode='cross' plays G^N combinations per prompt: more agents than this is refused."""


def build_reinforce(cfg: TrainConfig, actors: list[Actor], estimator: str) -> ReinforceFamily:
    """MAGRPO, MARLOO, MAReMax or MAREINFORCE: the reinforce family with one estimator."""
    from textzoo.algorithms.reinforce.family import ReinforceFamily

    return ReinforceFamily(
        cfg.reinforce, actors, estimator, cfg.gamma, cfg.credit, cfg.group_size, cfg.normalize_per_agent
    )


def build_atgrpo(cfg: TrainConfig, actors: list[Actor]) -> ATGRPOFamily:
    """AT-GRPO: the reinforce family's loss on advantages grouped by (state, agent, turn)."""
    from textzoo.algorithms.reinforce.atgrpo import ATGRPOFamily

    return ATGRPOFamily(cfg.reinforce, actors, cfg.gamma, cfg.credit, cfg.normalize_per_agent)


def check_reinforce(cfg: TrainConfig, estimator: str) -> None:
    check_estimator(estimator, cfg.group_size)
    if cfg.credit == "acting_role" and (ESTIMATORS[estimator].greedy or cfg.reinforce.joint_mode == "cross"):
        raise ConfigError(
            "credit='acting_role' credits each sample with the return of the role it played; remax's greedy "
            "rollout and joint_mode='cross' credit whole joint actions: use grpo, rloo or reinforce with "
            "joint_mode='aligned'"
        )
    if cfg.reinforce.reinforce_baseline == "per_role" and estimator != "reinforce":
        raise ConfigError(
            f"reinforce.reinforce_baseline='per_role' is the baseline of estimator reinforce (algo mareinforce), "
            f"not {estimator}: use --algo mareinforce"
        )
    check_no_tree(cfg)
    if cfg.reinforce.joint_mode == "cross" and cfg.collaboration == "centralized":
        raise ConfigError(
            "reinforce.joint_mode='cross' combines the samples of different agents, and a centralized team "
            "is one joint actor: use joint_mode='aligned'"
        )


def check_cross_team(cfg: TrainConfig, roles: list[str]) -> None:
    if cfg.reinforce.joint_mode == "cross" and len(roles) > MAX_CROSS_AGENTS:
        raise ConfigError(
            f"reinforce.joint_mode='cross' plays group_size^N combinations per prompt, and {cfg.env!r} has "
            f"N = {len(roles)} agents (at most {MAX_CROSS_AGENTS}): use joint_mode='aligned'"
        )


def check_atgrpo(cfg: TrainConfig) -> None:
    if cfg.group_size < 2:
        raise ConfigError(f"atgrpo compares the samples of a state: set group_size >= 2 (got {cfg.group_size})")
    if cfg.reinforce.joint_mode == "cross":
        raise ConfigError("atgrpo groups aligned samples by state: use reinforce.joint_mode='aligned'")
    check_acting_role(cfg)
    if cfg.reinforce.reinforce_baseline != "none":
        raise ConfigError(
            "reinforce.reinforce_baseline is estimator reinforce's (algo mareinforce); atgrpo's baseline "
            "is its state group's mean: leave it 'none'"
        )


def reinforce_algorithm(estimator: str) -> Algorithm:
    """The reinforce family with one registered estimator (`textzoo.algorithms.settings.register_estimator`)."""
    return Algorithm(
        "reinforce",
        partial(build_reinforce, estimator=estimator),
        check=partial(check_reinforce, estimator=estimator),
        check_team=check_cross_team,
    )


ENTRIES: dict[str, Algorithm] = {
    "magrpo": reinforce_algorithm("grpo"),
    "marloo": reinforce_algorithm("rloo"),
    "maremax": reinforce_algorithm("remax"),
    "mareinforce": reinforce_algorithm("reinforce"),
    "atgrpo": Algorithm("reinforce", build_atgrpo, check=check_atgrpo),
}
