"""MARLHF's joint reward model: K members (an LM trunk + a scalar head each) over the joint text of an episode.

The model reads the whole episode as text — `state()` before the last turn followed by every actor's
last completion — and answers one score per episode. A member is a `Critic` (trunk + head); its
score pools the head's value over the text's tokens: `mean` (the average over every token: an additive
per-token reward, which a frozen trunk with a linear head can learn from few pairs) or `last` (the
value at the last token, InstructGPT's reward model). A frozen trunk (`Critic(shared_trunk=True)`) is
not a parameter of the model: only the heads learn, and members on one frozen trunk run it once.
Members are trained with the Bradley–Terry loss −log σ(s_w − s_l) (`textzoo.algorithms.rlmath.bradley_terry_loss`),
each on its own bootstrap weights of the pairs when there are several; the reward is the ensemble's
mean less λ times its spread (`textzoo.algorithms.rlmath.ensemble_reward`).

Frozen after each round's training, the model is the reward of any online family: `relabel` puts the
score on each episode's last turn for every role and keeps the task's rewards in `reward_terms` as
`task/mean` and `task/<term>`, so logs show `reward/task/...` beside the reward being optimised.
`HackingMonitor` watches the two: a rising model reward over a falling task reward is reward hacking.

Pairs are `PairBatch`es whose prompts are the joint texts in the reward model's own token ids
(completions empty), so the replay store and the update runner treat them like policy pairs.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import deque
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

import torch

from textzoo.algorithms.batch import PairBatch, Rollout
from textzoo.algorithms.preference.config import POOLINGS
from textzoo.algorithms.rlmath import (
    BatchNorm,
    bradley_terry_loss,
    ensemble_reward,
    group_pair_accuracy,
    pearson,
    spearman,
)
from textzoo.decoding.generation import Generation
from textzoo.decoding.inference import chunks
from textzoo.decoding.modes import eval_mode
from textzoo.decoding.precision import autocast
from textzoo.errors import ConfigError
from textzoo.models.critic import Critic

logger = logging.getLogger(__name__)


class RewardModel(torch.nn.Module):
    """An ensemble of K `Critic` members scoring joint texts; `reward` is their penalised mean.

    `pooling`: "mean" (the head's mean over the text's tokens) or "last" (the head at the last token).
    `disagreement_penalty` λ: the reward is mean_k s_k − λ·std_k s_k.
    """

    def __init__(self, members: list[Critic], pooling: str = "mean", disagreement_penalty: float = 0.0):
        super().__init__()
        if pooling not in POOLINGS:
            raise ConfigError(f"reward-model pooling must be one of {POOLINGS}, got {pooling!r}")
        if not members:
            raise ConfigError("a reward model needs at least one member")
        self.members = torch.nn.ModuleList(members)
        self.pooling = pooling
        self.disagreement_penalty = disagreement_penalty
        self.pad_id = members[0].pad_id

    def encode(self, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Left-padded ids and mask ([S, L]) in the members' tokenizer; a long text keeps its last tokens."""
        return self.members[0].encode(texts)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Member scores [K, S] of left-padded texts ([S, L])."""
        hidden: dict[int, torch.Tensor] = {}  # one forward per distinct trunk
        out = []
        for member in self.members:
            key = id(member.trunk)
            if key not in hidden:
                hidden[key] = _hidden_states(member, ids, mask)  # [S, L, d]
            values = member.value(hidden[key])  # [S, L]
            out.append(_pool(values, mask.to(values.device), self.pooling))
        return torch.stack(out)  # [K, S]

    def reward(self, member_scores: torch.Tensor) -> torch.Tensor:
        """The reward [S] of member scores [K, S]: mean − λ·std over members."""
        return ensemble_reward(member_scores, self.disagreement_penalty)


def _hidden_states(member: Critic, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The trunk's final hidden states [S, L, d], under the member's autocast (the actors' precision); a
    frozen (shared) trunk runs in eval mode without gradients."""
    device = member.device
    ids, mask = ids.to(device), mask.to(device).long()
    position = (mask.cumsum(1) - 1).clamp(min=0)  # [S, L] explicit for left padding (GPT-2)
    with ExitStack() as stack:
        stack.enter_context(autocast(device, member.autocast))
        if member.shared_trunk:
            stack.enter_context(eval_mode(member.trunk))
            stack.enter_context(torch.no_grad())
        out = member.trunk(input_ids=ids, attention_mask=mask, position_ids=position, use_cache=False)
        return out.last_hidden_state


def _pool(values: torch.Tensor, mask: torch.Tensor, pooling: str) -> torch.Tensor:
    """[S, L] per-token values -> [S]: the last column (left padding: the last token) or the masked mean."""
    if pooling == "last":
        return values[:, -1]
    m = mask.to(values.dtype)
    return (values * m).sum(1) / m.sum(1).clamp(min=1)


# ---- episodes as text ---------------------------------------------------------------------------
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


def encode_texts(model: RewardModel | Critic, texts: list[str]) -> Generation:
    """Joint texts as a `Generation` of prompts in the reward model's token ids (empty completions)."""
    ids, mask = model.encode(texts)  # [S, L]
    empty = ids.new_zeros((len(texts), 0))
    return Generation(ids, mask, empty, empty.clone(), empty.float(), texts=list(texts))


