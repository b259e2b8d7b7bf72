"""The training recipe: collect -> advantages -> update -> log (-> evaluate), top to bottom.

The trainer calls the algorithm family through one interface (`family.jobs(rollout)`), never
`if algo == ...`.
"""

from __future__ import annotations

import json
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import torch

from textzoo.agents.batch import Rollout
from textzoo.errors import ConfigError
from textzoo.runners.build import (
    ItemSampler,
    build_actors,
    build_family,
    build_learner,
    env_factory,
)
from textzoo.runners.config import TrainConfig, save_config
from textzoo.runners.rollout import Collector, prompt_seed
from textzoo.runners.schedule import build_schedule
from textzoo.runners.update import run_job


def default_run_dir(cfg: TrainConfig) -> Path:
    name = cfg.env.split("/")[-1]
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"{name}-{cfg.algo}-s{cfg.seed}-{stamp}"


class Trainer:
    """Builds a run from a `TrainConfig` (validating everything first) and trains it."""

    def __init__(self, cfg: TrainConfig, run_dir: str | Path | None = None):
        self.cfg = cfg
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        torch.manual_seed(cfg.seed)
        self.env_fn = env_factory(cfg)
        self.eval_env_fn = env_factory(cfg, eval=True)
        probe = self.env_fn()
        self.roles = list(probe.possible_agents)
        num_items = probe.num_items() if hasattr(probe, "num_items") else None
        probe.close()
        if not num_items:
            raise ConfigError(f"{cfg.env!r} has no num_items(); textzoo runners select prompts by index")
        self.actors = build_actors(cfg, self.roles)
        self.family = build_family(cfg, self.actors)
        if cfg.reinforce.joint_mode == "cross" and len(self.actors) > 6:
            raise ConfigError("joint_mode='cross' evaluates G^N combinations: use it with few agents")
        self.collector = Collector(self.env_fn, self.actors, cfg.env_workers)
        self.learners = {
            a.id: build_learner(a.policy.model, cfg.agent_config(a.id) if a.id in self.roles else cfg.agent, cfg.steps)
            for a in self.actors if a.trainable
        }
        # models a family trains besides the actors (critics, reward models): name -> (module, AgentConfig)
        for name, (module, settings) in getattr(self.family, "trainable_models", dict)().items():
            self.learners[name] = build_learner(module, settings, cfg.steps)
        self.sampler = ItemSampler(num_items, cfg.seed)
        self.schedule = build_schedule(cfg.trainable_agents, cfg.alternate_every, [a.id for a in self.actors],
                                       [a.id for a in self.actors if a.trainable])
        self.step = 0
        self.run_dir = Path(run_dir or cfg.run_dir or default_run_dir(cfg))
        self.metrics_path = self.run_dir / "metrics.jsonl"
        self.history: list[dict[str, Any]] = []

    # ---- one step of the recipe --------------------------------------------------------------
    def train_step(self) -> dict[str, Any]:
        cfg = self.cfg
        t0 = time.perf_counter()
        items = self.sampler.next(cfg.batch_prompts)
        seeds = [prompt_seed(cfg.seed, self.step, b) for b in range(len(items))]
        rollout = self.collector.collect(items, seeds, cfg.group_size, cross=cfg.reinforce.joint_mode == "cross")
        if self.family.needs_greedy_baseline:
            rollout.greedy = self.collector.collect(items, seeds, 1, greedy=True)
        t_collect = time.perf_counter()
        jobs, family_stats = self.family.jobs(rollout)
        training = self.schedule.at(self.step)
        jobs = self.schedule.filter(jobs, self.step)  # agents frozen this step: no loss, no step, no version bump
        update_stats = {job.learner: run_job(job, self.learners[job.learner], cfg.update) for job in jobs}
        t_update = time.perf_counter()
        self.step += 1
        row = {"step": self.step, **rollout_metrics(rollout), **family_stats}
        for learner, stats in update_stats.items():
            row.update({f"agent/{learner}/{k}": v for k, v in stats.items()})
        for actor_id, learner in self.learners.items():
            row[f"agent/{actor_id}/weights_version"] = learner.version
            row[f"agent/{actor_id}/max_grad_norm"] = learner.max_grad_norm or 0.0  # the clip target (0 = off)
            if actor_id in self.schedule.agents:
                row[f"agent/{actor_id}/training"] = float(actor_id in training)
        step_time = t_update - t0
        tokens = row["tokens_generated"]
        row.update({
            "time/step": step_time,
            "time/generate": rollout.infos["time_generate"],
            "time/reward": rollout.infos["time_env"],
            "time/update": t_update - t_collect,
            "time/tokens_per_s": tokens / step_time,
            "time/joint_actions_per_s": rollout.num_envs / step_time,
        })
        return row

    def evaluate(self, prompts: int | None = None) -> dict[str, float]:
        """Greedy and sampled rewards (mean and per term) on held-out items."""
        cfg = self.cfg
        collector = getattr(self, "_eval_collector", None)
        if collector is None:
            collector = self._eval_collector = Collector(self.eval_env_fn, self.actors, cfg.env_workers)
        n_items = collector.envs[0].num_items()
        n = min(prompts or cfg.eval_prompts, n_items)
        items = list(range(n))
        seeds = [prompt_seed(cfg.seed, -1, b) for b in items]
        out: dict[str, float] = {}
        for mode, greedy in (("greedy", True), ("sampled", False)):
            rollout = collector.collect(items, seeds, 1, greedy=greedy)
            for k, v in rollout_metrics(rollout).items():
                if k.startswith(("reward", "role/", "parse_failure")):
                    out[f"eval/{mode}/{k}"] = v
        return out

    # ---- the loop ----------------------------------------------------------------------------
    def train(self) -> list[dict[str, Any]]:
        """Run the remaining steps; write config, metrics.jsonl and the learning-curve PNG."""
        cfg = self.cfg
        self.run_dir.mkdir(parents=True, exist_ok=True)
        save_config(cfg, self.run_dir / "config.json")
        progress = _Progress(cfg.steps, self.step, enabled=cfg.progress)
        with progress, open(self.metrics_path, "a") as log:
            if self.step == 0:
                self._write(log, {"step": 0, **self.evaluate()})
            while self.step < cfg.steps:
                row = self.train_step()
                last = self.step == cfg.steps
                if (cfg.eval_every and self.step % cfg.eval_every == 0) or last:
                    row.update(self.evaluate())
                self._write(log, row)
                progress.update(row)
        if cfg.plot:
            from textzoo.runners.plot import plot_runs

            plot_runs([self.run_dir], self.run_dir / "curve.png")
        return self.history

    def _write(self, log, row: dict[str, Any]) -> None:
        self.history.append(row)
        log.write(json.dumps(row, sort_keys=True) + "\n")
        log.flush()


def rollout_metrics(rollout: Rollout) -> dict[str, float]:
    """Reward mean/std (episode team return), per-term means, completion lengths, parse failures.

    `role/<role>/...` columns split the team back into roles (each role's return, reward terms and
    action length), so decentralized and centralized runs are comparable column for column.
    """
    episode = rollout.team_rewards.sum(-1)  # [E]
    out = {
        "reward/mean": float(episode.mean()),
        "reward/std": float(episode.std()) if episode.numel() > 1 else 0.0,
    }
    for term, values in sorted(rollout.reward_terms.items()):
        out[f"reward/{term}"] = float(values.mean())
    for ri, role in enumerate(rollout.roles):
        out[f"role/{role}/reward"] = float(rollout.rewards[:, ri].sum(-1).mean())
        for term, values in sorted(rollout.reward_terms.items()):
            out[f"role/{role}/reward/{term}"] = float(values[:, ri].mean())
    for role, lengths in sorted(rollout.infos.get("role_tokens", {}).items()):
        if lengths:
            out[f"role/{role}/completion_len"] = sum(lengths) / len(lengths)
    for actor in rollout.actors:
        lengths = [s.gen.completion_mask.sum(-1).float() for s in rollout.steps_of(actor)]
        if lengths:
            out[f"agent/{actor}/completion_len"] = float(torch.cat(lengths).mean())
    samples = sum(len(s.gen) for s in rollout.steps)
    out["parse_failures"] = float(rollout.infos.get("parse_failures", 0))
    out["parse_failure_rate"] = out["parse_failures"] / max(samples, 1)
    out["tokens_generated"] = float(sum(int(s.gen.completion_mask.sum()) for s in rollout.steps))
    return out


class _Progress:
    """A rich progress bar with ETA and the current reward (silent when disabled)."""

    def __init__(self, total: int, done: int, enabled: bool = True):
        self.enabled = enabled
        if enabled:
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

            self.bar = Progress(TextColumn("[bold]train"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                                TimeElapsedColumn(), TimeRemainingColumn(), TextColumn("{task.fields[info]}"))
            self.task = self.bar.add_task("train", total=total, completed=done, info="")

    def __enter__(self):
        if self.enabled:
            self.bar.start()
        return self

    def __exit__(self, *exc):
        if self.enabled:
            self.bar.stop()

    def update(self, row: dict[str, Any]) -> None:
        if self.enabled:
            info = f"reward {row['reward/mean']:.3f}"
            if "eval/greedy/reward/mean" in row:
                info += f" | eval {row['eval/greedy/reward/mean']:.3f}"
            self.bar.update(self.task, completed=row["step"], info=info)
