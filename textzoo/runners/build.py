"""Builders: turn a `TrainConfig` into envs, actors and learners (models: `textzoo.models.build`; families:
`textzoo.algorithms.registry`).

Everything that can fail on bad input (unknown env, missing model, agents that do not match the env)
fails here, before any training work starts.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from textzoo.decoding.generation import GenerationConfig
from textzoo.decoding.precision import AUTO
from textzoo.envs import make as make_env
from textzoo.envs.registry import takes
from textzoo.errors import ConfigError, EnvError
from textzoo.models.build import build_device, generation_config, load_model, lora_policy, prompt_format, shared_base
from textzoo.models.joint import JointActor, structured_overhead
from textzoo.models.lora import SharedBase
from textzoo.models.policy import Policy
from textzoo.models.prompting import PromptFormat
from textzoo.models.team import Actor, AgentActor
from textzoo.runners.distributed import DistContext
from textzoo.runners.engines import TeamEngines, check_servers
from textzoo.runners.update import Learner

if TYPE_CHECKING:
    from textzoo.config import AgentConfig, TrainConfig


logger = logging.getLogger(__name__)


def env_factory(cfg: TrainConfig, eval: bool = False):
    """A zero-argument constructor of the configured env (validated once here)."""
    kwargs = dict(cfg.env_kwargs)
    if eval:
        extra = dict(cfg.eval_env_kwargs)
        if "split" in extra and not takes(cfg.env, "split"):
            # a task with one set of items (no `split`): evaluation plays its training items
            logger.warning("%s takes no `split`: held-out evaluation plays its training items", cfg.env)
            del extra["split"]
        kwargs.update(extra)

    def build():
        return make_env(cfg.env, **kwargs)

    try:
        build().close()
    except EnvError:
        raise
    except TypeError as e:
        raise EnvError(f"cannot build {cfg.env!r} with {kwargs}: {e}") from e
    return build


def build_actors(cfg: TrainConfig, roles: list[str], dist: DistContext | None = None) -> list[Actor]:
    """One actor per role (decentralized) or one joint actor for all roles (centralized), each built with
    everything it holds (`build_agent_policy`): nothing is set on an actor or a policy after it is built.
    ``dist``: this process's place in a data-parallel run (its engines are colocated, or share a server)."""
    for name in ("agent_overrides", "joint_section_tokens"):
        unknown = sorted(set(getattr(cfg, name)) - set(roles))
        if unknown:
            raise ConfigError(f"{name} names {unknown}, which the env {cfg.env!r} does not have; its agents: {roles}")
    if cfg.collaboration == "centralized":
        if cfg.agent_overrides:
            raise ConfigError(
                "agent_overrides set per-role models, but collaboration='centralized' has one joint model: "
                "put its settings in `agent` and drop agent_overrides"
            )
        check_servers(["joint"], [cfg.agent])
        return [build_joint_actor(cfg, roles, dist)]
    agents = [cfg.agent_config(role) for role in roles]
    check_servers(roles, agents)
    engines = team_engines(cfg.seed, agents, dist)
    bases: dict[tuple, SharedBase] = {}  # LoRA agents of one model share its base
    actors: list[Actor] = []
    for i, (role, agent) in enumerate(zip(roles, agents)):
        policy = build_agent_policy(agent, role, cfg.seed * 1000 + i, i, bases, engines)
        actors.append(AgentActor(role, policy, trainable=agent.trainable, prompt_format=prompt_format(agent, policy)))
    return actors


