"""The one interface between the trainer and an algorithm family.

A family turns a `Rollout` into update `Job`s; the trainer executes them with `run_job`. Families
never touch optimizers, files or device placement, and the trainer never branches on the algorithm:
what a family needs beyond the plain rollout it declares in `needs`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch

from textzoo.algorithms.batch import ActorSamples, Job, LossFn, Rollout, SampleBatch
from textzoo.algorithms.rlmath import standardize, truncated_importance_weights

if TYPE_CHECKING:
    from textzoo.decoding.generation import Generation
    from textzoo.models.policy import Policy
    from textzoo.models.team import Actor


@dataclass(frozen=True)
class RolloutNeeds:
    """The extra rollouts a family asks the runner for, besides the B x G samples of each step."""

    greedy: bool = False
    """One greedy (argmax) rollout of each prompt, as `rollout.greedy` (ReMax's baseline)."""
    cross: bool = False
    """The reward of every combination of the actors' samples, as `rollout.cross_rewards` (joint mode cross)."""
    tree: bool = False
    """Tree rollout (AT-GRPO): after each turn every prompt's best branch is copied to its other env copies."""


class Family(Protocol):
    """What every algorithm family provides (see `ReinforceFamily` for the reference one)."""

    needs: RolloutNeeds
    """Extra rollouts the runner collects for this family each step."""

    def jobs(self, rollout: Rollout) -> tuple[list[Job], dict[str, float]]:
        """Update jobs for this batch (one per learner and objective) and statistics to log."""
        ...

    def trainable_models(self) -> dict[str, tuple[torch.nn.Module, Any]]:
        """Models the family trains besides the actors: name -> (module, AgentConfig-like settings)."""
        ...

    def frozen_models(self) -> dict[str, torch.nn.Module]:
        """Frozen models the family reads (reference copies): placement name -> module."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """State beyond weights that an exact resume needs (running baselines, pair stores)."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def trainable_samples(rollout: Rollout, actors: Mapping[str, Actor]) -> dict[str, ActorSamples]:
    """Each trainable actor's samples of the rollout (actors that made none are left out)."""
    out = {}
    for actor_id in rollout.actors:
        actor = actors[actor_id]
        samples = rollout.samples(actor_id, actor.policy.pad_id) if actor.trainable else None
        if samples is not None:
            out[actor_id] = samples
    return out


def policy_jobs(
    rollout: Rollout,
    samples: Mapping[str, ActorSamples],
    advantages: torch.Tensor,
    actors: Mapping[str, Actor],
    loss: Callable[[Policy], LossFn],
    epochs: int,
    minibatches: int,
    normalize_per_agent: bool = False,
    ref_logprobs: Mapping[str, torch.Tensor] | None = None,
) -> tuple[list[Job], dict[str, float]]:
    """One policy-gradient job per actor of `samples`: its advantages read from `advantages` [E, A, T] at its
    samples (standardised over them with `normalize_per_agent`), trained with `loss(policy)`."""
    jobs, stats = [], {}
    for ai, actor_id in enumerate(rollout.actors):
        if actor_id not in samples:
            continue
        s, policy = samples[actor_id], actors[actor_id].policy
        sample_adv = advantages[s.env_ids, ai, s.turns]  # [S]
        if normalize_per_agent:
            sample_adv = standardize(sample_adv)
        stats[f"agent/{actor_id}/advantage_abs"] = float(sample_adv.abs().mean())
        batch = SampleBatch(s.gen, sample_adv, (ref_logprobs or {}).get(actor_id))
        jobs.append(
            Job(
                actor_id,
                batch,
                loss(policy),
                epochs=epochs,
                minibatches=minibatches,
                max_new_tokens=policy.generation.max_new_tokens,
                prompt_cache=policy.prompt_cache,
            )
        )
    return jobs, stats


def engine_token_weights(policy: Policy, gen: Generation) -> tuple[torch.Tensor | None, dict[str, torch.Tensor]]:
    """The truncated importance weights ([S, C], `truncated_importance_weights`) of a batch that ``policy``'s
    rollout engine sampled, when its agent applies them (``agent.engine.tis``; C = ``agent.engine.tis_cap``),
    and their statistics (`tis_weight`: mean weight, `tis_clipfrac`: share of tokens at the cap); (None, {})
    for the policy's own samples (the local path: the losses are unchanged)."""
    client = policy.engine
    if gen.engine_logprobs is None or client is None or not client.tis:
        return None, {}
    trainer, engine = gen.logprobs.detach(), gen.engine_logprobs.detach().to(gen.logprobs.dtype)
    mask = gen.completion_mask.to(trainer.dtype)
    weights = truncated_importance_weights(trainer, engine, mask, client.tis_cap)  # [S, C]
    over = (torch.exp((trainer - engine) * mask) > client.tis_cap).to(mask.dtype) * mask  # [S, C]
    tokens = mask.sum().clamp(min=1)
    return weights, {"tis_weight": weights.sum() / tokens, "tis_clipfrac": over.sum() / tokens}
