"""The training recipe: collect -> advantages -> update -> log (-> evaluate) -> checkpoint, top to bottom.

The trainer calls the algorithm family through one interface (`family.jobs(rollout)`), never
`if algo == ...`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch

from textzoo.algorithms import registry
from textzoo.algorithms.batch import Job, Rollout
from textzoo.config import AgentConfig, TrainConfig, precisions_as_in
from textzoo.config_files import from_dict, save_config, to_dict
from textzoo.decoding.precision import slow_bf16
from textzoo.errors import CheckpointError, ConfigError
from textzoo.models.team import Actor
from textzoo.runners import sharding
from textzoo.runners.build import ItemSampler, build_actors, build_learner, env_factory, resolved_config
from textzoo.runners.checkpoint import (
    apply_weights,
    capture_rng,
    check_weights,
    config_diff,
    latest_intact,
    list_checkpoints,
    read_checkpoint,
    restore_rng,
    write_checkpoint,
)
from textzoo.runners.diagnostics import no_signal_streak, signal_metrics
from textzoo.runners.distributed import DistContext, merge_rows
from textzoo.runners.engines import (
    attach_engines,
    engine_metrics,
    refresh_engines,
    sleep_engines,
    sync_engines,
)
from textzoo.runners.placement import format_placement, place_models, team_models, visible_devices
from textzoo.runners.preemption import GracefulStop, agree
from textzoo.runners.provenance import record_start
from textzoo.runners.resources import (
    as_write_error,
    check_run_dir,
    checkpoint_bytes,
    out_of_memory,
    owners_of,
    write_failure,
)
from textzoo.runners.rollout import Collector, prompt_seed
from textzoo.runners.rundir import start_fresh
from textzoo.runners.samples import SamplesLog, sample_rows, samples_table
from textzoo.runners.schedule import build_schedule
from textzoo.runners.tracking import build_trackers
from textzoo.runners.update import Learner, run_job, run_jobs

logger = logging.getLogger(__name__)


def default_run_dir(cfg: TrainConfig) -> Path:
    name = cfg.env.split("/")[-1]
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"{name}-{cfg.algo}-s{cfg.seed}-{stamp}"


RESUME_SAFE = frozenset(
    {
        "steps",
        "run_dir",
        "overwrite",
        "progress",
        "log_completions",
        "plot",
        "threads",
        "env_workers",
        "save_every",
        "keep_last",
        "report_to",
        "eval_every",
        "eval_at_start",
        "eval_prompts",
        "devices",
        "device_map",
        "num_processes",
        "sharding",
        "agent.device",
        "agent.engine.url",
        "agent.engine.api_key",
        "agent.engine.timeout_s",
        "agent.engine.sync_dir",
        "no_signal_steps",
    }
)
"""Config fields a resumed run may change: they do not alter what was learned so far. A longer `steps`
extends the run (a linear/cosine schedule is then stretched over the new total). Evaluation samples
from its own stream, so the eval schedule never changes training; the replica count is checked
against the checkpoint separately."""


def find_resumable(cfg: TrainConfig, root: str | Path = "runs") -> Path | None:
    """The run dir (cfg.run_dir, else the newest under `root`) whose newest checkpoint has this config."""
    candidates = [Path(cfg.run_dir)] if cfg.run_dir else [p for p in Path(root).glob("*") if p.is_dir()]
    found = []
    for run_dir in candidates:
        checkpoints = list_checkpoints(run_dir)
        if not checkpoints:
            continue
        try:
            saved = from_dict(TrainConfig, json.loads((checkpoints[-1] / "config.json").read_text()))
        except (OSError, ValueError):
            continue
        if not config_diff(saved, precisions_as_in(cfg, saved), RESUME_SAFE):
            found.append((checkpoints[-1].stat().st_mtime, run_dir))
    return max(found)[1] if found else None


class Trainer:
    """Builds a run from a `TrainConfig` (validating everything first) and trains it.

    `resume`: a run dir to continue from its newest intact checkpoint, or "auto" (`find_resumable`;
    a fresh run when nothing matches). `dist`: this process's data-parallel replica (default: the
    process group a launcher describes in the environment, else a single process).
    """

    def __init__(
        self,
        cfg: TrainConfig,
        run_dir: str | Path | None = None,
        resume: str | Path | None = None,
        dist: DistContext | None = None,
    ):
        registry.configure(cfg)  # the algorithm's defaults, then its rules across fields: before anything is built
        self.cfg = cfg
        self.dist = dist or DistContext.from_env()
        if cfg.batch_prompts % self.dist.world_size:
            raise ConfigError(f"batch_prompts ({cfg.batch_prompts}) must divide over {self.dist.world_size} replicas")
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        torch.manual_seed(cfg.seed)
        random.seed(cfg.seed)
        np.random.seed(cfg.seed)
        logger.info("building the env %s", cfg.env)
        self.env_fn = env_factory(cfg)
        self.eval_env_fn = env_factory(cfg, eval=True)
        probe = self.env_fn()
        self.roles = list(probe.possible_agents)
        num_items = probe.num_items() if hasattr(probe, "num_items") else None
        probe.close()
        if not num_items:
            raise ConfigError(f"{cfg.env!r} has no num_items(); textzoo runners select prompts by index")
        registry.check_team(cfg, self.roles)
        self.actors = build_actors(cfg, self.roles, self.dist)
        if self.dist.enabled:
            attach_engines(self.actors, self.dist)  # every process built its engines: check what they were sent
        self.family = registry.build_family(cfg, self.actors)
        cfg = self.cfg = resolved_config(cfg, self.actors)  # precision "auto" as built: config.json records it
        for actor in self.actors:
            logger.info("agent %s: precision %s", actor.id, actor.policy.precision)
        overrides = {
            a.id: cfg.agent_config(a.id).device
            for a in self.actors
            if a.id in self.roles and cfg.agent_config(a.id).device != "auto"
        }
        local_rank = self.dist.local_rank if self.dist.enabled else None
        self.placement = place_models(
            team_models(self.actors, self.family),
            visible_devices(cfg.devices, local_rank),
            {**overrides, **cfg.device_map},
        )
        for actor in self.actors:
            if (slow := slow_bf16(actor.policy.precision, actor.policy.device)) is not None:
                logger.warning("agent %s: %s", actor.id, slow)
        self.collector = Collector(self.env_fn, self.actors, cfg.env_workers, cfg.generate_workers)
        self._eval_collector: Collector | None = None
        self.sharded = self._shard() if cfg.sharding == "fsdp" and self.dist.enabled else []
        self.learners = {
            a.id: build_learner(a.policy.model, cfg.agent_config(a.id) if a.id in self.roles else cfg.agent, cfg.steps)
            for a in self.actors
            if a.trainable
        }
        # models a family trains besides the actors (critics, reward models): name -> (module, AgentConfig)
        for name, (module, settings) in self.family.trainable_models().items():
            self.learners[name] = build_learner(module, settings, cfg.steps)
        self.sampler = ItemSampler(num_items, cfg.seed)
        self.schedule = build_schedule(
            cfg.trainable_agents,
            cfg.alternate_every,
            [a.id for a in self.actors],
            [a.id for a in self.actors if a.trainable],
        )
        self.step = 0
        # pipeline stages between collection and the family (preference rounds, reward-model rewards)
        self.hooks = registry.build_hooks(cfg, self)
        self._resume_tried = resume == "auto"
        if resume == "auto":
            found = find_resumable(cfg) if self.dist.is_main else None
            resume = self.dist.broadcast(found) if self.dist.enabled else found
        self.run_dir = Path(resume or run_dir or cfg.run_dir or default_run_dir(cfg))
        if self.dist.enabled:
            self.run_dir = Path(self.dist.broadcast(str(self.run_dir)))
            for module, _kind, _trained in team_models(self.actors, self.family).values():
                if not any(module is m for m in self.sharded):  # sharded ones were broadcast before sharding
                    self.dist.broadcast_module(module)
            # replicas sample their own prompts with their own streams; replica 0 keeps the seed's
            seed = (
                int(np.random.SeedSequence([cfg.seed, self.dist.rank]).generate_state(1)[0])
                if self.dist.rank
                else cfg.seed
            )
            torch.manual_seed(seed)
            random.seed(seed)
            np.random.seed(seed)
        self.metrics_path = self.run_dir / "metrics.jsonl"
        self.samples = SamplesLog(self.run_dir / "samples.jsonl")
        self.rollouts: dict[str, Rollout] = {}  # the latest "train", "eval/greedy", "eval/sampled" rollouts
        self.stopped_by: str | None = None
        self.resumed_step: int | None = None  # the step of the checkpoint this run resumed from
        self._team_models = team_models(self.actors, self.family)
        self.history: list[dict[str, Any]] = []
        self._claimed = False  # whether train() has checked (or cleared) the run dir for this run
        if resume:
            self._resume()

    # ---- one step of the recipe --------------------------------------------------------------
    # ---- what a rollout hook may use of the run (`textzoo.algorithms.hooks.Run`) ------------------------
    def build_team(self, cfg: TrainConfig) -> list[Actor]:
        """A team for this run's roles, built from `cfg` (a comparator's)."""
        return build_actors(cfg, self.roles)

    def build_learner(self, model: torch.nn.Module, settings: AgentConfig, total_steps: int) -> Learner:
        """AdamW over `model` with `settings`' learning rate, schedule and clipping."""
        return build_learner(model, settings, total_steps)

    def collector_for(self, actors: list[Actor]) -> Collector:
        """A collector that plays `actors` on this run's training env."""
        return Collector(self.env_fn, actors, self.cfg.env_workers)

    def run_job(self, job: Job, learner: Learner) -> dict[str, float]:
        """Train `learner` on `job` with this run's update settings (the shared update path)."""
        return run_job(job, learner, self.cfg.update)

    def train_step(self) -> dict[str, Any]:
        cfg = self.cfg
        t0 = time.perf_counter()
        # every replica draws the global batch and plays its share, with the seeds of one process
        share = self.dist.shard(cfg.batch_prompts)
        items = self.sampler.next(cfg.batch_prompts)[share]
        seeds = [prompt_seed(cfg.seed, self.step, b) for b in range(cfg.batch_prompts)][share]
        needs = self.family.needs
        rank = self.dist.rank if self.dist.enabled else None
        engine_metrics(self.actors)  # an engine's log-prob gap of the training rollout only (not of evaluations)
        restarts = refresh_engines(self.actors, self._engine_weights, self.dist)  # a restarted server: resend
        with self.full_weights():  # sharded models whole from sampling to the jobs (no collectives inside)
            with self._phase("generate"):
                rollout = self.collector.collect(items, seeds, cfg.group_size, cross=needs.cross, tree=needs.tree)
                self.rollouts["train"] = rollout
                if needs.greedy:
                    rollout.greedy = self.collector.collect(items, seeds, 1, greedy=True)
            t_collect = time.perf_counter()
            hook_stats: dict[str, float] = {**restarts, **engine_metrics(self.actors, rank)}
            with self._phase("score"):
                for hook in self.hooks:
                    rollout, stats = hook.before_jobs(self, rollout, items, seeds)
                    hook_stats.update(stats)
                jobs, family_stats = self.family.jobs(rollout)
        hook_stats.update(sleep_engines(self.actors))  # engine.sleep: the update gets the engines' device memory
        training = self.schedule.at(self.step)
        jobs = self.schedule.filter(jobs, self.step)  # agents frozen this step: no loss, no step, no version bump
        sync = self.dist.grad_sync if self.dist.enabled else None
        with self._phase("update"):
            update_stats = run_jobs(jobs, self.learners, cfg.update, grad_sync=sync)
        t_update = time.perf_counter()
        self.step += 1
        # the engines sample the next rollout with the weights this update made
        hook_stats.update(self._sync_engines())
        row = {"step": self.step, **rollout_metrics(rollout), **hook_stats, **family_stats}
        budgets = {a.id: a.policy.generation.max_new_tokens for a in self.actors}
        ends = {a.id: a.policy.eos_ids for a in self.actors}
        row.update(signal_metrics(rollout, budgets, ends, cfg.credit, cfg.gamma))
        for learner, stats in update_stats.items():
            row.update({f"agent/{learner}/{k}": v for k, v in stats.items()})
        for actor_id, learner in self.learners.items():
            row[f"agent/{actor_id}/weights_version"] = learner.version
            row[f"agent/{actor_id}/max_grad_norm"] = learner.max_grad_norm or 0.0  # the clip target (0 = off)
            if actor_id in self.schedule.agents:
                row[f"agent/{actor_id}/training"] = float(actor_id in training)
        step_time = t_update - t0
        tokens = row["tokens_generated"]
        row.update(
            {
                "time/step": step_time,
                "time/generate": rollout.infos["time_generate"],
                "time/reward": rollout.infos["time_env"],
                "time/update": t_update - t_collect,
                "time/tokens_per_s": tokens / step_time,
                "time/joint_actions_per_s": rollout.num_envs / step_time,
            }
        )
        return merge_rows(self.dist.gather(row)) if self.dist.enabled else row

    def _shard(self) -> list[torch.nn.Module]:
        """FSDP2-shard every trainable model over the processes (`textzoo.runners.sharding`), after
        giving every process rank 0's weights; the sharded models."""
        models = [a.policy.model for a in self.actors if a.trainable]
        models += [module for module, _settings in self.family.trainable_models().values()]
        for model in models:
            self.dist.broadcast_module(model)
            sharding.shard(model, next(model.parameters()).device, self.dist.world_size)
        return models

    def _engine_weights(self, actor: Any) -> dict[str, torch.Tensor] | None:
        """The whole weights of an engine-backed actor's sharded model, for its engine (a collective); None
        when the model is not sharded (the engine reads the model itself)."""
        model = actor.policy.model
        return sharding.full_weights(model, everywhere=True) if any(model is m for m in self.sharded) else None

    def _sync_engines(self, force: bool = False) -> dict[str, float]:
        """Give every engine the weights its learner moved on to (`sync_engines`), sharded ones gathered first."""
        versions = {k: v.version for k, v in self.learners.items()}
        weights = {}
        for actor in self.actors:
            client = actor.policy.engine
            if (
                client is not None
                and client.open
                and actor.id in versions
                and (force or versions[actor.id] != client.version)
            ):
                if (state := self._engine_weights(actor)) is not None:
                    weights[actor.id] = state
        with self.full_weights():  # a server's sync is verified with a trainer forward
            return sync_engines(self.actors, versions, force, weights, self.dist)

    def full_weights(self):
        """A context within which the sharded models hold their whole weights (`sharding.gathered`);
        every process must enter it together. A no-op without sharding."""
        return sharding.gathered(self.sharded) if self.sharded else contextlib.nullcontext()

    def evaluate(self, prompts: int | None = None) -> dict[str, float]:
        """Rewards (mean and per term) on held-out items, one rollout per `eval_modes` entry."""
        cfg = self.cfg
        if self._eval_collector is None:  # built on first use: a run that never evaluates builds no eval envs
            self._eval_collector = Collector(self.eval_env_fn, self.actors, cfg.env_workers)
        collector = self._eval_collector
        n_items = collector.envs[0].num_items()
        n = min(prompts or cfg.eval_prompts, n_items)
        items = list(range(n))
        seeds = [prompt_seed(cfg.seed, -1, b) for b in items]
        out: dict[str, float] = {}
        # evaluation samples from its own stream (seeded by the step) and restores the training RNG
        # afterwards, so when and how often a run evaluates never changes what it learns
        with torch.random.fork_rng(devices=list(range(torch.cuda.device_count()))), self._phase("evaluate"):
            torch.manual_seed(prompt_seed(cfg.seed, -1, 10**9 + self.step))  # apart from item seeds
            for mode in cfg.eval_modes:
                rollout = self.rollouts[f"eval/{mode}"] = collector.collect(items, seeds, 1, greedy=mode == "greedy")
                for k, v in rollout_metrics(rollout).items():
                    if k.startswith(("reward", "role/", "parse_failure")):
                        out[f"eval/{mode}/{k}"] = v
        return out

    # ---- the loop ----------------------------------------------------------------------------
    def train(self) -> list[dict[str, Any]]:
        """Run the remaining steps; write config, metrics.jsonl, checkpoints and the learning-curve PNG.

        Replica 0 writes every file; the other replicas only train. A SIGTERM or first Ctrl-C (on any
        replica) ends the run after the current step with a checkpoint; `stopped_by` then names the
        signal (None after a full run). The run dir is checked for room first (`ResourceError`); a fresh
        run refuses a run dir that already holds a run unless `cfg.overwrite` (`ConfigError`).
        """
        cfg = self.cfg
        main = self.dist.is_main
        if main and self.resumed_step is None and not self._claimed:
            start_fresh(self.run_dir, cfg.overwrite, self._resume_tried)  # refuses a run dir holding a run
        self._claimed = True
        if main:
            check_run_dir(self.run_dir, *checkpoint_bytes(self.learners))  # writable, with room for a checkpoint
            save_config(cfg, self.run_dir / "config.json")
            record_start(self.run_dir, self.step)  # the command and source commit, for an export's card
            (self.run_dir / "placement.json").write_text(json.dumps(self.placement, indent=2) + "\n")
            logger.info(format_placement(self.placement))
        trackers = build_trackers(cfg.report_to, self.run_dir, to_dict(cfg), self.step) if main else []
        progress = _Progress(cfg.steps, self.step, enabled=cfg.progress and main)
        log_file = open(self.metrics_path, "a") if main else contextlib.nullcontext()
        with progress, log_file as log, GracefulStop() as stop:
            if cfg.eval_at_start and self.step == 0 and self.resumed_step is None:  # a resumed step 0 has its row
                with self.full_weights():  # entered by every process; replica 0 evaluates
                    if main:
                        self._write(log, {"step": 0, **self.evaluate()}, trackers)
                        self._log_samples(self.eval_splits, trackers, progress)
                        progress.update(self.history[-1])
            saved = self.step if self.resumed_step is not None else None
            while self.step < cfg.steps:
                if agree(stop.requested):  # SIGTERM / Ctrl-C on any replica: checkpoint and stop here
                    self.stopped_by = stop.name or "a signal to another replica"
                    if self.step != saved:  # step 0 too: a restart must not redo its row
                        self.save_checkpoint()
                    break
                row = self.train_step()
                if main:  # the streak continues from the last logged row (resume-safe)
                    previous = self.history[-1] if self.history else None
                    row["no_signal_streak"] = no_signal_streak(row, previous, cfg.no_signal_steps)
                last = self.step == cfg.steps
                evaluated = (cfg.eval_every and self.step % cfg.eval_every == 0) or last
                if evaluated:
                    with self.full_weights():
                        if main:
                            row.update(self.evaluate())
                if main:
                    self._write(log, row, trackers)
                    splits = ("train", *self.eval_splits) if evaluated else ("train",)
                    self._log_samples(splits, trackers, progress)
                    progress.update(row)
                if last or (cfg.save_every and self.step % cfg.save_every == 0):
                    self.save_checkpoint()
                    saved = self.step
        for tracker in trackers:
            tracker.close()
        self.dist.barrier()
        if cfg.plot and main:
            from textzoo.runners.plot import plot_runs

            plot_runs([self.run_dir], self.run_dir / "curve.png")
        return self.history

    @property
    def eval_prompt_count(self) -> int:
        """Held-out prompts an evaluation plays: `eval_prompts`, at most the held-out items."""
        if self._eval_collector is None:
            return self.cfg.eval_prompts
        return min(self.cfg.eval_prompts, self._eval_collector.envs[0].num_items())

    @property
    def eval_splits(self) -> tuple[str, ...]:
        """The rollout names an evaluation fills: "eval/greedy", "eval/sampled" (as `eval_modes` says)."""
        return tuple(f"eval/{mode}" for mode in self.cfg.eval_modes)

    def _log_samples(self, splits, trackers: list, progress: _Progress) -> None:
        """Append the latest rollouts of ``splits`` to samples.jsonl and the trackers; show the held-out ones,
        a table per decoding mode."""
        for split in splits:
            rows = sample_rows(self.rollouts[split], self.actors, self.step, split, self.cfg.log_completions)
            self.samples.write(rows)
            for tracker in trackers:
                tracker.log_samples(rows, split, self.step)
            if split in self.eval_splits and rows:  # one table per decoding: greedy and sampled can differ a lot
                progress.show(samples_table(rows, f"held-out completions at step {self.step} ({split[5:]})"))

    def _write(self, log, row: dict[str, Any], trackers: list | None = None) -> None:
        self.history.append(row)
        log.write(json.dumps(row, sort_keys=True) + "\n")
        log.flush()
        for tracker in trackers or []:
            tracker.log(row, row["step"])

    # ---- checkpoints -------------------------------------------------------------------------
    def save_checkpoint(self) -> Path | None:
        """Checkpoint the run (every replica takes part; replica 0 writes). Returns the folder on replica 0."""
        own = {"rng": capture_rng(), "family": self.family.state_dict(), "hooks": [h.state_dict() for h in self.hooks]}
        replicas = self.dist.gather(own) if self.dist.enabled else [own]
        # sharded models' weights and optimizer states are gathered by every process, written by rank 0
        learners = {name: learner.state_dict() for name, learner in self.learners.items()}
        models = {name: self._checkpointed(learner.model, gather=True) for name, learner in self.learners.items()}
        if not self.dist.is_main:
            return None
        state = {
            "learners": learners,
            "sampler": self.sampler.state_dict(),
            "replicas": replicas,
            "metrics_rows": len(self.history),
        }
        previous = (list_checkpoints(self.run_dir) or [None])[-1]
        try:
            return write_checkpoint(self.run_dir, self.step, models, state, to_dict(self.cfg), self.cfg.keep_last)
        except Exception as e:  # disk full, quota, file-size limit: the earlier checkpoints are untouched
            needed = checkpoint_bytes(self.learners)[0]
            cause = as_write_error(e, self.run_dir, needed)
            if cause is None:
                raise
            raise write_failure(cause, self.run_dir, self.step, needed, previous) from e

    def _phase(self, phase: str):
        """Turn a CUDA out-of-memory error in `phase` into a `ResourceError` naming the model and the fixes."""
        named = [(a.id, a.policy) for a in self.actors] + [(k, v[0]) for k, v in self._team_models.items()]
        named += [(name, learner.model) for name, learner in self.learners.items()]
        u = self.cfg.update
        settings = (
            f"batch_prompts={self.cfg.batch_prompts}, group_size={self.cfg.group_size}, "
            f"micro_batch_size={u.micro_batch_size}, per_sample_backward={u.per_sample_backward}"
        )
        return out_of_memory(phase, owners_of(named), lambda: (list_checkpoints(self.run_dir) or [None])[-1], settings)

    @staticmethod
    def _checkpointed(model: torch.nn.Module, gather: bool = False):
        """What a checkpoint reads and writes of ``model``: itself, or for a sharded model its whole
        weights (`sharding.FullState`; with ``gather``, gathered now, on rank 0: a collective)."""
        if not sharding.is_sharded(model):
            return model
        return sharding.FullState(model, sharding.full_weights(model) if gather else None)

    def _resume(self) -> None:
        """Continue from the newest intact checkpoint of `run_dir`; validate everything, then load.

        Without any checkpoint the run starts over in its folder (the start is a function of the config).
        """
        path, damage = latest_intact(self.run_dir)
        for problem in damage:
            logger.warning("skipping damaged checkpoint %s", problem)
        if path is None:
            if damage:
                raise CheckpointError(f"no intact checkpoint in {self.run_dir}: " + "; ".join(damage))
            if not (self.run_dir / "config.json").is_file():
                raise CheckpointError(f"{self.run_dir} is not a textzoo run directory (no config.json, no checkpoints)")
            self._truncate_metrics(0, [])
            return
        ck = read_checkpoint(path)
        try:
            saved = from_dict(TrainConfig, ck.config)
        except ConfigError as e:
            raise CheckpointError(f"the config stored in {path} no longer loads: {e}") from e
        diff = config_diff(saved, self.cfg, RESUME_SAFE)
        if diff:
            raise CheckpointError(
                f"the config differs from the one {path.name} was trained with, in: {'; '.join(diff)}. "
                f"Resume with the original values, or start a new run. Fields safe to change: {sorted(RESUME_SAFE)}"
            )
        state = ck.state
        if sorted(ck.weights) != sorted(self.learners) or sorted(state["learners"]) != sorted(self.learners):
            raise CheckpointError(f"{path} trains models {sorted(ck.weights)}, this run trains {sorted(self.learners)}")
        for name, learner in self.learners.items():
            check_weights(self._checkpointed(learner.model), ck.weights[name], name)
            groups = state["learners"][name]["optimizer"]["param_groups"]
            if [len(g["params"]) for g in groups] != [len(g["params"]) for g in learner.optimizer.param_groups]:
                raise CheckpointError(f"the optimizer state of {name!r} in {path} does not fit its parameters")
        if len(state["replicas"]) != self.dist.world_size:
            raise CheckpointError(
                f"{path} was written by {len(state['replicas'])} data-parallel replica(s); resume with as many "
                f"(this run has {self.dist.world_size})"
            )
        rows = self._read_metrics(state["metrics_rows"], path) if self.dist.is_main else []
        # everything checked: now mutate
        for name, learner in self.learners.items():
            apply_weights(self._checkpointed(learner.model), ck.weights[name])
            learner.load_state_dict(state["learners"][name])
        self.sampler.load_state_dict(state["sampler"])
        self.step = self.resumed_step = int(state["step"])
        own = state["replicas"][self.dist.rank]
        self.family.load_state_dict(own["family"])
        for hook, hook_state in zip(self.hooks, own.get("hooks", [])):
            hook.load_state_dict(hook_state)
        restore_rng(own["rng"])
        self._sync_engines()  # the engines get the loaded weights
        if self.dist.is_main:
            self._truncate_metrics(state["metrics_rows"], rows)
            self.samples.truncate(self.step)

    def _read_metrics(self, n: int, path: Path) -> list[str]:
        lines = self.metrics_path.read_text().splitlines() if self.metrics_path.is_file() else []
        if len(lines) < n:
            raise CheckpointError(
                f"{self.metrics_path} has {len(lines)} rows but {path.name} was saved after {n}: the metrics file "
                "was truncated or replaced; restore it or start a new run"
            )
        return lines[:n]

    def _truncate_metrics(self, n: int, lines: list[str]) -> None:
        """Drop rows written after the checkpoint, so the resumed file matches an uninterrupted run."""
        if not self.dist.is_main:
            return
        self.history = [json.loads(line) for line in lines[:n]]
        if self.metrics_path.exists():
            tmp = self.metrics_path.with_suffix(".jsonl.tmp")
            tmp.write_text("".join(line + "\n" for line in lines[:n]))
            os.replace(tmp, self.metrics_path)

    def load_final_weights(self) -> int:
        """Load the trained weights of the newest intact checkpoint of `run_dir`; return its step."""
        path, damage = latest_intact(self.run_dir)
        if path is None:
            detail = "; ".join(damage) if damage else "it has no checkpoints"
            raise CheckpointError(f"cannot load final weights from {self.run_dir}: {detail}")
        ck = read_checkpoint(path)
        self.load_weights(ck.weights, str(path))
        return ck.step

    def load_weights(self, weights: dict[str, dict[str, torch.Tensor]], source: str) -> None:
        """Copy trained weights (learner name -> tensors, as a checkpoint or an exported adapter holds them)
        into this run's models, every one checked before any is copied; the engines get them too."""
        unknown = sorted(set(weights) - set(self.learners))
        if unknown:
            raise CheckpointError(f"{source} holds weights of {unknown}, which this config does not train")
        for name, tensors in weights.items():
            check_weights(self._checkpointed(self.learners[name].model), tensors, name)
        for name, tensors in weights.items():
            apply_weights(self._checkpointed(self.learners[name].model), tensors)
        self._sync_engines(force=True)


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
    for role, lengths in sorted(rollout.infos.get("role_chars", {}).items()):
        if lengths:
            out[f"role/{role}/completion_chars"] = sum(lengths) / len(lengths)
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
    """A rich progress bar with ETA, the training batch's reward and the latest held-out rewards, each named
    (silent when disabled)."""

    def __init__(self, total: int, done: int, enabled: bool = True):
        self.enabled = enabled
        if enabled:
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

            self.bar = Progress(
                TextColumn("[bold]train"),
                BarColumn(),
                TextColumn("{task.completed}/{task.total}"),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                TextColumn("{task.fields[info]}"),
            )
            self.task = self.bar.add_task("train", total=total, completed=done, info="")
        self.held_out = ""

    def __enter__(self):
        if self.enabled:
            self.bar.start()
        return self

    def __exit__(self, *exc):
        if self.enabled:
            self.bar.stop()

    def show(self, renderable: Any) -> None:
        """Print above the bar (nothing when disabled)."""
        if self.enabled:
            self.bar.console.print(renderable)

    def update(self, row: dict[str, Any]) -> None:
        if self.enabled:
            keys = {m: f"eval/{m}/reward/mean" for m in ("sampled", "greedy")}
            held = [f"{m} {row[k]:.3f}" for m, k in keys.items() if k in row]
            if held:
                self.held_out = f"held-out reward: {', '.join(held)}"
            parts = [f"train reward {row['reward/mean']:.3f}"] if "reward/mean" in row else []
            info = " | ".join([*parts, self.held_out] if self.held_out else parts)
            self.bar.update(self.task, completed=row["step"], info=info)
