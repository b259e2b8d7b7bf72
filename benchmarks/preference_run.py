"""Short MADPO and MARLHF runs on textzoo/Writing-v0 (length ratio): reward before/after, RM accuracy, wall time.

    OMP_NUM_THREADS=1 python benchmarks/preference_run.py [--steps 20] [--out /tmp/preference-runs]

Prints one line per run. "before"/"after" are the sampled-eval team rewards on held-out prompts at
steps 0 and the end, and the mean training reward of the first/last five steps (MARLHF: the task reward,
not the reward model's).
"""

from __future__ import annotations

import argparse
import time

import torch

from textzoo.agents.preference import PreferenceConfig
from textzoo.runners.config import AgentConfig, TrainConfig
from textzoo.runners.trainer import Trainer

WRITING = {"terms": {"length_ratio": 1.0}, "max_prompt_chars": 128}


def run(name: str, cfg: TrainConfig) -> None:
    start = time.perf_counter()
    history = Trainer(cfg).train()
    wall = time.perf_counter() - start
    rows = [r for r in history if r["step"] > 0]
    key = "reward/task/mean" if cfg.algo == "marlhf" else "reward/mean"
    train = [r[key] for r in rows]
    line = (
        f"{name}: eval sampled {history[0]['eval/sampled/reward/mean']:.3f} -> "
        f"{history[-1]['eval/sampled/reward/mean']:.3f}"
        f" | train {sum(train[:5]) / 5:.3f} -> {sum(train[-5:]) / 5:.3f}"
    )
    rm = [r for r in rows if "rm/heldout_accuracy" in r]
    for r in rm:
        line += (
            f" | round {int(r['round'])}: RM held-out acc {r['rm/heldout_accuracy_before']:.2f} -> "
            f"{r['rm/heldout_accuracy']:.2f} ({int(r['rm/heldout_pairs'])} pairs), "
            f"train acc {r['rm/train_accuracy']:.2f}"
        )
    if cfg.algo == "marlhf":
        line += f" | RM reward {rows[0]['reward/rm']:.2f} -> {rows[-1]['reward/rm']:.2f}"
    print(f"{line} | wall {wall:.0f}s ({wall / cfg.steps:.1f}s/step)", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--out", default="/tmp/preference-runs")
    args = parser.parse_args()
    torch.set_num_threads(1)
    common = dict(
        steps=args.steps,
        batch_prompts=4,
        group_size=4,
        progress=False,
        plot=False,
        seed=0,
        env_kwargs=WRITING,
        agent=AgentConfig(max_new_tokens=24, lr=5e-3),
        eval_prompts=8,
    )
    run(
        "madpo",
        TrainConfig(
            algo="madpo", run_dir=f"{args.out}/madpo", preference=PreferenceConfig(beta=0.5, epochs=2), **common
        ),
    )
    run(
        "marlhf+magrpo",
        TrainConfig(
            algo="marlhf",
            rl_algo="magrpo",
            iterations=2,
            run_dir=f"{args.out}/marlhf",
            preference=PreferenceConfig(rm_batches=4, rm_epochs=4, replay_pairs=32),
            **common,
        ),
    )


if __name__ == "__main__":
    main()
