"""`textzoo bench`: a grid of training runs (tasks x algorithms x collaboration modes x seeds) from TOML.

Grid file (see `benchmarks/grids/cpu-small.toml`)::

    [grid]
    name = "cpu-small"
    out_dir = "runs/bench/cpu-small"          # default: runs/bench/<name>
    tasks = ["writing", "relay"]              # names of [task.NAME] tables
    algos = ["magrpo", "iac"]                 # or "all": every algorithm textzoo has when the grid runs
    collaboration = ["decentralized", "centralized"]
    seeds = [0, 1]
    metric = "eval/sampled/reward/mean"       # the reward the table reports (a metrics.jsonl column)
    exclude = [{ algo = "maac", collaboration = "centralized" }]   # cells matching every given key

    [base]                                    # TrainConfig fields shared by every cell
    steps = 30
    [base.agent]
    max_new_tokens = 16

    [task.writing]                            # this task's TrainConfig fields (`env` is required)
    env = "textzoo/Writing-v0"

    [algo.iac]                                # optional: fields for one algorithm
    [collaboration.centralized]               # optional: fields for one collaboration mode

A cell's `TrainConfig` is `base`, then its task's, algorithm's and collaboration mode's tables, then
its own `algo`, `collaboration`, `seed` and `run_dir`. Config tables (`agent`, `reinforce`, ...)
merge key by key; every other value (including `env_kwargs`) replaces the earlier one.

Each cell trains in `OUT_DIR/<task>/<algo>-<collaboration>-s<seed>/` and, once finished, writes
`bench.json` there (its summary and config): the completed marker. A rerun skips finished cells
and restarts the others (from their newest checkpoint when they have one), so an interrupted grid
resumes; a finished cell whose config no longer matches the grid is an error (use a new out_dir).
At the end (and with `--report` alone) `OUT_DIR/results.md` gets one table per task (start, final
and best reward as mean ± std over seeds, wall time and tokens/s per cell) and
`OUT_DIR/curves-<task>.png` the training reward curves (mean over seeds, min-max band). Tables are
computed from the cells' metrics.jsonl at report time, so a changed `metric` needs no retraining.

`--workers N` trains N cells at once in separate processes (set `threads` in `base` so that
N x threads fits the cores); those processes see only the tasks registered on import of textzoo.
SIGTERM or Ctrl-C stops the grid: running cells finish their step and checkpoint, queued cells never
start, and the same command continues; a grid process that is killed outright takes its workers with
it (Linux: they get SIGTERM and checkpoint too).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import statistics
import sys
import time
import tomllib
import traceback
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import active_children, get_context
from pathlib import Path
from typing import Any

import tyro

from textzoo.algorithms.registry import ALGORITHMS, configure, resolve_algorithm
from textzoo.config import AgentConfig, TrainConfig, migrate_agent
from textzoo.config_files import from_dict, to_dict
from textzoo.errors import ConfigError, TextzooError

logger = logging.getLogger(__name__)

MARKER = "bench.json"
"""File a finished cell writes into its run dir."""

RUN_ONLY_FIELDS = ("run_dir", "progress", "plot", "threads", "env_workers")
"""Config fields that do not change what a cell learns (ignored when checking a finished cell)."""

_MODES = ("decentralized", "centralized")


@dataclass
class BenchArgs:
    """Run a benchmark grid from a TOML file and write results.md and learning-curve PNGs."""

    grid: tyro.conf.Positional[str]
    """The grid TOML file."""
    out_dir: str = ""
    """Output folder (default: the file's grid.out_dir, else runs/bench/<grid name>)."""
    workers: int = 1
    """Cells trained at once, each in its own process."""
    dry_run: bool = False
    """List the cells and whether they are finished; train nothing."""
    report: bool = False
    """Only rewrite results.md and the PNGs from the finished cells."""

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ConfigError(f"workers must be >= 1, got {self.workers}")


@dataclass
class Cell:
    """One training run of the grid."""

    task: str
    algo: str
    collaboration: str
    seed: int
    config: TrainConfig

    @property
    def run_dir(self) -> Path:
        return Path(self.config.run_dir)

    @property
    def label(self) -> str:
        return f"{self.task} {self.algo} {self.collaboration} seed {self.seed}"

    def summary(self) -> dict[str, Any] | None:
        """The finished cell's summary, or None when it has not finished."""
        path = self.run_dir / MARKER
        return json.loads(path.read_text()) if path.is_file() else None

    def error(self) -> str | None:
        """The last line of the traceback of the cell's last failed run (None when it has none)."""
        path = self.run_dir / "error.txt"
        lines = path.read_text().strip().splitlines() if path.is_file() else []
        return lines[-1] if lines else None


@dataclass
class Grid:
    """A parsed grid file: its cells, where they go and which metric the table reports."""

    name: str
    out_dir: Path
    tasks: dict[str, str]  # task name -> env id
    metric: str
    cells: list[Cell]
    source: str


# ---- parsing ---------------------------------------------------------------------------------------
def load_grid(path: str | Path, out_dir: str = "") -> Grid:
    """Read and validate a grid file: every cell's `TrainConfig` is built (and so checked) here."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"grid file {str(path)!r} does not exist")
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"cannot parse grid file {str(path)!r}: {e}") from e
    unknown = sorted(set(data) - {"grid", "base", "task", "algo", "collaboration"})
    if unknown:
        raise ConfigError(f"grid file has unknown table(s) {unknown}; valid: grid, base, task, algo, collaboration")
    grid = data.get("grid", {})
    known = {"name", "out_dir", "tasks", "algos", "collaboration", "seeds", "metric", "exclude"}
    if sorted(set(grid) - known):
        raise ConfigError(f"[grid] has unknown key(s) {sorted(set(grid) - known)}; valid: {sorted(known)}")
    name = str(grid.get("name", path.stem))
    task_tables = data.get("task", {})
    tasks = _names(grid, "tasks", list(task_tables))
    for task in tasks:
        if task not in task_tables or "env" not in task_tables[task]:
            raise ConfigError(f'grid.tasks names {task!r}: add a [task.{task}] table with at least `env = "..."`')
    algos_value = grid.get("algos", "all")
    algos = list(ALGORITHMS) if algos_value == "all" else _names(grid, "algos", None)
    for algo in algos:
        resolve_algorithm(algo)  # an unknown name raises with the list of known ones
    modes = _names(grid, "collaboration", ["decentralized"])
    bad_modes = sorted(set(modes) - set(_MODES))
    if bad_modes:
        raise ConfigError(f"grid.collaboration has {bad_modes}; choose from {list(_MODES)}")
    seeds = grid.get("seeds", [0])
    if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) for s in seeds):
        raise ConfigError(f"grid.seeds must be a non-empty list of ints, got {seeds!r}")
    exclude = grid.get("exclude", [])
    if not isinstance(exclude, list) or not all(isinstance(e, dict) and e for e in exclude):
        raise ConfigError(
            'grid.exclude must be a list of tables such as { algo = "maac", collaboration = "centralized" }'
        )
    for rule in exclude:
        if sorted(set(rule) - {"task", "algo", "collaboration", "seed"}):
            raise ConfigError(f"grid.exclude entry {rule} may only use the keys task, algo, collaboration, seed")

    root = Path(out_dir or grid.get("out_dir") or Path("runs") / "bench" / name)
    base = data.get("base", {})
    for key in ("algo", "collaboration", "seed", "run_dir"):
        if key in base:
            raise ConfigError(f"[base] sets {key!r}, which the grid sets per cell; list it in [grid] instead")
    cells = []
    for task in tasks:
        for algo in algos:
            for mode in modes:
                for seed in seeds:
                    values = {"task": task, "algo": algo, "collaboration": mode, "seed": seed}
                    if any(all(values[k] == v for k, v in rule.items()) for rule in exclude):
                        continue
                    merged = base
                    for layer in (
                        task_tables[task],
                        data.get("algo", {}).get(algo, {}),
                        data.get("collaboration", {}).get(mode, {}),
                    ):
                        merged = merge_config(merged, layer)
                    run_dir = root / task / f"{algo}-{mode}-s{seed}"
                    merged = {**merged, "algo": algo, "collaboration": mode, "seed": seed, "run_dir": str(run_dir)}
                    try:
                        config = from_dict(TrainConfig, merged)
                        configure(config)  # the algorithm's defaults and rules, as the run will check them
                    except TextzooError as e:
                        raise ConfigError(f"grid cell {task}/{algo}/{mode}/seed {seed}: {e}") from e
                    _check_metric(grid, config, f"grid cell {task}/{algo}/{mode}/seed {seed}")
                    cells.append(Cell(task, algo, mode, seed, config))
    if not cells:
        raise ConfigError("the grid has no cells: check tasks, algos, collaboration, seeds and exclude")
    metric = str(grid.get("metric", "eval/greedy/reward/mean"))
    return Grid(name, root, {t: task_tables[t]["env"] for t in tasks}, metric, cells, str(path))


def _check_metric(grid: dict, config: TrainConfig, where: str) -> None:
    """An eval/<mode>/... metric needs that mode in the cell's eval_modes (else the table would be empty)."""
    metric = str(grid.get("metric", "eval/greedy/reward/mean"))
    parts = metric.split("/")
    if parts[0] == "eval" and len(parts) > 1 and parts[1] not in config.eval_modes:
        raise ConfigError(
            f"{where}: grid.metric {metric!r} needs eval_modes to include {parts[1]!r}, "
            f"got {list(config.eval_modes)}; add it or choose an eval/{config.eval_modes[0]}/... metric"
        )


def _names(grid: dict, key: str, default: list[str] | None) -> list[str]:
    value = grid.get(key, default)
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"grid.{key} must be a non-empty list of names, got {value!r}")
    return list(dict.fromkeys(value))


