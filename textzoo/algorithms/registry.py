"""The algorithm registry: each `--algo` name -> its family, how that family is built, its defaults and rules.

`TrainConfig` fills an algorithm's defaults and checks its rules before anything is built; the trainer
builds the family and the rollout hooks through the registry and never names an algorithm. Adding
an algorithm is one `register_algorithm` call (CONTRIBUTING.md has the recipe). The registry and the
rules are plain data: the builders import the families (and so torch) when a run builds one, so a
config can be made and checked without torch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

from textzoo.errors import ConfigError
from textzoo.models.settings import check_actor_critic, check_estimator

if TYPE_CHECKING:
    from textzoo.algorithms.actor_critic.family import ActorCriticFamily
    from textzoo.algorithms.family import Family
    from textzoo.algorithms.hooks import RolloutHook
    from textzoo.algorithms.preference.madpo import MADPOFamily
    from textzoo.algorithms.reinforce.atgrpo import ATGRPOFamily
    from textzoo.algorithms.reinforce.family import ReinforceFamily
    from textzoo.config import AgentConfig, TrainConfig
    from textzoo.models.critic import Critic
    from textzoo.models.team import Actor

MAX_CROSS_AGENTS = 6
"""joint_mode='cross' plays G^N combinations per prompt: more agents than this is refused."""


def _no_check(cfg: TrainConfig) -> None:
    pass


def _no_team_check(cfg: TrainConfig, roles: list[str]) -> None:
    pass


def _no_hooks(cfg: TrainConfig) -> list[RolloutHook]:
    return []


@dataclass(frozen=True)
class Algorithm:
    """One algorithm: the family that learns, its builder, and what it adds to the config."""

    family: str
    """The family, which is also the config section it reads (`cfg.reinforce`, `cfg.actor_critic`, `cfg.preference`)."""
    build: Callable[[TrainConfig, list[Actor]], Family]
    """The family over the team's actors (critics and frozen references included)."""
    defaults: Mapping[str, Any] = field(default_factory=dict)
    """Fields of the family's config section set for this algorithm unless the user set them."""
    check: Callable[[TrainConfig], None] = _no_check
    """Rules across fields, run by `TrainConfig` (after the defaults) before anything is built."""
    check_team: Callable[[TrainConfig, list[str]], None] = _no_team_check
    """Rules on the env's agents, run by the trainer before any model is built."""
    hooks: Callable[[TrainConfig], list[RolloutHook]] = _no_hooks
    """Stages the trainer runs between collection and `family.jobs` (the preference pipeline)."""

    def configure(self, cfg: TrainConfig) -> None:
        """Fill this algorithm's defaults into `cfg`'s section of its family, then check its rules."""
        if self.defaults:
            setattr(cfg, self.family, with_defaults(getattr(cfg, self.family), self.defaults))
        self.check(cfg)


def with_defaults(section: Any, defaults: Mapping[str, Any]) -> Any:
    """`section` (a config dataclass) with `defaults` in the fields that still hold their class default."""
    base = {f.name: f.default for f in dataclasses.fields(section)}
    unknown = sorted(set(defaults) - set(base))
    if unknown:
        raise ConfigError(f"algorithm defaults name {unknown}, which {type(section).__name__} does not have")
    fill = {k: v for k, v in defaults.items() if getattr(section, k) == base[k]}
    return dataclasses.replace(section, **fill) if fill else section


# ---- builders --------------------------------------------------------------------------------------
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


def build_actor_critic(cfg: TrainConfig, actors: list[Actor], centralized: bool) -> ActorCriticFamily:
    """IAC / IPPO (a critic per trainable actor) or MAAC / MAPPO (one centralized critic)."""
    from textzoo.algorithms.actor_critic.family import ActorCriticFamily, critic_name
    from textzoo.models.critic import Critic
    from textzoo.runners.build import build_device, build_policy

    ac = cfg.actor_critic
    on_actor = ac.critic_model == "actor"

    def critic(agent: AgentConfig, seed: int, actor: Actor | None = None) -> tuple[Critic, AgentConfig]:
        # the critic's model and learner settings: the agent's, with the critic's model and lr
        head = dict(
            hidden=ac.value_head_hidden, init_std=ac.value_head_init_std, max_tokens=ac.critic_max_tokens, seed=seed
        )
        if on_actor:
            return Critic.from_policy(actor.policy, shared_trunk=True, **head), dataclasses.replace(
                agent, lr=ac.critic_lr or agent.lr
            )
        settings = dataclasses.replace(agent, model=ac.critic_model or agent.model, lr=ac.critic_lr or agent.lr)
        policy = build_policy(settings, seed, build_device(settings.device))
        return Critic.from_policy(policy, **head), settings

    if centralized:
        built = {"critic": critic(cfg.agent, cfg.seed * 1000 + 999)}
    else:
        built = {
            critic_name(a.id): critic(cfg.agent_config(a.id), cfg.seed * 1000 + 500 + i, a)
            for i, a in enumerate(actors)
            if a.trainable
        }
    return ActorCriticFamily(
        ac,
        actors,
        {k: v[0] for k, v in built.items()},
        centralized,
        cfg.gamma,
        cfg.credit,
        critic_settings={k: v[1] for k, v in built.items()},
        normalize_per_agent=cfg.normalize_per_agent,
    )


