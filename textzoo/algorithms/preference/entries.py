"""The preference family's registry entries: madpo and marlhf.

MADPO learns with its own family (DPO over pairs of joint samples). MARLHF learns with any online
algorithm (`preference.rl_algo`, which the registry configures and builds for it) on a reward model's
rewards; its reward model is its rollout hook's. The hooks import the pipeline (and so torch) only when
a run builds them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from textzoo.algorithms.algorithm import Algorithm, check_acting_role, check_no_tree
from textzoo.errors import ConfigError

if TYPE_CHECKING:
    from textzoo.algorithms.hooks import RolloutHook, Run
    from textzoo.algorithms.preference.madpo import MADPOFamily
    from textzoo.config import TrainConfig
    from textzoo.models.team import Actor


def build_madpo(cfg: TrainConfig, actors: list[Actor]) -> MADPOFamily:
    """Multi-agent DPO over pairs of each prompt's joint samples."""
    from textzoo.algorithms.preference.madpo import MADPOFamily

    return MADPOFamily(cfg.preference, actors)


def madpo_hooks(cfg: TrainConfig, run: Run) -> list[RolloutHook]:
    """MADPO's stages: the rounds that sample a comparator beside the team, when there is one."""
    from textzoo.algorithms.preference.rounds import ComparatorRounds

    return [ComparatorRounds(cfg, run)] if cfg.preference.comparator != "current" else []


def marlhf_hooks(cfg: TrainConfig, run: Run) -> list[RolloutHook]:
    """MARLHF's stage: the rounds that fit the reward model and relabel every rollout with its rewards."""
    from textzoo.algorithms.preference.rounds import RewardModelRounds

    return [RewardModelRounds(cfg, run)]


def _check_rounds(cfg: TrainConfig) -> None:
    check_acting_role(cfg)
    pc = cfg.preference
    if cfg.steps % pc.iterations:
        raise ConfigError(f"preference.iterations ({pc.iterations}) must divide steps ({cfg.steps})")
    if cfg.reinforce.joint_mode == "cross":
        raise ConfigError("preference algorithms pair aligned joint samples: set reinforce.joint_mode='aligned'")


def check_madpo(cfg: TrainConfig) -> None:
    _check_rounds(cfg)
    check_no_tree(cfg)
    if cfg.group_size < 2 and cfg.preference.comparator == "current":
        raise ConfigError("madpo pairs the samples of a prompt: set group_size >= 2 (or a comparator)")
    if cfg.normalize_per_agent:
        raise ConfigError("normalize_per_agent standardises advantages, and madpo has none: unset it")


def check_marlhf(cfg: TrainConfig) -> None:
    _check_rounds(cfg)  # marlhf's online algorithm checks its own rollout settings (the registry runs them)
    if cfg.num_processes > 1:
        # each replica would fit its own reward model on its own samples, and the replicas' rewards diverge
        raise ConfigError("marlhf trains its reward model in one process: set num_processes=1")


def online_algo(cfg: TrainConfig) -> str:
    return cfg.preference.rl_algo


ENTRIES: dict[str, Algorithm] = {
    "madpo": Algorithm("preference", build_madpo, check=check_madpo, hooks=madpo_hooks),
    "marlhf": Algorithm("preference", None, check=check_marlhf, hooks=marlhf_hooks, trains_with=online_algo),
}