def _tables(cls: type) -> dict[str, type]:
    """The fields of config dataclass `cls` that are config dataclasses themselves (its tables), by name."""
    return {
        f.name: f.default_factory
        for f in dataclasses.fields(cls)
        if f.default_factory is not dataclasses.MISSING and dataclasses.is_dataclass(f.default_factory)
    }


def merge_config(base: dict[str, Any], layer: dict[str, Any], cls: type = TrainConfig) -> dict[str, Any]:
    """`layer` over `base` (dicts for `cls`): config tables (agent, reinforce, agent.lora, ...) merge key by key,
    other values replace. An agent table in an older layout (flat `lora_rank`) is read as today's first."""
    out = dict(base)
    tables = _tables(cls)
    for key, value in layer.items():
        if key in tables and isinstance(value, dict) and isinstance(out.get(key), dict):
            old, new = out[key], value
            if issubclass(tables[key], AgentConfig):
                old, new = migrate_agent(old, f"{key}."), migrate_agent(new, f"{key}.")
            out[key] = merge_config(old, new, tables[key])
        else:
            out[key] = value
    return out


# ---- running ---------------------------------------------------------------------------------------
def comparable(config: dict[str, Any]) -> dict[str, Any]:
    """A config dict without the fields that do not change what a cell learns."""
    return {k: v for k, v in config.items() if k not in RUN_ONLY_FIELDS}


