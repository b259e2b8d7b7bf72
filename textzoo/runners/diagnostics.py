"""Learning-signal diagnostics of a rollout: is there anything to learn from in this batch?

Per actor (and per turn for a multi-turn task), logged in every training row of `metrics.jsonl`:
- `agent/<id>/frac_reward_zero_std`: the share of groups (the samples of one prompt, per actor and
  turn, two or more of them) whose credited returns are all equal. A group-relative baseline gives
  those samples zero advantage: no gradient from them.
- `agent/<id>/truncated`: the share of the actor's completions that used their whole token budget
  without writing an end token (cut by `max_new_tokens`; for a joint actor, the budget of the whole
  joint completion).
- `agent/<id>/completion_len`: the mean completion length in scored tokens (per turn only; the
  per-actor mean is `rollout_metrics`'s).
Reward terms (solving and format terms alike) are `rollout_metrics`'s `reward/<term>` and
`role/<role>/reward/<term>`.

`no_signal_streak` counts the consecutive steps without a gradient signal (`no_gradient_signal`), and
logs a warning each time it reaches a multiple of `TrainConfig.no_signal_steps`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from textzoo.algorithms.batch import Rollout
from textzoo.algorithms.rlmath import acting_role_returns, credited_rewards, discounted_returns

logger = logging.getLogger(__name__)


def zero_std_groups(returns: torch.Tensor, mask: torch.Tensor, tol: float = 1e-8) -> tuple[int, int]:
    """(groups whose masked returns are all equal, groups with >= 2 masked samples), over dim 1 (G).

    Shapes: returns, mask [B, G, ...]; every index other than dim 1 is a separate group.
    """
    mask = mask.bool()
    big = torch.finfo(returns.dtype).max
    hi = torch.where(mask, returns, torch.full_like(returns, -big)).amax(1)  # [B, ...]
    lo = torch.where(mask, returns, torch.full_like(returns, big)).amin(1)
    counted = mask.sum(1) >= 2
    flat = counted & ((hi - lo) <= tol)
    return int(flat.sum()), int(counted.sum())


def truncated(completion_ids: torch.Tensor, completion_mask: torch.Tensor, budget: int, end_ids: Sequence[int]):
    """[S] bool: the sample scored `budget` tokens or more and its last scored token is not an end token."""
    mask = completion_mask.bool()
    lengths = mask.sum(-1)  # [S]
    last = (mask.long() * torch.arange(1, mask.shape[-1] + 1, device=mask.device)).argmax(-1)  # [S] last scored col
    last_token = completion_ids.gather(-1, last.unsqueeze(-1)).squeeze(-1)  # [S]
    ended = torch.isin(last_token, torch.as_tensor(list(end_ids), dtype=last_token.dtype, device=last_token.device))
    return (lengths >= budget) & ~ended & (lengths > 0)


def signal_metrics(
    rollout: Rollout,
    budgets: Mapping[str, int],
    end_ids: Mapping[str, Sequence[int]],
    credit: str = "shared",
    gamma: float = 1.0,
) -> dict[str, float]:
    """The diagnostics of the module docstring for every actor of `rollout`; `budgets` and `end_ids` give
    each actor's token budget and end tokens. Groups compare the returns the reinforce family would use
    (`credit`, `gamma`; no KL shaping)."""
    B, G, A = rollout.num_prompts, rollout.group_size, len(rollout.actors)
    if credit == "acting_role":  # self-play: each turn credited as the role the actor played there
        returns = acting_role_returns(rollout.rewards, rollout.infos["role_active"], rollout.actor_roles, gamma)
    else:
        returns = discounted_returns(credited_rewards(rollout.rewards, rollout.actor_roles, credit), gamma)
    T = returns.shape[-1]
    returns = returns.view(B, G, A, T)  # [E, A, T] -> [B, G, A, T]
    active = rollout.active.view(B, G, A, T)
    out: dict[str, float] = {}
    for ai, actor in enumerate(rollout.actors):
        steps = rollout.steps_of(actor)
        if not steps:
            continue
        flat, counted = zero_std_groups(returns[:, :, ai], active[:, :, ai])  # groups (b, t)
        if counted:
            out[f"agent/{actor}/frac_reward_zero_std"] = flat / counted
        cut = [truncated(s.gen.completion_ids, s.gen.completion_mask, budgets[actor], end_ids[actor]) for s in steps]
        out[f"agent/{actor}/truncated"] = float(torch.cat(cut).float().mean())
        if T < 2:
            continue
        for t in range(T):
            at = [(s, c) for s, c in zip(steps, cut) if s.turn == t]
            if not at:
                continue
            prefix = f"agent/{actor}/turn{t}"
            flat, counted = zero_std_groups(returns[:, :, ai, t], active[:, :, ai, t])
            if counted:
                out[f"{prefix}/frac_reward_zero_std"] = flat / counted
            out[f"{prefix}/truncated"] = float(torch.cat([c for _, c in at]).float().mean())
            lengths = torch.cat([s.gen.completion_mask.sum(-1).float() for s, _ in at])
            out[f"{prefix}/completion_len"] = float(lengths.mean())
    return out


def no_gradient_signal(row: Mapping[str, Any]) -> bool:
    """Whether a training row had no gradient signal: every actor's mean |advantage| is 0 (when the
    family logs advantages), else every actor's groups all had zero reward variance."""
    adv = [v for k, v in row.items() if k.startswith("agent/") and k.endswith("/advantage_abs")]
    if adv:
        return all(abs(v) < 1e-12 for v in adv)
    flat = [
        v for k, v in row.items() if k.startswith("agent/") and k.endswith("/frac_reward_zero_std") and "/turn" not in k
    ]
    return bool(flat) and all(v >= 1.0 for v in flat)


def no_signal_streak(row: Mapping[str, Any], previous: Mapping[str, Any] | None, warn_every: int) -> int:
    """The consecutive steps up to `row` without gradient signal (`previous` is the last logged row, which
    holds the streak before it); warns when the streak reaches a multiple of `warn_every` (0 = never)."""
    if not no_gradient_signal(row):
        return 0
    streak = int((previous or {}).get("no_signal_streak", 0)) + 1
    if warn_every and streak % warn_every == 0:
        logger.warning(
            "no gradient signal for %d consecutive steps (step %s): every group's samples got the same "
            "reward, so every advantage is 0. Make the task easier for this model (a preset), raise "
            "group_size or the sampling temperature, or check the token budget (agent/<id>/truncated)",
            streak,
            row.get("step"),
        )
    return streak
