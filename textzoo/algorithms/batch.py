"""Data that flows from acting to learning: rollouts, per-learner batches and update jobs.

Runners fill a `Rollout`; an algorithm family turns it into `Job`s (who learns, on which batch, with
which loss); runners execute the jobs. Families never see optimizers and never choose a device: a
family's tensors stay where they were computed (read back to the CPU for bookkeeping), and `run_job`
moves each job's batch to its learner's device.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from textzoo.algorithms.rlmath import BatchNorm
from textzoo.decoding.generation import Generation


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

    Rewards are per env copy, role and turn; `actor_roles` says which roles each actor plays (one
    role for a decentralized agent, all roles for a joint actor), which is what crediting reads
    (`textzoo.algorithms.rlmath.credited_rewards`).
    """

    num_prompts: int
    group_size: int
    roles: list[str]
    actors: list[str]
    actor_roles: list[tuple[int, ...]]  # [A] indices into `roles` of each actor's roles
    items: list[int]  # dataset index per prompt
    steps: list[ActorStep]
    rewards: torch.Tensor  # [E, R, T] per role
    active: torch.Tensor  # [E, A, T] bool: the actor produced a sample there
    states: list[list[str]]  # [T][E] env.state() before each turn (what a centralized critic reads)
    reward_terms: dict[str, torch.Tensor] = field(default_factory=dict)  # term -> [E, R] summed over turns
    greedy: Rollout | None = None  # one greedy rollout per prompt (ReMax baseline); E = B
    cross_rewards: torch.Tensor | None = None  # [B, G**A, R] per-role reward of every joint combination
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

    def samples(self, actor: str, pad_id: int) -> ActorSamples | None:
        """Every sample of `actor` over all turns, in generation order (None when it made none)."""
        steps = self.steps_of(actor)
        if not steps:
            return None
        return ActorSamples(
            Generation.cat([s.gen for s in steps], pad_id=pad_id),
            torch.cat([s.env_ids for s in steps]).cpu(),
            torch.cat([torch.full_like(s.env_ids, s.turn) for s in steps]).cpu(),
        )


@dataclass
class ActorSamples:
    """One actor's samples of a rollout: row s was played in env copy `env_ids[s]` at turn `turns[s]`."""

    gen: Generation
    env_ids: torch.Tensor  # [S] long, CPU
    turns: torch.Tensor  # [S] long, CPU


class Batch(Protocol):
    """What `run_job` needs of a learner's batch: a size in samples (or pairs), sub-batches, a device move."""

    @property
    def gen(self) -> Generation:
        """The rows the runner sizes micro-batches and loss normalisers by."""
        ...

    def __len__(self) -> int: ...

    def select(self, index: torch.Tensor) -> Batch:
        """The sub-batch of rows `index`."""
        ...

    def to(self, device: torch.device | str) -> Batch:
        """This batch with every tensor on `device`."""
        ...


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

    def to(self, device: torch.device | str) -> SampleBatch:
        ref = None if self.ref_logprobs is None else self.ref_logprobs.to(device)
        return SampleBatch(
            self.gen.to(device), self.advantages.to(device), ref, {k: v.to(device) for k, v in self.extra.items()}
        )


@dataclass
class PairBatch:
    """One learner's pairs: row s of `chosen` beat row s of `rejected`; per-pair tensors in `extra`.

    `gen` is the chosen side, so a runner sizes micro-batches and normalisers in pairs.
    """

    chosen: Generation
    rejected: Generation
    extra: dict[str, torch.Tensor] = field(default_factory=dict)  # name -> [S]

    @property
    def gen(self) -> Generation:
        return self.chosen

    def __len__(self) -> int:
        return len(self.chosen)

    def select(self, index: torch.Tensor) -> PairBatch:
        return PairBatch(
            self.chosen.select(index),
            self.rejected.select(index),
            {k: v[index.to(v.device)] for k, v in self.extra.items()},
        )

    def to(self, device: torch.device | str) -> PairBatch:
        return PairBatch(
            self.chosen.to(device), self.rejected.to(device), {k: v.to(device) for k, v in self.extra.items()}
        )


LossFn = Callable[[Batch, BatchNorm], tuple[torch.Tensor, dict[str, torch.Tensor]]]


@dataclass
class Job:
    """One learner's update: train `learner` on `batch` with `loss` (per-sample contributions).

    `epochs` passes over the batch, each split into `minibatches` optimizer steps.
    """

    learner: str
    batch: Batch
    loss: LossFn
    epochs: int = 1
    minibatches: int = 1
    max_new_tokens: int = 1
    prompt_cache: Callable[[], AbstractContextManager] | None = None
    """For per-sample backward: a context in which the samples of one prompt share its forward
    (`Policy.prompt_cache` of the job's policy); None = each sample runs its prompt."""
