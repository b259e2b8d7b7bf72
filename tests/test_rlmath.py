"""`textzoo.algorithms.rlmath` against hand-computed values: every row of the README's algorithm table.

Returns and credit, the four baselines and their scaling, the reference-KL estimators, GAE, the
policy-gradient / PPO-clip / value-clip losses, DPO and Bradley–Terry (single and ensemble), and the
reward-model diagnostics (correlations, within-group pair accuracy).
"""

import math

import pytest
import torch

torch.set_num_threads(1)

from textzoo.algorithms.rlmath import (  # noqa: E402
    BatchNorm,
    advantages,
    aggregation_of,
    average_ranks,
    bradley_terry_loss,
    credited_rewards,
    critic_loss,
    cross_returns,
    discounted_returns,
    dpo_loss,
    ensemble_reward,
    entropy_bonus,
    gae,
    group_pair_accuracy,
    k1_log_ratio,
    k3_kl,
    k3_per_token,
    kl_loss,
    kl_shaped_rewards,
    pearson,
    policy_gradient_loss,
    running_mean_update,
    spearman,
    standardize,
    state_group_advantages,
    state_group_ids,
    truncated_importance_weights,
)


def group(values):
    """[G] rewards of one prompt, one agent, one turn -> [B=1, G, A=1, T=1]."""
    return torch.tensor(values, dtype=torch.float32).view(1, -1, 1, 1)


R = [1.0, 0.0, 0.5, 0.5]
ONES = torch.ones(1, 4, 1, 1)


def nll_sigmoid(x: float) -> float:
    """−log σ(x) by hand."""
    return math.log1p(math.exp(-x))


# ---- credit and returns -------------------------------------------------------------------------
def test_credited_rewards_shared_and_per_agent_by_hand():
    # two env copies, three roles, two turns; actor 0 plays role 0, actor 1 (a joint actor) roles 1 and 2
    rewards = torch.tensor([[[1.0, 0.0], [2.0, 3.0], [0.0, 3.0]], [[0.0, 6.0], [3.0, 0.0], [3.0, 0.0]]])  # [2, 3, 2]
    roles = [(0,), (1, 2)]
    shared = credited_rewards(rewards, roles, "shared")  # the mean over the three roles, for both actors
    assert torch.allclose(shared, torch.tensor([[[1.0, 2.0]] * 2, [[2.0, 2.0]] * 2]))
    own = credited_rewards(rewards, roles, "per_agent")  # actor 1: the mean of roles 1 and 2
    assert torch.allclose(own, torch.tensor([[[1.0, 0.0], [1.0, 3.0]], [[0.0, 6.0], [3.0, 0.0]]]))
    with pytest.raises(ValueError, match="credit"):
        credited_rewards(rewards, roles, "team")


def test_cross_combinations_are_credited_like_aligned_samples():
    # B=1, G=2, two one-role actors: 4 combinations x 2 roles; the team reward is the roles' mean
    combos = torch.tensor([[1.0, 0.0], [0.0, 0.0], [1.0, 1.0], [0.0, 1.0]])  # [B*G**A, R]
    shared = credited_rewards(combos, [(0,), (1,)], "shared").view(1, 4, 2)
    own = credited_rewards(combos, [(0,), (1,)], "per_agent").view(1, 4, 2)
    # shared: (0,0) 0.5, (0,1) 0, (1,0) 1, (1,1) 0.5; agent 0 sample 0 = mean(0.5, 0) = 0.25, sample 1 = 0.75
    assert torch.allclose(cross_returns(shared, 2)[0], torch.tensor([[0.25, 0.75], [0.75, 0.25]]))
    # per agent: agent 0's sample 0 earned 1 and 0 (mean 0.5); agent 1's sample 1 earned 0 and 1
    assert torch.allclose(cross_returns(own, 2)[0], torch.tensor([[0.5, 0.5], [0.5, 0.5]]))


def test_discounted_returns_by_hand():
    r = torch.tensor([[1.0, 0.0, 2.0]])
    assert torch.allclose(discounted_returns(r, 0.5), torch.tensor([[1.5, 1.0, 2.0]]))
    assert torch.allclose(discounted_returns(r, 1.0), torch.tensor([[3.0, 2.0, 2.0]]))
    assert torch.allclose(discounted_returns(r, 0.0), r)


def test_cross_mode_means_over_partners():
    # G=2, A=2; combination (g1, g2) row-major: (0,0), (0,1), (1,0), (1,1)
    credited = torch.tensor([[[1.0, 1.0], [0.0, 0.0], [0.5, 0.5], [0.25, 0.25]]])  # [B=1, 4, A=2]
    out = cross_returns(credited, 2)  # [1, G, A]
    # agent 0 sample 0: mean of (0,0),(0,1) = 0.5; sample 1: mean of (1,0),(1,1) = 0.375
    # agent 1 sample 0: mean of (0,0),(1,0) = 0.75; sample 1: mean of (0,1),(1,1) = 0.125
    assert torch.allclose(out[0], torch.tensor([[0.5, 0.75], [0.375, 0.125]]))


