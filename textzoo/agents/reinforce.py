"""Family `reinforce`: MAGRPO, MARLOO, MAReMax and MAREINFORCE as advantage estimators.

For env copy e = (b, g), actor i, turn t the credited return is
    R[e,i,t] = Σ_{k>=t} γ^{k-t} r̃[e,i,k],   r̃ = team reward (credit "shared") or own reward ("per_agent"),
less β·Σ_k(ℓ_k − ℓ_ref,k) per turn when `kl_in="reward"` (k1 shaping; k3 is logged, and is the loss term
of `kl_in="loss"`). The group of (b, i, t) is its G samples; baselines:
    grpo       A_g = R_g − mean_g R                       (Shao et al. 2024; MAGRPO)
    rloo       A_g = R_g − mean_{g'≠g} R_{g'}             (Ahmadian et al. 2024)
    remax      A_g = R_g − R_greedy                       (Li et al. 2023; one greedy rollout per prompt)
    reinforce  A_g = R_g (− a running mean of past returns when `reinforce_baseline="running_mean"`)
`advantage_scale="std"` divides by max(std_g R, std_floor) + 1e-6 and never re-centres; "none" is
Dr. GRPO. `normalize_per_agent` then standardises each actor's advantages over the batch (Dr. MAS).
`joint_mode="cross"` (single-turn) credits sample g of actor i with the **mean** return over every
combination of its partners' samples. Loss: `policy_gradient_loss` (−A·ℓ, or PPO-clip with
`clip_range` over several `epochs`), plus β·KL_k3 per token when `kl_in="loss"`.

Every formula is a function of `textzoo.agents.rlmath`; this module routes the rollout to them.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch

from textzoo.agents.batch import Job, Rollout, SampleBatch
from textzoo.agents.family import RolloutNeeds, check_policy_update, policy_jobs, trainable_samples
from textzoo.agents.inference import score_no_grad
from textzoo.agents.policy import Policy
from textzoo.agents.rlmath import (
    ESTIMATORS,
    GROUP_ESTIMATORS,
    BatchNorm,
    advantages,
    credited_rewards,
    cross_returns,
    discounted_returns,
    k1_log_ratio,
    k3_kl,
    kl_loss,
    kl_shaped_rewards,
    policy_gradient_loss,
    running_mean_update,
)
from textzoo.agents.team import Actor, frozen_references, reference_models
from textzoo.errors import ConfigError


@dataclass
class ReinforceConfig:
    """Settings of the group-relative REINFORCE family."""

    advantage_scale: str = "std"
    """"std": divide by the group's std of returns (+1e-6); "none": leave unscaled (Dr. GRPO)."""
    std_floor: float = 0.0
    """Lower bound on the group std when scaling, so near-constant sparse rewards do not blow up."""
    loss_aggregation: str = "seq_sum"
    """seq_sum | seq_mean | token_mean | constant (`textzoo.agents.rlmath.AGGREGATIONS`)."""
    clip_range: float | None = None
    """PPO ratio clip ε; None = plain on-policy REINFORCE gradient."""
    epochs: int = 1
    """Passes over each batch (>1 needs clip_range so the off-policy ratio is bounded)."""
    minibatches: int = 1
    """Optimizer steps per pass over a batch."""
    kl_coef: float = 0.0
    """β of the KL to a frozen copy of the initial policy (k1 in the reward, k3 in the loss: see kl_in);
    0 disables the reference copy."""
    kl_in: str = "reward"
    """"reward": subtract β·Σ_k log(π/π_ref) (k1) from the turn's reward; "loss": add β·KL_k3 per token to the loss."""
    joint_mode: str = "aligned"
    """"aligned": sample g of every agent forms joint action g; "cross": all G^N combinations."""
    reinforce_baseline: str = "none"
    """For estimator reinforce: "none" or "running_mean" (mean of past returns, momentum 0.9)."""
    tree_rollout: bool = False
    """atgrpo only: after each turn keep each prompt's best branch (team reward of the turn; ties: the first)
    and copy it to the prompt's other G − 1 env copies, so every turn's G samples come from one state."""

    def __post_init__(self) -> None:
        if self.advantage_scale not in ("std", "none"):
            raise ConfigError(f"reinforce.advantage_scale must be 'std' or 'none', got {self.advantage_scale!r}")
        check_policy_update("reinforce", self.loss_aggregation, self.clip_range, self.epochs, self.minibatches)
        if self.epochs > 1 and self.clip_range is None:
            raise ConfigError("reinforce.epochs > 1 reuses samples off-policy: set reinforce.clip_range (e.g. 0.2)")
        if self.kl_coef < 0:
            raise ConfigError(f"reinforce.kl_coef must be >= 0, got {self.kl_coef}")
        if self.kl_in not in ("reward", "loss"):
            raise ConfigError(f"reinforce.kl_in must be 'reward' or 'loss', got {self.kl_in!r}")
        if self.joint_mode not in ("aligned", "cross"):
            raise ConfigError(f"reinforce.joint_mode must be 'aligned' or 'cross', got {self.joint_mode!r}")
        if self.reinforce_baseline not in ("none", "running_mean"):
            raise ConfigError(
                f"reinforce.reinforce_baseline must be 'none' or 'running_mean', got {self.reinforce_baseline!r}"
            )
        if self.std_floor < 0:
            raise ConfigError(f"reinforce.std_floor must be >= 0, got {self.std_floor}")


