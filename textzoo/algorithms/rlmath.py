"""The math of every algorithm family, as pure functions of tensors.

Families only route a rollout's tensors to these functions; nothing else computes a return, an
advantage or a loss. Each function names its paper and is checked against hand-computed values in
`tests/test_rlmath.py` (the math table of docs/concepts/algorithms.md says which function each algorithm uses).

Notation: E = B·G env copies (B prompts x G samples, e = b·G + g), R roles, A actors, T turns;
S samples (or pairs) of one learner, C completion tokens; ℓ_k a token's log-prob.

Losses return **per-sample contributions** c[s] whose sum is the batch loss, plus detached statistics,
so a runner may back-propagate any split of the batch (micro-batches, or one sample at a time with
`per_sample_backward`) and get the batched gradient. The batch-level normaliser (`BatchNorm`: samples,
tokens, token budget of the whole (mini)batch) is passed in, never recomputed from a micro-batch.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence

import torch
import torch.nn.functional as F

from textzoo.algorithms.settings import AGGREGATIONS, CREDITS, ESTIMATORS, load


# ---- credit and returns -----------------------------------------------------------------------
def credited_rewards(rewards: torch.Tensor, actor_roles: Sequence[Sequence[int]], credit: str) -> torch.Tensor:
    """r̃ of each actor: the team reward (mean over roles) with credit "shared", else the mean of its own roles.

    Shapes: rewards [N, R, ...] (roles on dim 1) -> [N, A, ...]; `actor_roles[a]` = role indices of actor a.
    A decentralized actor plays one role; a joint actor plays all of them.
    """
    if credit == "shared":
        team = rewards.mean(1, keepdim=True)  # [N, 1, ...]
        return team.expand(rewards.shape[0], len(actor_roles), *rewards.shape[2:]).clone()
    if credit == "per_agent":
        return torch.stack([rewards[:, list(roles)].mean(1) for roles in actor_roles], 1)  # [N, A, ...]
    raise ValueError(f"credit must be one of {CREDITS}, got {credit!r}")


def acting_roles(role_active: torch.Tensor, actor_roles: Sequence[Sequence[int]]) -> torch.Tensor:
    """The role each actor played at each turn: its first role active there, -1 where it played none.

    Shapes: role_active [E, R, T] bool -> [E, A, T] long (indices into the roles)."""
    out = []
    for roles in actor_roles:
        idx = torch.tensor(list(roles), dtype=torch.long)  # [r]
        act = role_active[:, idx].bool()  # [E, r, T]
        first = act.to(torch.int8).argmax(1)  # [E, T] position of the first active role
        out.append(torch.where(act.any(1), idx[first], torch.full_like(first, -1)))
    return torch.stack(out, 1)


def acting_role_returns(
    rewards: torch.Tensor, role_active: torch.Tensor, actor_roles: Sequence[Sequence[int]], gamma: float
) -> torch.Tensor:
    """Self-play credit: actor a's return at turn t is the return from t on of the role it played at t,
    R[e,a,t] = Σ_{k>=t} γ^{k-t} r[e,ρ(e,a,t),k] with ρ = `acting_roles` (0 where it played none).

    One policy playing every side of a zero-sum game is so credited as each side in turn (SPIRAL,
    arXiv 2506.24119), where the team reward (credit "shared") would cancel to 0; for an actor with
    one role it is that role's return (credit "per_agent"). Shapes: rewards [E, R, T], role_active
    [E, R, T] -> [E, A, T]."""
    role_returns = discounted_returns(rewards, gamma)  # [E, R, T]
    roles = acting_roles(role_active, actor_roles)  # [E, A, T]
    picked = role_returns.gather(1, roles.clamp(min=0))  # [E, A, T]
    return torch.where(roles >= 0, picked, torch.zeros_like(picked))


def role_baselines(
    running: torch.Tensor | None, returns: torch.Tensor, roles: torch.Tensor, num_roles: int, momentum: float = 0.95
) -> tuple[torch.Tensor, torch.Tensor]:
    """Role-conditioned baselines (SPIRAL's RAE, arXiv 2506.24119): each sample's baseline is b[its role],
    an exponential moving average of that role's returns (0 before the first batch, as in the paper);
    then b[r] ← momentum·b[r] + (1 − momentum)·(the mean return of this batch's samples of role r),
    roles without samples unchanged. Returns (baseline per sample, the next b).

    Shapes: returns [...], roles [...] long (-1 = no sample, baseline 0); running and the next b [R]."""
    b = torch.zeros(num_roles, dtype=returns.dtype) if running is None else running.to(returns.dtype)
    valid = roles >= 0
    baseline = torch.where(valid, b[roles.clamp(min=0)], torch.zeros_like(returns))
    flat_roles, flat_returns = roles[valid], returns[valid]
    sums = torch.zeros(num_roles, dtype=returns.dtype).index_add_(0, flat_roles, flat_returns)
    counts = torch.zeros(num_roles, dtype=returns.dtype).index_add_(0, flat_roles, torch.ones_like(flat_returns))
    batch_mean = sums / counts.clamp(min=1)
    updated = torch.where(counts > 0, momentum * b + (1 - momentum) * batch_mean, b)
    return baseline, updated


def discounted_returns(rewards: torch.Tensor, gamma: float) -> torch.Tensor:
    """R[..., t] = Σ_{k>=t} γ^{k-t} r[..., k] over the last (turn) axis."""
    out = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[..., 0])
    for t in range(rewards.shape[-1] - 1, -1, -1):  # T is a handful of turns
        running = rewards[..., t] + gamma * running
        out[..., t] = running
    return out


def cross_returns(cross_rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """Joint mode "cross": each actor's sample g gets the **mean** credited reward over every combination
    of its partners' samples (CoMLRL sums, which scales returns by G^(A−1)).

    Shapes: cross_rewards [B, G**A, A] (combination index in row-major order of (g_1, ..., g_A)) -> [B, G, A].
    """
    B, _, A = cross_rewards.shape
    grid = cross_rewards.reshape(B, *([group_size] * A), A)  # [B, G, ..., G, A]
    out = []
    for a in range(A):
        partner_dims = [1 + d for d in range(A) if d != a]
        per_a = grid[..., a]
        out.append(per_a.mean(dim=partner_dims) if partner_dims else per_a)  # [B, G]
    return torch.stack(out, dim=-1)


# ---- reference KL -------------------------------------------------------------------------------
def k1_log_ratio(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-sample k1 estimate Σ_k (ℓ_k − ℓ_ref,k) of KL(π‖π_ref). Shapes [S, C] -> [S].

    As a REINFORCE reward penalty its score-function gradient is exactly ∇KL(π‖π_ref) (k3 as a
    reward is biased: it penalises rare samples most and was measured to push π *away* from π_ref).
    """
    return ((logprobs - ref_logprobs) * mask).sum(-1)


def kl_shaped_rewards(rewards: torch.Tensor, log_ratio: torch.Tensor, kl_coef: float) -> torch.Tensor:
    """r̃ − β·k1: the reward of each turn less β times the log-ratio of that turn's sample (same shapes)."""
    return rewards - kl_coef * log_ratio


def k3_per_token(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """k3 estimator of KL(π‖π_ref) per token: exp(ℓ_ref−ℓ) − (ℓ_ref−ℓ) − 1 (Schulman 2020), 0 off the mask.

    Non-negative and unbiased, with low variance: the KL term of a loss. Shapes [S, C] -> [S, C].
    Computed as expm1(d) − d, floored at 0: exp(d) − 1 rounds to within float epsilon of 1, which for
    near-equal log-probs (|d| ~ 1e-6) leaves negative values of the size of the true ones.
    """
    d = (ref_logprobs - logprobs) * mask  # [S, C]
    return (torch.expm1(d) - d).clamp_min(0) * mask


def k3_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-sample KL(π‖π_ref) with the k3 estimator, summed over the sample's tokens. Shapes [S, C] -> [S]."""
    return k3_per_token(logprobs, ref_logprobs, mask).sum(-1)


def engine_gap(
    trainer_logprobs: torch.Tensor, engine_logprobs: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """How far a rollout engine's sampling log-probs are from the trainer's on the tokens the engine
    sampled: (mean |ℓ_trainer − ℓ_engine|, mean k3 estimate of KL(π_engine‖π_trainer)) per token over
    ``mask``. Shapes [S, C] -> two scalars."""
    mask = mask.to(trainer_logprobs.dtype)
    n = mask.sum().clamp(min=1)
    gap = ((trainer_logprobs - engine_logprobs).abs() * mask).sum() / n
    kl = k3_per_token(engine_logprobs, trainer_logprobs, mask).sum() / n
    return gap, kl


def truncated_importance_weights(
    trainer_logprobs: torch.Tensor, engine_logprobs: torch.Tensor, mask: torch.Tensor, cap: float
) -> torch.Tensor:
    """Truncated importance sampling (Yao et al. 2025): w_k = min(π_trainer(y_k)/π_engine(y_k), C) per
    token, 0 off ``mask``; the weight that corrects a policy gradient for samples drawn by an engine
    whose distribution differs from the trainer's (E_engine[w·∇ℓ] = E_trainer[∇ℓ] where no ratio
    exceeds C; the cap bounds the variance at the cost of a small bias). π_trainer is the trainer's
    score of the tokens when they were sampled (the losses' old log-probs), so w is a constant of the
    batch (`policy_gradient_loss(token_weights=w)`). Shapes [S, C] -> [S, C]."""
    if not cap > 0:
        raise ValueError(f"the truncation cap C must be > 0, got {cap}")
    ratio = torch.exp((trainer_logprobs - engine_logprobs) * mask)
    return ratio.clamp(max=cap) * mask


# ---- baselines and scaling (REINFORCE family) ---------------------------------------------------
def _masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int) -> torch.Tensor:
    return (x * mask).sum(dim, keepdim=True) / mask.sum(dim, keepdim=True).clamp(min=1)


def group_baseline(returns: torch.Tensor, mask: torch.Tensor, estimator: str) -> torch.Tensor:
    """Baseline b_g of each sample from its group (dim 1 = G). Shapes [B, G, ...] -> [B, G, ...].

    grpo: the group mean (Shao et al. 2024); rloo: the mean of the *other* samples (Ahmadian et al. 2024).
    """
    if estimator == "grpo":
        return _masked_mean(returns, mask, 1).expand_as(returns)
    if estimator == "rloo":
        n = mask.sum(1, keepdim=True)  # [B, 1, ...]
        others = (returns * mask).sum(1, keepdim=True) - returns * mask
        # a group of one has no other sample: its baseline is its own return (advantage 0)
        return torch.where(n > 1, others / (n - 1).clamp(min=1), returns)
    raise ValueError(f"no group baseline for {estimator!r}")


def grpo_advantages(returns, mask, greedy_returns=None, running_mean=None) -> torch.Tensor:
    """GRPO's R_g − the group mean (`group_baseline`). [B, G, A, T]."""
    return returns - group_baseline(returns, mask, "grpo")


def rloo_advantages(returns, mask, greedy_returns=None, running_mean=None) -> torch.Tensor:
    """RLOO's R_g − the mean of the group's other samples (`group_baseline`). [B, G, A, T]."""
    return returns - group_baseline(returns, mask, "rloo")


def remax_advantages(returns, mask, greedy_returns=None, running_mean=None) -> torch.Tensor:
    """ReMax's R_g − R_greedy, the greedy rollout's return of the same prompt (Li et al. 2023). [B, G, A, T]."""
    if greedy_returns is None:
        raise ValueError("remax needs the greedy rollout's returns")
    return returns - greedy_returns.unsqueeze(1)  # greedy_returns [B, A, T]


def reinforce_advantages(returns, mask, greedy_returns=None, running_mean=None) -> torch.Tensor:
    """REINFORCE's R_g, less a running mean of past returns when one is kept. [B, G, A, T]."""
    return returns if running_mean is None else returns - running_mean


def group_std(returns: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Unbiased std of each group's returns over dim 1 (0 for groups of one). [B, G, ...] -> [B, 1, ...]."""
    n = mask.sum(1, keepdim=True)
    mean = _masked_mean(returns, mask, 1)
    var = (((returns - mean) * mask) ** 2).sum(1, keepdim=True) / (n - 1).clamp(min=1)
    return var.sqrt()


def std_scale(adv: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor, std_floor: float = 0.0) -> torch.Tensor:
    """A / (max(std_g R, floor) + 1e-6). It never re-centres, so the four baselines stay four different
    estimators (CoMLRL re-centres by default, which makes all four GRPO). A group whose returns are all
    equal (std 0, no floor) gets advantage 0: the remax and reinforce baselines leave A ≠ 0 there, and
    A / 1e-6 would be a 10⁶-fold update from a group that carries no signal. Shapes [B, G, ...]."""
    scale = group_std(returns, mask).clamp(min=std_floor)
    return torch.where(scale > 0, adv / (scale + 1e-6), torch.zeros_like(adv))


def advantages(
    returns: torch.Tensor,
    mask: torch.Tensor,
    estimator: str,
    scale: str = "std",
    std_floor: float = 0.0,
    greedy_returns: torch.Tensor | None = None,
    running_mean: torch.Tensor | None = None,
) -> torch.Tensor:
    """A_g = R_g − b_g, then `scale` ("std": `std_scale`; "none": unscaled, Dr. GRPO); 0 off the mask.

    `estimator` names a registered `Estimator` (`textzoo.algorithms.settings.ESTIMATORS`); built in: grpo and
    rloo (`group_baseline`), remax (the greedy rollout's return R_greedy, Li et al. 2023) and reinforce (none,
    or a running mean of past returns, `running_mean_update`).
    Shapes: returns, mask [B, G, A, T]; greedy_returns [B, A, T]; running_mean [A, T] (or a baseline per
    sample, [B, G, A, T]: `role_baselines`).
    """
    mask = mask.to(returns.dtype)
    if estimator not in ESTIMATORS:
        raise ValueError(f"unknown estimator {estimator!r}")
    adv = load(ESTIMATORS[estimator].fn)(returns, mask, greedy_returns, running_mean)
    if scale == "std":
        adv = std_scale(adv, returns, mask, std_floor)
    return adv * mask


# ---- agent- and turn-wise grouping by state (AT-GRPO) ---------------------------------------------
def state_group_ids(keys: Sequence[Hashable]) -> torch.Tensor:
    """The group of each sample: samples whose keys are equal (same agent, turn and state, e.g. the prompt
    it was sampled from) share one; groups are numbered in order of first appearance. [S] keys -> [S] long."""
    index: dict[Hashable, int] = {}
    return torch.tensor([index.setdefault(k, len(index)) for k in keys], dtype=torch.long)


def state_group_advantages(
    returns: torch.Tensor, groups: torch.Tensor, scale: str = "std", std_floor: float = 0.0
) -> torch.Tensor:
    """AT-GRPO (PettingLLMs, arXiv 2510.11062): A_s = R_s − mean of R over the samples of
    its (state, agent, turn) group, divided with `scale` "std" by max(std of the group, floor) + 1e-6
    (unbiased std, as `group_std`); "none" leaves it unscaled. A group of one gets 0.
    Shapes: returns, groups [S] (groups from `state_group_ids`) -> [S]."""
    groups = groups.to(returns.device)
    k = int(groups.max()) + 1 if groups.numel() else 0
    n = torch.zeros(k, dtype=returns.dtype, device=returns.device).index_add_(0, groups, torch.ones_like(returns))
    mean = torch.zeros_like(n).index_add_(0, groups, returns) / n  # [K]
    adv = returns - mean[groups]
    if scale == "std":
        var = torch.zeros_like(n).index_add_(0, groups, adv**2) / (n - 1).clamp(min=1)
        adv = adv / (var.sqrt().clamp(min=std_floor)[groups] + 1e-6)
    return adv


def running_mean_update(
    running: torch.Tensor | None, returns: torch.Tensor, mask: torch.Tensor, momentum: float = 0.9
) -> torch.Tensor:
    """The next running-mean baseline: m ← momentum·m + (1 − momentum)·mean_batch R (the batch mean when
    there is no m yet). Shapes: returns, mask [B, G, A, T]; running and the result [A, T]."""
    mask = mask.to(returns.dtype)
    batch_mean = (returns * mask).sum((0, 1)) / mask.sum((0, 1)).clamp(min=1)  # [A, T]
    return batch_mean if running is None else momentum * running + (1 - momentum) * batch_mean


def standardize(adv: torch.Tensor) -> torch.Tensor:
    """One actor's advantages over its samples of the batch, standardised: (A − mean) / (std + 1e-6),
    population std (per-agent normalisation, Dr. MAS). Fewer than two samples are left as they are.
    Shape [S] -> [S]."""
    if adv.numel() < 2:
        return adv
    return (adv - adv.mean()) / (adv.std(unbiased=False) + 1e-6)


# ---- GAE (actor-critic family) ------------------------------------------------------------------
def gae(
    rewards: torch.Tensor, values: torch.Tensor, active: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Turn-level GAE (Schulman et al. 2016): δ_t = r̃_t + γ V(s_{t+1}) − V(s_t), A_t = Σ_k (γλ)^k δ_{t+k},
    targets y_t = A_t + V(s_t), over the last (turn) axis; λ = 1 is Monte Carlo, λ = 0 one-step TD.

    `active` marks decision turns; rewards of other turns are credited to the decision before them
    (discounted), and γ spans the gap to the next decision. After the last decision V = 0.
    Shapes: rewards, values, active [..., T] -> advantages, targets [..., T] (0 off decisions).
    """
    active = active.bool()
    adv = torch.zeros_like(rewards)
    zero = torch.zeros_like(rewards[..., 0])  # [...]
    reward_to_next = zero  # Σ γ^k r̃ from this turn up to the next decision
    discount_to_next = zero  # γ^(gap to the next decision); 0 when there is none
    next_value, next_adv = zero, zero
    for t in range(rewards.shape[-1] - 1, -1, -1):  # T is a handful of turns
        reward_to_next = rewards[..., t] + gamma * reward_to_next
        discount_to_next = gamma * discount_to_next
        delta = reward_to_next + discount_to_next * next_value - values[..., t]
        a_t = delta + discount_to_next * lam * next_adv
        here = active[..., t]
        adv[..., t] = torch.where(here, a_t, zero)
        next_value = torch.where(here, values[..., t], next_value)
        next_adv = torch.where(here, a_t, next_adv)
        reward_to_next = torch.where(here, zero, reward_to_next)
        discount_to_next = torch.where(here, torch.ones_like(zero), discount_to_next)
    targets = torch.where(active, adv + values, torch.zeros_like(adv))
    return adv, targets


# ---- token aggregation --------------------------------------------------------------------------
class BatchNorm:
    """Sizes of the whole (mini)batch a micro-batch belongs to: samples, tokens, token budget."""

    def __init__(self, num_samples: int, num_tokens: int, max_new_tokens: int):
        self.num_samples = max(int(num_samples), 1)
        self.num_tokens = max(int(num_tokens), 1)
        self.max_new_tokens = max(int(max_new_tokens), 1)

    @classmethod
    def of(cls, completion_mask: torch.Tensor, max_new_tokens: int) -> BatchNorm:
        return cls(completion_mask.shape[0], int(completion_mask.sum()), max_new_tokens)


Aggregation = Callable[[torch.Tensor, torch.Tensor, BatchNorm], torch.Tensor]


def seq_sum(token_loss: torch.Tensor, mask: torch.Tensor, n: BatchNorm) -> torch.Tensor:
    # sum over tokens, mean over samples (CoMLRL's aggregation)
    return (token_loss * mask).sum(-1) / n.num_samples  # [S]


def seq_mean(token_loss: torch.Tensor, mask: torch.Tensor, n: BatchNorm) -> torch.Tensor:
    # mean over each sample's tokens, then over samples (GRPO paper)
    return (token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1) / n.num_samples  # [S]


def token_mean(token_loss: torch.Tensor, mask: torch.Tensor, n: BatchNorm) -> torch.Tensor:
    # mean over every token of the batch (DAPO)
    return (token_loss * mask).sum(-1) / n.num_tokens  # [S]


def constant(token_loss: torch.Tensor, mask: torch.Tensor, n: BatchNorm) -> torch.Tensor:
    # sum over tokens / (token budget x samples): a length-independent constant (Dr. GRPO)
    return (token_loss * mask).sum(-1) / (n.max_new_tokens * n.num_samples)  # [S]


def aggregation_of(name: str) -> Aggregation:
    """The registered loss aggregation `name` (`textzoo.algorithms.settings.AGGREGATIONS`: the four above and any
    added with `register_aggregation`)."""
    return load(AGGREGATIONS[name])


# ---- policy and value losses --------------------------------------------------------------------
def policy_gradient_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    norm: BatchNorm,
    aggregation: str = "seq_sum",
    clip_range: float | None = None,
    token_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-sample contributions of the REINFORCE / PPO-clip objective, and detached statistics.

    Without `clip_range`: token loss −A·ℓ_k (on-policy REINFORCE, Williams 1992).
    With `clip_range` ε: −min(ρ_k A, clip(ρ_k, 1−ε, 1+ε) A), ρ_k = exp(ℓ_k − ℓ_k^old)
    (PPO, Schulman et al. 2017, eq. 7). Shared by the reinforce and actor-critic families and
    by the joint actor, which is what makes their losses identical by construction.
    With `token_weights` w_k (detached): each token's loss times w_k, e.g. −w_k·A·ℓ_k; with
    w_k = min(π_trainer/π_engine, C) (`truncated_importance_weights`) that is truncated importance
    sampling of an engine's samples (Yao et al. 2025). None: every weight 1 (the same arithmetic).

    Shapes: logprobs, old_logprobs, mask, token_weights [S, C]; advantages [S].
    """
    mask = mask.to(logprobs.dtype)
    adv = advantages.to(logprobs.dtype).unsqueeze(-1)  # [S, 1]
    log_ratio = (logprobs - old_logprobs.detach()) * mask  # [S, C]
    ratio = torch.exp(log_ratio)  # [S, C]
    if clip_range is None:
        token_loss = -adv * logprobs  # [S, C]
        clipped = torch.zeros_like(mask)
    else:
        unclipped = ratio * adv
        clipped_obj = torch.clamp(ratio, 1.0 - clip_range, 1.0 + clip_range) * adv
        token_loss = -torch.minimum(unclipped, clipped_obj)  # [S, C]
        clipped = (clipped_obj < unclipped).to(mask.dtype)
    if token_weights is not None:
        token_loss = token_loss * token_weights.detach().to(token_loss.dtype)  # [S, C]
    contrib = aggregation_of(aggregation)(token_loss, mask, norm)  # [S]
    tokens = mask.sum().clamp(min=1)
    stats = {
        "clipfrac": ((clipped * mask).sum() / tokens).detach(),
        "approx_kl": ((((ratio - 1) - log_ratio) * mask).sum() / tokens).detach(),
    }
    return contrib, stats


def kl_loss(
    logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor, norm: BatchNorm, aggregation: str
) -> torch.Tensor:
    """Per-sample contributions of the k3 KL(π‖π_ref) per token, aggregated like the policy loss (the
    loss-side KL of `kl_in="loss"`; multiply by β). Shapes [S, C] -> [S]."""
    mask = mask.to(logprobs.dtype)
    return aggregation_of(aggregation)(k3_per_token(logprobs, ref_logprobs, mask), mask, norm)


def entropy_bonus(entropy: torch.Tensor, mask: torch.Tensor, norm: BatchNorm, aggregation: str) -> torch.Tensor:
    """Per-sample contributions of −H (to minimise), aggregated like the policy loss. Shapes [S, C] -> [S]."""
    return aggregation_of(aggregation)(-entropy, mask.to(entropy.dtype), norm)


def critic_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    targets: torch.Tensor,
    norm: BatchNorm,
    value_coef: float = 1.0,
    value_clip: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-sample contributions of c_v·(V − y)², mean over the batch's samples.

    With `value_clip` ε_v: c_v·max((V − y)², (V_clip − y)²), V_clip = V_old + clip(V − V_old, −ε_v, ε_v)
    (the PPO2 / CleanRL form), so one batch cannot move a value far from the value that computed the
    advantages. Shapes: values, old_values, targets [S] -> [S].
    """
    old_values, targets = old_values.detach().to(values.dtype), targets.detach().to(values.dtype)
    error = (values - targets) ** 2  # [S]
    clipped = torch.zeros_like(error)
    if value_clip is not None:
        v_clip = old_values + torch.clamp(values - old_values, -value_clip, value_clip)  # [S]
        error_clip = (v_clip - targets) ** 2
        clipped = (error_clip > error).to(error.dtype)
        error = torch.maximum(error, error_clip)
    contrib = value_coef * error / norm.num_samples  # [S]
    stats = {
        "value_error": ((values - targets) ** 2).mean().detach(),
        "value_clipfrac": clipped.mean().detach(),
    }
    return contrib, stats


# ---- preference losses --------------------------------------------------------------------------
def dpo_loss(
    logp_chosen: torch.Tensor,
    logp_rejected: torch.Tensor,
    ref_chosen: torch.Tensor | None,
    ref_rejected: torch.Tensor | None,
    others: torch.Tensor,
    beta: float,
    norm: BatchNorm,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-pair contributions of the joint DPO loss −log σ(β[Δ_i + Σ_{j≠i} sg(Δ_j)]) / (pairs in the batch).

    Δ_i = [ℓ_i(y^w) − ℓ_ref,i(y^w)] − [ℓ_i(y^l) − ℓ_ref,i(y^l)] (DPO, Rafailov et al. 2023, eq. 7, for a
    team whose joint policy is the product of its agents'); sg = stop-gradient.
    Shapes: sequence log-probs logp_*, ref_* [S] (ref None = reference-free); `others` [S] is
    Σ_{j≠i} Δ_j of the partners (detached here, whatever the caller passes).
    """
    delta = logp_chosen - logp_rejected  # [S] Δ_i
    if ref_chosen is not None:
        delta = delta - (ref_chosen - ref_rejected).detach()
    margin = beta * (delta + others.detach())  # [S] joint implicit reward margin
    contrib = -F.logsigmoid(margin) / norm.num_samples  # [S]
    stats = {
        "dpo_accuracy": (margin > 0).float().mean().detach(),
        "dpo_margin": margin.mean().detach(),
        "own_margin": (beta * delta).mean().detach(),
    }
    return contrib, stats


def bradley_terry_loss(
    score_chosen: torch.Tensor, score_rejected: torch.Tensor, norm: BatchNorm, weights: torch.Tensor | None = None
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-pair contributions of −log σ(s_w − s_l) / (pairs in the batch) (Bradley & Terry 1952; the reward
    model of Ouyang et al. 2022, eq. 1), and statistics.

    Shapes [S] -> [S], or for an ensemble of K members [K, S] -> [S]: the mean over members of each
    member's loss, member k's term on pair s weighted by `weights[k, s]` (its bootstrap count; None = 1).
    """
    margin = score_chosen - score_rejected  # [S] or [K, S]
    nll = -F.logsigmoid(margin)
    if weights is not None:
        nll = nll * weights.to(nll.dtype)
    if nll.dim() == 2:
        nll = nll.mean(0)  # [S] mean over members
    contrib = nll / norm.num_samples  # [S]
    return contrib, {"rm_accuracy": (margin > 0).float().mean().detach(), "rm_margin": margin.mean().detach()}


def ensemble_reward(member_scores: torch.Tensor, disagreement_penalty: float = 0.0) -> torch.Tensor:
    """r = mean_k s_k − λ·std_k s_k over an ensemble's members (population std; 0 for one member): the
    uncertainty-penalised reward of Coste et al. 2023, with the std in place of the variance so that λ is in
    reward units. Shapes [K, S] -> [S]."""
    mean = member_scores.mean(0)
    if disagreement_penalty == 0 or member_scores.shape[0] < 2:
        return mean
    return mean - disagreement_penalty * member_scores.std(0, unbiased=False)


# ---- reward-model diagnostics -------------------------------------------------------------------
def pearson(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Pearson's r = Σ(x−x̄)(y−ȳ) / √(Σ(x−x̄)² Σ(y−ȳ)²); NaN when either is constant or n < 2. Shapes [n] -> []."""
    x, y = x.double().flatten(), y.double().flatten()
    dx, dy = x - x.mean(), y - y.mean()
    denom = (dx.square().sum() * dy.square().sum()).sqrt()
    if len(x) < 2 or denom == 0:
        return torch.tensor(float("nan"))
    return (dx * dy).sum() / denom


def average_ranks(x: torch.Tensor) -> torch.Tensor:
    """1-based ranks of `x`, ties given the mean of the ranks they span ([3, 1, 3] -> [2.5, 1, 2.5]). [n] -> [n]."""
    x = x.double().flatten()
    less = (x[None, :] < x[:, None]).sum(1)  # [n] how many are smaller
    equal = (x[None, :] == x[:, None]).sum(1)  # [n] itself included
    return less + (equal + 1) / 2


def spearman(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Spearman's ρ: Pearson's r of the average ranks (ties handled); NaN when either is constant. [n] -> []."""
    return pearson(average_ranks(x), average_ranks(y))


def group_pair_accuracy(scores: torch.Tensor, rewards: torch.Tensor) -> torch.Tensor:
    """Share of the pairs (w, l) of a group with r_w > r_l that the scores order alike (s_w > s_l; a
    score tie counts half), pooled over groups; NaN when every group's rewards tie. Shapes [B, G] -> []."""
    better = rewards[:, :, None] > rewards[:, None, :]  # [B, G, G] w beats l
    margin = scores[:, :, None] - scores[:, None, :]  # [B, G, G]
    right = (margin > 0).double() + 0.5 * (margin == 0).double()
    n = better.sum()
    return (right * better).sum() / n if n else torch.tensor(float("nan"))