class Stopped(Exception):
    """A cell stopped early on SIGTERM / Ctrl-C (checkpointed); the grid stops with it."""


_GRID_STOP = None  # in a pool worker: the grid's stop event (set: start no further cell)


def _worker_init(parent: int, stop) -> None:
    """A pool worker: no signal while idle ends it (a cell's Trainer handles them while it trains), and
    it is sent SIGTERM when the grid's process dies (Linux), so a running cell checkpoints and stops."""
    global _GRID_STOP
    _GRID_STOP = stop
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    if sys.platform.startswith("linux"):  # prctl(PR_SET_PDEATHSIG, SIGTERM)
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)
    if os.getppid() != parent:  # the grid died before prctl took effect
        stop.set()


def run_cell(config: dict[str, Any], metric: str) -> dict[str, Any]:
    """Train one cell (resuming when its run dir holds a run) and write its completed marker."""
    from textzoo.runners.trainer import Trainer

    if _GRID_STOP is not None and _GRID_STOP.is_set():
        raise Stopped(f"the grid is stopping: {Path(config['run_dir']).name} not started")
    cfg = from_dict(TrainConfig, config)
    run_dir = Path(cfg.run_dir)
    resume = run_dir if (run_dir / "config.json").is_file() else None
    start = time.perf_counter()
    trainer = Trainer(cfg, resume=resume)
    history = trainer.train()
    wall = time.perf_counter() - start
    trainer.collector.close()
    if trainer.stopped_by:  # not finished: no marker, so the next run resumes this cell
        raise Stopped(f"stopped by {trainer.stopped_by} in {run_dir.name} at step {trainer.step}")
    summary = summarize(history, metric)
    summary.update({"wall_s": wall, "resumed": resume is not None, "config": to_dict(cfg)})
    tmp = run_dir / (MARKER + ".tmp")
    tmp.write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, run_dir / MARKER)
    (run_dir / "error.txt").unlink(missing_ok=True)  # from an earlier failed try
    return summary


