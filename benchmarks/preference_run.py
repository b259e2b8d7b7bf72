"""MARLHF against MAGRPO at the same number of environment steps, over seeds: the table of issue 18.

    OMP_NUM_THREADS=1 python benchmarks/preference_run.py [--task default|writing] [--seeds 0 1 2]
        [--variants marlhf magrpo] [--steps 80] [--out /tmp/preference-runs]

`--task default` is the embedded default (`textzoo train`: two tiny GPT-2s on textzoo/WritingRatio-v0,
80 steps of 8 prompts x 4 samples); `writing` is textzoo/Writing-v0 with all four reward terms.
Every variant is a `TrainConfig` of that task plus the overrides in VARIANTS (name -> JSON-like
dict, the same fields as the command line). A variant named "magrpo..." is run for as many steps as
the environment steps of the first marlhf variant listed of that seed, divided by the episodes of
one step, so both spend the same environment steps: a marlhf run's environment steps are its online
episodes (steps x batch_prompts x group_size) plus the episodes it played to train its reward model
(`rm/episodes`).

Printed per run: the held-out sampled task reward at step 0 and at the end (over every eval prompt,
`--eval-prompts`), the gain, environment steps, and for marlhf the reward model's mean held-out pair
accuracy over rounds, the mean Pearson / Spearman / within-prompt pair accuracy of its scores against
the task reward on the fresh online episodes, and the steps flagged as reward hacking; then per variant
the mean and std over seeds, and each marlhf variant's mean gain as a share of magrpo's. Wall times
are this machine's, with the thread count printed.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import time
from pathlib import Path
from typing import Any

import torch

from textzoo.config import TrainConfig
from textzoo.config_files import from_dict, to_dict
from textzoo.runners.trainer import Trainer

TASKS: dict[str, dict[str, Any]] = {
    "default": {},  # the embedded default: TrainConfig() as `textzoo train` runs it
    "writing": {"env": "textzoo/Writing-v0"},  # all four terms
}

VARIANTS: dict[str, dict[str, Any]] = {
    "magrpo": {"algo": "magrpo"},
    "marlhf": {"algo": "marlhf"},  # today's defaults
    # the reward model before issue 18: a few gap pairs of 2 batches, a trained last-token model over
    # 512 tokens, 4 x 4 updates, no early stopping
    "marlhf-before": {
        "algo": "marlhf",
        "preference": {
            "rm_pooling": "last",
            "rm_train_trunk": True,
            "rm_pair_selection": "gap",
            "rm_pairs_per_prompt": 4,
            "rm_early_stopping": False,
            "rm_batches": 2,
            "rm_epochs": 4,
            "rm_minibatches": 4,
            "rm_max_tokens": 512,
        },
    },
    # one change from the defaults each
    "marlhf-frozen": {"algo": "marlhf", "preference": {"rm_train_trunk": False, "rm_lr": 3e-3}},
    "marlhf-last": {"algo": "marlhf", "preference": {"rm_pooling": "last"}},
    "marlhf-512": {"algo": "marlhf", "preference": {"rm_max_tokens": 512}},
    "marlhf-noes": {"algo": "marlhf", "preference": {"rm_early_stopping": False}},
    "marlhf-kl": {"algo": "marlhf", "reinforce": {"kl_coef": 0.02}},
    "marlhf-ens": {"algo": "marlhf", "preference": {"rm_ensemble": 4, "rm_disagreement_penalty": 1.0}},
}


def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = merge(out.get(k, {}), v) if isinstance(v, dict) and not k.endswith("kwargs") else v
    return out


def build(task: str, variant: dict[str, Any], seed: int, args, steps: int | None = None) -> TrainConfig:
    base = to_dict(TrainConfig())
    data = merge(merge(base, TASKS[task]), variant)
    data.update(seed=seed, progress=False, plot=True, eval_prompts=args.eval_prompts, threads=1, overwrite=True)
    data["steps"] = steps or args.steps
    return from_dict(TrainConfig, data)


def run(cfg: TrainConfig, run_dir: Path) -> dict[str, float]:
    start = time.perf_counter()
    history = Trainer(cfg, run_dir=run_dir).train()
    wall = time.perf_counter() - start
    rows = [r for r in history if r["step"] > 0]
    rm_episodes = max((r.get("rm/episodes", 0.0) for r in rows), default=0.0)
    out = {
        "before": history[0]["eval/sampled/reward/mean"],
        "after": history[-1]["eval/sampled/reward/mean"],
        "env_steps": cfg.steps * cfg.batch_prompts * cfg.group_size + rm_episodes,
        "wall": wall,
    }
    out["gain"] = out["after"] - out["before"]
    if cfg.algo == "marlhf":
        out["rm_episodes"] = rm_episodes

        def mean(key: str) -> float:
            values = [r[key] for r in rows if key in r and not math.isnan(r[key])]
            return sum(values) / len(values) if values else float("nan")

        out.update(
            heldout_acc=mean("rm/heldout_accuracy"),
            pearson=mean("rm/pearson"),
            spearman=mean("rm/spearman"),
            group_acc=mean("rm/group_accuracy"),
            hacking_steps=sum(r.get("rm/hacking", 0.0) for r in rows),
        )
    return out


def line(name: str, seed: int, r: dict[str, float]) -> str:
    text = (
        f"{name:<16} seed {seed}: eval sampled {r['before']:.3f} -> {r['after']:.3f} (gain {r['gain']:+.3f}) "
        f"| env steps {int(r['env_steps'])}"
    )
    if "heldout_acc" in r:
        text += (
            f" (rm {int(r['rm_episodes'])}) | RM held-out acc {r['heldout_acc']:.3f}, fresh pearson "
            f"{r['pearson']:.3f} spearman {r['spearman']:.3f} group acc {r['group_acc']:.3f}, "
            f"hacking steps {int(r['hacking_steps'])}"
        )
    return text + f" | wall {r['wall']:.0f}s"


def stats(values: list[float]) -> str:
    mean = sum(values) / len(values)
    std = (sum((v - mean) ** 2 for v in values) / max(len(values) - 1, 1)) ** 0.5
    return f"{mean:+.3f} ± {std:.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", choices=sorted(TASKS), default="default")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--variants", nargs="+", default=["marlhf", "magrpo"])
    parser.add_argument("--set", action="append", default=[], metavar="NAME=JSON", help="add or replace a variant")
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--eval-prompts", type=int, default=80, help="held-out prompts per evaluation")
    parser.add_argument("--out", default="/tmp/preference-runs")
    args = parser.parse_args()
    torch.set_num_threads(1)
    variants = dict(VARIANTS)
    for spec in args.set:
        name, _, text = spec.partition("=")
        variants[name] = json.loads(text)
    print(f"task {args.task}, seeds {args.seeds}, {args.steps} steps, threads {torch.get_num_threads()}", flush=True)
    results: dict[str, list[dict[str, float]]] = {v: [] for v in args.variants}
    online = [v for v in args.variants if variants[v].get("algo") != "marlhf"]
    for seed in args.seeds:
        marlhf_steps = []
        for name in [v for v in args.variants if v not in online]:
            cfg = build(args.task, variants[name], seed, args)
            r = run(cfg, Path(args.out) / args.task / f"{name}-s{seed}")
            results[name].append(r)
            marlhf_steps.append(r["env_steps"])
            print(line(name, seed, r), flush=True)
        per_step = TrainConfig().batch_prompts * TrainConfig().group_size
        for name in online:
            steps = round(marlhf_steps[0] / per_step) if marlhf_steps else args.steps  # the first marlhf variant's
            cfg = build(args.task, variants[name], seed, args, steps)
            r = run(cfg, Path(args.out) / args.task / f"{name}-s{seed}")
            results[name].append(r)
            print(line(name, seed, r), flush=True)
    print(f"\n| variant | env steps | eval sampled before | after | gain (mean ± std over {len(args.seeds)} seeds) |")
    print("| --- | --- | --- | --- | --- |")
    for name, rs in results.items():
        env = sum(r["env_steps"] for r in rs) / len(rs)
        before, after = stats([r["before"] for r in rs]), stats([r["after"] for r in rs])
        print(f"| {name} | {env:.0f} | {before.lstrip('+')} | {after.lstrip('+')} | {stats([r['gain'] for r in rs])} |")
    reference = [v for v in online if v.startswith("magrpo")]
    if reference:
        base = sum(r["gain"] for r in results[reference[0]]) / len(args.seeds)
        for name in [v for v in args.variants if v not in online]:
            gain = sum(r["gain"] for r in results[name]) / len(args.seeds)
            print(f"{name}: mean gain {gain:+.3f} = {gain / base:.0%} of {reference[0]}'s {base:+.3f}")
    print(f"curves: {args.out}/{args.task}/<variant>-s<seed>/curve.png")


if __name__ == "__main__":
    main()
