"""Run a `textzoo bench` grid end to end with tiny models in place of its models: a dry run of the
whole pipeline (every cell's config, env, rollouts, updates, evaluation, results.md, curves) in
minutes, before the real grid spends hours.

Every cell keeps its grid config except: each agent's model (and every `model` in agent_overrides)
becomes a tiny GPT-2 built locally ("tiny", `--n-layer`/`--n-embd`; LoRA, when the grid uses it, on
peft's default modules), float32 on the CPU, its prompts raw (a tiny model has no chat template), at most
`--max-new-tokens` tokens per turn (and `--max-prompt-tokens` of prompt), `--steps` steps of
`--batch-prompts` x `--group-size`, `--eval-prompts` held-out prompts (`--one-per-algo`: only the first
cell of each algorithm). It prints the cells as they
finish and the path of results.md; the figures are those of untrained tiny models, a check of the
pipeline, not a result.

    OMP_NUM_THREADS=1 python benchmarks/grid_smoke.py benchmarks/grids/cpu-smollm2.toml --out-dir /tmp/smoke
"""

from __future__ import annotations

import dataclasses
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import tyro

from textzoo.config import TrainConfig
from textzoo.runners.bench import Grid, load_grid, run_grid, write_report

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

_MODEL_KEYS = (
    "model",
    "precision",
    "prompt_format",
    "max_new_tokens",
    "max_prompt_tokens",
)


@dataclass(kw_only=True)  # the positional grid file after the inherited settings
@harness.defaults(batch_prompts=2, group_size=2, max_new_tokens=16, n_layer=1, n_embd=32)
class Args(harness.Rollouts, harness.TinyGPT2):
    """Every cell's schedule and models (`max_new_tokens`: at most that per turn, a role's smaller budget kept)."""

    grid: tyro.conf.Positional[str]
    """The grid TOML file."""
    out_dir: str = "runs/bench/smoke"
    """Where the tiny grid writes its cells and results.md."""
    steps: int = 2
    """Training steps of every cell."""
    eval_prompts: int = 2
    """Held-out prompts of every cell's evaluations."""
    max_prompt_tokens: int = 384
    """At most that many prompt tokens."""
    workers: int = 1
    """Cells trained at once, each in its own process."""
    one_per_algo: bool = False
    """Train only the first cell of each algorithm (first task, mode and seed); every cell's config is still
    built and checked."""


def tiny_config(cfg: TrainConfig, args: Args, run_dir: Path) -> TrainConfig:
    """`cfg` with tiny local models and a short schedule (see the module docstring)."""
    agent = dataclasses.replace(
        cfg.agent,
        model="tiny",
        **args.tiny(),
        precision="fp32",  # the field itself: a grid's precision (or its migrated legacy dtype) is replaced
        prompt_format="auto",  # a tiny model has no chat template: "chat" would be refused
        lora=dataclasses.replace(cfg.agent.lora, target_modules=()),
        max_new_tokens=min(cfg.agent.max_new_tokens, args.max_new_tokens),
        max_prompt_tokens=min(cfg.agent.max_prompt_tokens, args.max_prompt_tokens),
    )
    overrides = {
        role: {k: v for k, v in fields.items() if k not in _MODEL_KEYS} for role, fields in cfg.agent_overrides.items()
    }
    for fields in overrides.values():  # a real model's module names: the tiny model has others
        if isinstance(fields.get("lora"), dict):
            fields["lora"] = {k: v for k, v in fields["lora"].items() if k != "target_modules"}
    for role, fields in cfg.agent_overrides.items():  # keep a role's smaller token budget
        if "max_new_tokens" in fields:
            overrides[role]["max_new_tokens"] = min(fields["max_new_tokens"], args.max_new_tokens)
    return dataclasses.replace(
        cfg,
        agent=agent,
        agent_overrides=overrides,
        joint_max_new_tokens=min(cfg.joint_max_new_tokens, 2 * args.max_new_tokens),
        steps=args.steps,
        batch_prompts=args.batch_prompts,
        group_size=args.group_size,
        eval_prompts=args.eval_prompts,
        eval_every=0,
        save_every=0,
        devices="cpu",
        device_map={},
        report_to=(),
        num_processes=1,
        run_dir=str(run_dir),
    )


def tiny_grid(grid: Grid, args: Args) -> Grid:
    out = Path(args.out_dir)
    cells = [
        dataclasses.replace(c, config=tiny_config(c.config, args, out / c.task / c.run_dir.name)) for c in grid.cells
    ]
    if args.one_per_algo:
        cells = [c for i, c in enumerate(cells) if c.algo not in {d.algo for d in cells[:i]}]
    return dataclasses.replace(grid, name=f"{grid.name} (tiny models)", out_dir=out, cells=cells)


def main(args: Args) -> None:
    grid = tiny_grid(load_grid(args.grid), args)
    start = time.perf_counter()
    results = run_grid(grid, args.workers, log=lambda line: print(line, flush=True))
    print(f"grid time: {time.perf_counter() - start:.0f} s ({len(grid.cells)} cells, tiny models)")
    print(f"results: {write_report(grid, results)}")
    failed = [label for label, s in results.items() if "error" in s]
    if failed:
        print(f"FAILED: {failed}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main(tyro.cli(Args))
