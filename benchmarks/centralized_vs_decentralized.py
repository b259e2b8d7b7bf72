"""Centralized (one joint model answers for every role) vs decentralized (one model per role).

For each algorithm family that exists (its first algorithm in `ALGORITHMS`, or `--algos`), on
textzoo/Writing-v0 and textzoo/Relay-v0, trains both modes with the same seeds, settings and total
actor parameter budget, then writes into `--out`:
- `results.md`: a Markdown table (also printed), `results.json`: the same numbers;
- `curves.png`: training reward (3-step moving average, mean over seeds) against steps and wall seconds;
- `runs/*/metrics.jsonl`: every run's log.

Parameter budget: the decentralized team has N tiny GPT-2 policies of `--n-layer` layers; the joint
model has the same width and as many layers as brings its parameter count closest to the team's
total (critics, when a family has them, are built like the actors). Columns:
- final: mean training reward of the last 3 steps; best: the best 3-step moving average;
- eval greedy: held-out greedy reward before -> after training;
- gain/s: (final − mean reward of the first 3 steps) / training wall seconds (evaluation excluded);
- parse fail: share of joint completions with no section for any role (0 by construction when
  decentralized); tokens: completion tokens generated in training.

Tasks: Writing-v0 with its pure length-ratio reward, `--max-new-tokens` per agent (the joint budget
is N x that); Relay-v0 with messages and answers restricted to one symbol token (A-D); one role acts
per turn there, so the joint budget is one token too.

    OMP_NUM_THREADS=1 python benchmarks/centralized_vs_decentralized.py --out runs/cvd
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import tyro

from textzoo.algorithms.registry import ALGORITHMS
from textzoo.config import AgentConfig, TrainConfig
from textzoo.errors import TextzooError
from textzoo.models.policy import Policy
from textzoo.runners.trainer import Trainer

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

MODES = ("decentralized", "centralized")


@dataclass
@harness.defaults(batch_prompts=4, max_new_tokens=24)
class Args(harness.Rollouts, harness.TinyGPT2):
    """Centralized-vs-decentralized benchmark settings (`max_new_tokens`: each agent's budget on Writing-v0,
    the joint actor's N times that; `n_layer`: each decentralized agent's, the joint model's depth is matched
    to the team's parameters)."""

    out: str = "runs/centralized_vs_decentralized"
    """Output folder (table, JSON, PNG, run logs); runs/ is git-ignored."""
    algos: tuple[str, ...] = ()
    """Algorithms to compare; empty = the first algorithm of every family in ALGORITHMS."""
    envs: tuple[str, ...] = ("textzoo/Writing-v0", "textzoo/Relay-v0")
    """Tasks (Writing-v0 and Relay-v0 have tuned settings below; others use the Writing ones)."""
    seeds: tuple[int, ...] = (0, 1, 2)
    """Seeds; every (algo, env, mode) runs each, the two modes alternating seed by seed (the rounds)."""
    writing_steps: int = 15
    """Training steps on Writing-v0."""
    relay_steps: int = 30
    """Training steps on Relay-v0."""
    lr: float = 1e-3
    """Learning rate of every model."""
    eval_prompts: int = 8
    """Held-out prompts of the start and end evaluations."""


def count_params(n_layer: int, n_embd: int) -> int:
    return sum(p.numel() for p in Policy.tiny(n_layer=n_layer, n_embd=n_embd).model.parameters())


def joint_depth(num_roles: int, n_layer: int, n_embd: int) -> tuple[int, int, int]:
    """(depth, params) of the joint model closest to `num_roles` agents' total, and that total."""
    team = num_roles * count_params(n_layer, n_embd)
    depths = range(1, 4 * num_roles * n_layer + 1)
    best = min(depths, key=lambda d: abs(count_params(d, n_embd) - team))
    return best, count_params(best, n_embd), team


def task_settings(env: str, args: Args) -> dict:
    """TrainConfig fields of one task (shared by both modes)."""
    if env == "textzoo/Relay-v0":
        return {
            "env_kwargs": {},
            "steps": args.relay_steps,
            "joint_max_new_tokens": 1,
            "agent": {"max_new_tokens": 1, "allowed_outputs": ("A", "B", "C", "D")},
        }
    return {"steps": args.writing_steps, "agent": {"max_new_tokens": args.max_new_tokens}}


def run_one(algo: str, env: str, mode: str, seed: int, args: Args, n_layer: int, run_dir: Path) -> dict:
    task = task_settings(env, args)
    agent = AgentConfig(**{**args.tiny(), "n_layer": n_layer}, lr=args.lr, **task.pop("agent"))
    cfg = TrainConfig(
        env=env,
        algo=algo,
        collaboration=mode,
        seed=seed,
        agent=agent,
        batch_prompts=args.batch_prompts,
        group_size=args.group_size,
        eval_prompts=args.eval_prompts,
        run_dir=str(run_dir),
        overwrite=True,  # a rerun of the benchmark starts its runs over
        progress=False,
        plot=False,
        threads=1,
        **task,
    )
    start = time.perf_counter()
    trainer = Trainer(cfg)
    history = trainer.train()
    wall = time.perf_counter() - start
    params = sum(p.numel() for a in trainer.actors for p in a.policy.model.parameters())
    train = [r for r in history if "reward/mean" in r]
    rewards = [r["reward/mean"] for r in train]
    smooth = [sum(rewards[max(0, i - 2) : i + 1]) / len(rewards[max(0, i - 2) : i + 1]) for i in range(len(rewards))]
    seconds = [r["time/step"] for r in train]
    train_s = sum(seconds)
    first, final = sum(rewards[:3]) / len(rewards[:3]), sum(rewards[-3:]) / len(rewards[-3:])
    return {
        "algo": algo,
        "env": env,
        "mode": mode,
        "seed": seed,
        "params": params,
        "steps": len(train),
        "final": final,
        "best": max(smooth),
        "first": first,
        "eval_start": history[0]["eval/greedy/reward/mean"],
        "eval_end": history[-1]["eval/greedy/reward/mean"],
        "gain_per_s": (final - first) / train_s,
        "train_s": train_s,
        "wall_s": wall,
        "parse_fail": sum(r["parse_failure_rate"] for r in train) / len(train),
        "tokens": sum(r["tokens_generated"] for r in train),
        "curve": smooth,
        "curve_s": [sum(seconds[: i + 1]) for i in range(len(seconds))],
    }


def alternate_modes(algo: str, env: str, args: Args, layers: dict[str, int]) -> harness.Alternation:
    """Both modes of ``algo`` on ``env``, seed after seed (decentralized, centralized, decentralized, ...): each
    round's figures are ``{"run": run_one's dict or {"error": ...}, "train_s": ...}``."""
    seeds = {mode: iter(args.seeds) for mode in MODES}

    def side(mode: str):
        def run() -> dict:
            seed = next(seeds[mode])
            run_dir = Path(args.out) / "runs" / f"{algo}-{env.split('/')[-1]}-{mode}-s{seed}"
            try:
                r = run_one(algo, env, mode, seed, args, layers[mode], run_dir)
            except TextzooError as e:  # a family that refuses this setting: report it, go on
                print(f"  {algo:8s} {mode:13s} seed {seed}: not run: {e}", flush=True)
                return {"run": {"error": str(e)}, "train_s": float("nan")}
            print(
                f"  {algo:8s} {mode:13s} seed {seed}: final {r['final']:.3f} best {r['best']:.3f} "
                f"parse fail {r['parse_fail']:.2f} ({r['wall_s']:.0f} s)",
                flush=True,
            )
            return {"run": r, "train_s": r["train_s"]}

        return run

    return harness.alternate({mode: side(mode) for mode in MODES}, len(args.seeds))


def mean_over_seeds(runs: list[dict]) -> dict:
    out = dict(runs[0])
    for key in (
        "final",
        "best",
        "first",
        "eval_start",
        "eval_end",
        "gain_per_s",
        "train_s",
        "wall_s",
        "parse_fail",
        "tokens",
    ):
        out[key] = sum(r[key] for r in runs) / len(runs)
    for key in ("curve", "curve_s"):
        out[key] = [sum(v) / len(v) for v in zip(*(r[key] for r in runs))]
    out["seeds"] = len(runs)
    return out


def table(rows: list[dict]) -> str:
    head = (
        "| algo | env | mode | actor params | steps | final | best | eval greedy | gain/s | train s "
        "| parse fail | tokens |\n|---|---|---|---:|---:|---:|---:|---|---:|---:|---:|---:|"
    )
    lines = [
        f"| {r['algo']} | {r['env'].split('/')[-1]} | {r['mode']} | not run: {r['error']} |||||||||"
        if "error" in r
        else f"| {r['algo']} | {r['env'].split('/')[-1]} | {r['mode']} | {r['params']:,} | {r['steps']} "
        f"| {r['final']:.3f} "
        f"| {r['best']:.3f} | {r['eval_start']:.3f} -> {r['eval_end']:.3f} | {r['gain_per_s']:+.4f} "
        f"| {r['train_s']:.1f} "
        f"| {r['parse_fail']:.2f} | {r['tokens']:,.0f} |"
        for r in rows
    ]
    return "\n".join([head, *lines])


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    envs = list(dict.fromkeys(r["env"] for r in rows))
    algos = list(dict.fromkeys(r["algo"] for r in rows))
    fig, axes = plt.subplots(len(envs), 2 * len(algos), figsize=(4.2 * 2 * len(algos), 3.2 * len(envs)), squeeze=False)
    for i, env in enumerate(envs):
        for j, algo in enumerate(algos):
            for k, xkey in enumerate(("step", "wall s")):
                ax = axes[i][2 * j + k]
                for r in rows:
                    if r["env"] == env and r["algo"] == algo and "curve" in r:
                        xs = range(1, len(r["curve"]) + 1) if xkey == "step" else r["curve_s"]
                        ax.plot(list(xs), r["curve"], label=r["mode"])
                ax.set_title(f"{env.split('/')[-1]} / {algo}", fontsize=9)
                harness.label(ax, xkey, "train reward (3-step MA)")
    harness.save(fig, path, dpi=110)


def main(args: Args) -> None:
    torch.set_num_threads(1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    families: dict[str, str] = {}
    for name, algorithm in ALGORITHMS.items():
        families.setdefault(algorithm.family, name)
    algos = list(args.algos) or list(families.values())
    rows, notes = [], []
    for env in args.envs:
        from textzoo.envs import make

        probe = make(env, **task_settings(env, args).get("env_kwargs", {}))
        num_roles = len(probe.possible_agents)
        probe.close()
        depth, joint_params, team_params = joint_depth(num_roles, args.n_layer, args.n_embd)
        print(
            f"{env}: {num_roles} roles; team {num_roles} x {args.n_layer} layers = {team_params:,} params, "
            f"joint {depth} layers = {joint_params:,} params"
        )
        for algo in algos:
            alt = alternate_modes(algo, env, args, {"decentralized": args.n_layer, "centralized": depth})
            for mode in MODES:
                runs = alt.values(mode, "run")
                error = next((r["error"] for r in runs if "error" in r), None)
                rows.append(
                    {"algo": algo, "env": env, "mode": mode, "error": error} if error else mean_over_seeds(runs)
                )
            if not any("error" in r for mode in MODES for r in alt.values(mode, "run")):
                ratio = alt.ratio("train_s", "centralized", "decentralized").format("x")
                notes.append(f"{algo} on {env}: train s centralized / decentralized, seed by seed: {ratio}")
    md = table(rows)
    note = (
        f"\n\nSeeds {list(args.seeds)}, the two modes alternating seed by seed; B={args.batch_prompts} prompts x "
        f"G={args.group_size} samples per step; width {args.n_embd}; decentralized agents {args.n_layer} layers "
        f"each; CPU, 1 thread. Learning figures are means over the seeds.\n" + "".join(f"\n{n}" for n in notes)
    )
    (out / "results.md").write_text(md + note)
    (out / "results.json").write_text(json.dumps(rows, indent=1))
    plot(rows, out / "curves.png")
    print(md + note)
    print(f"wrote {out / 'results.md'}, {out / 'results.json'}, {out / 'curves.png'}")


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main(tyro.cli(Args))
