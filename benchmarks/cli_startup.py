"""How long `textzoo --help`, `textzoo train --help` and `textzoo eval --help` take, as separate processes
(median of --repeat).

    OMP_NUM_THREADS=1 python benchmarks/cli_startup.py

None of them imports torch or transformers: the commands module is imported only when a command runs,
and the configs it parses are plain data (`tests/test_config_light.py`). The script also times
`import torch` alone, what a command that trains or evaluates pays before its first step.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass

import tyro


@dataclass
class Args:
    repeat: int = 5
    """Runs of each command; the median is reported."""


def seconds(args: list[str], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run([sys.executable, *args], check=True, capture_output=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    a = tyro.cli(Args)
    out = {
        "textzoo --help": seconds(["-m", "textzoo.runners.cli", "--help"], a.repeat),
        "textzoo train --help": seconds(["-m", "textzoo.runners.cli", "train", "--help"], a.repeat),
        "textzoo eval --help": seconds(["-m", "textzoo.runners.cli", "eval", "--help"], a.repeat),
        "import torch": seconds(["-c", "import torch"], a.repeat),
        "python -c pass": seconds(["-c", "pass"], a.repeat),
    }
    report = {k: round(v, 3) for k, v in out.items()}
    report.update({"repeat": a.repeat, "omp_threads": os.environ.get("OMP_NUM_THREADS"), "load_avg": os.getloadavg()})
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
