"""Training throughput: joint actions/s, generated tokens/s, s/step and peak RSS.

    OMP_NUM_THREADS=1 python benchmarks/throughput.py                       # 2 agents, tiny GPT-2, G=4, 32 tokens
    OMP_NUM_THREADS=1 python benchmarks/throughput.py --agents 4
    OMP_NUM_THREADS=1 python benchmarks/throughput.py --n-embd 128 --n-layer 4 --max-new-tokens 64   # ~883k params

A joint action is one env copy's set of completions (one per agent). Every figure printed is measured
in this run; a comparison with a peer library is `benchmarks/peer_comlrl.py`, which runs both side by
side on the same prompts and weights.

Figures are medians over `--steps` measured steps. On a shared machine wall time depends on the
load, so the script also prints process CPU seconds per step and a load-free estimate for two idle
cores: the step's CPU time with each parallel section (the agents' generate calls of a turn, the
learners' update jobs) counted at its longest thread instead of its sum (`est_*`; it ignores
contention between the two threads, e.g. for the GIL, so it is an upper bound on the speed-up).
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import sys
import threading
import time
from dataclasses import dataclass

import torch
import tyro

from textzoo.config import AgentConfig, TrainConfig, UpdateConfig
from textzoo.envs import make
from textzoo.models.policy import Policy
from textzoo.runners import trainer as trainer_module
from textzoo.runners import update as update_module
from textzoo.runners.rollout import Collector
from textzoo.runners.trainer import Trainer


@dataclass
class Args:
    agents: int = 2
    """Agents in the team (Team-v0 with a length-ratio reward when != 2, Writing-v0 otherwise)."""
    algo: str = "magrpo"
    n_layer: int = 2
    n_embd: int = 64
    n_head: int = 2
    group_size: int = 4
    batch_prompts: int = 32
    """Prompts per step (B)."""
    max_new_tokens: int = 32
    steps: int = 6
    warmup: int = 2
    threads: int = 1
    micro_batch_size: int = 32
    per_sample_backward: bool = False
    fast_forward: bool = True
    """Use the plain-torch forward (textzoo.decoding.fastlm) where the architecture supports it."""
    share_prompts: bool = True
    """Run each distinct prompt once per generate / score call (group prefix sharing)."""
    parallel_jobs: int = 2
    """Agents updated at once in threads (update.parallel_jobs): both cores with threads=1."""
    generate_workers: int = 2
    """Agents generating at once in threads (TrainConfig.generate_workers)."""
    critic_model: str = ""
    """iac/ippo: "actor" puts the value head on the actor's trunk (actor_critic.critic_model)."""


def _length_reward(prompts, completions, **_):
    return [min(len(c) / 60.0, 1.0) for c in completions]


def _writing_prompts() -> list[str]:
    """The summary prompts of Writing-v0 (~150-250 characters), shared by every Team-v0 agent."""
    env = make("textzoo/Writing-v0")
    prompts = [env.reset(seed=0, options={"index": i})[0]["summary"] for i in range(env.num_items())]
    env.close()
    return prompts


def config(a: Args) -> TrainConfig:
    agent = AgentConfig(n_layer=a.n_layer, n_embd=a.n_embd, n_head=a.n_head, max_new_tokens=a.max_new_tokens)
    if a.agents == 2:
        env, env_kwargs = "textzoo/Writing-v0", {"terms": {"length_ratio": 1.0}}
    else:
        env, env_kwargs = "textzoo/Team-v0", {"agents": a.agents}
    cfg = TrainConfig(
        env=env,
        env_kwargs=env_kwargs,
        algo=a.algo,
        agent=agent,
        steps=a.steps + a.warmup,
        batch_prompts=a.batch_prompts,
        group_size=a.group_size,
        threads=a.threads,
        progress=False,
        plot=False,
        generate_workers=a.generate_workers,
        run_dir="/tmp/textzoo-throughput",
        overwrite=True,  # each measurement starts over
        update=UpdateConfig(
            micro_batch_size=a.micro_batch_size,
            per_sample_backward=a.per_sample_backward,
            parallel_jobs=a.parallel_jobs,
        ),
    )
    cfg.actor_critic.critic_model = a.critic_model
    return cfg


class ThreadClock:
    """Thread CPU seconds of the calls made inside parallel sections, per section and thread."""

    def __init__(self) -> None:
        self.sections: list[dict[int, float]] = []

    def section(self, fn):
        def wrapped(*args, **kwargs):
            self.sections.append({})
            return fn(*args, **kwargs)

        return wrapped

    def call(self, fn):
        def wrapped(*args, **kwargs):
            start = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                per_thread = self.sections[-1]
                thread = threading.get_ident()
                per_thread[thread] = per_thread.get(thread, 0.0) + time.thread_time() - start

        return wrapped

    def saved(self) -> float:
        """CPU seconds that idle cores would overlap: per section, all threads' time but the longest's."""
        out = sum(sum(t.values()) - max(t.values()) for t in self.sections if t)
        self.sections.clear()
        return out


def main() -> None:
    a = tyro.cli(Args)
    torch.set_num_threads(a.threads)
    cfg = config(a)
    if a.agents != 2:
        # Team-v0 needs a reward callable, which a config file cannot hold: set it on the config object
        cfg.env_kwargs = {
            "agents": a.agents,
            "reward_fns": _length_reward,
            "prompts": _writing_prompts(),
            "split": "all",
        }
    clock = ThreadClock()
    Collector._generate = clock.section(Collector._generate)
    Policy.generate = clock.call(Policy.generate)
    trainer_module.run_jobs = clock.section(update_module.run_jobs)
    update_module.run_job = clock.call(update_module.run_job)
    trainer = Trainer(cfg)
    for actor in trainer.actors:
        actor.policy.fast_forward = a.fast_forward
        actor.policy.share_prompts = a.share_prompts
    params = sum(p.numel() for p in trainer.actors[0].policy.model.parameters())
    rows, cpu, est = [], [], []
    for i in range(a.steps + a.warmup):
        start = time.process_time()
        row = trainer.train_step()
        used = time.process_time() - start
        saved = clock.saved()
        if i >= a.warmup:
            rows.append(row)
            cpu.append(used)
            est.append(used - saved)

    def median(key: str) -> float:
        return statistics.median(r[key] for r in rows)

    step_s = median("time/step")
    joint = a.batch_prompts * a.group_size / step_s
    tokens = median("time/tokens_per_s")
    out = {
        "params_per_agent": params,
        "agents": a.agents,
        "algo": a.algo,
        "B": a.batch_prompts,
        "G": a.group_size,
        "max_new_tokens": a.max_new_tokens,
        "threads": a.threads,
        "parallel_jobs": a.parallel_jobs,
        "generate_workers": a.generate_workers,
        "s_per_step": round(step_s, 4),
        "s_generate": round(median("time/generate"), 4),
        "s_update": round(median("time/update"), 4),
        "cpu_s_per_step": round(statistics.median(cpu), 4),
        "est_2core_s_per_step": round(statistics.median(est), 4),
        "est_2core_joint_actions_per_s": round(a.batch_prompts * a.group_size / statistics.median(est), 1),
        "load_avg_1min": round(os.getloadavg()[0], 2),
        "joint_actions_per_s": round(joint, 1),
        "tokens_per_s": round(tokens, 1),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "reward_first": round(rows[0]["reward/mean"], 3),
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
