"""Family `reinforce`: MAGRPO, MARLOO, MAReMax and MAREINFORCE as advantage estimators.

For env copy e = (b, g), actor i, turn t the credited return is
    R[e,i,t] = Σ_{k>=t} γ^{k-t} r̃[e,i,k],   r̃ = team reward (credit "shared") or own reward ("per_agent"),
minus β·Σ_k(ℓ_k − ℓ_ref,k) when `kl_in="reward"` (the k1 log-ratio: as a REINFORCE reward its
gradient is exactly ∇KL(π‖π_ref); the k3 estimator the design doc named is biased as a reward and was
measured to push the policy away from the reference, so k3 is only logged, and used in the loss).
The group of (b, i, t) is its G samples; baselines:
    grpo       A_g = R_g − mean_g R                       (Shao et al. 2024; MAGRPO)
    rloo       A_g = R_g − mean_{g'≠g} R_{g'}             (Ahmadian et al. 2024)
    remax      A_g = R_g − R_greedy                       (Li et al. 2023; one greedy rollout per prompt)
    reinforce  A_g = R_g (− a running mean of past returns when `reinforce_baseline="running_mean"`)
`advantage_scale="std"` divides by max(std_g R, std_floor) + 1e-6 and never re-centres, so the four
estimators stay different (CoMLRL re-centres by default, which makes all four GRPO); "none" is
Dr. GRPO. `normalize_per_agent` then standardises each actor's advantages over the batch (Dr. MAS).
`joint_mode="cross"` (single-turn) credits sample g of actor i with the **mean** return over every
combination of its partners' samples (CoMLRL sums, scaling returns by G^(N−1)).
Loss: `policy_gradient_loss` (−A·ℓ, or PPO-clip with `clip_range` over several `epochs`), plus
β·KL_k3 per token when `kl_in="loss"`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch

from textzoo.agents.batch import Job, Rollout, SampleBatch
from textzoo.agents.losses import AGGREGATIONS, BatchNorm, k3_kl, policy_gradient_loss
from textzoo.agents.policy import Generation, Policy
from textzoo.agents.team import Actor, frozen_references
from textzoo.errors import ConfigError

ESTIMATORS = ("grpo", "rloo", "remax", "reinforce")
GROUP_ESTIMATORS = ("grpo", "rloo")


@dataclass
class ReinforceConfig:
    """Settings of the group-relative REINFORCE family."""

    advantage_scale: str = "std"
    """"std": divide by the group's std of returns (+1e-6); "none": leave unscaled (Dr. GRPO)."""
    std_floor: float = 0.0
    """Lower bound on the group std when scaling, so near-constant sparse rewards do not blow up."""
    normalize_per_agent: bool = False
    """Standardise each agent's advantages over the whole batch after the baseline (Dr. MAS)."""
    loss_aggregation: str = "seq_sum"
    """seq_sum | seq_mean | token_mean | constant (see textzoo.agents.losses)."""
    clip_range: float | None = None
    """PPO ratio clip ε; None = plain on-policy REINFORCE gradient."""
    epochs: int = 1
    """Passes over each batch (>1 needs clip_range so the off-policy ratio is bounded)."""
    minibatches: int = 1
    """Optimizer steps per pass over a batch."""
    kl_coef: float = 0.0
    """β of the reference KL (k3); 0 disables the frozen reference copy."""
    kl_in: str = "reward"
    """"reward": subtract β·log(π/π_ref) (k1) from the turn's reward; "loss": add β·KL_k3 per token to the loss."""
    joint_mode: str = "aligned"
    """"aligned": sample g of every agent forms joint action g; "cross": all G^N combinations."""
    reinforce_baseline: str = "none"
    """For estimator reinforce: "none" or "running_mean" (mean of past returns, momentum 0.9)."""

    def __post_init__(self) -> None:
        if self.advantage_scale not in ("std", "none"):
            raise ConfigError(f"reinforce.advantage_scale must be 'std' or 'none', got {self.advantage_scale!r}")
        if self.loss_aggregation not in AGGREGATIONS:
            raise ConfigError(
                f"reinforce.loss_aggregation must be one of {sorted(AGGREGATIONS)}, got {self.loss_aggregation!r}"
            )
        if self.clip_range is not None and not 0 < self.clip_range < 1:
            raise ConfigError(f"reinforce.clip_range must be in (0, 1) or None, got {self.clip_range}")
        if self.epochs < 1 or self.minibatches < 1:
            raise ConfigError("reinforce.epochs and reinforce.minibatches must be >= 1")
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


