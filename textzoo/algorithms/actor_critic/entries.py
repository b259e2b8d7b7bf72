"""The actor-critic family's registry entries: iac and maac, and their clipped forms ippo and mappo.

IAC (a critic per trainable actor) and MAAC (one centralized critic over `state()`) are two builders,
not a flag; each builder imports the family (and so torch) only when a run builds it.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from textzoo.algorithms.actor_critic.config import check_actor_critic
from textzoo.algorithms.algorithm import Algorithm, check_acting_role, check_no_tree
from textzoo.errors import ConfigError

if TYPE_CHECKING:
    from textzoo.algorithms.actor_critic.family import ActorCriticFamily
    from textzoo.config import AgentConfig, TrainConfig
    from textzoo.models.critic import Critic
    from textzoo.models.team import Actor


def _critic(cfg: TrainConfig, agent: AgentConfig, seed: int, actor: Actor | None) -> tuple[Critic, AgentConfig]:
    """A critic and its learner settings: the agent's, with the critic's model and lr."""
    from textzoo.models.build import build_device, build_policy
    from textzoo.models.critic import Critic

    ac = cfg.actor_critic
    head = dict(
        hidden=ac.value_head_hidden, init_std=ac.value_head_init_std, max_tokens=ac.critic_max_tokens, seed=seed
    )
    if ac.critic_model == "actor":
        settings = dataclasses.replace(agent, lr=ac.critic_lr or agent.lr)
        return Critic.from_policy(actor.policy, shared_trunk=True, **head), settings
    settings = dataclasses.replace(agent, model=ac.critic_model or agent.model, lr=ac.critic_lr or agent.lr)
    policy = build_policy(settings, seed, build_device(settings.device))
    return Critic.from_policy(policy, **head), settings


def _family(family: type[ActorCriticFamily], cfg: TrainConfig, actors: list[Actor], built: dict) -> ActorCriticFamily:
    """`family` over the team and the critics `built` (learner name -> (critic, its learner settings))."""
    return family(
        cfg.actor_critic,
        actors,
        {k: v[0] for k, v in built.items()},
        gamma=cfg.gamma,
        credit=cfg.credit,
        critic_settings={k: v[1] for k, v in built.items()},
        normalize_per_agent=cfg.normalize_per_agent,
    )


def build_iac(cfg: TrainConfig, actors: list[Actor]) -> ActorCriticFamily:
    """IAC / IPPO: a critic per trainable actor, reading that actor's prompt."""
    from textzoo.algorithms.actor_critic.family import IACFamily, critic_name

    built = {
        critic_name(a.id): _critic(cfg, cfg.agent_config(a.id), cfg.seed * 1000 + 500 + i, a)
        for i, a in enumerate(actors)
        if a.trainable
    }
    return _family(IACFamily, cfg, actors, built)


def build_maac(cfg: TrainConfig, actors: list[Actor]) -> ActorCriticFamily:
    """MAAC / MAPPO: one centralized critic over the whole state (every role's prompt)."""
    from textzoo.algorithms.actor_critic.family import MAACFamily

    return _family(MAACFamily, cfg, actors, {"critic": _critic(cfg, cfg.agent, cfg.seed * 1000 + 999, None)})


def check_iac(cfg: TrainConfig) -> None:
    _check(cfg, centralized=False)


def check_maac(cfg: TrainConfig) -> None:
    _check(cfg, centralized=True)


def _check(cfg: TrainConfig, centralized: bool) -> None:
    check_acting_role(cfg)
    check_actor_critic(cfg.actor_critic, centralized, cfg.credit)
    check_no_tree(cfg)
    if cfg.reinforce.joint_mode == "cross":
        raise ConfigError(
            f"{cfg.algo} learns from aligned joint samples and would ignore reinforce.joint_mode='cross' "
            "(while the runner plays every combination): use joint_mode='aligned', or a reinforce-family algo"
        )


PPO = {"clip_range": 0.2, "epochs": 2}
"""What ippo / mappo set in `actor_critic` unless the user set it (iac / maac: on-policy, one epoch)."""
ON_POLICY = {"clip_range": None, "epochs": 1}

ENTRIES: dict[str, Algorithm] = {
    "iac": Algorithm("actor_critic", build_iac, defaults=ON_POLICY, check=check_iac),
    "maac": Algorithm("actor_critic", build_maac, defaults=ON_POLICY, check=check_maac),
    "ippo": Algorithm("actor_critic", build_iac, defaults=PPO, check=check_iac),
    "mappo": Algorithm("actor_critic", build_maac, defaults=PPO, check=check_maac),
}
