"""Family `reinforce`: MAGRPO, MARLOO, MAReMax and MAREINFORCE as advantage estimators.

For env copy e = (b, g), actor i, turn t the credited return is
    R[e,i,t] = Σ_{k>=t} γ^{k-t} r̃[e,i,k],   r̃ = team reward (credit "shared") or own reward ("per_agent"),
less β·Σ_k(ℓ_k − ℓ_ref,k) per turn when `kl_in="reward"` (k1 shaping; k3 is logged, and is the loss term
of `kl_in="loss"`). The group of (b, i, t) is its G samples; baselines:
    grpo       A_g = R_g − mean_g R                       (Shao et al. 2024; MAGRPO)
    rloo       A_g = R_g − mean_{g'≠g} R_{g'}             (Ahmadian et al. 2024)
    remax      A_g = R_g − R_greedy                       (Li et al. 2023; one greedy rollout per prompt)
    reinforce  A_g = R_g (− a running mean of past returns when `reinforce_baseline="running_mean"`,
               or − b[role], an average of the returns of the role the sample played, when "per_role":
               SPIRAL's role-conditioned advantage estimation, RAE)
`advantage_scale="std"` divides by max(std_g R, std_floor) + 1e-6 and never re-centres; "none" is
Dr. GRPO. With `credit="acting_role"` (self-play: one policy playing several roles in turn) R is the
return of the role the actor played at t (`acting_role_returns`). `normalize_per_agent` then
standardises each actor's advantages over the batch (Dr. MAS).
`joint_mode="cross"` (single-turn) credits sample g of actor i with the **mean** return over every
combination of its partners' samples. Loss: `policy_gradient_loss` (−A·ℓ, or PPO-clip with
`clip_range` over several `epochs`), plus β·KL_k3 per token when `kl_in="loss"`. Samples of a rollout
engine (`agent.engine.kind="vllm"`, `agent.engine.tis`) weigh each token's policy-gradient term by
w_k = min(π_trainer/π_engine, C) (truncated importance sampling, Yao et al. 2025; the KL term is not weighted).

Every formula is a function of `textzoo.algorithms.rlmath`; this module routes the rollout to them.
"""

from __future__ import annotations

from functools import partial

import torch

from textzoo.algorithms.batch import ActorSamples, Job, Rollout, SampleBatch
from textzoo.algorithms.family import RolloutNeeds, engine_token_weights, policy_jobs, trainable_samples
from textzoo.algorithms.reinforce.config import ReinforceConfig
from textzoo.algorithms.rlmath import (
    BatchNorm,
    acting_role_returns,
    acting_roles,
    advantages,
    credited_rewards,
    cross_returns,
    discounted_returns,
    k1_log_ratio,
    k3_kl,
    kl_loss,
    kl_shaped_rewards,
    policy_gradient_loss,
    role_baselines,
    running_mean_update,
)
from textzoo.algorithms.settings import ESTIMATORS, check_estimator
from textzoo.decoding.inference import score_no_grad
from textzoo.errors import ConfigError
from textzoo.models.policy import Policy
from textzoo.models.team import Actor, frozen_references, reference_models


