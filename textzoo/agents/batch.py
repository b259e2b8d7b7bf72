"""Data that flows from acting to learning: rollouts, per-learner sample batches and update jobs.

Runners fill a `Rollout`; an algorithm family turns it into `Job`s (who learns, on which samples,
with which loss); runners execute the jobs. Families never see optimizers or devices.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import torch

from textzoo.agents.losses import BatchNorm
from textzoo.agents.policy import Generation


@dataclass
class ActorStep:
    """One actor's samples in one turn: row s of `gen` was generated for env copy `env_ids[s]`."""

    actor: str
    turn: int
    env_ids: torch.Tensor  # [S] long
    gen: Generation
    greedy: bool = False


@dataclass
class Rollout:
    """B prompts x G samples played in lock-step (E = B*G env copies, env e = b*G + g).

    Rewards are per env copy, role and turn; `actor_rewards` credit each actor with the mean reward
    of the roles it plays (one role for a decentralized agent, all roles for a joint actor).
    """

    num_prompts: int
    group_size: int
    roles: list[str]
    actors: list[str]
    items: list[int]  # dataset index per prompt
    steps: list[ActorStep]
    rewards: torch.Tensor  # [E, R, T] per role
    actor_rewards: torch.Tensor  # [E, A, T] mean reward of each actor's roles
    active: torch.Tensor  # [E, A, T] bool: the actor produced a sample there
    states: list[list[str]]  # [T][E] env.state() before each turn (what a centralized critic reads)
    reward_terms: dict[str, torch.Tensor] = field(default_factory=dict)  # term -> [E, R] summed over turns
    greedy: Rollout | None = None  # one greedy rollout per prompt (ReMax baseline); E = B
    cross_rewards: torch.Tensor | None = None  # [B, G**A, A] credited reward of every joint combination
    infos: dict[str, Any] = field(default_factory=dict)  # counters for logging (parse failures, ...)

    @property
    def num_envs(self) -> int:
        return self.num_prompts * self.group_size

    @property
    def team_rewards(self) -> torch.Tensor:
        """[E, T] the mean of the roles' rewards (the team reward of a cooperative task)."""
        return self.rewards.mean(dim=1)

    def steps_of(self, actor: str) -> list[ActorStep]:
        return [s for s in self.steps if s.actor == actor]


@dataclass
class SampleBatch:
    """What one learner trains on: generations plus per-sample tensors aligned with its rows."""

    gen: Generation
    advantages: torch.Tensor  # [S]
    ref_logprobs: torch.Tensor | None = None  # [S, C]
    extra: dict[str, torch.Tensor] = field(default_factory=dict)  # family-specific per-row tensors [S, ...]

    def __len__(self) -> int:
        return len(self.gen)

    def select(self, index: torch.Tensor) -> SampleBatch:
        gen = self.gen.select(index)
        width = gen.completion_ids.shape[1]
        ref = None if self.ref_logprobs is None else self.ref_logprobs[index][:, :width]
        extra = {k: v[index.to(v.device)] for k, v in self.extra.items()}  # per-row: never cropped
        return SampleBatch(gen, self.advantages[index], ref, extra)


LossFn = Callable[[SampleBatch, BatchNorm], tuple[torch.Tensor, dict[str, torch.Tensor]]]


@dataclass
class Job:
    """One learner's update: train `learner` on `batch` with `loss` (per-sample contributions).

    `epochs` passes over the batch, each split into `minibatches` optimizer steps.
    """

    learner: str
    batch: SampleBatch
    loss: LossFn
    epochs: int = 1
    minibatches: int = 1
    max_new_tokens: int = 1
    prompt_cache: Callable[[], AbstractContextManager] | None = None
    """For per-sample backward: a context in which the samples of one prompt share its forward
    (`Policy.prompt_cache` of the job's policy); None = each sample runs its prompt."""
