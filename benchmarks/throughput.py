"""Training throughput: joint actions/s, generated tokens/s, s/step and peak RSS.

    OMP_NUM_THREADS=1 python benchmarks/throughput.py                       # 2 agents, tiny GPT-2, G=4, 32 tokens
    OMP_NUM_THREADS=1 python benchmarks/throughput.py --agents 4
    OMP_NUM_THREADS=1 python benchmarks/throughput.py --n-embd 128 --n-layer 4 --max-new-tokens 64   # ~883k params
    OMP_NUM_THREADS=1 python benchmarks/throughput.py --baseline /tmp/base   # against another checkout

A joint action is one env copy's set of completions (one per agent). Every figure printed is measured
in this run; a comparison with a peer library is `benchmarks/peer_comlrl.py`, which runs both side by
side on the same prompts and weights.

Each round trains `--warmup` + `--steps` steps in a fresh process and takes the medians over the
measured steps; the table gives each figure's median and range over `--rounds` rounds (default 3).
`--baseline DIR` measures another checkout of textzoo (e.g. `git worktree add /tmp/base main`) the same
way, its rounds alternating with this checkout's (this, base, this, base, ...), and prints the ratios
round by round. On a shared machine wall time depends on the load, so the script also prints process CPU
seconds per step and a load-free estimate for two idle cores: the step's CPU time with each parallel
section (the agents' generate calls of a turn, the learners' update jobs) counted at its longest thread
instead of its sum (`est.`; it ignores contention between the two threads, e.g. for the GIL, so it is an
upper bound on the speed-up).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import tyro

from textzoo.config import AgentConfig, TrainConfig, UpdateConfig
from textzoo.envs import make
from textzoo.models.policy import Policy
from textzoo.runners import trainer as trainer_module
from textzoo.runners import update as update_module
from textzoo.runners.rollout import Collector
from textzoo.runners.trainer import Trainer

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402


@dataclass
class Args(harness.Common, harness.Rollouts, harness.TinyGPT2):
    agents: int = 2
    """Agents in the team (Team-v0 with a length-ratio reward when != 2, Writing-v0 otherwise)."""
    algo: str = "magrpo"
    """The algorithm trained (`textzoo train --algo`)."""
    steps: int = 6
    """Measured steps (after `warmup`); a side's figures are medians over them."""
    warmup: int = 2
    """Steps run before measuring."""
    micro_batch_size: int = 32
    """Samples per forward/backward of the update."""
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
    baseline: str = ""
    """Another textzoo checkout to measure in alternating rounds with this one (its folder)."""
    one: bool = False
    """Internal: measure once in this process and print the figures as JSON."""


def _length_reward(prompts, completions, **_):
    return [min(len(c) / 60.0, 1.0) for c in completions]


def _writing_prompts() -> list[str]:
    """The summary prompts of Writing-v0 (~150-250 characters), shared by every Team-v0 agent."""
    env = make("textzoo/Writing-v0")
    prompts = [env.reset(seed=0, options={"index": i})[0]["summary"] for i in range(env.num_items())]
    env.close()
    return prompts


def config(a: Args) -> TrainConfig:
    agent = AgentConfig(**a.tiny(), max_new_tokens=a.max_new_tokens)
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
        seed=a.seed,
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


def measure(a: Args) -> dict:
    """Train `warmup` + `steps` steps in this process; the figures of the measured ones (medians)."""
    harness.setup(a.threads)
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
    rows, cpu, est = [], [], []
    for i in range(a.steps + a.warmup):
        with harness.Clock() as step:
            row = trainer.train_step()
        saved = clock.saved()
        if i >= a.warmup:
            rows.append(row)
            cpu.append(step.cpu)
            est.append(step.cpu - saved)

    def median(key: str) -> float:
        return statistics.median(r[key] for r in rows)

    per_step = a.batch_prompts * a.group_size
    return {
        "params_per_agent": sum(p.numel() for p in trainer.actors[0].policy.model.parameters()),
        "joint_actions_per_s": per_step / median("time/step"),
        "tokens_per_s": median("time/tokens_per_s"),
        "s_per_step": median("time/step"),
        "s_generate": median("time/generate"),
        "s_update": median("time/update"),
        "cpu_s_per_step": statistics.median(cpu),
        "est_2core_s_per_step": statistics.median(est),
        "est_2core_joint_actions_per_s": per_step / statistics.median(est),
        "peak_rss_mb": harness.peak_rss_mib(),
        "reward_first": rows[0]["reward/mean"],
    }


FIGURES = {
    "joint_actions_per_s": "joint actions/s",
    "tokens_per_s": "tokens/s",
    "s_per_step": "s/step",
    "s_generate": "s generate",
    "s_update": "s update",
    "cpu_s_per_step": "CPU s/step",
    "est_2core_s_per_step": "est. 2 idle cores s/step",
    "est_2core_joint_actions_per_s": "est. 2 idle cores joint actions/s",
    "peak_rss_mb": "peak RSS MB",
    "reward_first": "reward (first measured step)",
}
RATIOS = ("joint_actions_per_s", "tokens_per_s", "cpu_s_per_step", "est_2core_joint_actions_per_s")


def main() -> None:
    a = tyro.cli(Args)
    if a.one:
        print(json.dumps(measure(a)))
        return
    command = [sys.executable, __file__, *harness.cli_flags(a, skip=("results", "baseline")), "--one"]
    sides = {"this checkout": lambda: harness.run_json(command, a.threads)}
    if a.baseline:
        base = Path(a.baseline).resolve()
        sides[f"baseline {a.baseline}"] = lambda: harness.run_json(command, a.threads, {"PYTHONPATH": str(base)})
    alt = harness.alternate(sides, a.rounds)
    reference = f"baseline {a.baseline}" if a.baseline else None
    header, rows = harness.compare(alt, FIGURES, reference=reference, ratios=RATIOS)
    params = alt.values("this checkout", "params_per_agent")[0]
    title = (
        f"{a.algo}: {a.agents} agents of {params:,} parameters (GPT-2 {a.n_layer} x {a.n_embd}), "
        f"B={a.batch_prompts}, G={a.group_size}, {a.max_new_tokens} new tokens, {a.steps} measured steps after "
        f"{a.warmup}, {a.threads} thread(s), {a.generate_workers} generate / {a.parallel_jobs} update worker(s)"
    )
    notes = [alt.note(), "A side's figures are medians over its measured steps; est. = CPU time with each parallel "
             "section counted at its longest thread (an upper bound on two idle cores' speed)."]  # fmt: skip
    harness.report(a.results, "throughput", title, header, rows, {"args": harness.cli_flags(a), **alt.to_json()}, notes)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
