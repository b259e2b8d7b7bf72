"""Side by side: CoMLRL 1.4.3 (MAGRPO) and textzoo (magrpo) train the same tiny models, offline.

    pip install --no-deps comlrl==1.4.3 && pip install datasets wandb   # CoMLRL imports both; torch untouched
    OMP_NUM_THREADS=1 python benchmarks/peer_comlrl.py
    OMP_NUM_THREADS=1 python benchmarks/peer_comlrl.py --max-new-tokens 64 --steps 12

Same for both: two tiny GPT-2 agents built locally by `Policy.tiny` (identical initial weights: the
seeds textzoo's builder uses), the byte tokenizer, `textzoo/Writing-v0`'s length-ratio reward
(`length_ratio_score(summary, elaboration)`), the same prompts in the same order, G samples per
prompt, `max_new_tokens`, temperature 1 with top-p and top-k off, AdamW at the same learning rate,
one prompt per step and one update per step (CoMLRL trains one prompt per step; its
`rollout_buffer_size=1` updates after each). CoMLRL is handed the model and tokenizer objects, so
it loads and downloads nothing; wandb stays off.

Each side runs in its own process (so peak RSS is its own) for `warmup` + `steps` prompts; the
figures are means over the `steps` measured ones. A joint action is one set of completions, one per
agent (G per prompt). textzoo is measured twice: with CoMLRL's settings (B = 1 prompt per step) and
with `--batch-prompts` prompts per step in lock-step (its batched design; same per-prompt work).
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from dataclasses import asdict, dataclass

import torch
import tyro

from textzoo.agents.policy import GenerationConfig, Policy
from textzoo.envs import make
from textzoo.envs.writing_v0 import length_ratio_score
from textzoo.runners.build import ItemSampler
from textzoo.runners.config import AgentConfig, TrainConfig, UpdateConfig
from textzoo.runners.trainer import Trainer

ENV_KWARGS = {"terms": {"length_ratio": 1.0}}


@dataclass
class Args:
    """Benchmark settings shared by both libraries."""

    group_size: int = 4
    """Samples per prompt (CoMLRL's num_generations)."""
    max_new_tokens: int = 32
    """Completion token budget."""
    n_layer: int = 2
    """Layers of the tiny GPT-2."""
    n_embd: int = 64
    """Width of the tiny GPT-2."""
    lr: float = 1e-3
    """AdamW learning rate (both)."""
    steps: int = 8
    """Measured steps (prompts for CoMLRL)."""
    warmup: int = 2
    """Steps run before measuring."""
    batch_prompts: int = 8
    """Prompts per step of the second textzoo run (its lock-step batching)."""
    workers: int = 2
    """textzoo's threads for generating and updating agents in parallel (both cores; 1 = sequential)."""
    micro_batch_size: int = 32
    """textzoo's samples per forward/backward."""
    seed: int = 0
    """textzoo's seed: agent i is built with seed 1000 * seed + i, as textzoo's builder does."""
    side: str = ""
    """Internal: run one side ("comlrl" or "textzoo") in this process and print its JSON."""


def textzoo_config(a: Args, batch_prompts: int) -> TrainConfig:
    agent = AgentConfig(n_layer=a.n_layer, n_embd=a.n_embd, n_head=2, lr=a.lr, max_new_tokens=a.max_new_tokens,
                        temperature=1.0, top_p=1.0, top_k=0)
    return TrainConfig(env="textzoo/Writing-v0", env_kwargs=ENV_KWARGS, algo="magrpo", agent=agent,
                       steps=a.warmup + a.steps, batch_prompts=batch_prompts, group_size=a.group_size, seed=a.seed,
                       threads=1, progress=False, plot=False, run_dir="runs/peer-comlrl-textzoo",
                       generate_workers=a.workers,
                       update=UpdateConfig(micro_batch_size=a.micro_batch_size, parallel_jobs=a.workers))


def run_textzoo(a: Args, batch_prompts: int) -> dict:
    trainer = Trainer(textzoo_config(a, batch_prompts))
    rows = [trainer.train_step() for _ in range(a.warmup + a.steps)][a.warmup:]
    seconds = sum(r["time/step"] for r in rows)
    return {
        "s_per_step": seconds / len(rows),
        "joint_actions_per_s": batch_prompts * a.group_size * len(rows) / seconds,
        "tokens_per_s": sum(r["tokens_generated"] for r in rows) / seconds,
        "reward_mean": sum(r["reward/mean"] for r in rows) / len(rows),
    }


def run_comlrl(a: Args) -> dict:
    os.environ.setdefault("WANDB_MODE", "disabled")
    from datasets import Dataset
    from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer

    env = make("textzoo/Writing-v0", **ENV_KWARGS)
    roles = env.possible_agents  # summary, elaboration
    # the prompts textzoo's sampler serves, in its order
    items = ItemSampler(env.num_items(), a.seed).next(a.warmup + a.steps)
    rows = []
    for index in items:
        prompts, _ = env.reset(options={"index": index})
        rows.append({role: prompts[role] for role in roles})
    gen = GenerationConfig(max_new_tokens=a.max_new_tokens)
    policies = [Policy.tiny("gpt2", n_layer=a.n_layer, n_embd=a.n_embd, n_head=2, seed=1000 * a.seed + i,
                            generation=gen) for i in range(len(roles))]

    def reward(summaries, elaborations):
        return [length_ratio_score(s, e) for s, e in zip(summaries, elaborations)]

    config = MAGRPOConfig(
        num_train_epochs=1, agent_learning_rate=a.lr, logging_steps=10**6, num_agents=len(roles),
        num_generations=a.group_size, max_new_tokens=a.max_new_tokens, temperature=1.0, top_p=1.0, top_k=0,
        num_turns=1, eval_interval=0, rollout_buffer_size=1,
    )
    trainer = MAGRPOTrainer(
        agents=[p.model for p in policies], num_agents=len(roles), tokenizer=policies[0].tokenizer,
        train_dataset=Dataset.from_list(rows), reward_func=reward,
        formatters=[lambda item, role=role: item[role] for role in roles], args=config,
    )
    step_times: list[float] = []
    tokens: list[int] = []
    rewards: list[float] = []
    generate, train_step, compute_rewards = (trainer._generate_completions, trainer._train_step_returns,
                                             trainer._compute_rewards)

    # instance-level wrappers: count what CoMLRL generates and time each of its steps
    def counted_generate(*args, **kwargs):
        out = generate(*args, **kwargs)
        tokens[-1] += sum(out["response_lens"])
        return out

    def timed_step(*args, **kwargs):
        tokens.append(0)
        start = time.perf_counter()
        out = train_step(*args, **kwargs)
        step_times.append(time.perf_counter() - start)
        return out

    def recorded_rewards(*args, **kwargs):
        out = compute_rewards(*args, **kwargs)
        rewards.extend(out)
        return out

    trainer._generate_completions, trainer._train_step_returns, trainer._compute_rewards = (
        counted_generate, timed_step, recorded_rewards)
    trainer.verbose = False
    trainer.train()
    seconds = sum(step_times[a.warmup:])
    measured = len(step_times) - a.warmup
    return {
        "s_per_step": seconds / measured,
        "joint_actions_per_s": a.group_size * measured / seconds,
        "tokens_per_s": sum(tokens[a.warmup:]) / seconds,
        "reward_mean": sum(rewards[a.warmup * a.group_size:]) / (measured * a.group_size),
    }


def run_side(a: Args) -> None:
    torch.set_num_threads(1)
    if a.side == "comlrl":
        out = run_comlrl(a)
    else:
        out = run_textzoo(a, 1 if a.side == "textzoo" else a.batch_prompts)
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(out))