# ---- returns and baselines: pure functions on [B, G, ...] tensors --------------------------------
def discounted_returns(rewards: torch.Tensor, gamma: float) -> torch.Tensor:
    """R[..., t] = Σ_{k>=t} γ^{k-t} r[..., k] over the last (turn) axis."""
    out = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[..., 0])
    for t in range(rewards.shape[-1] - 1, -1, -1):  # T is a handful of turns
        running = rewards[..., t] + gamma * running
        out[..., t] = running
    return out


def _masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int) -> torch.Tensor:
    return (x * mask).sum(dim, keepdim=True) / mask.sum(dim, keepdim=True).clamp(min=1)


def group_baseline(returns: torch.Tensor, mask: torch.Tensor, estimator: str) -> torch.Tensor:
    """Baseline b_g of each sample from its group (dim 1 = G). Shapes [B, G, ...] -> [B, G, ...]."""
    if estimator == "grpo":
        return _masked_mean(returns, mask, 1).expand_as(returns)
    if estimator == "rloo":
        n = mask.sum(1, keepdim=True)  # [B, 1, ...]
        others = (returns * mask).sum(1, keepdim=True) - returns * mask
        # a group of one has no other sample: its baseline is its own return (advantage 0)
        return torch.where(n > 1, others / (n - 1).clamp(min=1), returns)
    raise ValueError(f"no group baseline for {estimator!r}")


