"""The median family: A_g = R_g - median_g R, with the REINFORCE family's loss."""

from __future__ import annotations

from functools import partial

import torch

from textzoo.algorithms import rlmath
from textzoo.algorithms.batch import Job, Rollout, SampleBatch
from textzoo.algorithms.family import RolloutNeeds
from textzoo.algorithms.reinforce.config import ReinforceConfig
from textzoo.algorithms.reinforce.family import reinforce_loss
from textzoo.models.team import Actor


def median_baseline(returns: torch.Tensor) -> torch.Tensor:
    """The median of each group's returns (dim 1 = G). [B, G, ...] -> [B, G, ...]."""
    return returns.median(dim=1, keepdim=True).values.expand_as(returns)


class MedianFamily:
    """A_g = R_g - median_g R; the loss is the REINFORCE family's."""

    needs = RolloutNeeds()  # no greedy rollout, no cross combinations

    def __init__(self, loss: ReinforceConfig, actors: list[Actor], gamma: float, credit: str):
        self.loss, self.gamma, self.credit = loss, gamma, credit
        self.actors = {a.id: a for a in actors}

    def jobs(self, rollout: Rollout) -> tuple[list[Job], dict[str, float]]:
        B, G, A = rollout.num_prompts, rollout.group_size, len(rollout.actors)
        rewards = rlmath.credited_rewards(rollout.rewards, rollout.actor_roles, self.credit)  # [E, A, T]
        returns = rlmath.discounted_returns(rewards, self.gamma).view(B, G, A, -1)
        adv = ((returns - median_baseline(returns)) * rollout.active.view(B, G, A, -1)).view(B * G, A, -1)
        jobs = []
        for ai, actor_id in enumerate(rollout.actors):
            actor = self.actors[actor_id]
            samples = rollout.samples(actor_id, actor.policy.pad_id)
            if not actor.trainable or samples is None:
                continue
            batch = SampleBatch(samples.gen, adv[samples.env_ids, ai, samples.turns])
            loss = partial(reinforce_loss, actor.policy, self.loss)
            jobs.append(Job(actor_id, batch, loss, max_new_tokens=actor.policy.generation.max_new_tokens))
        return jobs, {}

    def trainable_models(self) -> dict:  # critics or reward models this family trains besides the actors
        return {}

    def frozen_models(self) -> dict:  # frozen references it reads (placed by the runner)
        return {}

    def state_dict(self) -> dict:  # what an exact resume needs beyond weights
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass
