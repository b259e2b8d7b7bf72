"""Sandbox throughput: programs/s on the 164 HumanEval canonical solutions + their tests.

Runs the batch serially (workers=1) and with several worker counts through
`textzoo.envs.code_v0.score_batch` (the path a runner uses for batched rewards) and prints
programs/s, the mean wall time per program and the mean fraction of tests passed (1.0 expected),
each a median [min, max] over `--rounds` rounds (default 3), each round a fresh process. The first
program's latency (the zygote's start) is printed apart. `--baseline DIR` measures another checkout of
textzoo (e.g. the main branch before the zygote) the same way, its rounds alternating with this one's
(this, base, this, base, ...), so both see the same machine load, and prints the ratios round by round.

    python benchmarks/sandbox_throughput.py [--workers 1 2 4] [--rounds 3] [--baseline /path/to/textzoo]
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import tyro

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402


def _worker_counts() -> tuple[int, ...]:
    cpus = os.cpu_count() or 1
    return tuple(sorted({1, max(cpus // 2, 1), cpus, 2 * cpus}))


@dataclass
class Args(harness.Common):
    workers: tuple[int, ...] = field(default_factory=_worker_counts)
    """Worker counts to measure (default: 1, half the CPUs, all of them, twice that)."""
    repeat: int = 1
    """Copies of the 164 problems per batch."""
    baseline: str = ""
    """Another textzoo checkout to measure in alternating rounds with this one (its folder)."""
    one: bool = False
    """Internal: measure once in this process and print the figures as JSON."""


def measure(workers: tuple[int, ...], repeat: int) -> dict:
    """One round: the first program's ms, the isolation in force, and per worker count programs/s, mean ms per
    program and the share of tests passed."""
    try:
        from textzoo import sandbox
    except ImportError:  # a --baseline checkout from before the sandbox had its own package
        from textzoo.envs import sandbox
    from textzoo.envs.code_v0 import load_problems, score_batch

    problems = load_problems() * repeat
    mains = [p.prompt + p.canonical_solution for p in problems]
    helpers = [""] * len(problems)
    limits = sandbox.SandboxLimits()
    if hasattr(sandbox, "close_zygotes"):  # every round starts its zygote afresh
        sandbox.close_zygotes()
    with harness.Clock() as first:
        score_batch(problems[:1], helpers[:1], mains[:1], limits, workers=1)
    report = sandbox.isolation_report(limits) if hasattr(sandbox, "isolation_report") else None
    isolation = str(report) if report else ("uid" if sandbox.can_drop_privileges() else "none")
    out = {"first_ms": 1000 * first.wall, "isolation": isolation}
    for w in workers:
        with harness.Clock() as batch:
            scores = score_batch(problems, helpers, mains, limits, workers=w)
        walls = [s.result.wall_s for s in scores if s.result is not None]
        out[f"programs_per_s/{w}"] = len(problems) / batch.wall
        out[f"ms/{w}"] = 1000 * sum(walls) / len(walls)
        out[f"passed/{w}"] = sum(s.terms["tests"] for s in scores) / len(scores)
    return out


def main() -> None:
    a = tyro.cli(Args)
    if a.one:
        print(json.dumps(measure(a.workers, a.repeat)))
        return
    command = [sys.executable, __file__, *harness.cli_flags(a, skip=("results", "baseline")), "--one"]
    sides = {"this checkout": lambda: harness.run_json(command, a.threads)}
    if a.baseline:
        base = str(Path(a.baseline).resolve())
        sides[f"baseline {a.baseline}"] = lambda: harness.run_json(command, a.threads, {"PYTHONPATH": base})
    alt = harness.alternate(sides, a.rounds)
    figures = {"first_ms": "first program ms (with the zygote's start)"}
    for w in a.workers:
        figures |= {f"programs_per_s/{w}": f"programs/s, {w} worker(s)", f"ms/{w}": f"ms/program, {w} worker(s)",
                    f"passed/{w}": f"tests passed, {w} worker(s)"}  # fmt: skip
    reference = f"baseline {a.baseline}" if a.baseline else None
    ratios = [f"programs_per_s/{w}" for w in a.workers]
    header, rows = harness.compare(alt, figures, reference=reference, ratios=ratios)
    isolation = {side: alt.runs[i][2]["isolation"] for i, side in enumerate(alt.sides)}
    title = f"{164 * a.repeat} programs, {os.cpu_count()} CPUs, {a.threads} thread(s) per process"
    notes = [alt.note(), "isolation: " + "; ".join(f"{side}: {text}" for side, text in isolation.items())]
    harness.report(a.results, "sandbox_throughput", title, header, rows, alt.to_json(), notes)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
