"""Sandbox throughput: programs/s on the 164 HumanEval canonical solutions + their tests.

Runs the batch serially (workers=1) and with several worker counts through
`textzoo.envs.code_v0.score_batch` (the path a runner uses for batched rewards) and prints
programs/s, the mean wall time per program and the mean fraction of tests passed (1.0 expected).

    python benchmarks/sandbox_throughput.py [--workers 1 2 4] [--repeat 1]
"""

from __future__ import annotations

import argparse
import os
import time

from textzoo.envs.code_v0 import load_problems, score_batch
from textzoo.envs.sandbox import SandboxLimits, can_drop_privileges


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cpus = os.cpu_count() or 1
    parser.add_argument("--workers", type=int, nargs="+", default=sorted({1, max(cpus // 2, 1), cpus, 2 * cpus}))
    parser.add_argument("--repeat", type=int, default=1, help="copies of the 164 problems per batch")
    args = parser.parse_args()

    problems = load_problems() * args.repeat
    mains = [p.prompt + p.canonical_solution for p in problems]
    helpers = [""] * len(problems)
    limits = SandboxLimits()
    print(f"{len(problems)} programs, {cpus} CPUs, uid drop: {can_drop_privileges(limits.python, limits.uid_base)}")
    print(f"{'workers':>7} {'seconds':>8} {'programs/s':>10} {'ms/program':>10} {'tests passed':>12}")
    for workers in args.workers:
        t = time.perf_counter()
        scores = score_batch(problems, helpers, mains, limits, workers=workers)
        dt = time.perf_counter() - t
        walls = [s.result.wall_s for s in scores if s.result is not None]
        passed = sum(s.terms["tests"] for s in scores) / len(scores)
        print(
            f"{workers:>7} {dt:>8.2f} {len(problems) / dt:>10.1f} "
            f"{1000 * sum(walls) / len(walls):>10.1f} {passed:>12.3f}"
        )


if __name__ == "__main__":
    main()