def child(a: Args, side: str) -> dict:
    flags = [arg for k, v in asdict(a).items() if k != "side" for arg in (f"--{k.replace('_', '-')}", str(v))]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run([sys.executable, __file__, *flags, "--side", side], capture_output=True, text=True, env=env)
    if done.returncode:
        raise SystemExit(f"the {side} run failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    a = tyro.cli(Args)
    if a.side:
        return run_side(a)
    try:
        import comlrl  # noqa: F401
    except ImportError as e:
        raise SystemExit(f"CoMLRL is not installed ({e}): pip install --no-deps comlrl==1.4.3 && "
                         "pip install datasets wandb") from e
    results = {"comlrl": child(a, "comlrl"), "textzoo": child(a, "textzoo"), "textzoo_batched": child(a, "textzoo_batched")}
    columns = [("CoMLRL 1.4.3", "comlrl"), ("textzoo B=1", "textzoo"), (f"textzoo B={a.batch_prompts}", "textzoo_batched")]
    print(f"tiny GPT-2 ({a.n_layer} layers x {a.n_embd}), 2 agents, G={a.group_size}, {a.max_new_tokens} new tokens, "
          f"{a.steps} measured steps after {a.warmup}, 1 thread each\n")
    print("| figure | " + " | ".join(name for name, _ in columns) + " | textzoo B=1 / CoMLRL | "
          f"textzoo B={a.batch_prompts} / CoMLRL |")
    print("| --- " * (len(columns) + 3) + "|")
    for key, label in (("joint_actions_per_s", "joint actions/s"), ("tokens_per_s", "tokens/s"),
                       ("s_per_step", "s/step"), ("peak_rss_mb", "peak RSS MB"), ("reward_mean", "train reward")):
        values = [results[side][key] for _, side in columns]
        ratios = [f"{v / values[0]:.2f}x" for v in values[1:]]
        if key == "s_per_step":  # a batched step plays batch_prompts prompts: not comparable per step
            ratios[1] = "n/a"
        print(f"| {label} | " + " | ".join(f"{v:.3f}" if key in ("s_per_step", "reward_mean") else f"{v:.1f}"
                                          for v in values) + " | " + " | ".join(ratios) + " |")
    print("\n" + json.dumps({"args": {k: v for k, v in asdict(a).items() if k != "side"}, **results}))


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
