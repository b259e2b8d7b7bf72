"""Sandbox throughput: programs/s on the 164 HumanEval canonical solutions + their tests.

Runs the batch serially (workers=1) and with several worker counts through
`textzoo.envs.code_v0.score_batch` (the path a runner uses for batched rewards) and prints
programs/s, the mean wall time per program and the mean fraction of tests passed (1.0 expected),
for each of `--rounds` rounds and their median. The first program's latency (the zygote's start)
is printed apart. `--baseline DIR` measures another checkout of textzoo (e.g. the main branch
before the zygote) in a subprocess, round by round alternating with this one, so both see the same
machine load.

    python benchmarks/sandbox_throughput.py [--workers 1 2 4] [--rounds 3] [--baseline /path/to/textzoo]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")


def measure(workers: list[int], repeat: int) -> dict:
    """One round: {"first_s", "isolation", "rows": [{workers, seconds, programs_per_s, ms, passed}]}."""
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
    t = time.perf_counter()
    score_batch(problems[:1], helpers[:1], mains[:1], limits, workers=1)
    first = time.perf_counter() - t
    report = sandbox.isolation_report(limits) if hasattr(sandbox, "isolation_report") else None
    isolation = str(report) if report else ("uid" if sandbox.can_drop_privileges() else "none")
    rows = []
    for w in workers:
        t = time.perf_counter()
        scores = score_batch(problems, helpers, mains, limits, workers=w)
        dt = time.perf_counter() - t
        walls = [s.result.wall_s for s in scores if s.result is not None]
        rows.append(
            {
                "workers": w,
                "seconds": dt,
                "programs_per_s": len(problems) / dt,
                "ms": 1000 * sum(walls) / len(walls),
                "passed": sum(s.terms["tests"] for s in scores) / len(scores),
            }
        )
    return {"first_s": first, "isolation": isolation, "programs": len(problems), "rows": rows}


def _baseline(path: str, workers: list[int], repeat: int) -> dict:
    env = {**os.environ, "PYTHONPATH": path}
    cmd = [
        sys.executable,
        __file__,
        "--json",
        "--rounds",
        "1",
        "--repeat",
        str(repeat),
        "--workers",
        *map(str, workers),
    ]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def _print_round(label: str, m: dict) -> None:
    print(f"[{label}] isolation {m['isolation']}, first program {1000 * m['first_s']:.0f} ms (with the zygote's start)")
    for r in m["rows"]:
        print(
            f"[{label}] {r['workers']:>7} {r['seconds']:>8.2f} {r['programs_per_s']:>10.1f} "
            f"{r['ms']:>10.1f} {r['passed']:>12.3f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cpus = os.cpu_count() or 1
    parser.add_argument("--workers", type=int, nargs="+", default=sorted({1, max(cpus // 2, 1), cpus, 2 * cpus}))
    parser.add_argument("--repeat", type=int, default=1, help="copies of the 164 problems per batch")
    parser.add_argument("--rounds", type=int, default=3, help="measurements of every worker count")
    parser.add_argument("--baseline", default="", help="another textzoo checkout to measure alongside")
    parser.add_argument("--json", action="store_true", help="print one JSON line per round (for --baseline)")
    args = parser.parse_args()

    if args.json:
        for _ in range(args.rounds):
            print(json.dumps(measure(args.workers, args.repeat)))
        return
    print(
        f"{164 * args.repeat} programs, {cpus} CPUs, OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}, "
        f"{args.rounds} rounds; load average {os.getloadavg()[0]:.2f} at start"
    )
    print(f"{'':>6} {'workers':>7} {'seconds':>8} {'programs/s':>10} {'ms/program':>10} {'tests passed':>12}")
    results: dict[str, list[dict]] = {"this": [], "baseline": []}
    for _ in range(args.rounds):
        results["this"].append(measure(args.workers, args.repeat))
        _print_round("this", results["this"][-1])
        if args.baseline:
            results["baseline"].append(_baseline(args.baseline, args.workers, args.repeat))
            _print_round("base", results["baseline"][-1])
    print(f"median programs/s over {args.rounds} rounds (load average {os.getloadavg()[0]:.2f} at the end):")
    for label, rounds in results.items():
        if rounds:
            medians = {
                w: statistics.median(r["rows"][i]["programs_per_s"] for r in rounds) for i, w in enumerate(args.workers)
            }
            print(f"  {label:>8}: " + ", ".join(f"{w} worker(s) {v:.1f}" for w, v in medians.items()))
    if results["baseline"]:
        ratios = [a["rows"][0]["programs_per_s"] / b["rows"][0]["programs_per_s"] for a, b in zip(*results.values())]
        print(
            f"  serial speed-up over the baseline, round by round: {', '.join(f'{r:.1f}x' for r in ratios)}; ", end=""
        )
        print(f"median {statistics.median(ratios):.1f}x")


if __name__ == "__main__":
    main()
