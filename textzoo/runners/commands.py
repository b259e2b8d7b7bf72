"""The `textzoo` commands (train, eval, export, plot, sft, bench, serve-engine) over the same dataclass configs
as the Python API.

`textzoo.runners.cli` parses the command name and imports this module only when a command runs.
Results are printed with rich (`textzoo.runners.console`); the library's log records show on stderr.
The configs are plain data, so `--help` and a config error answer before torch is imported; a
command says on stderr what it loads before it takes seconds to do so.
"""

from __future__ import annotations

import json
import os
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal

import tyro

from textzoo.config import JsonDict, SFTArgs, TrainConfig
from textzoo.config_files import load_config
from textzoo.errors import CheckpointError, ConfigError, EngineError
from textzoo.runners.console import console


def _split_config(argv: list[str]) -> tuple[str | None, list[str]]:
    """Pull `--config PATH` (or `--config=PATH`) out of argv."""
    rest, path = [], None
    it = iter(range(len(argv)))
    for i in it:
        arg = argv[i]
        if arg == "--config" and i + 1 < len(argv):
            path = argv[i + 1]
            next(it)
        elif arg.startswith("--config="):
            path = arg.split("=", 1)[1]
        else:
            rest.append(arg)
    return path, rest


def _split_option(argv: list[str], name: str) -> tuple[str | None, list[str]]:
    """Pull `name VALUE` (or `name=VALUE`) out of argv."""
    rest, value = [], None
    it = iter(range(len(argv)))
    for i in it:
        arg = argv[i]
        if arg == name and i + 1 < len(argv):
            value = argv[i + 1]
            next(it)
        elif arg.startswith(f"{name}="):
            value = arg.split("=", 1)[1]
        else:
            rest.append(arg)
    return value, rest


def status(text: str) -> None:
    """Say on stderr what a command is about to do (stdout stays the command's result)."""
    console(stderr=True).print(f"{text} ...")


def _run_config(run_dir: str) -> TrainConfig:
    """The config a run dir was trained with (its config.json, else its newest checkpoint's)."""
    from textzoo.runners.checkpoint import list_checkpoints

    for path in [Path(run_dir) / "config.json", *[c / "config.json" for c in reversed(list_checkpoints(run_dir))]]:
        if path.is_file():
            return load_config(path)
    raise CheckpointError(
        f"{run_dir!r} is not a textzoo run directory (no config.json): pass a folder written by textzoo train"
    )


def train(argv: list[str]) -> None:
    """Parse a TrainConfig (file + flags) and train.

    `--resume RUN_DIR` continues that run (its config, with any flags on top); `--resume auto` continues
    the newest run with this config, or starts one. `--num-processes K` trains K data-parallel replicas.
    """
    path, rest = _split_config(argv)
    resume, rest = _split_option(rest, "--resume")
    explicit = resume if resume and resume != "auto" else None
    default = load_config(path) if path else _run_config(explicit) if explicit else TrainConfig()
    description = (
        "Train a team of LLM agents on a text task. Add --config FILE to start from a file, "
        "--resume RUN_DIR|auto to continue a run."
    )
    if "-h" in rest or "--help" in rest:
        description += "\n\n" + registered()
    cfg = tyro.cli(TrainConfig, default=default, args=rest, prog="textzoo train", description=description)
    models = sorted({cfg.agent.model, *(cfg.agent_config(role).model for role in cfg.agent_overrides)})
    status(f"training {cfg.algo} on {cfg.env} ({', '.join(models)} models, {cfg.steps} steps): loading torch")
    from textzoo.runners.trainer import Trainer, default_run_dir

    if cfg.num_processes > 1 and "WORLD_SIZE" not in os.environ:
        from textzoo.runners.distributed import launch

        # every replica must write to (and resume from) one folder: fix it before they start
        run_dir = explicit or cfg.run_dir or str(default_run_dir(cfg))
        launch(_train_replica, cfg.num_processes, cfg, run_dir, resume)
        return
    trainer = Trainer(cfg, run_dir=explicit, resume=resume)
    trainer.train()
    if trainer.dist.is_main:
        _summary(trainer)


def registered() -> str:
    """What `--env` and `--algo` accept now: the registered tasks and algorithms, those that installed packages
    register through entry points included (`textzoo.plugins`)."""
    from textzoo.algorithms.registry import algorithm_names
    from textzoo.envs import registry

    return f"Tasks (--env): {', '.join(registry())}.\nAlgorithms (--algo): {', '.join(algorithm_names())}."


