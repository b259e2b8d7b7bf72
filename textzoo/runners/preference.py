"""The preference pipeline: iterative rounds with comparators, and MARLHF's reward model, as a rollout hook.

A run of `steps` steps is split into `iterations` rounds of equal length. `PreferenceRounds` is a
rollout hook (`textzoo.runners.hooks`) the trainer calls after collecting each step's rollout and
before `family.jobs`:

- at the first step of round r it refreshes the comparator (`copy`: a frozen copy of the team now;
  `history`: the team at the start of round max(r − k, 0); `model`: another model, built once) and,
  for MARLHF, collects `rm_batches` batches from the current team (and the comparator), pairs them by
  the task reward, replays older pairs from the store (token ids), trains the reward model with the
  Bradley–Terry loss and reports its held-out pair accuracy;
- every step, for MADPO with a comparator, it plays the comparator on the same prompts and attaches
  those samples as `rollout.infos["comparator"]` (they join the candidate pool); for MARLHF it
  replaces the rewards with the frozen reward model's (`relabel`), so any online family trains on them.

Everything a resume needs (round, snapshots, reward model and its optimizer, pair store) is in
`state_dict`, which the trainer checkpoints beside the family's.
"""

from __future__ import annotations

import copy
import dataclasses
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from textzoo.agents.batch import Job, PairBatch, Rollout
from textzoo.agents.critic import Critic
from textzoo.agents.policy import Generation
from textzoo.agents.preference import PairStore, merge_groups, select_pairs
from textzoo.agents.reward_model import encode_texts, joint_texts, pair_accuracy, relabel, reward_model_loss, scores
from textzoo.errors import ConfigError
from textzoo.runners.build import build_actors, build_learner, build_policy
from textzoo.runners.hooks import Run
from textzoo.runners.rollout import Collector
from textzoo.runners.update import run_job

if TYPE_CHECKING:
    from textzoo.runners.config import TrainConfig


def madpo_hooks(cfg: TrainConfig) -> list[PreferenceRounds]:
    """MADPO's hooks: the preference pipeline when a comparator joins the candidates, else none."""
    return [PreferenceRounds(cfg, marlhf=False)] if cfg.preference.comparator != "current" else []


def marlhf_hooks(cfg: TrainConfig) -> list[PreferenceRounds]:
    """MARLHF's hook: the preference pipeline that trains the reward model and relabels every rollout."""
    return [PreferenceRounds(cfg, marlhf=True)]


def _seed(*parts: int) -> int:
    return int(np.random.SeedSequence([p & 0xFFFFFFFF for p in parts]).generate_state(1)[0])


def _cat_pairs(batches: list[PairBatch], pad_id: int) -> PairBatch:
    return PairBatch(
        Generation.cat([b.chosen for b in batches], pad_id), Generation.cat([b.rejected for b in batches], pad_id)
    )