# ---- learning and scoring ---------------------------------------------------------------------
def reward_model_loss(model: RewardModel, batch: PairBatch, norm: BatchNorm):
    """The Bradley–Terry loss of one micro-batch of pairs: chosen and rejected scored in one forward.

    `batch.extra["bootstrap"]` [S, K], when present, weighs each member's term on each pair.
    """
    m = len(batch)
    both = Generation.cat([batch.chosen, batch.rejected], pad_id=model.pad_id)
    scores = model(both.prompt_ids, both.prompt_mask)  # [K, 2m]
    weights = batch.extra.get("bootstrap")
    return bradley_terry_loss(scores[:, :m], scores[:, m:], norm, None if weights is None else weights.T)


@torch.no_grad()
def member_scores(model: RewardModel, gen: Generation) -> torch.Tensor:
    """Every member's scores [K, S] (float, CPU) of encoded texts, in eval mode, without gradients."""
    with eval_mode(model):
        out = [model(part.prompt_ids, part.prompt_mask).float().cpu() for part in chunks(gen)]
    return torch.cat(out, 1) if out else torch.zeros(len(model.members), 0)


def scores(model: RewardModel, gen: Generation) -> torch.Tensor:
    """The reward [S] (float, CPU) of encoded texts: the members' penalised mean."""
    return model.reward(member_scores(model, gen))


def pair_accuracy(model: RewardModel, batch: PairBatch) -> float:
    """Fraction of pairs the reward orders correctly (s_w > s_l; a tie counts half); NaN for no pairs."""
    if not len(batch):
        return float("nan")
    margin = scores(model, batch.chosen) - scores(model, batch.rejected)  # [S]
    return float(((margin > 0).float() + 0.5 * (margin == 0).float()).mean())


def relabel(
    rollout: Rollout, score_texts: Callable[[list[str]], torch.Tensor], scores: torch.Tensor | None = None
) -> Rollout:
    """The rollout with the reward model's episode score as every role's reward on its last turn.

    `scores` [E], when given, are the episodes' scores already computed (else `score_texts` of
    `joint_texts`). The task's rewards move to `reward_terms`: `task/mean` (each role's episode reward)
    and `task/<term>` for each task term. The greedy baseline rollout, if any, is relabelled alike.
    """
    E, R, T = rollout.rewards.shape
    s = (score_texts(joint_texts(rollout)) if scores is None else scores).to(rollout.rewards.dtype)  # [E]
    last = last_turns(rollout)  # [E]
    rows = torch.arange(E)
    rewards = torch.zeros_like(rollout.rewards)  # [E, R, T]
    rewards[rows, :, last] = s[:, None]
    terms = {"rm": s[:, None].expand(E, R).clone(), "task/mean": rollout.rewards.sum(-1)}
    terms.update({f"task/{k}": v for k, v in rollout.reward_terms.items()})
    greedy = None if rollout.greedy is None else relabel(rollout.greedy, score_texts)
    return dataclasses.replace(rollout, rewards=rewards, reward_terms=terms, greedy=greedy)


def agreement(rm: torch.Tensor, task: torch.Tensor, group_size: int) -> dict[str, float]:
    """How well reward-model scores [E] track task rewards [E] of fresh episodes (E = B·G, prompt-major).

    `pearson` and `spearman` over every episode; `group_accuracy`: the share of each prompt's pairs
    with different task rewards that the scores order alike (what a group-relative update sees).
    """
    B = len(rm) // group_size
    return {
        "pearson": float(pearson(rm, task)),
        "spearman": float(spearman(rm, task)),
        "group_accuracy": float(group_pair_accuracy(rm.view(B, group_size), task.view(B, group_size))),
    }


# ---- reward hacking -----------------------------------------------------------------------------
@dataclasses.dataclass
class HackingMonitor:
    """Warns when the reward-model score rises while the task reward falls over the last `window` steps.

    Each trend is Pearson's r between the step index and the per-step mean (scale-free); the monitor
    fires when the model's trend is >= `threshold` and the task's <= −`threshold`, and logs one
    warning per episode of hacking (again only after it has stopped).
    """

    window: int = 20
    threshold: float = 0.5
    rm: deque = dataclasses.field(default_factory=deque)
    task: deque = dataclasses.field(default_factory=deque)
    firing: bool = False

    def update(self, step: int, rm_mean: float, task_mean: float) -> dict[str, float]:
        """Add one step's means; return the trends and whether hacking is flagged (1.0) now."""
        if self.window < 2:
            return {}
        self.rm.append(rm_mean)
        self.task.append(task_mean)
        while len(self.rm) > self.window:
            self.rm.popleft()
            self.task.popleft()
        if len(self.rm) < self.window:
            return {}
        index = torch.arange(self.window, dtype=torch.float64)
        rm_trend = float(pearson(index, torch.tensor(list(self.rm))))
        task_trend = float(pearson(index, torch.tensor(list(self.task))))
        hacking = rm_trend >= self.threshold and task_trend <= -self.threshold
        if hacking and not self.firing:
            logger.warning(
                "reward hacking at step %d: over the last %d steps the reward model's score rose (%.3f -> %.3f, "
                "trend %.2f) while the task reward fell (%.3f -> %.3f, trend %.2f). Retrain the reward model "
                "more often (iterations), give it more pairs (preference.rm_batches), or raise "
                "reinforce.kl_coef / preference.rm_disagreement_penalty",
                step,
                self.window,
                self.rm[0],
                self.rm[-1],
                rm_trend,
                self.task[0],
                self.task[-1],
                task_trend,
            )
        self.firing = hacking
        return {"rm/trend": rm_trend, "rm/task_trend": task_trend, "rm/hacking": float(hacking)}

    def state_dict(self) -> dict[str, Any]:
        return {"rm": list(self.rm), "task": list(self.task), "firing": self.firing}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rm, self.task = deque(state["rm"]), deque(state["task"])
        self.firing = bool(state["firing"])
