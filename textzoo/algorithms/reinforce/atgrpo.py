"""AT-GRPO (PettingLLMs, arXiv 2510.11062): group-relative advantages over (state, agent, turn) groups.

For actor i's sample s at turn t, played from prompt o_s (the token ids the model saw), the group of s
is every sample of actor i at turn t with the same prompt: the candidates sampled from one state.
    R_s = Σ_{k>=t} γ^{k-t} r̃[e,i,k]   (credited as in the reinforce family; `tree_rollout`: r̃[e,i,t] only)
    A_s = (R_s − mean_group R) / (max(std_group R, std_floor) + 1e-6)   ("none": unscaled)
A group never mixes agents, turns or histories. At turn 0 the G samples of a prompt are one group
(MAGRPO's); later, without the tree rollout, G independent episodes share a history only by chance,
so most later samples are groups of one (advantage 0). With `reinforce.tree_rollout` the runner keeps,
after each turn, the branch with the best team reward of each prompt and copies it to the other G − 1
(`RolloutNeeds.tree`), so every turn's G candidates come from one state; a branch's later turns then
continue another branch's action, so its credit is its own turn's reward (and the rollout's reward
columns, summed over turns, mix a branch's own turn with the chosen branch's later ones).
Loss and its settings (aggregation, clip, epochs, reference KL) are the reinforce family's.

The math is `textzoo.algorithms.rlmath.state_group_ids` and `state_group_advantages`.
"""

from __future__ import annotations

import torch

from textzoo.algorithms.batch import Job, Rollout
from textzoo.algorithms.family import RolloutNeeds, trainable_samples
from textzoo.algorithms.reinforce.family import ReferenceKL, ReinforceConfig, reference_log_ratios
from textzoo.algorithms.rlmath import (
    credited_rewards,
    discounted_returns,
    kl_shaped_rewards,
    state_group_advantages,
    state_group_ids,
)
from textzoo.models.policy import Policy
from textzoo.models.team import Actor, frozen_references


def state_keys(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, turns: torch.Tensor) -> list[tuple]:
    """One hashable key per sample: its turn and the prompt tokens it was sampled from (padding left out)."""
    ids, mask, turns = prompt_ids.cpu(), prompt_mask.cpu().bool(), turns.cpu()
    return [(int(turns[s]), tuple(ids[s][mask[s]].tolist())) for s in range(ids.shape[0])]


class ATGRPOFamily(ReferenceKL):
    """Routes a rollout through the AT-GRPO grouping into one policy-gradient job per trainable actor."""

    def __init__(
        self,
        config: ReinforceConfig,
        actors: list[Actor],
        gamma: float = 1.0,
        credit: str = "shared",
        normalize_per_agent: bool = False,
    ):
        self.config = config
        self.gamma = gamma
        self.credit = credit
        self.normalize_per_agent = normalize_per_agent
        self.actors = {a.id: a for a in actors}
        self.needs = RolloutNeeds(tree=config.tree_rollout)
        self.references: dict[str, Policy] = frozen_references(actors) if config.kl_coef > 0 else {}

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass

    def jobs(self, rollout: Rollout) -> tuple[list[Job], dict[str, float]]:
        cfg = self.config
        rewards = credited_rewards(rollout.rewards, rollout.actor_roles, self.credit)  # [E, A, T]
        samples = trainable_samples(rollout, self.actors)
        stats: dict[str, float] = {}
        refs, log_ratio = reference_log_ratios(rollout, samples, self.references, rewards, stats)
        if cfg.kl_coef > 0 and cfg.kl_in == "reward":
            rewards = kl_shaped_rewards(rewards, log_ratio, cfg.kl_coef)
        returns = rewards if cfg.tree_rollout else discounted_returns(rewards, self.gamma)  # [E, A, T]
        adv = torch.zeros_like(returns)
        for ai, actor_id in enumerate(rollout.actors):
            if actor_id not in samples:
                continue
            s = samples[actor_id]
            groups = state_group_ids(state_keys(s.gen.prompt_ids, s.gen.prompt_mask, s.turns))
            adv[s.env_ids, ai, s.turns] = state_group_advantages(
                returns[s.env_ids, ai, s.turns], groups, cfg.advantage_scale, cfg.std_floor
            )
            stats[f"agent/{actor_id}/state_groups"] = float(groups.max() + 1) if len(groups) else 0.0
        jobs, job_stats = self.loss_jobs(rollout, samples, adv, refs)
        return jobs, {**stats, **job_stats}