# ---- baselines and scaling ----------------------------------------------------------------------
def test_grpo_by_hand():
    adv = advantages(group(R), ONES, "grpo", scale="none").flatten()
    assert torch.allclose(adv, torch.tensor([0.5, -0.5, 0.0, 0.0]))
    std = math.sqrt((0.25 + 0.25) / 3)  # unbiased std of the group
    adv = advantages(group(R), ONES, "grpo", scale="std").flatten()
    assert torch.allclose(adv, torch.tensor([0.5, -0.5, 0.0, 0.0]) / (std + 1e-6), atol=1e-6)


def test_rloo_by_hand():
    adv = advantages(group(R), ONES, "rloo", scale="none").flatten()
    # baseline of sample g is the mean of the other three
    assert torch.allclose(adv, torch.tensor([1 - 1 / 3, 0 - 2 / 3, 0.5 - 0.5, 0.5 - 0.5]))


def test_remax_and_reinforce_by_hand():
    greedy = torch.tensor([0.25]).view(1, 1, 1)
    adv = advantages(group(R), ONES, "remax", scale="none", greedy_returns=greedy).flatten()
    assert torch.allclose(adv, torch.tensor([0.75, -0.25, 0.25, 0.25]))
    assert torch.allclose(advantages(group(R), ONES, "reinforce", scale="none").flatten(), torch.tensor(R))
    running = torch.tensor([[0.4]])
    adv = advantages(group(R), ONES, "reinforce", scale="none", running_mean=running).flatten()
    assert torch.allclose(adv, torch.tensor(R) - 0.4)


def test_four_estimators_differ_on_same_rewards():
    greedy = torch.tensor([0.25]).view(1, 1, 1)
    out = {
        e: advantages(group(R), ONES, e, scale="std", greedy_returns=greedy).flatten()
        for e in ("grpo", "rloo", "remax", "reinforce")
    }
    names = list(out)
    for i in range(4):
        for j in range(i + 1, 4):
            assert not torch.allclose(out[names[i]], out[names[j]]), (names[i], names[j])


def test_zero_variance_group_has_zero_advantage():
    # remax and reinforce leave A = 0.7 − 0.25 and A = 0.7 before scaling: dividing those by 0 + 1e-6
    # gave 4.5e5 and 7e5 (issue: mareinforce with G=2 equal rewards logged ~8e6 losses)
    greedy = torch.tensor([0.25]).view(1, 1, 1)
    for est in ("grpo", "rloo", "remax", "reinforce"):
        adv = advantages(group([0.7] * 4), ONES, est, scale="std", greedy_returns=greedy)
        assert torch.count_nonzero(adv) == 0, est
    floored = advantages(group([0.7] * 4), ONES, "reinforce", scale="std", std_floor=0.5).flatten()
    assert torch.allclose(floored, torch.full((4,), 0.7 / (0.5 + 1e-6)))
    unscaled = advantages(group([0.7] * 4), ONES, "reinforce", scale="none").flatten()
    assert torch.allclose(unscaled, torch.full((4,), 0.7))


def test_std_floor_bounds_the_scale():
    adv = advantages(group([1.0, 0.0, 0.0, 0.0]), ONES, "grpo", scale="std", std_floor=10.0).flatten()
    assert torch.allclose(adv, torch.tensor([0.75, -0.25, -0.25, -0.25]) / (10.0 + 1e-6))


def test_inactive_samples_are_left_out_of_the_group():
    mask = torch.tensor([1.0, 1.0, 0.0, 0.0]).view(1, 4, 1, 1)
    adv = advantages(group([1.0, 0.0, 5.0, 5.0]), mask, "grpo", scale="none").flatten()
    assert torch.allclose(adv, torch.tensor([0.5, -0.5, 0.0, 0.0]))


def test_running_mean_baseline_update_by_hand():
    returns, mask = group(R), ONES.clone()
    mask[0, 3] = 0  # an inactive sample is not part of the batch mean: (1 + 0 + 0.5) / 3 = 0.5
    first = running_mean_update(None, returns, mask)
    assert first.shape == (1, 1) and torch.allclose(first, torch.tensor([[0.5]]))
    assert torch.allclose(running_mean_update(torch.tensor([[2.0]]), returns, mask), torch.tensor([[0.9 * 2 + 0.05]]))


def test_standardize_by_hand():
    out = standardize(torch.tensor([1.0, 2.0, 3.0, 6.0]))
    mean, std = 3.0, math.sqrt((4 + 1 + 0 + 9) / 4)  # population std
    assert torch.allclose(out, (torch.tensor([1.0, 2.0, 3.0, 6.0]) - mean) / (std + 1e-6))
    assert torch.equal(standardize(torch.tensor([0.7])), torch.tensor([0.7]))  # nothing to standardise against
    assert torch.count_nonzero(standardize(torch.tensor([0.4, 0.4]))) == 0