def group_std(returns: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Unbiased std of each group's returns over dim 1 (0 for groups of one). [B, G, ...] -> [B, 1, ...]."""
    n = mask.sum(1, keepdim=True)
    mean = _masked_mean(returns, mask, 1)
    var = (((returns - mean) * mask) ** 2).sum(1, keepdim=True) / (n - 1).clamp(min=1)
    return var.sqrt()


def advantages(
    returns: torch.Tensor,
    mask: torch.Tensor,
    estimator: str,
    scale: str = "std",
    std_floor: float = 0.0,
    greedy_returns: torch.Tensor | None = None,
    running_mean: torch.Tensor | None = None,
) -> torch.Tensor:
    """Advantages of every sample. `returns`, `mask`: [B, G, A, T]; `greedy_returns`: [B, A, T]."""
    mask = mask.to(returns.dtype)
    if estimator in GROUP_ESTIMATORS:
        adv = returns - group_baseline(returns, mask, estimator)
    elif estimator == "remax":
        if greedy_returns is None:
            raise ValueError("remax needs the greedy rollout's returns")
        adv = returns - greedy_returns.unsqueeze(1)
    elif estimator == "reinforce":
        adv = returns if running_mean is None else returns - running_mean
    else:
        raise ValueError(f"unknown estimator {estimator!r}")
    if scale == "std":
        adv = adv / (group_std(returns, mask).clamp(min=std_floor) + 1e-6)
    return adv * mask


def normalize_over_batch(adv: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Standardise advantages per actor over the batch. [B, G, A, T] with actors on dim 2."""
    mask = mask.to(adv.dtype)
    dims = (0, 1, 3)
    n = mask.sum(dims, keepdim=True).clamp(min=1)
    mean = (adv * mask).sum(dims, keepdim=True) / n
    std = ((((adv - mean) * mask) ** 2).sum(dims, keepdim=True) / n).sqrt()
    return (adv - mean) / (std + 1e-6) * mask


def cross_returns(cross_rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """Mean credited reward of each actor's sample over all partner combinations.

    `cross_rewards` [B, G**A, A] (combination index in row-major order of (g_1, ..., g_A)) -> [B, G, A].
    """
    B, _, A = cross_rewards.shape
    grid = cross_rewards.reshape(B, *([group_size] * A), A)  # [B, G, ..., G, A]
    out = []
    for a in range(A):
        partner_dims = [1 + d for d in range(A) if d != a]
        per_a = grid[..., a]
        out.append(per_a.mean(dim=partner_dims) if partner_dims else per_a)  # [B, G]
    return torch.stack(out, dim=-1)


# ---- the family ---------------------------------------------------------------------------------
class ReinforceFamily:
    """Turns rollouts into one policy-gradient job per trainable actor."""

    def __init__(
        self,
        config: ReinforceConfig,
        actors: list[Actor],
        estimator: str,
        gamma: float = 1.0,
        credit: str = "shared",
        group_size: int = 2,
    ):
        if estimator not in ESTIMATORS:
            raise ConfigError(f"unknown estimator {estimator!r}; choose one of {ESTIMATORS}")
        if estimator in GROUP_ESTIMATORS and group_size < 2:
            raise ConfigError(f"{estimator} compares samples within a group: set group_size >= 2 (got {group_size})")
        self.config = config
        self.estimator = estimator
        self.gamma = gamma
        self.credit = credit
        self.actors = {a.id: a for a in actors}
        self.needs_greedy_baseline = estimator == "remax"
        self.running_mean: torch.Tensor | None = None
        # frozen copies of the initial weights, made before any checkpoint is loaded
        self.references: dict[str, Policy] = frozen_references(actors) if config.kl_coef > 0 else {}

    def trainable_models(self) -> dict:
        return {}

    def state_dict(self) -> dict:
        return {"running_mean": self.running_mean}

    def load_state_dict(self, state: dict) -> None:
        self.running_mean = state.get("running_mean")

    def credited_rewards(self, rollout: Rollout) -> torch.Tensor:
        """r̃ [E, A, T]: the team reward for every actor (shared) or each actor's own reward."""
        if self.credit == "shared":
            team = rollout.team_rewards  # [E, T]
            return team.unsqueeze(1).expand(-1, len(rollout.actors), -1).clone()
        return rollout.actor_rewards.clone()

    def jobs(self, rollout: Rollout) -> tuple[list[Job], dict[str, float]]:
        cfg = self.config
        B, G, A = rollout.num_prompts, rollout.group_size, len(rollout.actors)
        batches: dict[str, tuple[Generation, torch.Tensor, torch.Tensor]] = {}
        rewards = self.credited_rewards(rollout)  # [E, A, T]
        T = rewards.shape[-1]
        stats: dict[str, float] = {}
        kl = torch.zeros_like(rewards)
        for ai, actor_id in enumerate(rollout.actors):
            steps = rollout.steps_of(actor_id)
            if not steps or not self.actors[actor_id].trainable:
                continue
            gen = Generation.cat([s.gen for s in steps], pad_id=self.actors[actor_id].policy.pad_id)
            env_ids = torch.cat([s.env_ids for s in steps]).cpu()
            turns = torch.cat([torch.full_like(s.env_ids, s.turn) for s in steps]).cpu()
            ref_lp = None
            if actor_id in self.references:
                # the reference may sit on another device (placement spreads models)
                ref_lp = _score_no_grad(self.references[actor_id], gen).to(gen.logprobs.device)
                mask = gen.completion_mask.to(ref_lp.dtype)
                # shaping uses the log-ratio (k1): its score-function gradient is exactly ∇KL(π‖π_ref).
                # k3 as a reward is biased: it penalises rare samples most and pushes *away* from π_ref
                log_ratio = ((gen.logprobs - ref_lp) * mask).sum(-1).cpu()  # [S]
                kl[env_ids, ai, turns] = log_ratio.to(kl.dtype)
                stats[f"agent/{actor_id}/kl"] = float(k3_kl(gen.logprobs, ref_lp, mask).mean())  # low-variance estimate
            batches[actor_id] = (gen, torch.stack([env_ids, turns], 1), ref_lp)
        if cfg.kl_coef > 0 and cfg.kl_in == "reward":
            rewards = rewards - cfg.kl_coef * kl

        mask = rollout.active.to(rewards.dtype)  # [E, A, T]
        if cfg.joint_mode == "cross":
            if rollout.cross_rewards is None or T != 1:
                raise ConfigError("joint_mode='cross' needs a single-turn env and cross rewards from the runner")
            credited = (
                rollout.cross_rewards
                if self.credit == "per_agent"
                else rollout.cross_rewards.mean(-1, keepdim=True).expand_as(rollout.cross_rewards)
            )
            returns = cross_returns(credited, G).unsqueeze(-1)  # [B, G, A, 1]
            if cfg.kl_coef > 0 and cfg.kl_in == "reward":
                returns = returns - cfg.kl_coef * kl.view(B, G, A, T)
        else:
            returns = discounted_returns(rewards, self.gamma).view(B, G, A, T)
        greedy = None
        if self.estimator == "remax":
            greedy = discounted_returns(self.credited_rewards(rollout.greedy), self.gamma)  # [B, A, T]
        running = None
        if self.estimator == "reinforce" and cfg.reinforce_baseline == "running_mean":
            running = self.running_mean
            batch_mean = (returns * mask.view(B, G, A, T)).sum((0, 1)) / mask.view(B, G, A, T).sum((0, 1)).clamp(min=1)
            self.running_mean = batch_mean if running is None else 0.9 * running + 0.1 * batch_mean  # [A, T]
        adv = advantages(
            returns, mask.view(B, G, A, T), self.estimator, cfg.advantage_scale, cfg.std_floor, greedy, running
        )
        if cfg.normalize_per_agent:
            adv = normalize_over_batch(adv, mask.view(B, G, A, T))
        adv = adv.reshape(B * G, A, T)

        jobs = []
        for ai, actor_id in enumerate(rollout.actors):
            if actor_id not in batches:
                continue
            gen, where, ref_lp = batches[actor_id]
            sample_adv = adv[where[:, 0], ai, where[:, 1]]  # [S]
            stats[f"agent/{actor_id}/advantage_abs"] = float(sample_adv.abs().mean())
            loss = partial(reinforce_loss, self.actors[actor_id].policy, cfg)
            jobs.append(
                Job(
                    actor_id,
                    SampleBatch(gen, sample_adv.to(gen.logprobs.device), ref_lp),
                    loss,
                    epochs=cfg.epochs,
                    minibatches=cfg.minibatches,
                    max_new_tokens=self.actors[actor_id].policy.generation.max_new_tokens,
                    prompt_cache=getattr(self.actors[actor_id].policy, "prompt_cache", None),
                )
            )
        return jobs, stats


def reinforce_loss(policy: Policy, cfg: ReinforceConfig, batch: SampleBatch, norm: BatchNorm):
    """Per-sample loss contributions of one micro-batch (policy gradient, plus β·KL if in the loss)."""
    g = batch.gen
    logprobs = policy.score(g.prompt_ids, g.prompt_mask, g.completion_ids, g.completion_mask)  # [S, C]
    contrib, stats = policy_gradient_loss(
        logprobs, g.logprobs, batch.advantages, g.completion_mask, norm, cfg.loss_aggregation, cfg.clip_range
    )
    if cfg.kl_coef > 0 and cfg.kl_in == "loss" and batch.ref_logprobs is not None:
        mask = g.completion_mask.to(logprobs.dtype)
        d = (batch.ref_logprobs - logprobs) * mask
        token_kl = torch.exp(d) - d - 1  # [S, C] k3 per token
        contrib = contrib + cfg.kl_coef * AGGREGATIONS[cfg.loss_aggregation](token_kl, mask, norm)
        stats["kl"] = ((token_kl * mask).sum(-1).mean()).detach()
    return contrib, stats


@torch.no_grad()
def _score_no_grad(policy: Policy, gen: Generation, chunk: int = 64) -> torch.Tensor:
    outs = []
    for i in range(0, len(gen), chunk):
        part = gen.select(torch.arange(i, min(i + chunk, len(gen))))
        lp = policy.score(part.prompt_ids, part.prompt_mask, part.completion_ids, part.completion_mask)
        pad = gen.completion_ids.shape[1] - lp.shape[1]
        outs.append(torch.nn.functional.pad(lp, (0, pad)))
    return torch.cat(outs)  # [S, C]
