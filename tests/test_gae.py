"""Turn-level GAE and value targets against hand-computed values."""

import pytest
import torch

torch.set_num_threads(1)

from textzoo.agents.actor_critic import gae  # noqa: E402

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