# ---- the family ---------------------------------------------------------------------------------
class ReinforceFamily:
    """Routes a rollout through `textzoo.agents.rlmath` into one policy-gradient job per trainable actor."""

    def __init__(
        self,
        config: ReinforceConfig,
        actors: list[Actor],
        estimator: str,
        gamma: float = 1.0,
        credit: str = "shared",
        group_size: int = 2,
        normalize_per_agent: bool = False,
    ):
        check_estimator(estimator, group_size)
        self.config = config
        self.estimator = estimator
        self.gamma = gamma
        self.credit = credit
        self.normalize_per_agent = normalize_per_agent
        self.actors = {a.id: a for a in actors}
        self.needs = RolloutNeeds(greedy=estimator == "remax", cross=config.joint_mode == "cross")
        self.running_mean: torch.Tensor | None = None
        # frozen copies of the initial weights, made before any checkpoint is loaded
        self.references: dict[str, Policy] = frozen_references(actors) if config.kl_coef > 0 else {}

    def trainable_models(self) -> dict:
        return {}

    def frozen_models(self) -> dict[str, torch.nn.Module]:
        return reference_models(self.references)

    def state_dict(self) -> dict:
        return {"running_mean": self.running_mean}

    def load_state_dict(self, state: dict) -> None:
        self.running_mean = state.get("running_mean")

    def jobs(self, rollout: Rollout) -> tuple[list[Job], dict[str, float]]:
        cfg = self.config
        B, G, A = rollout.num_prompts, rollout.group_size, len(rollout.actors)
        rewards = credited_rewards(rollout.rewards, rollout.actor_roles, self.credit)  # [E, A, T]
        T = rewards.shape[-1]
        stats: dict[str, float] = {}
        samples = trainable_samples(rollout, self.actors)
        refs: dict[str, torch.Tensor] = {}  # actor -> reference log-probs [S, C] (on the reference's device)
        log_ratio = torch.zeros_like(rewards)  # [E, A, T] k1 of each sample
        for ai, actor_id in enumerate(rollout.actors):
            if actor_id not in samples or actor_id not in self.references:
                continue
            s = samples[actor_id]
            refs[actor_id] = score_no_grad(self.references[actor_id], s.gen)
            lp, ref, mask = s.gen.logprobs.cpu(), refs[actor_id].cpu(), s.gen.completion_mask.cpu().float()
            log_ratio[s.env_ids, ai, s.turns] = k1_log_ratio(lp, ref, mask).to(log_ratio.dtype)
            stats[f"agent/{actor_id}/kl"] = float(k3_kl(lp, ref, mask).mean())  # the low-variance estimate
        shaping = cfg.kl_coef > 0 and cfg.kl_in == "reward"

        mask = rollout.active.to(rewards.dtype).view(B, G, A, T)
        if cfg.joint_mode == "cross":
            if rollout.cross_rewards is None or T != 1:
                raise ConfigError("joint_mode='cross' needs a single-turn env and cross rewards from the runner")
            C, R = rollout.cross_rewards.shape[1:]
            combos = credited_rewards(rollout.cross_rewards.reshape(B * C, R), rollout.actor_roles, self.credit)
            returns = cross_returns(combos.view(B, C, A), G).unsqueeze(-1)  # [B, G, A, 1]
            if shaping:
                returns = kl_shaped_rewards(returns, log_ratio.view(B, G, A, T), cfg.kl_coef)
        else:
            if shaping:
                rewards = kl_shaped_rewards(rewards, log_ratio, cfg.kl_coef)
            returns = discounted_returns(rewards, self.gamma).view(B, G, A, T)
        greedy = None
        if self.estimator == "remax":
            g = rollout.greedy  # one greedy sample per prompt: E = B
            greedy = discounted_returns(credited_rewards(g.rewards, g.actor_roles, self.credit), self.gamma)  # [B,A,T]
        running = None
        if self.estimator == "reinforce" and cfg.reinforce_baseline == "running_mean":
            running = self.running_mean
            self.running_mean = running_mean_update(running, returns, mask)  # [A, T]
        adv = advantages(returns, mask, self.estimator, cfg.advantage_scale, cfg.std_floor, greedy, running)

        jobs, job_stats = policy_jobs(
            rollout,
            samples,
            adv.reshape(B * G, A, T),
            self.actors,
            lambda policy: partial(reinforce_loss, policy, cfg),
            cfg.epochs,
            cfg.minibatches,
            self.normalize_per_agent,
            refs,
        )
        return jobs, {**stats, **job_stats}


def check_estimator(estimator: str, group_size: int) -> None:
    """An estimator exists and has the group it needs (grpo and rloo compare samples of a group)."""
    if estimator not in ESTIMATORS:
        raise ConfigError(f"unknown estimator {estimator!r}; choose one of {ESTIMATORS}")
    if estimator in GROUP_ESTIMATORS and group_size < 2:
        raise ConfigError(f"{estimator} compares samples within a group: set group_size >= 2 (got {group_size})")


def reinforce_loss(policy: Policy, cfg: ReinforceConfig, batch: SampleBatch, norm: BatchNorm):
    """Per-sample loss contributions of one micro-batch (policy gradient, plus β·KL_k3 if in the loss)."""
    g = batch.gen
    logprobs = policy.score(g.prompt_ids, g.prompt_mask, g.completion_ids, g.completion_mask)  # [S, C]
    contrib, stats = policy_gradient_loss(
        logprobs, g.logprobs, batch.advantages, g.completion_mask, norm, cfg.loss_aggregation, cfg.clip_range
    )
    if cfg.kl_coef > 0 and cfg.kl_in == "loss" and batch.ref_logprobs is not None:
        mask = g.completion_mask.to(logprobs.dtype)
        contrib = contrib + cfg.kl_coef * kl_loss(logprobs, batch.ref_logprobs, mask, norm, cfg.loss_aggregation)
        stats["kl"] = k3_kl(logprobs, batch.ref_logprobs, mask).mean().detach()
    return contrib, stats