def summarize(history: list[dict[str, Any]], metric: str) -> dict[str, Any]:
    """Start / final / best of `metric` (best over evaluations after step 0) and mean tokens/s."""
    evals = [(row["step"], row[metric]) for row in history if row.get(metric) is not None]
    trained = [value for step, value in evals if step > 0]
    speeds = [row["time/tokens_per_s"] for row in history if "time/tokens_per_s" in row]
    return {
        "metric": metric,
        "start": evals[0][1] if evals and evals[0][0] == 0 else None,
        "final": trained[-1] if trained else None,
        "best": max(trained) if trained else None,
        "tokens_per_s": statistics.fmean(speeds) if speeds else None,
        "steps": max((row["step"] for row in history), default=0),
    }


def _run_or_fail(config: dict[str, Any], metric: str) -> dict[str, Any]:
    """`run_cell`, turning a failure into a summary with its error (the traceback goes to error.txt)."""
    try:
        return run_cell(config, metric)
    except Stopped:
        raise
    except Exception as e:  # one broken cell must not stop the grid; it is reported and retried next run
        run_dir = Path(config["run_dir"])
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "error.txt").write_text(traceback.format_exc())
        return {"error": f"{type(e).__name__}: {e}"}


def run_grid(grid: Grid, workers: int = 1, log: Callable[[str], None] | None = None) -> dict[str, dict[str, Any]]:
    """Train every unfinished cell; return label -> summary (with "error" for failed cells).

    Progress lines go to `log` (default: this module's logger at INFO)."""
    log = log or logger.info
    results: dict[str, dict[str, Any]] = {}
    todo: list[Cell] = []
    for cell in grid.cells:
        summary = cell.summary()
        if summary is None:
            todo.append(cell)
            continue
        saved = to_dict(from_dict(TrainConfig, summary["config"]))  # a config of an older layout read as today's
        if comparable(saved) != comparable(to_dict(cell.config)):
            raise ConfigError(
                f"{cell.run_dir} finished with a different config than the grid now gives it; "
                "write the changed grid to a new out_dir (or delete that cell's folder to retrain it)"
            )
        results[cell.label] = summary
    log(f"{grid.name}: {len(grid.cells)} cells, {len(results)} finished, {len(todo)} to train")
    done = len(results)

    def report(cell: Cell, summary: dict[str, Any]) -> None:
        nonlocal done
        done += 1
        results[cell.label] = summary
        if "error" in summary:
            log(f"[{done}/{len(grid.cells)}] {cell.label}: FAILED ({summary['error']}; see {cell.run_dir}/error.txt)")
        else:
            log(
                f"[{done}/{len(grid.cells)}] {cell.label}: final {_num(summary['final'])}, "
                f"best {_num(summary['best'])} in {summary['wall_s']:.0f} s"
            )

    jobs = [(cell, {**to_dict(cell.config), "progress": False, "plot": False}) for cell in todo]
    if workers == 1:
        for cell, config in jobs:
            report(cell, _run_or_fail(config, grid.metric))
    elif jobs:
        _run_parallel(jobs, grid.metric, workers, report)
    return results