def test_standardize_over_an_actors_samples():
    adv = torch.tensor([1.0, 2.0, 3.0, 4.0]).view(1, 4, 1, 1)
    out = standardize(adv.flatten())
    assert abs(float(out.mean())) < 1e-6
    assert torch.allclose(out.pow(2).mean(), torch.tensor(1.0), atol=1e-4)


# ---- reference KL ---------------------------------------------------------------------------------
def test_k3_kl_by_hand():
    lp = torch.tensor([[-1.0, -2.0]])
    ref = torch.tensor([[-1.5, -1.0]])
    d = ref - lp
    expected = (torch.exp(d) - d - 1).sum()
    assert torch.allclose(k3_kl(lp, ref, torch.ones(1, 2)), expected.view(1))
    assert float(k3_kl(lp, lp, torch.ones(1, 2))) == 0.0


def test_k1_shaping_by_hand():
    lp = torch.tensor([[-1.0, -2.0, -9.0]])
    ref = torch.tensor([[-1.5, -1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])  # the padded token counts for nothing
    k1 = k1_log_ratio(lp, ref, mask)
    assert torch.allclose(k1, torch.tensor([0.5 - 1.0]))
    assert torch.allclose(kl_shaped_rewards(torch.tensor([1.0]), k1, 0.2), torch.tensor([1.0 + 0.1]))


def test_k3_loss_term_is_aggregated_like_the_policy_loss():
    lp = torch.tensor([[-1.0, -2.0], [-0.5, -3.0]])
    ref = torch.tensor([[-1.5, -1.0], [-0.5, 0.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    per_token = k3_per_token(lp, ref, mask)
    d = torch.tensor([[-0.5, 1.0], [0.0, 0.0]])
    assert torch.allclose(per_token, (torch.exp(d) - d - 1) * mask)
    norm = BatchNorm(2, 3, 4)
    expected = torch.stack([per_token[0].sum(), per_token[1].sum()]) / 2  # seq_sum: sum over tokens / samples
    assert torch.allclose(kl_loss(lp, ref, mask, norm, "seq_sum"), expected)
    assert torch.allclose(kl_loss(lp, ref, mask, norm, "token_mean"), per_token.sum(-1) / 3)


def test_k3_of_near_equal_log_probs_is_accurate_and_never_negative():
    # an engine and a trainer that agree to float32 rounding (|d| ~ 1e-6): k3 ~ d^2 / 2 ~ 1e-12, which
    # exp(d) - d - 1 cannot resolve (its rounding, ~6e-8, comes out negative for about half the tokens)
    g = torch.Generator().manual_seed(0)
    lp = -torch.rand(64, 32, generator=g) * 5
    ref = lp + torch.randn(64, 32, generator=g) * 1e-6
    mask = torch.ones(64, 32)
    per_token = k3_per_token(lp, ref, mask)
    d = (ref - lp).double()
    exact = d.square() / 2 + d.pow(3) / 6  # the series of exp(d) - d - 1
    assert (per_token >= 0).all()
    assert torch.allclose(per_token.double(), exact, rtol=0.0, atol=5e-13)  # measured 1.1e-13; naive 6e-8
    naive = torch.exp(ref - lp) - (ref - lp) - 1
    assert (naive < 0).any()  # what the formula as written gives in float32


def test_entropy_bonus_by_hand():
    entropy = torch.tensor([[0.5, 1.5], [2.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    assert torch.allclose(entropy_bonus(entropy, mask, BatchNorm(2, 3, 2), "seq_mean"), torch.tensor([-0.5, -1.0]))


# ---- GAE ------------------------------------------------------------------------------------------
# one env, three turns, every turn a decision: r = [1, 0, 2], V = [0.5, 1.0, 1.5], γ = 0.9
# δ_2 = 2 − 1.5 = 0.5;  δ_1 = 0 + 0.9·1.5 − 1.0 = 0.35;  δ_0 = 1 + 0.9·1.0 − 0.5 = 1.4
R3 = torch.tensor([[1.0, 0.0, 2.0]])
V3 = torch.tensor([[0.5, 1.0, 1.5]])
ALL = torch.ones(1, 3, dtype=torch.bool)


def test_lambda_zero_is_one_step_td():
    adv, y = gae(R3, V3, ALL, gamma=0.9, lam=0.0)
    assert torch.allclose(adv, torch.tensor([[1.4, 0.35, 0.5]]))
    # y_t = r_t + γ V(s_{t+1})
    assert torch.allclose(y, torch.tensor([[1.9, 1.35, 2.0]]))


def test_lambda_one_is_monte_carlo():
    adv, y = gae(R3, V3, ALL, gamma=0.9, lam=1.0)
    returns = torch.tensor([[1 + 0.81 * 2, 0.9 * 2, 2.0]])  # Σ γ^k r_{t+k}
    assert torch.allclose(y, returns)
    assert torch.allclose(adv, returns - V3)
    assert torch.allclose(adv, torch.tensor([[2.12, 0.8, 0.5]]))


def test_lambda_between():
    adv, y = gae(R3, V3, ALL, gamma=0.9, lam=0.5)
    # A_2 = 0.5;  A_1 = 0.35 + 0.45·0.5 = 0.575;  A_0 = 1.4 + 0.45·0.575 = 1.65875
    assert torch.allclose(adv, torch.tensor([[1.65875, 0.575, 0.5]]))
    assert torch.allclose(y, torch.tensor([[2.15875, 1.575, 2.0]]))


def test_terminal_turn_bootstraps_nothing():
    # the episode ends after turn 1: the value stored at turn 2 (99) must not leak into turn 1
    rewards = torch.tensor([[1.0, 3.0, 0.0]])
    values = torch.tensor([[0.5, 1.0, 99.0]])
    active = torch.tensor([[True, True, False]])
    adv, y = gae(rewards, values, active, gamma=0.9, lam=1.0)
    assert torch.allclose(adv, torch.tensor([[3.2, 2.0, 0.0]]))  # A_1 = 3 − 1; A_0 = 1 + 2.7 − 0.5
    assert torch.allclose(y, torch.tensor([[3.7, 3.0, 0.0]]))
    adv0, y0 = gae(rewards, values, active, gamma=0.9, lam=0.0)
    assert torch.allclose(y0, torch.tensor([[1.9, 3.0, 0.0]]))


def test_single_turn_advantage_is_reward_minus_value():
    adv, y = gae(torch.tensor([[0.7]]), torch.tensor([[0.2]]), torch.ones(1, 1, dtype=torch.bool), 1.0, 0.3)
    assert torch.allclose(adv, torch.tensor([[0.5]])) and torch.allclose(y, torch.tensor([[0.7]]))


def test_turns_without_a_decision_fold_into_the_previous_one():
    # decisions at turns 0 and 2; the reward of turn 1 belongs to the decision at turn 0, and γ spans 2 turns
    rewards = torch.tensor([[1.0, 2.0, 4.0]])
    values = torch.tensor([[0.5, -7.0, 1.0]])
    active = torch.tensor([[True, False, True]])
    adv0, _ = gae(rewards, values, active, gamma=0.9, lam=0.0)
    assert torch.allclose(adv0, torch.tensor([[1 + 0.9 * 2 + 0.81 * 1.0 - 0.5, 0.0, 3.0]]))
    adv1, y1 = gae(rewards, values, active, gamma=0.9, lam=1.0)
    assert torch.allclose(adv1, torch.tensor([[1 + 1.8 + 0.81 * 4 - 0.5, 0.0, 3.0]]))
    assert torch.allclose(y1, torch.tensor([[1 + 1.8 + 0.81 * 4, 0.0, 4.0]]))


def test_relay_shape_sender_then_receiver():
    # sender acts at turn 0, receiver at turn 1, the team reward 1 arrives at turn 1
    rewards = torch.tensor([[[0.0, 1.0], [0.0, 1.0]]])  # [E=1, A=2, T=2]
    values = torch.tensor([[[0.25, 0.0], [0.0, 0.6]]])
    active = torch.tensor([[[True, False], [False, True]]])
    adv, y = gae(rewards, values, active, gamma=0.9, lam=1.0)
    assert torch.allclose(adv, torch.tensor([[[0.9 - 0.25, 0.0], [0.0, 0.4]]]))
    assert torch.allclose(y, torch.tensor([[[0.9, 0.0], [0.0, 1.0]]]))


@pytest.mark.parametrize("lam", [0.0, 0.3, 1.0])
def test_matches_the_definition_on_a_batch(lam):
    # A_t = Σ_k (γλ)^k δ_{t+k} written out directly, on a batch of envs with different lengths
    gen = torch.Generator().manual_seed(0)
    E, T, gamma = 5, 4, 0.8
    rewards = torch.randn(E, T, generator=gen)
    values = torch.randn(E, T, generator=gen)
    lengths = torch.tensor([4, 1, 3, 2, 4])
    active = torch.arange(T) < lengths[:, None]  # [E, T]
    rewards = rewards * active
    adv, y = gae(rewards, values, active, gamma, lam)
    for e in range(E):
        n = int(lengths[e])
        v = torch.cat([values[e, :n], torch.zeros(1)])
        delta = [rewards[e, t] + gamma * v[t + 1] - v[t] for t in range(n)]
        for t in range(n):
            expected = sum((gamma * lam) ** k * delta[t + k] for k in range(n - t))
            assert torch.allclose(adv[e, t], expected, atol=1e-6)
            assert torch.allclose(y[e, t], expected + values[e, t], atol=1e-6)
        assert torch.all(adv[e, n:] == 0) and torch.all(y[e, n:] == 0)


# ---- policy and value losses -----------------------------------------------------------------------
def test_aggregations_by_hand():
    token_loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    norm = BatchNorm(2, 4, 8)
    assert torch.allclose(aggregation_of("seq_sum")(token_loss, mask, norm), torch.tensor([3.0, 2.0]))
    assert torch.allclose(aggregation_of("seq_mean")(token_loss, mask, norm), torch.tensor([1.0, 2.0]))
    assert torch.allclose(aggregation_of("token_mean")(token_loss, mask, norm), torch.tensor([1.5, 1.0]))
    assert torch.allclose(aggregation_of("constant")(token_loss, mask, norm), torch.tensor([6 / 16, 4 / 16]))


def test_policy_gradient_matches_analytic_reinforce_gradient():
    theta = torch.tensor([0.2, -0.4, 1.0], requires_grad=True)
    tokens = torch.tensor([0, 2, 2, 1])
    adv = torch.tensor([1.5, -0.5, 0.25, 2.0])
    logp = torch.log_softmax(theta, -1)[tokens].view(4, 1)
    mask = torch.ones(4, 1)
    contrib, _ = policy_gradient_loss(logp, logp.detach(), adv, mask, BatchNorm(4, 4, 1))
    contrib.sum().backward()
    pi = torch.softmax(theta.detach(), -1)
    # d/dθ of −(1/S) Σ A_s log π(y_s) = −(1/S) Σ A_s (onehot(y_s) − π)
    expected = -sum(a * (torch.nn.functional.one_hot(t, 3).float() - pi) for a, t in zip(adv, tokens)) / 4
    assert torch.allclose(theta.grad, expected, atol=1e-6)


def test_truncated_importance_weights_scale_each_token_of_the_policy_gradient():
    """TIS (Yao et al. 2025): token k's term −A·ℓ_k becomes −w_k·A·ℓ_k, w_k = min(π_trainer/π_engine, C)."""
    trainer = torch.log(torch.tensor([[0.5, 0.2, 0.3]]))
    engine = torch.log(torch.tensor([[0.25, 0.4, 0.1]]))
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    w = truncated_importance_weights(trainer, engine, mask, cap=1.5)  # ratios 2 (capped), 0.5, masked 3
    assert torch.allclose(w, torch.tensor([[1.5, 0.5, 0.0]]))
    logp = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    adv = torch.tensor([2.0])
    w = w.clone().requires_grad_()  # the weights are constants of the batch: no gradient reaches them
    contrib, _ = policy_gradient_loss(logp, logp.detach(), adv, mask, BatchNorm(1, 2, 3), token_weights=w)
    # −(1.5·2·(−1) + 0.5·2·(−2)) = 5, against −(2·(−1) + 2·(−2)) = 6 unweighted
    assert torch.allclose(contrib, torch.tensor([5.0]))
    contrib.sum().backward()
    assert torch.allclose(logp.grad, torch.tensor([[-3.0, -1.0, 0.0]])) and w.grad is None
    plain, _ = policy_gradient_loss(logp, logp.detach(), adv, mask, BatchNorm(1, 2, 3))
    assert torch.allclose(plain, torch.tensor([6.0]))
    # PPO-clip: the weight multiplies the clipped objective; a clipped token still gets no gradient
    theta = torch.tensor([-1.0, -1.0], requires_grad=True)
    old = torch.stack([theta[0].detach() - math.log(1.1), theta[1].detach() - math.log(1.5)]).view(1, 2)
    ones = torch.ones(1, 2)
    contrib, stats = policy_gradient_loss(
        theta.view(1, 2), old, torch.tensor([1.0]), ones, BatchNorm(1, 2, 2), clip_range=0.2,
        token_weights=torch.tensor([[2.0, 0.5]]),
    )  # fmt: skip
    assert torch.allclose(contrib, torch.tensor([-(2.0 * 1.1 + 0.5 * 1.2)]))  # −(w·ρ·A + w·(1+ε)·A)
    contrib.sum().backward()
    assert torch.allclose(theta.grad, torch.tensor([-2.0 * 1.1, 0.0]))  # d/dℓ of −w·ρ·A = −w·ρ·A
    assert float(stats["clipfrac"]) == 0.5


def test_clipped_ratio_gives_no_gradient_outside_the_trust_region():
    theta = torch.tensor([0.0, 0.0], requires_grad=True)
    logp = torch.log_softmax(theta, -1)[0].view(1, 1)
    old = logp.detach() - 1.0  # ratio e ≈ 2.7 > 1 + ε
    contrib, stats = policy_gradient_loss(
        logp, old, torch.tensor([1.0]), torch.ones(1, 1), BatchNorm(1, 1, 1), clip_range=0.2
    )
    contrib.sum().backward()
    assert torch.count_nonzero(theta.grad) == 0
    assert float(stats["clipfrac"]) == 1.0
    assert torch.allclose(contrib, torch.tensor([-1.2]))


def test_masked_tokens_contribute_nothing():
    logp = torch.tensor([[-1.0, -2.0, -3.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    contrib, _ = policy_gradient_loss(logp, logp.detach(), torch.tensor([1.0]), mask, BatchNorm(1, 2, 3))
    contrib.sum().backward()
    assert torch.allclose(contrib, torch.tensor([3.0]))
    assert logp.grad[0, 2] == 0


def test_critic_loss_by_hand_and_value_clipping():
    values = torch.tensor([1.0, 2.0, 1.0], requires_grad=True)
    old = torch.tensor([0.5, 2.0, 0.5])
    targets = torch.tensor([2.0, 0.0, 0.0])
    norm = BatchNorm(3, 3, 1)
    contrib, _ = critic_loss(values, old, targets, norm, value_coef=0.5)
    assert torch.allclose(contrib, 0.5 * torch.tensor([1.0, 4.0, 1.0]) / 3)

    contrib, stats = critic_loss(values, old, targets, norm, value_coef=0.5, value_clip=0.2)
    # V_clip = old + clip(V − old, ±0.2) = [0.7, 2.0, 0.7]; (V_clip − y)² = [1.69, 4, 0.49]
    assert torch.allclose(contrib, 0.5 * torch.tensor([1.69, 4.0, 1.0]) / 3)
    contrib.sum().backward()
    # sample 0: the clipped error is larger and flat in V -> no gradient; samples 1, 2: c_v·2(V − y)/3
    assert torch.allclose(values.grad, torch.tensor([0.0, 2.0 / 3, 1.0 / 3]))
    assert math.isclose(float(stats["value_clipfrac"]), 1 / 3, rel_tol=1e-6)


# ---- preference losses ------------------------------------------------------------------------------
# per agent: (ℓ(y^w), ℓ(y^l), ℓ_ref(y^w), ℓ_ref(y^l)); Δ with reference, Δ without
AGENTS = [(-1.0, -2.0, -1.5, -1.0), (-0.7, -0.9, -0.5, -0.9), (-3.0, -1.0, -2.5, -1.4)]
DELTA_REF = [(-1.0 + 1.5) - (-2.0 + 1.0), (-0.7 + 0.5) - (-0.9 + 0.9), (-3.0 + 2.5) - (-1.0 + 1.4)]  # 1.5, -0.2, -0.9
DELTA_FREE = [-1.0 + 2.0, -0.7 + 0.9, -3.0 + 1.0]  # 1.0, 0.2, -2.0


@pytest.mark.parametrize("n", [1, 2, 3])
@pytest.mark.parametrize("reference", [True, False])
def test_dpo_loss_matches_hand_computed_values(n, reference):
    beta = 0.5
    deltas = DELTA_REF if reference else DELTA_FREE
    for i in range(n):
        lw, ll, rw, rl = (torch.tensor([v]) for v in AGENTS[i])
        others = torch.tensor([sum(deltas[j] for j in range(n) if j != i)])
        contrib, stats = dpo_loss(
            lw, ll, rw if reference else None, rl if reference else None, others, beta, BatchNorm(1, 1, 1)
        )
        margin = beta * sum(deltas[:n])
        assert contrib.item() == pytest.approx(nll_sigmoid(margin), abs=1e-6)
        assert stats["dpo_accuracy"].item() == float(margin > 0)


def test_dpo_loss_is_a_mean_over_pairs_of_the_batch():
    lw, ll, others = torch.tensor([-1.0, -2.0]), torch.tensor([-2.0, -1.0]), torch.zeros(2)
    contrib, _ = dpo_loss(lw, ll, None, None, others, 1.0, BatchNorm(4, 1, 1))  # two of four pairs
    assert contrib.tolist() == pytest.approx([nll_sigmoid(1.0) / 4, nll_sigmoid(-1.0) / 4], abs=1e-6)


@pytest.mark.parametrize("n", [2, 3])
def test_partners_terms_are_stop_gradient(n):
    """Agent 0's gradient is −σ(−m)β(e_w − e_l) per pair; the partners' parameters get none."""
    torch.manual_seed(0)
    beta = 0.7
    thetas = [torch.randn(4, requires_grad=True) for _ in range(n)]
    w, l = [0, 1, 2][:n], [3, 2, 1][:n]  # each agent's chosen / rejected word

    def logp(i, k):
        return torch.log_softmax(thetas[i], -1)[k].unsqueeze(0)

    partner = [logp(j, w[j]) - logp(j, l[j]) for j in range(1, n)]  # reference-free Δ_j with a graph
    others = sum(partner)
    contrib, _ = dpo_loss(logp(0, w[0]), logp(0, l[0]), None, None, others, beta, BatchNorm(1, 1, 1))
    contrib.sum().backward()
    margin = beta * float(sum(t.detach() for t in [logp(0, w[0]) - logp(0, l[0]), *partner]))
    expected = torch.zeros(4)
    expected[w[0]] -= beta / (1 + math.exp(margin))
    expected[l[0]] += beta / (1 + math.exp(margin))
    assert torch.allclose(thetas[0].grad, expected, atol=1e-6)
    for j in range(1, n):
        assert thetas[j].grad is None


def test_bradley_terry_loss_and_gradient_by_hand():
    s_w = torch.tensor([1.0, -0.5], requires_grad=True)
    s_l = torch.tensor([0.5, 0.5], requires_grad=True)
    contrib, stats = bradley_terry_loss(s_w, s_l, BatchNorm(2, 1, 1))
    assert contrib.tolist() == pytest.approx([math.log1p(math.exp(-0.5)) / 2, math.log1p(math.exp(1.0)) / 2], abs=1e-6)
    assert stats["rm_accuracy"].item() == 0.5
    contrib.sum().backward()
    # d/ds_w −log σ(s_w − s_l) = −σ(s_l − s_w), halved by the batch of two
    expected = [-1 / (1 + math.exp(0.5)) / 2, -1 / (1 + math.exp(-1.0)) / 2]
    assert s_w.grad.tolist() == pytest.approx(expected, abs=1e-6)
    assert s_l.grad.tolist() == pytest.approx([-g for g in expected], abs=1e-6)


def test_bradley_terry_ensemble_is_the_weighted_mean_over_members():
    # two members, two pairs; member 0 counts pair 0 twice and drops pair 1 (its bootstrap weights)
    s_w = torch.tensor([[1.0, -0.5], [0.0, 2.0]], requires_grad=True)  # [K=2, S=2]
    s_l = torch.tensor([[0.5, 0.5], [1.0, 0.0]])
    weights = torch.tensor([[2.0, 0.0], [1.0, 1.0]])  # [K, S]
    contrib, stats = bradley_terry_loss(s_w, s_l, BatchNorm(2, 1, 1), weights)
    pair0 = (2 * nll_sigmoid(0.5) + 1 * nll_sigmoid(-1.0)) / 2 / 2  # mean over members, / 2 pairs
    pair1 = (0 * nll_sigmoid(-1.0) + 1 * nll_sigmoid(2.0)) / 2 / 2
    assert contrib.tolist() == pytest.approx([pair0, pair1], abs=1e-6)
    assert stats["rm_accuracy"].item() == 0.5  # margins 0.5, -1, -1, 2
    contrib.sum().backward()
    # d/ds_w of w·(−log σ(m)) / (K·S) = −w·σ(−m) / 4; member 0's second pair has weight 0
    assert s_w.grad[0, 0].item() == pytest.approx(-2 / (1 + math.exp(0.5)) / 4, abs=1e-6)
    assert s_w.grad[0, 1].item() == 0.0
    assert s_w.grad[1, 1].item() == pytest.approx(-1 / (1 + math.exp(2.0)) / 4, abs=1e-6)
    one, _ = bradley_terry_loss(s_w[:1].detach(), s_l[:1], BatchNorm(2, 1, 1))
    single, _ = bradley_terry_loss(s_w[0].detach(), s_l[0], BatchNorm(2, 1, 1))
    assert torch.allclose(one, single)  # one member = the plain loss


def test_ensemble_reward_is_mean_less_lambda_std():
    scores = torch.tensor([[1.0, 0.0, 2.0], [3.0, 0.0, 2.0]])  # [K=2, S=3]
    assert ensemble_reward(scores).tolist() == [2.0, 0.0, 2.0]
    # population std over two members = |a − b| / 2: 1, 0, 0
    assert ensemble_reward(scores, 0.5).tolist() == [1.5, 0.0, 2.0]
    assert ensemble_reward(scores[:1], 3.0).tolist() == [1.0, 0.0, 2.0]  # one member: no spread


def test_pearson_and_spearman_by_hand():
    x = torch.tensor([1.0, 2.0, 3.0, 4.0])
    y = torch.tensor([1.0, 3.0, 2.0, 4.0])
    # x − x̄ = (−1.5, −0.5, 0.5, 1.5), y − ȳ = (−1.5, 0.5, −0.5, 1.5): Σ = 2.25 − 0.25 − 0.25 + 2.25 = 4, each Σ² = 5
    assert pearson(x, y).item() == pytest.approx(0.8, abs=1e-12)
    assert pearson(x, -y).item() == pytest.approx(-0.8, abs=1e-12)
    assert spearman(x, torch.exp(y)).item() == pytest.approx(0.8, abs=1e-12)  # ranks only
    assert average_ranks(torch.tensor([3.0, 1.0, 3.0, 2.0])).tolist() == [3.5, 1.0, 3.5, 2.0]
    # ties: ranks (1, 2.5, 2.5, 4) against (1, 2, 3, 4): Σ(dx dy) = 4.5, Σdx² = 4.5, Σdy² = 5
    assert spearman(torch.tensor([0.0, 1.0, 1.0, 2.0]), x).item() == pytest.approx(4.5 / math.sqrt(4.5 * 5), abs=1e-12)
    assert math.isnan(pearson(torch.ones(3), x[:3]).item()) and math.isnan(spearman(x[:1], x[:1]).item())


def test_group_pair_accuracy_by_hand():
    rewards = torch.tensor([[1.0, 0.0, 0.5], [2.0, 2.0, 2.0]])  # group 1 ties: no pairs
    scores = torch.tensor([[0.3, 0.1, 0.3], [5.0, 0.0, 1.0]])
    # pairs of group 0 with r_w > r_l: (0,1) right, (0,2) tie in score = 1/2, (2,1) right -> 2.5 / 3
    assert group_pair_accuracy(scores, rewards).item() == pytest.approx(2.5 / 3)
    assert group_pair_accuracy(-scores, rewards).item() == pytest.approx(0.5 / 3)
    assert math.isnan(group_pair_accuracy(scores[1:], rewards[1:]).item())


# ---- self-play credit and role-conditioned baselines (SPIRAL's RAE) --------------------------------
from textzoo.algorithms import rlmath  # noqa: E402  (module access keeps these tests apart from the list above)


def test_acting_role_returns_credit_each_turn_with_the_movers_return():
    # one env, two roles alternating over 3 turns (role 0, 1, 0); the game ends at turn 2 with
    # role 0 winning (+1, role 1 -1), and role 1 made an illegal move at turn 1 (-0.5)
    rewards = torch.tensor([[[0.0, 0.0, 1.0], [0.0, -0.5, -1.0]]])  # [E=1, R=2, T=3]
    played = torch.tensor([[[True, False, True], [False, True, False]]])  # [E, R, T]
    joint = rlmath.acting_role_returns(rewards, played, [(0, 1)], gamma=1.0)  # one actor, both roles
    assert torch.allclose(joint, torch.tensor([[[1.0, -1.5, 1.0]]]))  # role 0: 1; role 1: -0.5 - 1
    assert rlmath.credited_rewards(rewards, [(0, 1)], "per_agent").sum() == pytest.approx(-0.25)  # cancels
    # gamma 0.5: turn 0 of role 0 is 0.5^2 * 1
    assert torch.allclose(
        rlmath.acting_role_returns(rewards, played, [(0, 1)], 0.5), torch.tensor([[[0.25, -1.0, 1.0]]])
    )
    # two one-role actors: each its own role's return where it played, 0 elsewhere
    split = rlmath.acting_role_returns(rewards, played, [(0,), (1,)], 1.0)
    assert torch.allclose(split, torch.tensor([[[1.0, 0.0, 1.0], [0.0, -1.5, 0.0]]]))
    assert rlmath.acting_roles(played, [(0, 1), (1,)]).tolist() == [[[0, 1, 0], [-1, 1, -1]]]


def test_role_baselines_are_moving_averages_per_role():
    returns = torch.tensor([1.0, 3.0, -2.0, 5.0])
    roles = torch.tensor([0, 0, 1, -1])  # the last sample played no role
    baseline, b = rlmath.role_baselines(None, returns, roles, num_roles=3, momentum=0.9)
    assert baseline.tolist() == [0.0, 0.0, 0.0, 0.0]  # b starts at 0 (SPIRAL)
    # role 0: 0.9 * 0 + 0.1 * mean(1, 3) = 0.2; role 1: 0.1 * -2 = -0.2; role 2: no sample, stays 0
    assert torch.allclose(b, torch.tensor([0.2, -0.2, 0.0]))
    baseline, b2 = rlmath.role_baselines(b, torch.tensor([2.0, 0.0]), torch.tensor([1, 0]), 3, 0.9)
    assert torch.allclose(baseline, torch.tensor([-0.2, 0.2]))
    assert torch.allclose(b2, torch.tensor([0.9 * 0.2 + 0.1 * 0.0, 0.9 * -0.2 + 0.1 * 2.0, 0.0]))
    # as the reinforce estimator's baseline: A = R - b[role], masked
    mask = torch.tensor([True, True])
    adv = rlmath.advantages(torch.tensor([2.0, 0.0]), mask, "reinforce", "none", running_mean=baseline)
    assert torch.allclose(adv, torch.tensor([2.2, -0.2]))


# ---- AT-GRPO: groups of (state, agent, turn) -------------------------------------------------------
def test_state_groups_by_hand():
    """Five samples: three from state x (returns 1, 0, 2), one alone from y, one from z with another x key."""
    keys = [(0, "x"), (1, "y"), (0, "x"), (0, "x"), (1, "z")]
    groups = state_group_ids(keys)
    assert groups.tolist() == [0, 1, 0, 0, 2]
    returns = torch.tensor([1.0, 5.0, 0.0, 2.0, -3.0])
    # group x: mean 1, unbiased std sqrt((0 + 1 + 1) / 2) = 1; groups of one get 0
    adv = state_group_advantages(returns, groups, scale="none")
    assert torch.allclose(adv, torch.tensor([0.0, 0.0, -1.0, 1.0, 0.0]))
    adv = state_group_advantages(returns, groups, scale="std")
    assert torch.allclose(adv, torch.tensor([0.0, 0.0, -1.0, 1.0, 0.0]) / (1 + 1e-6))
    # a std floor of 4 divides by 4 instead
    adv = state_group_advantages(returns, groups, scale="std", std_floor=4.0)
    assert torch.allclose(adv, torch.tensor([0.0, 0.0, -0.25, 0.25, 0.0]), atol=1e-6)


def test_state_groups_of_one_prompt_are_grpo():
    """When every sample of a group shares its state (turn 0), AT-GRPO's advantages are MAGRPO's."""
    grpo = advantages(group(R), ONES, "grpo", scale="std").flatten()
    assert torch.allclose(state_group_advantages(torch.tensor(R), state_group_ids(["s"] * 4)), grpo)