def build_madpo(cfg: TrainConfig, actors: list[Actor]) -> MADPOFamily:
    """Multi-agent DPO over pairs of each prompt's joint samples."""
    from textzoo.algorithms.preference.madpo import MADPOFamily

    return MADPOFamily(cfg.preference, actors)


def build_marlhf(cfg: TrainConfig, actors: list[Actor]) -> Family:
    """MARLHF updates with its online algorithm; the reward model is its hook's (`marlhf_hooks`)."""
    return resolve_algorithm(cfg.rl_algo).build(cfg, actors)


# ---- rules -----------------------------------------------------------------------------------------
def _check_no_tree(cfg: TrainConfig) -> None:
    if cfg.reinforce.tree_rollout:
        raise ConfigError(f"reinforce.tree_rollout is AT-GRPO's rollout and {cfg.algo} ignores it: use algo='atgrpo'")


def _check_atgrpo(cfg: TrainConfig) -> None:
    if cfg.group_size < 2:
        raise ConfigError(f"atgrpo compares the samples of a state: set group_size >= 2 (got {cfg.group_size})")
    if cfg.reinforce.joint_mode == "cross":
        raise ConfigError("atgrpo groups aligned samples by state: use reinforce.joint_mode='aligned'")
    _check_acting_role(cfg)
    if cfg.reinforce.reinforce_baseline != "none":
        raise ConfigError(
            "reinforce.reinforce_baseline is estimator reinforce's (algo mareinforce); atgrpo's baseline "
            "is its state group's mean: leave it 'none'"
        )


def _check_reinforce(cfg: TrainConfig, estimator: str) -> None:
    check_estimator(estimator, cfg.group_size)
    if cfg.credit == "acting_role" and (estimator == "remax" or cfg.reinforce.joint_mode == "cross"):
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
    _check_no_tree(cfg)
    if cfg.reinforce.joint_mode == "cross" and cfg.collaboration == "centralized":
        raise ConfigError(
            "reinforce.joint_mode='cross' combines the samples of different agents, and a centralized team "
            "is one joint actor: use joint_mode='aligned'"
        )


def _check_cross_team(cfg: TrainConfig, roles: list[str]) -> None:
    if cfg.reinforce.joint_mode == "cross" and len(roles) > MAX_CROSS_AGENTS:
        raise ConfigError(
            f"reinforce.joint_mode='cross' plays group_size^N combinations per prompt, and {cfg.env!r} has "
            f"N = {len(roles)} agents (at most {MAX_CROSS_AGENTS}): use joint_mode='aligned'"
        )


def _check_acting_role(cfg: TrainConfig) -> None:
    if cfg.credit == "acting_role":
        raise ConfigError(
            f"credit='acting_role' (self-play credit) is a reinforce-family setting; {cfg.algo} takes "
            "credit 'shared' or 'per_agent'"
        )


def _check_actor_critic(cfg: TrainConfig, centralized: bool) -> None:
    _check_acting_role(cfg)
    check_actor_critic(cfg.actor_critic, centralized, cfg.credit)
    _check_no_tree(cfg)
    if cfg.reinforce.joint_mode == "cross":
        raise ConfigError(
            f"{cfg.algo} learns from aligned joint samples and would ignore reinforce.joint_mode='cross' "
            "(while the runner plays every combination): use joint_mode='aligned', or a reinforce-family algo"
        )


def _check_preference(cfg: TrainConfig) -> None:
    _check_acting_role(cfg)
    if cfg.iterations < 1 or cfg.steps % cfg.iterations:
        raise ConfigError(f"iterations ({cfg.iterations}) must be >= 1 and divide steps ({cfg.steps})")
    if cfg.algo.lower() != "marlhf":  # marlhf's online algorithm checks its own rollout settings
        _check_no_tree(cfg)
    if cfg.reinforce.joint_mode == "cross":
        raise ConfigError("preference algorithms pair aligned joint samples: set reinforce.joint_mode='aligned'")


