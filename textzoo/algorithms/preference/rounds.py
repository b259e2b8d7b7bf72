"""The preference pipeline: iterative rounds with comparators, and MARLHF's reward model, as a rollout hook.

A run of `steps` steps is split into `preference.iterations` rounds of equal length. `PreferenceRounds`
(the rounds, the comparator and the pair store) is the base of two rollout hooks
(`textzoo.algorithms.hooks`), `ComparatorRounds` (MADPO with a comparator) and `RewardModelRounds`
(MARLHF), which the trainer calls after collecting each step's rollout and before `family.jobs`:

- at the first step of round r it refreshes the comparator (`copy`: a frozen copy of the team now;
  `history`: the team at the start of round max(r − k, 0); `model`: another model, built once) and,
  for MARLHF, collects `rm_batches` batches from the current team (and the comparator), pairs them by
  the task reward, holds out a share of the prompts (all their pairs), replays older pairs from the
  store (token ids), trains the reward model with the Bradley–Terry loss for up to `rm_epochs` epochs,
  keeps the epoch with the best held-out pair accuracy (early stopping) and reports it;
- every step, for MADPO with a comparator, it plays the comparator on the same prompts and attaches
  those samples as `rollout.infos["comparator"]` (they join the candidate pool); for MARLHF it
  replaces the rewards with the frozen reward model's (`relabel`), so any online family trains on them,
  measures how well the model's scores track the task reward on these fresh episodes (Pearson,
  Spearman, within-prompt pair accuracy) and feeds the `HackingMonitor` (reset each round: a new
  reward model has a new scale).

Everything a resume needs (round, snapshots, reward model and its optimizer, pair store, monitor) is
in `state_dict`, which the trainer checkpoints beside the family's. `rm/episodes` counts the episodes
played to train the reward model (environment steps beside the online ones).

MARLHF's settings that matter (`PreferenceConfig`; held-out task-reward gain on the embedded
default, two tiny GPT-2s on WritingRatio-v0, 80 steps, seed 0, `benchmarks/preference_run.py`;
these defaults: +0.215, MAGRPO at the same environment steps +0.288):

- pairs: `rm_batches=16` batches a round and every pair of each group (`rm_pair_selection="all"`),
  `rm_holdout` of the prompts held out. The old 2 batches of 4 gap pairs a prompt: +0.060 (held-out
  pair accuracy 0.50).
- `rm_early_stopping` keeps the epoch (of `rm_epochs`) with the best held-out pair accuracy; off: +0.072.
- `rm_pooling="mean"` (the head averaged over the tokens: an additive per-token reward, which can
  express lengths) over the last `rm_max_tokens=128` tokens of the joint text; "last": +0.095; 512
  tokens (the prompt's tokens dilute the mean): −0.073. Raise it for a task whose preference depends
  on the whole prompt.
- `rm_train_trunk=True` trains the trunk with the head; frozen: +0.096. `reward_model="actor"` starts
  from the first actor's weights, a model id from a pretrained model (the usual choice on real models).
- off by default because they did not help here: `reinforce.kl_coef` (0.02: +0.075) and
  `rm_ensemble` with `rm_disagreement_penalty` (4 members, λ = 1: +0.093).
- `rm/heldout_accuracy`, `rm/pearson`, `rm/spearman`, `rm/group_accuracy` (each step, on its fresh
  episodes) and `rm/hacking` (over `hacking_window` steps, with a logged warning) say whether the
  reward model still tracks the task.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from textzoo.algorithms.batch import Job, PairBatch, Rollout
from textzoo.algorithms.hooks import Learns, Run
from textzoo.algorithms.preference.madpo import PairStore, merge_groups, select_pairs
from textzoo.algorithms.preference.reward_model import (
    HackingMonitor,
    RewardModel,
    agreement,
    encode_texts,
    joint_texts,
    member_scores,
    pair_accuracy,
    relabel,
    reward_model_loss,
)
from textzoo.decoding.generation import Generation
from textzoo.errors import CheckpointError, ConfigError
from textzoo.models.build import build_policy
from textzoo.models.critic import Critic
from textzoo.models.settings import TINY_MODELS
from textzoo.models.team import Actor

if TYPE_CHECKING:
    from textzoo.config import AgentConfig, TrainConfig


def build_reward_model(cfg: TrainConfig, actors: list[Actor], device: torch.device) -> tuple[RewardModel, AgentConfig]:
    """MARLHF's reward model (`preference.reward_model` trunk, frozen unless `rm_train_trunk`) and its
    learner settings.

    Members of a frozen pretrained or "actor" trunk share one copy of it (only their heads differ);
    "tiny" members, and members that train their trunk, get their own (tiny ones from their own seeds).
    """
    pc = cfg.preference
    settings = dataclasses.replace(
        cfg.agent, model=pc.reward_model, lr=pc.rm_lr, lr_schedule="constant", warmup_steps=0, trainable=True
    )
    frozen, seed = not pc.rm_train_trunk, cfg.seed * 1000 + 777
    members, policy = [], None
    for k in range(pc.rm_ensemble):
        if policy is None or not frozen or pc.reward_model in TINY_MODELS:
            if pc.reward_model == "actor":
                policy = copy.deepcopy(actors[0].policy)  # the first actor's weights now, before any training
                policy.model.to(device)
            else:
                policy = build_policy(settings, seed + k, device)
            if frozen:
                policy.model.eval().requires_grad_(False)
        members.append(Critic.from_policy(policy, max_tokens=pc.rm_max_tokens, seed=seed + k, shared_trunk=frozen))
    return RewardModel(members, pc.rm_pooling, pc.rm_disagreement_penalty), settings


def _seed(*parts: int) -> int:
    return int(np.random.SeedSequence([p & 0xFFFFFFFF for p in parts]).generate_state(1)[0])


def _copy_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def held_out_prompts(prompts: int, fraction: float) -> torch.Tensor:
    """[P] True for round(P x fraction) prompts drawn at random (torch's generator): every pair of a
    held-out prompt is held out, so held-out accuracy measures prompts the model never trained on."""
    held = torch.zeros(prompts, dtype=torch.bool)
    held[torch.randperm(prompts)[: int(round(prompts * fraction))]] = True
    return held


def fit_reward_model(
    rm: RewardModel,
    learner: Learns,
    train: PairBatch,
    holdout: PairBatch,
    epochs: int,
    minibatches: int,
    early_stopping: bool,
    run_job: Callable[[Job, Learns], dict[str, float]],
) -> tuple[int, list[float]]:
    """Fit Bradley–Terry for up to `epochs` passes over `train` (each pass one `run_job`, the run's shared
    update path); return the epoch kept and each pass's loss.

    With `early_stopping` (and held-out pairs) the weights of the epoch with the best held-out pair
    accuracy are kept, epoch 0 being the model as it came (ties keep the earlier epoch); else the last.
    """
    early = early_stopping and len(holdout) > 0
    best = (pair_accuracy(rm, holdout), 0, _copy_state(rm)) if early else None
    losses: list[float] = []
    for epoch in range(epochs if len(train) else 0):
        job = Job("reward_model", train, partial(reward_model_loss, rm), minibatches=minibatches)
        losses.append(run_job(job, learner)["loss"])
        if early and (accuracy := pair_accuracy(rm, holdout)) > best[0]:
            best = (accuracy, epoch + 1, _copy_state(rm))
    if not early:
        return len(losses), losses
    with torch.no_grad():
        rm.load_state_dict(best[2])
    return best[1], losses


def _cat_pairs(batches: list[PairBatch], pad_id: int) -> PairBatch:
    return PairBatch(
        Generation.cat([b.chosen for b in batches], pad_id), Generation.cat([b.rejected for b in batches], pad_id)
    )


class PreferenceRounds:
    """The rounds of the preference pipeline: the comparator team, its snapshots and the pair store (see
    the module doc). The two hooks below add what their algorithm does each round and each step."""

    def __init__(self, cfg: TrainConfig, run: Run):
        """The rounds of `run`, with the comparator team (when there is one) built next to its team."""
        self.cfg = cfg
        self.pc = cfg.preference
        self.round_steps = cfg.steps // cfg.preference.iterations
        self.round = -1
        self.snapshots: dict[int, dict[str, dict[str, torch.Tensor]]] = {}  # round -> actor -> weights
        self.store = PairStore(self.pc.replay_capacity if self.pc.replay_pairs else 0)
        self.round_stats: dict[str, float] = {}
        self.comparator = self._comparator(run)
        if self.comparator is not None:
            self.collector = run.collector_for(self.comparator)

    # ---- building --------------------------------------------------------------------------------
    def _comparator(self, run: Run) -> list[Actor] | None:
        """The comparator team (None when there is none), on the device of the run's team."""
        cfg, pc = self.cfg, self.pc
        comparator = None
        device = run.actors[0].policy.device
        if pc.comparator == "model":
            agent = dataclasses.replace(cfg.agent, model=pc.comparator_model, trainable=False)
            comparator = run.build_team(dataclasses.replace(cfg, agent=agent, agent_overrides={}))
            own = run.actors[0].policy.tokenizer.get_vocab()
            if any(a.policy.tokenizer.get_vocab() != own for a in comparator):
                raise ConfigError(
                    f"preference.comparator_model {pc.comparator_model!r} has a different tokenizer from the agents': "
                    "its samples could not be scored on the tokens it sampled. Pick one of the agents' model family"
                )
        elif pc.comparator in ("copy", "history"):
            comparator = [actor.frozen_copy() for actor in run.actors]
        for twin in comparator or []:
            twin.policy.model.to(device)
        return comparator

    # ---- the hook --------------------------------------------------------------------------------
    def before_jobs(
        self, run: Run, rollout: Rollout, items: list[int], seeds: list[int]
    ) -> tuple[Rollout, dict[str, float]]:
        """Start a round when one begins, then this algorithm's change to the step (`step`)."""
        stats: dict[str, float] = {}
        r = run.step // self.round_steps
        if r != self.round:
            self.start_round(run, r)
            stats.update(self.round_stats)
        stats["round"] = float(self.round)
        return self.step(run, rollout, items, seeds, stats)

    def step(
        self, run: Run, rollout: Rollout, items: list[int], seeds: list[int], stats: dict[str, float]
    ) -> tuple[Rollout, dict[str, float]]:
        """This algorithm's change to the step's rollout, and its statistics added to `stats`."""
        return rollout, stats

    def start_round(self, run: Run, r: int) -> None:
        """Snapshot the team for the `copy` / `history` comparator and load the one this round plays."""
        self.round = r
        if self.pc.comparator in ("copy", "history"):
            self.snapshots[r] = {
                a.id: {k: v.detach().to("cpu", copy=True) for k, v in a.policy.model.state_dict().items()}
                for a in run.actors
            }
            back = 0 if self.pc.comparator == "copy" else self.pc.history_k
            for old in [k for k in self.snapshots if k < r - back]:
                del self.snapshots[old]
            self._load_comparator()

    def _load_comparator(self) -> None:
        back = 0 if self.pc.comparator == "copy" else self.pc.history_k
        weights = self.snapshots[max(self.round - back, min(self.snapshots))]
        with torch.no_grad():
            for twin in self.comparator:
                twin.policy.model.load_state_dict(weights[twin.id])

    def candidates(self, run: Run, items: list[int], seeds: list[int]) -> Rollout:
        """The current team's samples of the prompts, and the comparator's when there is one."""
        rollout = run.collector.collect(items, seeds, self.cfg.group_size)
        if self.comparator is not None:
            rollout = merge_groups(rollout, self.collector.collect(items, seeds, self.cfg.group_size))
        return rollout

    # ---- checkpoints -------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "round": self.round,
            "round_steps": self.round_steps,
            "snapshots": self.snapshots,
            "store": self.store.state_dict(),
            "round_stats": self.round_stats,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.round = int(state["round"])
        # the round length the run started with, even if `steps` was extended on resume
        self.round_steps = int(state["round_steps"])
        self.snapshots = {int(k): v for k, v in state["snapshots"].items()}
        self.store.load_state_dict(state["store"])
        self.round_stats = dict(state["round_stats"])
        if self.snapshots and self.comparator is not None:
            self._load_comparator()


class ComparatorRounds(PreferenceRounds):
    """MADPO with a comparator: every step the comparator plays the step's prompts, and its samples join
    the candidate pool as `rollout.infos["comparator"]`."""

    def step(
        self, run: Run, rollout: Rollout, items: list[int], seeds: list[int], stats: dict[str, float]
    ) -> tuple[Rollout, dict[str, float]]:
        other = self.collector.collect(items, seeds, rollout.group_size)
        rollout.infos["comparator"] = other
        stats["comparator/reward/mean"] = float(other.team_rewards.sum(-1).mean())
        return rollout, stats


class RewardModelRounds(PreferenceRounds):
    """MARLHF: each round fits the reward model on pairs of fresh samples; every step relabels the rollout
    with its rewards (so any online family trains on them) and checks that they track the task reward."""

    def __init__(self, cfg: TrainConfig, run: Run):
        """The rounds of `run`: the reward model and its learner, then the comparator (when there is one)."""
        self.reward_model, settings = build_reward_model(cfg, run.actors, run.actors[0].policy.device)
        self.rm_learner = run.build_learner(self.reward_model, settings, cfg.preference.iterations)
        self._run_job = run.run_job
        super().__init__(cfg, run)
        self.monitor = HackingMonitor(min(self.pc.hacking_window, self.round_steps), self.pc.hacking_threshold)
        self.rm_episodes = 0

    def step(
        self, run: Run, rollout: Rollout, items: list[int], seeds: list[int], stats: dict[str, float]
    ) -> tuple[Rollout, dict[str, float]]:
        task = rollout.team_rewards.sum(-1)  # [E] episode task reward
        members = member_scores(self.reward_model, encode_texts(self.reward_model, joint_texts(rollout)))  # [K, E]
        reward = self.reward_model.reward(members)  # [E]
        rollout = relabel(rollout, self.score_texts, reward)
        stats.update({f"rm/{k}": v for k, v in agreement(reward, task, rollout.group_size).items()})
        if len(members) > 1:
            stats["rm/disagreement"] = float(members.std(0, unbiased=False).mean())
        stats.update(self.monitor.update(run.step + 1, float(reward.mean()), float(task.mean())))
        stats["rm/episodes"] = float(self.rm_episodes)
        return rollout, stats

    def score_texts(self, texts: list[str]) -> torch.Tensor:
        """The reward model's reward [S] of joint texts."""
        rm = self.reward_model
        return rm.reward(member_scores(rm, encode_texts(rm, texts)))

    def start_round(self, run: Run, r: int) -> None:
        super().start_round(run, r)
        self.train_reward_model(run, r)
        self.monitor = HackingMonitor(self.monitor.window, self.monitor.threshold)  # a new model, a new scale

    def train_reward_model(self, run: Run, r: int) -> None:
        """Collect pairs by task reward, hold out whole prompts, replay older pairs, fit Bradley–Terry with
        early stopping on held-out pair accuracy, report accuracies."""
        cfg, pc, rm = self.cfg, self.pc, self.reward_model
        pools = []
        for k in range(pc.rm_batches):
            items = run.sampler.next(cfg.batch_prompts)
            seeds = [_seed(cfg.seed, 2, r, k, b) for b in range(cfg.batch_prompts)]
            pools.append(self.candidates(run, items, seeds))
        self.rm_episodes += sum(p.num_envs for p in pools)
        held_out = held_out_prompts(sum(p.num_prompts for p in pools), pc.rm_holdout)  # [P]
        sides: dict[bool, list[PairBatch]] = {True: [], False: []}
        offset = 0
        for pool in pools:
            B, K = pool.num_prompts, pool.group_size
            episode = pool.team_rewards.sum(-1).view(B, K)  # [B, K]
            chosen = select_pairs(episode, pc.rm_pair_selection, pc.rm_pairs_per_prompt)  # [S, 3]
            gen = encode_texts(rm, joint_texts(pool))
            pairs = PairBatch(gen.select(chosen[:, 0] * K + chosen[:, 1]), gen.select(chosen[:, 0] * K + chosen[:, 2]))
            held = held_out[offset + chosen[:, 0]]  # [S]
            for side in (True, False):
                sides[side].append(pairs.select(torch.nonzero(held == side).flatten()))
            offset += B
        holdout, fresh = _cat_pairs(sides[True], rm.pad_id), _cat_pairs(sides[False], rm.pad_id)
        replay = self.store.sample(pc.replay_pairs).get("reward_model")
        self.store.add({"reward_model": fresh}, {"reward_model": rm.pad_id})
        train = fresh if replay is None else _cat_pairs([fresh, replay], rm.pad_id)
        if len(rm.members) > 1:  # each member fits its own bootstrap resample (Poisson(1) counts per pair)
            train.extra["bootstrap"] = torch.poisson(torch.ones(len(train), len(rm.members)))
        before = pair_accuracy(rm, holdout)
        epoch, losses = fit_reward_model(
            rm, self.rm_learner, train, holdout, pc.rm_epochs, pc.rm_minibatches, pc.rm_early_stopping, self._run_job
        )
        self.round_stats = {
            "rm/pairs": float(len(train)),
            "rm/heldout_pairs": float(len(holdout)),
            "rm/heldout_accuracy_before": before,
            "rm/heldout_accuracy": pair_accuracy(rm, holdout),
            "rm/train_accuracy": pair_accuracy(rm, train),
            "rm/epochs": float(epoch),
            "rm/loss": float(losses[epoch - 1] if epoch else float("nan")),
            "rm/task_reward": float(torch.stack([p.team_rewards.sum(-1).mean() for p in pools]).mean()),
        }

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state.update(monitor=self.monitor.state_dict(), rm_episodes=self.rm_episodes)
        state["reward_model"] = {k: v.detach().cpu() for k, v in self.reward_model.state_dict().items()}
        state["rm_learner"] = self.rm_learner.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.monitor.load_state_dict(state.get("monitor", self.monitor.state_dict()))
        self.rm_episodes = int(state.get("rm_episodes", 0))
        try:
            with torch.no_grad():
                self.reward_model.load_state_dict(state["reward_model"])
            self.rm_learner.load_state_dict(state["rm_learner"])
        except (KeyError, RuntimeError, ValueError) as e:
            raise CheckpointError(
                f"the checkpoint's reward model does not fit this run's ({e}); it was written by an older "
                "textzoo whose reward model had another layout: start a new run"
            ) from e
        super().load_state_dict(state)