def _train_replica(ctx, cfg: TrainConfig, run_dir: str, resume: str | None) -> None:
    from textzoo.runners.trainer import Trainer

    trainer = Trainer(cfg, run_dir=run_dir, resume=resume, dist=ctx)
    trainer.train()
    if ctx.is_main:
        _summary(trainer)


def _summary(trainer) -> None:
    out = console()
    out.print(f"run dir: {trainer.run_dir}")
    for line in summary_lines(trainer.history, trainer.cfg, trainer.eval_prompt_count):
        out.print(line)
    if trainer.stopped_by:
        from textzoo.runners.checkpoint import list_checkpoints
        from textzoo.runners.preemption import resume_hint

        checkpointed = bool(list_checkpoints(trainer.run_dir))
        out.print(resume_hint(trainer.run_dir, trainer.step, trainer.cfg.steps, trainer.stopped_by, checkpointed))


def summary_lines(history: list[dict], cfg: TrainConfig, eval_prompts: int) -> list[str]:
    """The run's reward before -> after, each figure named: what was decoded how, on how many prompts.

    Held-out figures are the first and last evaluation's; the training figure is the mean of the first
    and of the last k steps' batches (k = a quarter of the steps, 1 to 5).
    """
    lines = []
    evals = [row for row in history if any(k.startswith("eval/") for k in row)]
    temperature = cfg.agent.temperature
    gains = {}
    for mode in ("sampled", "greedy"):
        key = f"eval/{mode}/reward/mean"
        rows = [row for row in evals if key in row]
        if len(rows) < 2:
            continue
        how = f"sampled at temperature {temperature:g}" if mode == "sampled" else "greedy (argmax) decoding"
        before, after = rows[0][key], rows[-1][key]
        gains[mode] = after - before
        lines.append(
            f"held-out reward, {how}, {eval_prompts} prompts, step {rows[0]['step']} -> {rows[-1]['step']}: "
            f"{before:.3f} -> {after:.3f} ({after - before:+.3f})"
        )
    train = [row["reward/mean"] for row in history if "reward/mean" in row]
    if train:
        k = max(1, min(5, len(train) // 4))
        before, after = sum(train[:k]) / k, sum(train[-k:]) / k
        lines.append(
            f"training reward, sampled, {cfg.batch_prompts} prompts x {cfg.group_size} samples a step, mean of the "
            f"first and the last {k} step(s): {before:.3f} -> {after:.3f} ({after - before:+.3f})"
        )
    if len(gains) == 2 and gains["sampled"] >= gains["greedy"] + FLAT_GAP:
        lines.append(
            "the sampled reward rose and the greedy one did not: the models learned a distribution of answers "
            "that scores, not yet one most likely answer that does (README, Quick start)"
        )
    return lines


FLAT_GAP = 0.1
"""How much more the sampled held-out reward must rise than the greedy one for the summary to say so."""


@dataclass
class EvalArgs:
    """Evaluate a trained run (its final weights), an exported team, or the configured models on an env."""

    run_dir: str = ""
    """A run directory written by `textzoo train` (uses its config)."""
    team: str = ""
    """A folder written by `textzoo export`: the exported models, evaluated by the run's own evaluation (its
    held-out items, prompt formats, sampling settings and seed), so the local decoder reproduces the run's
    greedy figures at the exported step."""
    config: str = ""
    """A config file to evaluate instead of a run directory."""
    engine: Literal["local", "vllm"] = "local"
    """With --team: where the team samples: local (textzoo's decoder) | vllm (a vLLM engine; adapters served
    as LoRA modules)."""
    prompts: int | None = None
    """Held-out prompts to evaluate (default: the run's eval_prompts with --team, else 32)."""
    env_kwargs: JsonDict = field(default_factory=dict)
    """Env arguments merged over the config's."""
    show: int = 0
    """Also print this many held-out completions (greedy: prompt item, role, completion, reward, its terms)."""


def evaluate(argv: list[str]) -> None:
    args = tyro.cli(EvalArgs, args=argv, prog="textzoo eval")
    if sum(map(bool, (args.run_dir, args.team, args.config))) > 1:
        raise ConfigError("pass one of --run-dir, --team and --config")
    if args.team:
        status(f"evaluating the team exported to {args.team}: loading torch")
        from textzoo.runners.exported import read_team, team_trainer

        team = read_team(args.team, args.engine)
        team.config.env_kwargs = {**team.config.env_kwargs, **args.env_kwargs}
        trainer = team_trainer(team)
        step, prompts = team.step, args.prompts or team.config.eval_prompts
    else:
        if args.run_dir:
            cfg = load_config(Path(args.run_dir) / "config.json")
        elif args.config:
            cfg = load_config(args.config)
        else:
            cfg = TrainConfig()
        cfg.env_kwargs = {**cfg.env_kwargs, **args.env_kwargs}
        status(f"evaluating {args.run_dir or args.config or 'the default config'} on {cfg.env}: loading torch")
        from textzoo.runners.trainer import Trainer

        trainer = Trainer(cfg, run_dir=args.run_dir or None)
        step = trainer.load_final_weights() if args.run_dir else 0
        prompts = args.prompts or 32
    status(f"evaluating on up to {prompts} held-out prompts ({', '.join(trainer.cfg.eval_modes)})")
    metrics = trainer.evaluate(prompts)
    if args.team and prompts == team.config.eval_prompts and not args.env_kwargs:
        _compare_with_run(team.manifest["run"]["metrics"], metrics, step)
    if args.show > 0:  # the table goes to stderr, so that stdout stays the JSON of the metrics
        from textzoo.runners.samples import sample_rows, samples_table

        split = trainer.eval_splits[0]
        rows = sample_rows(trainer.rollouts[split], trainer.actors, step, split, args.show)
        console(stderr=True).print(samples_table(rows, f"held-out completions ({split[5:]}), weights of step {step}"))
    console().print(json.dumps(metrics, indent=2, sort_keys=True))


def _compare_with_run(logged: dict[str, float], metrics: dict[str, float], step: int) -> None:
    """Say on stderr how the team's held-out rewards compare with those the run logged at the exported step."""
    err = console(stderr=True)
    for mode in ("greedy", "sampled"):
        key = f"eval/{mode}/reward/mean"
        if key in logged and key in metrics:
            same = "the same" if logged[key] == metrics[key] else f"{metrics[key] - logged[key]:+.6f}"
            err.print(
                f"{mode} held-out reward: {metrics[key]:.6f}; the run logged {logged[key]:.6f} at step {step} ({same})"
            )


@dataclass
class ExportArgs:
    """Export a run's trained models as transformers folders or PEFT adapters, with model cards and team.json."""

    run_dir: Annotated[str, tyro.conf.Positional, tyro.conf.arg(metavar="RUN_DIR")]
    """A run directory written by `textzoo train`."""
    out: Annotated[str, tyro.conf.arg(metavar="DIR")]
    """The folder to write (it appears whole or not at all)."""
    step: int | None = None
    """The checkpoint step to export (default: the newest verified checkpoint)."""
    merge_lora: bool = False
    """Merge each LoRA adapter into its base and write a transformers folder (default: the adapter)."""
    adapters: bool = False
    """Write each LoRA agent as its PEFT adapter (the default; fails for a fully fine-tuned model)."""
    with_critics: bool = False
    """Also export the run's critics and value heads."""
    overwrite: bool = False
    """Replace --out when it exists."""
    base_model_ids: JsonDict = field(default_factory=dict)
    """The hub id each card names as base_model, by the run's model setting (a .gguf file or a folder), e.g.
    '{"models/x.Q4_1.gguf": "org/x"}' (default: read from the .gguf metadata, or guessed from its name)."""


def export(argv: list[str]) -> None:
    """Export a run's checkpoint (`textzoo.runners.export`)."""
    args = tyro.cli(ExportArgs, args=argv, prog="textzoo export")
    if args.merge_lora and args.adapters:
        raise ConfigError("--merge-lora and --adapters exclude each other: pass one (default: adapters)")
    lora = "merge" if args.merge_lora else "adapters" if args.adapters else "auto"
    status(f"exporting {args.run_dir} to {args.out}: loading torch")
    from transformers.utils import logging as transformers_logging

    from textzoo.runners.export import export_run
    from textzoo.runners.exported import TEAM_FILE

    transformers_logging.disable_progress_bar()  # the command's output says what was written
    out = export_run(
        args.run_dir, args.out, args.step, lora, args.with_critics, args.overwrite, dict(args.base_model_ids)
    )
    manifest = json.loads((out / TEAM_FILE).read_text())
    show = console()
    show.print(f"exported step {manifest['run']['step']} of {args.run_dir} to {out}")
    for role, entry in manifest["roles"].items():
        where = f"{entry['folder']}/ ({entry['kind']})" if entry["folder"] else f"frozen: {entry['base']}"
        show.print(f"  {role}: {where}")
    show.print(f"evaluate it: textzoo eval --team {out}")


@dataclass
class PlotArgs:
    """Overlay the learning curves of one or more runs into a PNG."""

    run_dirs: tyro.conf.Positional[tuple[str, ...]]
    """Run directories."""
    out: str = ""
    """Output PNG (default: RUN_DIR/curve.png for one run, curves.png for several)."""
    smooth: int = 1
    """Moving-average window."""


def plot(argv: list[str]) -> None:
    from textzoo.runners.plot import plot_runs

    args = tyro.cli(PlotArgs, args=argv, prog="textzoo plot")
    out = args.out or (str(Path(args.run_dirs[0]) / "curve.png") if len(args.run_dirs) == 1 else "curves.png")
    console().print(str(plot_runs(list(args.run_dirs), out, smooth=args.smooth)))


def sft(argv: list[str]) -> None:
    """Warm up one agent on (prompt, completion) pairs and save it for `textzoo train`."""
    args = tyro.cli(SFTArgs, args=argv, prog="textzoo sft")
    status(f"warming up {args.model} on {args.pairs}: loading torch")
    from textzoo.runners.sft import run_sft

    losses = run_sft(args)
    out = console()
    out.print(f"sft loss: {losses[0]:.4f} -> {losses[-1]:.4f} in {len(losses)} steps")
    out.print(f'saved to {args.out}; train with --agent-overrides \'{{"ROLE": {{"model": "{args.out}"}}}}\'')


def bench(argv: list[str]) -> None:
    """Run a benchmark grid (tasks x algorithms x collaboration modes x seeds) from a TOML file."""
    from textzoo.runners.bench import main as run_bench

    run_bench(argv)


def serve_engine(argv: list[str]) -> None:
    """Start a vLLM server with the settings textzoo's server engine needs and serve until interrupted."""
    from textzoo.decoding.vllm_serve import ServeConfig, ServerProcess

    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    args = tyro.cli(
        ServeConfig,
        args=argv,
        prog="textzoo serve-engine",
        description="Serve MODEL with vLLM for --agent.engine.kind vllm-server (its rollouts and weight syncs). "
        "Arguments after -- go to vLLM's server as they are.",
    )
    args.extra = extra
    folder = ""
    if args.model.endswith(".gguf"):  # vLLM serves a transformers folder
        import tempfile

        from textzoo.models.loading import convert_gguf

        status(f"converting {args.model} to a transformers folder")
        folder = str(Path(tempfile.mkdtemp(prefix="textzoo-serve-")) / "model")
        convert_gguf(args.model, folder)

    def interrupted(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    # Ctrl-C and SIGTERM stop the server, even where SIGINT came in ignored (a command started with `&` by a
    # script: its shell ignores SIGINT for it, and Python then installs no handler of its own)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, interrupted)
    server = ServerProcess(args, folder=folder)
    flag = "" if not args.api_key else " (and its API key: --agent.engine.api-key or $TEXTZOO_ENGINE_API_KEY)"
    status(f"starting vLLM for {args.model} on {server.url}: loading the model")
    try:
        seconds = server.wait_ready()
        console().print(f"serving {args.model} at {server.url} (ready in {seconds:.0f} s)")
        console().print(f"train with --agent.engine.kind vllm-server --agent.engine.url {server.url}{flag}")
        if server.proc.wait() != 0:
            raise EngineError(f"the vLLM server at {server.url} stopped (exit code {server.proc.returncode})")
    except KeyboardInterrupt:
        status("stopping the server")
    finally:
        server.stop()
        if folder:
            import shutil

            shutil.rmtree(Path(folder).parent, ignore_errors=True)


HANDLERS = {
    "train": train,
    "eval": evaluate,
    "export": export,
    "plot": plot,
    "sft": sft,
    "bench": bench,
    "serve-engine": serve_engine,
}
"""Command name -> handler of its arguments."""