def reference_log_ratios(
    rollout: Rollout,
    samples: dict[str, ActorSamples],
    references: dict[str, Policy],
    like: torch.Tensor,
    stats: dict[str, float],
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Each sample's reference log-probs (actor -> [S, C], on the reference's device) and its k1 log-ratio
    to the reference, summed over tokens ([E, A, T], shaped and typed as `like`); logs the k3 KL per actor."""
    refs: dict[str, torch.Tensor] = {}
    log_ratio = torch.zeros_like(like)  # [E, A, T]
    for ai, actor_id in enumerate(rollout.actors):
        if actor_id not in samples or actor_id not in references:
            continue
        s = samples[actor_id]
        refs[actor_id] = score_no_grad(references[actor_id], s.gen)
        lp, ref, mask = s.gen.logprobs.cpu(), refs[actor_id].cpu(), s.gen.completion_mask.cpu().float()
        log_ratio[s.env_ids, ai, s.turns] = k1_log_ratio(lp, ref, mask).to(log_ratio.dtype)
        stats[f"agent/{actor_id}/kl"] = float(k3_kl(lp, ref, mask).mean())  # the low-variance estimate
    return refs, log_ratio


# ---- the family ---------------------------------------------------------------------------------
class ReferenceKL:
    """What the families of this folder share: the REINFORCE loss on the advantages they compute, no model
    trained besides the actors, and the frozen copies of the initial policies (`self.references`, made
    when `kl_coef` > 0)."""

    config: ReinforceConfig
    actors: dict[str, Actor]
    normalize_per_agent: bool
    references: dict[str, Policy]

    def loss_jobs(
        self, rollout: Rollout, samples: dict[str, ActorSamples], adv: torch.Tensor, refs: dict
    ) -> tuple[list[Job], dict[str, float]]:
        """One job per trainable actor: `reinforce_loss` on advantages `adv` [E, A, T] (`policy_jobs`)."""
        cfg = self.config
        return policy_jobs(
            rollout,
            samples,
            adv,
            self.actors,
            lambda policy: partial(reinforce_loss, policy, cfg),
            cfg.epochs,
            cfg.minibatches,
            self.normalize_per_agent,
            refs,
        )

    def trainable_models(self) -> dict:
        return {}

    def frozen_models(self) -> dict[str, torch.nn.Module]:
        return reference_models(self.references)


class ReinforceFamily(ReferenceKL):
    """Routes a rollout through `textzoo.algorithms.rlmath` into one policy-gradient job per trainable actor."""

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
        self.needs = RolloutNeeds(greedy=ESTIMATORS[estimator].greedy, cross=config.joint_mode == "cross")
        self.running_mean: torch.Tensor | None = None
        self.role_mean: torch.Tensor | None = None  # [R] RAE baselines (reinforce_baseline="per_role")
        # frozen copies of the initial weights, made before any checkpoint is loaded
        self.references: dict[str, Policy] = frozen_references(actors) if config.kl_coef > 0 else {}

    def state_dict(self) -> dict:
        return {"running_mean": self.running_mean, "role_mean": self.role_mean}

    def load_state_dict(self, state: dict) -> None:
        self.running_mean = state.get("running_mean")
        self.role_mean = state.get("role_mean")

    def jobs(self, rollout: Rollout) -> tuple[list[Job], dict[str, float]]:
        cfg = self.config
        B, G, A = rollout.num_prompts, rollout.group_size, len(rollout.actors)
        # acting_role's returns come from the roles played (below); its shapes are per_agent's
        credit = "per_agent" if self.credit == "acting_role" else self.credit
        rewards = credited_rewards(rollout.rewards, rollout.actor_roles, credit)  # [E, A, T]
        T = rewards.shape[-1]
        stats: dict[str, float] = {}
        samples = trainable_samples(rollout, self.actors)
        refs, log_ratio = reference_log_ratios(rollout, samples, self.references, rewards, stats)
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
        elif self.credit == "acting_role":
            played = rollout.infos["role_active"]  # [E, R, T]
            returns = acting_role_returns(rollout.rewards, played, rollout.actor_roles, self.gamma)  # [E, A, T]
            if shaping:
                returns = returns - discounted_returns(cfg.kl_coef * log_ratio, self.gamma)
            returns = returns.view(B, G, A, T)
        else:
            if shaping:
                rewards = kl_shaped_rewards(rewards, log_ratio, cfg.kl_coef)
            returns = discounted_returns(rewards, self.gamma).view(B, G, A, T)
        greedy = None
        if self.needs.greedy:
            g = rollout.greedy  # one greedy sample per prompt: E = B
            greedy = discounted_returns(credited_rewards(g.rewards, g.actor_roles, self.credit), self.gamma)  # [B,A,T]
        running = None
        if self.estimator == "reinforce" and cfg.reinforce_baseline == "running_mean":
            running = self.running_mean
            self.running_mean = running_mean_update(running, returns, mask)  # [A, T]
        if self.estimator == "reinforce" and cfg.reinforce_baseline == "per_role":
            roles = acting_roles(rollout.infos["role_active"], rollout.actor_roles).view(B, G, A, T)
            roles = torch.where(mask.bool(), roles, torch.full_like(roles, -1))
            running, self.role_mean = role_baselines(self.role_mean, returns, roles, len(rollout.roles))
        adv = advantages(returns, mask, self.estimator, cfg.advantage_scale, cfg.std_floor, greedy, running)

        jobs, job_stats = self.loss_jobs(rollout, samples, adv.reshape(B * G, A, T), refs)
        return jobs, {**stats, **job_stats}


def reinforce_loss(policy: Policy, cfg: ReinforceConfig, batch: SampleBatch, norm: BatchNorm):
    """Per-sample loss contributions of one micro-batch (policy gradient, each token weighted by its truncated
    importance weight when a rollout engine sampled it, `engine_token_weights`; plus β·KL_k3 if in the loss)."""
    g = batch.gen
    logprobs = policy.score(g.prompt_ids, g.prompt_mask, g.completion_ids, g.completion_mask)  # [S, C]
    weights, tis_stats = engine_token_weights(policy, g)
    contrib, stats = policy_gradient_loss(
        logprobs, g.logprobs, batch.advantages, g.completion_mask, norm, cfg.loss_aggregation, cfg.clip_range, weights
    )
    stats.update(tis_stats)
    if cfg.kl_coef > 0 and cfg.kl_in == "loss" and batch.ref_logprobs is not None:
        mask = g.completion_mask.to(logprobs.dtype)
        contrib = contrib + cfg.kl_coef * kl_loss(logprobs, batch.ref_logprobs, mask, norm, cfg.loss_aggregation)
        stats["kl"] = k3_kl(logprobs, batch.ref_logprobs, mask).mean().detach()
    return contrib, stats
