"""MARLHF's joint reward model: an LM trunk + scalar head over the joint text of an episode.

The model is a `Critic` (trunk + value head) that reads the whole episode as text — `state()` before
the last turn followed by every actor's last completion — and answers one score per episode. It is
trained on pairs with the Bradley–Terry loss −log σ(s_w − s_l) (`textzoo.agents.rlmath.bradley_terry_loss`),
then frozen and used as the reward of any online family:
`relabel` puts the score on each episode's last turn for every role and keeps the task's rewards in
`reward_terms` as `task/mean` and `task/<term>`, so logs show `reward/task/...` beside the reward
being optimised (a rising model reward over a flat task reward is reward hacking).

Pairs are `PairBatch`es whose prompts are the joint texts in the reward model's own token ids
(completions empty), so the replay store and the update runner treat them like policy pairs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from textzoo.agents.batch import PairBatch, Rollout
from textzoo.agents.critic import Critic
from textzoo.agents.inference import chunks, eval_mode
from textzoo.agents.policy import Generation
from textzoo.agents.rlmath import BatchNorm, bradley_terry_loss


def last_turns(rollout: Rollout) -> torch.Tensor:
    """[E] the last turn in which any actor acted, per env copy."""
    acted = rollout.active.any(1)  # [E, T]
    T = acted.shape[1]
    return (acted.long() * torch.arange(1, T + 1)).argmax(1)  # [E] last index with a True


def joint_texts(rollout: Rollout) -> list[str]:
    """The text of each episode [E]: the global state before its last turn, then that turn's completions."""
    last = last_turns(rollout).tolist()
    texts = [rollout.states[t][e] for e, t in enumerate(last)]
    for s in rollout.steps:
        for e, text in zip(s.env_ids.tolist(), s.gen.texts):
            if s.turn == last[e]:
                texts[e] += f"\n[turn {s.turn}] <{s.actor} action>\n{text}"
    return texts


def encode_texts(model: Critic, texts: list[str]) -> Generation:
    """Joint texts as a `Generation` of prompts in the reward model's token ids (empty completions)."""
    ids, mask = model.encode(texts)  # [S, L]
    empty = ids.new_zeros((len(texts), 0))
    return Generation(ids, mask, empty, empty.clone(), empty.float(), texts=list(texts))


def reward_model_loss(model: Critic, batch: PairBatch, norm: BatchNorm):
    """The Bradley–Terry loss of one micro-batch of pairs: chosen and rejected scored in one forward."""
    m = len(batch)
    both = Generation.cat([batch.chosen, batch.rejected], pad_id=model.pad_id)
    scores = model(both.prompt_ids, both.prompt_mask)  # [2m]
    return bradley_terry_loss(scores[:m], scores[m:], norm)


@torch.no_grad()
def scores(model: Critic, gen: Generation) -> torch.Tensor:
    """Reward-model scores [S] (float, CPU) of encoded texts, in eval mode, without gradients."""
    with eval_mode(model):
        out = [model(part.prompt_ids, part.prompt_mask).float().cpu() for part in chunks(gen)]
    return torch.cat(out) if out else torch.zeros(0)


def pair_accuracy(model: Critic, batch: PairBatch) -> float:
    """Fraction of pairs the model orders correctly (s_w > s_l; a tie counts half); NaN for no pairs."""
    if not len(batch):
        return float("nan")
    margin = scores(model, batch.chosen) - scores(model, batch.rejected)  # [S]
    return float(((margin > 0).float() + 0.5 * (margin == 0).float()).mean())


def relabel(rollout: Rollout, score_texts: Callable[[list[str]], torch.Tensor]) -> Rollout:
    """The rollout with the reward model's episode score as every role's reward on its last turn.

    The task's rewards move to `reward_terms`: `task/mean` (each role's episode reward) and
    `task/<term>` for each task term. The greedy baseline rollout, if any, is relabelled alike.
    """
    E, R, T = rollout.rewards.shape
    s = score_texts(joint_texts(rollout)).to(rollout.rewards.dtype)  # [E]
    last = last_turns(rollout)  # [E]
    rows = torch.arange(E)
    rewards = torch.zeros_like(rollout.rewards)  # [E, R, T]
    rewards[rows, :, last] = s[:, None]
    terms = {"rm": s[:, None].expand(E, R).clone(), "task/mean": rollout.rewards.sum(-1)}
    terms.update({f"task/{k}": v for k, v in rollout.reward_terms.items()})
    greedy = None if rollout.greedy is None else relabel(rollout.greedy, score_texts)
    return dataclasses.replace(rollout, rewards=rewards, reward_terms=terms, greedy=greedy)