def build_joint_actor(cfg: TrainConfig, roles: list[str], dist: DistContext | None = None) -> JointActor:
    """The centralized team: one policy answering for every role, with N roles' budgets. A structured joint
    answer also holds forced tags and the later roles' tasks: its prompt budget leaves room for the tags
    (2 tokens per role of slack for re-tokenized cut observations), and each task gets an equal share of it."""
    budget = cfg.joint_max_new_tokens or len(roles) * cfg.agent.max_new_tokens
    agent = dataclasses.replace(
        cfg.agent, max_new_tokens=budget, max_prompt_tokens=len(roles) * cfg.agent.max_prompt_tokens
    )
    structured = cfg.joint_format == "structured"

    def generation(tokenizer: Any, model: torch.nn.Module) -> GenerationConfig:
        if not structured:
            return generation_config(agent, tokenizer, model)
        tags, _ = structured_overhead(roles, tokenizer, _prompt_format(agent, tokenizer))
        room = generation_config(
            dataclasses.replace(agent, max_new_tokens=budget + tags + 2 * len(roles)), tokenizer, model
        )
        return dataclasses.replace(room, max_new_tokens=budget)

    engines = team_engines(cfg.seed, [agent], dist)
    policy = build_agent_policy(agent, "joint", cfg.seed, 0, {}, engines, generation)
    fmt = prompt_format(agent, policy)
    task_tokens = 0
    if structured:
        _, intro = structured_overhead(roles, policy.tokenizer, fmt)
        task_tokens = max((policy.generation.max_prompt_tokens - intro) // len(roles), 1)
    sections = {r: cfg.joint_section_tokens.get(r, budget // len(roles)) for r in roles}
    return JointActor(
        roles, policy, trainable=agent.trainable, prompt_format=fmt, joint_format=cfg.joint_format,
        section_tokens=sections, task_tokens=task_tokens,
    )  # fmt: skip


def _prompt_format(agent: AgentConfig, tokenizer: Any) -> PromptFormat:
    """The agent's prompt format with this tokenizer."""
    return PromptFormat.resolve(tokenizer, agent.prompt_format, agent.system_prompt, agent.chat_template_kwargs)


def team_engines(seed: int, agents: list[AgentConfig], dist: DistContext | None = None) -> TeamEngines:
    """The rollout engines of a team of `agents` (its LoRA agents on an engine share their base's)."""
    loras = [a for a in agents if a.lora.rank and a.engine.kind != "local"]
    return TeamEngines(seed, len(loras), max((a.lora.rank for a in loras), default=0), dist)


def build_agent_policy(
    agent: AgentConfig,
    agent_id: str,
    seed: int,
    index: int,
    bases: dict[tuple, SharedBase],
    engines: TeamEngines,
    generation: Callable[[Any, torch.nn.Module], GenerationConfig] | None = None,
) -> Policy:
    """Agent ``agent_id``'s policy, built in order: its model (or, for LoRA, the shared base in ``bases``),
    its sampling settings (``generation(tokenizer, model)``, default the agent's own), its rollout engine
    (``engines``; actor ``index``), then the `Policy` that holds them all."""
    settings = generation or functools.partial(generation_config, agent)
    if agent.lora.rank:
        base = shared_base(agent, seed, bases)
        engine = engines.for_adapter(agent.engine, base, agent_id, index)
        policy = lora_policy(agent, agent_id, seed, base, settings(base.tokenizer, base.base), engine)
    else:
        loaded = load_model(agent, seed, build_device(agent.device))
        policy = Policy(
            loaded.model,
            loaded.tokenizer,
            settings(loaded.tokenizer, loaded.model),
            name=loaded.name,
            precision=loaded.precision,
            engine=engines.for_model(agent.engine, loaded, index),
        )
    if policy.engine is not None:  # a shared base's engine gets this agent's adapter, a server the weights
        policy.engine.attach(policy, verify=not engines.dist.enabled)
    return policy


def resolved_config(cfg: TrainConfig, actors: list[Actor]) -> TrainConfig:
    """``cfg`` with each agent's precision "auto" replaced by what its built model resolved to
    (`Policy.precision`): what the run's config.json records, so a resumed run computes as this one did.
    `agent` takes the first inheriting role's; a role that resolved otherwise gets its own override."""
    overrides = {role: dict(values) for role, values in cfg.agent_overrides.items()}
    agent_precision = cfg.agent.precision
    for actor in actors:
        if cfg.agent_config(actor.id).precision != AUTO:
            continue
        value = actor.policy.precision
        if overrides.get(actor.id, {}).get("precision") == AUTO:
            overrides[actor.id]["precision"] = value
        elif agent_precision == AUTO:
            agent_precision = value
        elif value != agent_precision:
            overrides.setdefault(actor.id, {})["precision"] = value
    if agent_precision == cfg.agent.precision and overrides == cfg.agent_overrides:
        return cfg
    agent = dataclasses.replace(cfg.agent, precision=agent_precision)
    return dataclasses.replace(cfg, agent=agent, agent_overrides=overrides)


def build_learner(model: torch.nn.Module, agent: AgentConfig, total_steps: int) -> Learner:
    """AdamW with the agent's learning rate, schedule and clip target."""
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = adamw(params, agent.lr, agent.weight_decay)
    warmup, total = agent.warmup_steps, max(total_steps, 1)

    def factor(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        if agent.lr_schedule == "constant":
            return 1.0
        progress = min((step - warmup) / max(total - warmup, 1), 1.0)
        return 1.0 - progress if agent.lr_schedule == "linear" else 0.5 * (1 + math.cos(math.pi * progress))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    return Learner(model, optimizer, scheduler, agent.max_grad_norm or None, params=params)


def adamw(params: list[torch.nn.Parameter], lr: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW, fused (one kernel over all parameters: ~3x faster on CPU for a 135M-parameter model than
    the default per-parameter loop) where torch has the fused kernel for these parameters."""
    fusable = params and all(
        type(p.data) is torch.Tensor and p.device.type in ("cpu", "cuda") and p.dtype in FUSED_DTYPES for p in params
    )
    if fusable and len({p.device for p in params}) == 1:
        try:
            return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=True)
        except (RuntimeError, ValueError):  # no fused kernel for this device / dtype in this torch
            pass
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)


FUSED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@dataclass
class ItemSampler:
    """Shuffled passes over the training items; (epoch, position) is the data cursor."""

    num_items: int
    seed: int
    epoch: int = 0
    position: int = 0

    def _order(self) -> np.ndarray:
        return np.random.default_rng([self.seed, self.epoch]).permutation(self.num_items)

    def next(self, n: int) -> list[int]:
        out: list[int] = []
        order = self._order()
        while len(out) < n:
            if self.position >= self.num_items:
                self.epoch, self.position = self.epoch + 1, 0
                order = self._order()
            take = min(n - len(out), self.num_items - self.position)
            out.extend(int(i) for i in order[self.position : self.position + take])
            self.position += take
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
