"""Learning-signal diagnostics against hand-computed values (`textzoo.runners.diagnostics`)."""

import logging

import pytest
import torch

torch.set_num_threads(1)

from textzoo.algorithms.batch import ActorStep, Rollout  # noqa: E402
from textzoo.decoding.generation import Generation  # noqa: E402
from textzoo.runners.diagnostics import (  # noqa: E402
    no_gradient_signal,
    no_signal_streak,
    signal_metrics,
    truncated,
    zero_std_groups,
)

EOS = 9


def test_zero_std_groups_by_hand():
    # 3 prompts x 3 samples: [1, 1, 1] flat; [0, 1, 0] varies; [2, 2, 5] with the 5 masked out: flat
    returns = torch.tensor([[1.0, 1.0, 1.0], [0.0, 1.0, 0.0], [2.0, 2.0, 5.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 1], [1, 1, 0]])
    assert zero_std_groups(returns, mask) == (2, 3)
    # a group with one active sample is not counted at all
    assert zero_std_groups(returns, torch.tensor([[1, 0, 0], [1, 1, 1], [0, 0, 0]])) == (0, 1)


def test_truncated_means_the_whole_budget_without_an_end_token():
    ids = torch.tensor([[1, 2, 3], [1, 2, EOS], [1, EOS, 0], [4, 0, 0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 1], [1, 1, 0], [0, 0, 0]])
    assert truncated(ids, mask, 3, (EOS,)).tolist() == [True, False, False, False]
    assert truncated(ids, mask, 2, (EOS,)).tolist() == [True, False, False, False]
    assert truncated(ids, mask, 2, ()).tolist() == [True, True, True, False]


def _gen(ids: list[list[int]], lengths: list[int]) -> Generation:
    n, c = len(ids), len(ids[0])
    mask = torch.tensor([[1] * k + [0] * (c - k) for k in lengths])
    return Generation(
        prompt_ids=torch.ones(n, 1, dtype=torch.long),
        prompt_mask=torch.ones(n, 1, dtype=torch.long),
        completion_ids=torch.tensor(ids),
        completion_mask=mask,
        logprobs=torch.zeros(n, c),
    )


def test_signal_metrics_per_agent_and_turn_by_hand():
    """B=2 prompts x G=2, two roles (one actor each), two turns; env copy 3 ends after turn 0."""
    # rewards [E, R, T]; shared credit: the team reward is the mean over roles
    rewards = torch.tensor(
        [
            [[1.0, 0.0], [1.0, 0.0]],  # e0: team 1, 0
            [[1.0, 1.0], [1.0, 1.0]],  # e1: team 1, 1
            [[0.0, 0.0], [0.0, 0.0]],  # e2: team 0, 0
            [[0.0, 0.0], [0.0, 0.0]],  # e3: team 0, - (done)
        ]
    )
    active = torch.ones(4, 2, 2, dtype=torch.bool)
    active[3, :, 1] = False
    steps = []
    for actor in ("a", "b"):
        # turn 0: 4 samples, budget 3: [1 2 3] cut, [1 EOS] ended, [1 2 3] cut, [EOS]
        steps.append(
            ActorStep(actor, 0, torch.arange(4), _gen([[1, 2, 3], [1, EOS, 0], [1, 2, 3], [EOS, 0, 0]], [3, 2, 3, 1]))
        )
        steps.append(ActorStep(actor, 1, torch.arange(3), _gen([[1, EOS], [2, EOS], [1, 2]], [2, 2, 1])))
    rollout = Rollout(2, 2, ["a", "b"], ["a", "b"], [(0,), (1,)], [0, 1], steps, rewards, active, [])
    out = signal_metrics(rollout, {"a": 3, "b": 3}, {"a": (EOS,), "b": (EOS,)})
    # returns-to-go: e0 [1, 0], e1 [2, 1], e2 [0, 0], e3 [0, -]
    # turn 0 groups: prompt 0 {1, 2} varies, prompt 1 {0, 0} flat; turn 1: prompt 0 {0, 1} varies, prompt 1 one sample
    assert out["agent/a/frac_reward_zero_std"] == 1 / 3
    assert out["agent/a/turn0/frac_reward_zero_std"] == 1 / 2
    assert out["agent/a/turn1/frac_reward_zero_std"] == 0.0
    assert out["agent/b/truncated"] == pytest.approx(2 / 7)  # two cut samples of 7, both at turn 0
    assert out["agent/b/turn0/truncated"] == 2 / 4 and out["agent/b/turn1/truncated"] == 0.0
    assert out["agent/a/turn0/completion_len"] == 9 / 4
    assert out["agent/a/turn1/completion_len"] == pytest.approx(5 / 3)
    # per-agent credit: each actor's own role (here the same rewards, so the same groups)
    assert signal_metrics(rollout, {"a": 3, "b": 3}, {"a": (EOS,), "b": (EOS,)}, "per_agent") == out


def test_no_signal_streak_counts_and_warns_every_k_steps(caplog):
    flat = {"step": 1, "agent/a/advantage_abs": 0.0, "agent/b/advantage_abs": 0.0}
    some = {"step": 1, "agent/a/advantage_abs": 0.0, "agent/b/advantage_abs": 0.3}
    assert no_gradient_signal(flat) and not no_gradient_signal(some)
    # without advantages (a preference family), zero-variance groups decide; per-turn keys do not
    assert no_gradient_signal({"agent/a/frac_reward_zero_std": 1.0, "agent/a/turn1/frac_reward_zero_std": 0.5})
    assert not no_gradient_signal({"agent/a/frac_reward_zero_std": 0.75})
    assert not no_gradient_signal({"step": 3})
    streak, previous = [], None
    with caplog.at_level(logging.WARNING, logger="textzoo.runners.diagnostics"):
        for row in (flat, flat, some, flat, flat, flat, flat):
            row = dict(row, no_signal_streak=no_signal_streak(row, previous, 2))
            streak.append(row["no_signal_streak"])
            previous = row
    assert streak == [1, 2, 0, 1, 2, 3, 4]
    assert sum("no gradient signal for" in r.getMessage() for r in caplog.records) == 3  # at 2, 2 and 4
    assert no_signal_streak(flat, {"no_signal_streak": 7}, 0) == 8