def _run_parallel(jobs: list[tuple[Cell, dict[str, Any]]], metric: str, workers: int, report) -> None:
    """Cells in `workers` processes. SIGTERM / Ctrl-C to the grid, or a cell stopped by one, stops the
    grid: running cells get SIGTERM (each checkpoints after its step), queued ones never start, and
    `Stopped` is raised once every worker is done."""
    from textzoo.runners.preemption import GracefulStop

    context = get_context("spawn")
    halt = context.Event()
    stopped: Stopped | None = None
    with (
        GracefulStop() as signalled,
        ProcessPoolExecutor(workers, context, initializer=_worker_init, initargs=(os.getpid(), halt)) as pool,
    ):
        futures = {pool.submit(_run_or_fail, config, metric): cell for cell, config in jobs}
        pending = set(futures)
        while pending:
            if signalled.requested and stopped is None:
                stopped = Stopped(f"stopped by {signalled.name}")
            if stopped is not None and not halt.is_set():
                halt.set()
                for future in pending:
                    future.cancel()
                for child in active_children():  # the pool's workers; a repeat of the user's Ctrl-C counts once
                    os.kill(child.pid, signal.SIGTERM)
            finished = {f for f in pending if f.done()}
            for future in finished:
                if future.cancelled():
                    continue
                try:
                    report(futures[future], future.result())
                except Stopped as e:
                    stopped = stopped or e
            pending -= finished
            if pending:
                time.sleep(0.2)
    if stopped is not None:
        raise stopped


# ---- reporting -------------------------------------------------------------------------------------
def _num(value: float | None, digits: int = 3) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _spread(values: list[float | None]) -> str:
    """mean ± std over seeds (sample std; the mean alone for one seed)."""
    xs = [v for v in values if v is not None]
    if not xs:
        return "n/a"
    if len(xs) == 1:
        return f"{xs[0]:.3f}"
    return f"{statistics.fmean(xs):.3f} ± {statistics.stdev(xs):.3f}"


def _mean(values: list[float | None], digits: int) -> str:
    xs = [v for v in values if v is not None]
    return f"{statistics.fmean(xs):.{digits}f}" if xs else "n/a"