def _check_madpo(cfg: TrainConfig) -> None:
    _check_preference(cfg)
    if cfg.group_size < 2 and cfg.preference.comparator == "current":
        raise ConfigError("madpo pairs the samples of a prompt: set group_size >= 2 (or a comparator)")
    if cfg.normalize_per_agent:
        raise ConfigError("normalize_per_agent standardises advantages, and madpo has none: unset it")


def _check_marlhf(cfg: TrainConfig) -> None:
    _check_preference(cfg)
    if cfg.num_processes > 1:
        # each replica would fit its own reward model on its own samples, and the replicas' rewards diverge
        raise ConfigError("marlhf trains its reward model in one process: set num_processes=1")
    online = resolve_algorithm(cfg.rl_algo)
    if online.family == "preference":
        raise ConfigError(f"rl_algo must be an online algorithm (magrpo, marloo, iac, ...), got {cfg.rl_algo!r}")
    online.configure(cfg)


def _check_marlhf_team(cfg: TrainConfig, roles: list[str]) -> None:
    resolve_algorithm(cfg.rl_algo).check_team(cfg, roles)


def madpo_hooks(cfg: TrainConfig) -> list[RolloutHook]:
    """MADPO's stages (`textzoo.algorithms.preference.rounds.madpo_hooks`), imported when a run builds them."""
    from textzoo.algorithms.preference import rounds as preference

    return preference.madpo_hooks(cfg)


def marlhf_hooks(cfg: TrainConfig) -> list[RolloutHook]:
    """MARLHF's stages (`textzoo.algorithms.preference.rounds.marlhf_hooks`), imported when a run builds them."""
    from textzoo.algorithms.preference import rounds as preference

    return preference.marlhf_hooks(cfg)


# ---- the registry ----------------------------------------------------------------------------------
def _reinforce(estimator: str) -> Algorithm:
    return Algorithm(
        "reinforce",
        partial(build_reinforce, estimator=estimator),
        check=partial(_check_reinforce, estimator=estimator),
        check_team=_check_cross_team,
    )


def _actor_critic(centralized: bool, clip_range: float | None, epochs: int) -> Algorithm:
    return Algorithm(
        "actor_critic",
        partial(build_actor_critic, centralized=centralized),
        defaults={"clip_range": clip_range, "epochs": epochs},
        check=partial(_check_actor_critic, centralized=centralized),
    )


ALGORITHMS: dict[str, Algorithm] = {
    "magrpo": _reinforce("grpo"),
    "marloo": _reinforce("rloo"),
    "maremax": _reinforce("remax"),
    "mareinforce": _reinforce("reinforce"),
    "atgrpo": Algorithm("reinforce", build_atgrpo, check=_check_atgrpo),
    "iac": _actor_critic(centralized=False, clip_range=None, epochs=1),
    "maac": _actor_critic(centralized=True, clip_range=None, epochs=1),
    "ippo": _actor_critic(centralized=False, clip_range=0.2, epochs=2),
    "mappo": _actor_critic(centralized=True, clip_range=0.2, epochs=2),
    "madpo": Algorithm("preference", build_madpo, check=_check_madpo, hooks=madpo_hooks),
    "marlhf": Algorithm(
        "preference", build_marlhf, check=_check_marlhf, check_team=_check_marlhf_team, hooks=marlhf_hooks
    ),
}
"""Algorithm name -> `Algorithm`. Aliases without the "ma" prefix are accepted (`grpo` = `magrpo`)."""


def register_algorithm(name: str, algorithm: Algorithm) -> None:
    """Make `algorithm` available as `--algo name` (and in benchmark grids)."""
    key = name.lower()
    if key in ALGORITHMS:
        raise ConfigError(f"algorithm {name!r} is already registered; pick another name")
    ALGORITHMS[key] = algorithm


def resolve_algorithm(name: str) -> Algorithm:
    """The registered algorithm called `name` (case-insensitive; the "ma" prefix may be left out)."""
    key = name.lower()
    if key not in ALGORITHMS and f"ma{key}" in ALGORITHMS:
        key = f"ma{key}"
    if key not in ALGORITHMS:
        raise ConfigError(f"unknown algo {name!r}; choose one of {', '.join(sorted(ALGORITHMS))}")
    return ALGORITHMS[key]