class PreferenceRounds:
    """Round-start work and per-step rollout changes of the preference pipeline (see the module doc)."""

    def __init__(self, cfg: TrainConfig, marlhf: bool):
        self.cfg = cfg
        self.pc = cfg.preference
        self.marlhf = marlhf
        self.round_steps = cfg.steps // cfg.iterations
        self.round = -1
        self.snapshots: dict[int, dict[str, dict[str, torch.Tensor]]] = {}  # round -> actor -> weights
        self.store = PairStore(self.pc.replay_capacity if self.pc.replay_pairs else 0)
        self.round_stats: dict[str, float] = {}
        self.reward_model: Critic | None = None

    # ---- building --------------------------------------------------------------------------------
    def attach(self, run: Run) -> None:
        """Build the reward model, its learner and the comparator team next to the run's team."""
        cfg, pc = self.cfg, self.pc
        device = run.actors[0].policy.device
        if self.marlhf:
            settings = dataclasses.replace(
                cfg.agent, model=pc.reward_model, lr=pc.rm_lr, lr_schedule="constant", warmup_steps=0, trainable=True
            )
            seed = cfg.seed * 1000 + 777
            self.reward_model = Critic.from_policy(
                build_policy(settings, seed, device), max_tokens=pc.rm_max_tokens, seed=seed
            )
            self.rm_learner = build_learner(self.reward_model, settings, cfg.iterations)
        self.comparator = None
        if pc.comparator == "model":
            agent = dataclasses.replace(cfg.agent, model=pc.comparator_model, trainable=False)
            self.comparator = build_actors(dataclasses.replace(cfg, agent=agent, agent_overrides={}), run.roles)
            own = run.actors[0].policy.tokenizer.get_vocab()
            if any(a.policy.tokenizer.get_vocab() != own for a in self.comparator):
                raise ConfigError(
                    f"preference.comparator_model {pc.comparator_model!r} has a different tokenizer from the agents': "
                    "its samples could not be scored on the tokens it sampled. Pick one of the agents' model family"
                )
        elif pc.comparator in ("copy", "history"):
            self.comparator = []
            for actor in run.actors:
                twin = copy.deepcopy(actor)
                twin.trainable = False
                twin.policy.model.eval().requires_grad_(False)
                self.comparator.append(twin)
        if self.comparator is not None:
            for twin in self.comparator:
                twin.policy.model.to(device)
            self.collector = Collector(run.env_fn, self.comparator, cfg.env_workers)

    # ---- the hook --------------------------------------------------------------------------------
    def before_jobs(
        self, run: Run, rollout: Rollout, items: list[int], seeds: list[int]
    ) -> tuple[Rollout, dict[str, float]]:
        """Start a round when one begins; add comparator samples (MADPO) or reward-model rewards (MARLHF)."""
        stats: dict[str, float] = {}
        r = run.step // self.round_steps
        if r != self.round:
            self.start_round(run, r)
            stats.update(self.round_stats)
        stats["round"] = float(self.round)
        if self.comparator is not None and not self.marlhf:
            other = self.collector.collect(items, seeds, rollout.group_size)
            rollout.infos["comparator"] = other
            stats["comparator/reward/mean"] = float(other.team_rewards.sum(-1).mean())
        if self.marlhf:
            rollout = relabel(rollout, self.score_texts)
        return rollout, stats

    def score_texts(self, texts: list[str]) -> torch.Tensor:
        return scores(self.reward_model, encode_texts(self.reward_model, texts))

    def start_round(self, run: Run, r: int) -> None:
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
        if self.marlhf:
            self.train_reward_model(run, r)

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

    def train_reward_model(self, run: Run, r: int) -> None:
        """Collect pairs by task reward, hold some out, replay older ones, fit Bradley–Terry, report accuracy."""
        cfg, pc, rm = self.cfg, self.pc, self.reward_model
        new, task = [], []
        for k in range(pc.rm_batches):
            items = run.sampler.next(cfg.batch_prompts)
            seeds = [_seed(cfg.seed, 2, r, k, b) for b in range(cfg.batch_prompts)]
            pool = self.candidates(run, items, seeds)
            episode = pool.team_rewards.sum(-1).view(pool.num_prompts, pool.group_size)  # [B, K]
            task.append(episode.mean())
            chosen = select_pairs(episode, pc.pair_selection, pc.pairs_per_prompt)  # [S, 3]
            gen = encode_texts(rm, joint_texts(pool))
            K = pool.group_size
            new.append(
                PairBatch(gen.select(chosen[:, 0] * K + chosen[:, 1]), gen.select(chosen[:, 0] * K + chosen[:, 2]))
            )
        new_pairs = _cat_pairs(new, rm.pad_id)
        order = torch.randperm(len(new_pairs))
        held = int(round(len(new_pairs) * pc.rm_holdout))
        holdout, fresh = new_pairs.select(order[:held]), new_pairs.select(order[held:])
        replay = self.store.sample(pc.replay_pairs).get("reward_model")
        self.store.add({"reward_model": fresh}, {"reward_model": rm.pad_id})
        train = fresh if replay is None else _cat_pairs([fresh, replay], rm.pad_id)
        before = pair_accuracy(rm, holdout)
        update = {}
        if len(train):
            job = Job(
                "reward_model",
                train,
                partial(reward_model_loss, rm),
                epochs=pc.rm_epochs,
                minibatches=pc.rm_minibatches,
            )
            update = run_job(job, self.rm_learner, cfg.update)
        self.round_stats = {
            "rm/pairs": float(len(train)),
            "rm/heldout_pairs": float(len(holdout)),
            "rm/heldout_accuracy_before": before,
            "rm/heldout_accuracy": pair_accuracy(rm, holdout),
            "rm/train_accuracy": pair_accuracy(rm, train),
            "rm/loss": float(update.get("loss", float("nan"))),
            "rm/task_reward": float(torch.stack(task).mean()),
        }

    # ---- checkpoints -------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {
            "round": self.round,
            "round_steps": self.round_steps,
            "snapshots": self.snapshots,
            "store": self.store.state_dict(),
            "round_stats": self.round_stats,
        }
        if self.reward_model is not None:
            state["reward_model"] = {k: v.detach().cpu() for k, v in self.reward_model.state_dict().items()}
            state["rm_learner"] = self.rm_learner.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.round = int(state["round"])
        # the round length the run started with, even if `steps` was extended on resume
        self.round_steps = int(state["round_steps"])
        self.snapshots = {int(k): v for k, v in state["snapshots"].items()}
        self.store.load_state_dict(state["store"])
        self.round_stats = dict(state["round_stats"])
        if self.reward_model is not None:
            with torch.no_grad():
                self.reward_model.load_state_dict(state["reward_model"])
            self.rm_learner.load_state_dict(state["rm_learner"])
        if self.snapshots and self.comparator is not None:
            self._load_comparator()