def write_report(grid: Grid, results: dict[str, dict[str, Any]]) -> Path:
    """Write OUT_DIR/results.md (and results.json, curves-<task>.png); return the Markdown path."""
    grid.out_dir.mkdir(parents=True, exist_ok=True)
    finished = sum("error" not in s for s in results.values())
    failed = sum("error" in s for s in results.values())
    lines = [
        f"# Benchmark `{grid.name}`",
        "",
        f"Grid `{grid.source}`: {len(grid.cells)} cells, {finished} finished, {failed} failed, "
        f"{len(grid.cells) - finished - failed} not run. Reward: `{grid.metric}`, mean ± std over seeds; "
        "start = before training, final = at the last step, best = the highest evaluation after step 0. "
        "Wall time (of the run that finished the cell) and generated tokens/s: mean per cell.",
    ]
    from textzoo.runners.plot import read_metrics

    results = {
        c.label: (
            results[c.label]
            if "error" in results[c.label]
            else {**results[c.label], **summarize(read_metrics(c.run_dir), grid.metric)}
        )
        for c in grid.cells
        if c.label in results
    }
    for task, env_id in grid.tasks.items():
        lines += [
            "",
            f"## {task} (`{env_id}`)",
            "",
            "| algo | mode | seeds | start | final | best | wall s | tokens/s |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        groups: dict[tuple[str, str], list[Cell]] = {}
        for cell in grid.cells:
            if cell.task == task:
                groups.setdefault((cell.algo, cell.collaboration), []).append(cell)
        for (algo, mode), cells in groups.items():
            done = [results[c.label] for c in cells if c.label in results and "error" not in results[c.label]]
            errors = [results[c.label]["error"] for c in cells if "error" in results.get(c.label, {})]
            if not done:
                status = f"failed: {errors[0]}" if errors else "not run"
                lines.append(f"| {algo} | {mode} | 0/{len(cells)} | {status} | | | | |")
                continue
            lines.append(
                f"| {algo} | {mode} | {len(done)}/{len(cells)} | {_spread([s['start'] for s in done])} | "
                f"{_spread([s['final'] for s in done])} | {_spread([s['best'] for s in done])} | "
                f"{_mean([s['wall_s'] for s in done], 0)} | {_mean([s['tokens_per_s'] for s in done], 0)} |"
            )
        png = plot_task(grid, task, results)
        if png is not None:
            lines += ["", f"![{task}]({png.name})"]
    md = grid.out_dir / "results.md"
    md.write_text("\n".join(lines) + "\n")
    (grid.out_dir / "results.json").write_text(
        json.dumps(
            {label: {k: v for k, v in s.items() if k != "config"} for label, s in results.items()},
            indent=2,
            sort_keys=True,
        )
        + "\n"
    )
    return md


def plot_task(grid: Grid, task: str, results: dict[str, dict[str, Any]], smooth: int = 5) -> Path | None:
    """Training reward per step of each (algo, mode) of `task`: mean over seeds, min-max band."""
    from textzoo.runners.plot import read_metrics

    curves: dict[tuple[str, str], list[dict[int, float]]] = {}
    for cell in grid.cells:
        if cell.task != task or "error" in results.get(cell.label, {"error": ""}):
            continue
        rows = read_metrics(cell.run_dir)
        curves.setdefault((cell.algo, cell.collaboration), []).append(
            {row["step"]: row["reward/mean"] for row in rows if "reward/mean" in row}
        )
    if not curves:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    algos = list(dict.fromkeys(algo for algo, _ in curves))  # one colour per algorithm, one line style per mode
    for (algo, mode), seeds in curves.items():
        steps = sorted(set.intersection(*(set(s) for s in seeds)))
        if not steps:
            continue
        per_seed = [_moving_average([s[t] for t in steps], smooth) for s in seeds]
        mean = [statistics.fmean(v) for v in zip(*per_seed)]
        color = plt.get_cmap("tab10")(algos.index(algo) % 10)
        ax.plot(steps, mean, label=f"{algo}, {mode}", color=color, linestyle="-" if mode == "decentralized" else "--")
        if len(per_seed) > 1:
            ax.fill_between(
                steps, [min(v) for v in zip(*per_seed)], [max(v) for v in zip(*per_seed)], color=color, alpha=0.12
            )
    ax.set_title(f"{grid.name}: {task} ({grid.tasks[task]}), training reward, moving average over {smooth} steps")
    ax.set_xlabel("step")
    ax.set_ylabel("reward/mean")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    out = grid.out_dir / f"curves-{task}.png"
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def _moving_average(values: list[float], window: int) -> list[float]:
    return [statistics.fmean(values[max(0, i - window + 1) : i + 1]) for i in range(len(values))]


def main(argv: list[str]) -> None:
    """`textzoo bench GRID.toml [--workers N] [--dry-run] [--report]`: prints the cells' progress and results."""
    from textzoo.runners.console import console

    out, err = console(), console(stderr=True)
    args = tyro.cli(BenchArgs, args=argv, prog="textzoo bench")
    grid = load_grid(args.grid, args.out_dir)
    if args.dry_run:
        for cell in grid.cells:
            state = "finished" if cell.summary() is not None else "failed" if cell.error() else "to train"
            out.print(f"{cell.label:<50} {state:<9} {cell.run_dir}")
        out.print(f"{len(grid.cells)} cells")
        return
    if args.report:
        results = {}
        for cell in grid.cells:
            summary, error = cell.summary(), cell.error()
            if summary is not None or error is not None:
                results[cell.label] = summary if summary is not None else {"error": error}
    else:
        start = time.perf_counter()
        try:
            results = run_grid(grid, args.workers, log=out.print)
        except Stopped as e:
            out.print(f"{e}; the same command continues the grid (finished cells are kept, this one resumes)")
            return
        err.print(f"grid time: {time.perf_counter() - start:.0f} s")
    out.print(f"results: {write_report(grid, results)}")
    if any("error" in s for s in results.values()):
        raise TextzooError("some cells failed; their error.txt says why, and a rerun retries them")


__all__ = ["BenchArgs", "Cell", "Grid", "load_grid", "main", "merge_config", "run_grid", "summarize", "write_report"]
