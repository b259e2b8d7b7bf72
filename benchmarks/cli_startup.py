"""How long `textzoo --help` and `textzoo train --help` take, as separate processes (median of --repeat).

    OMP_NUM_THREADS=1 python benchmarks/cli_startup.py

`textzoo --help` imports neither torch nor transformers (the commands module is imported only when a
command runs); `train --help` needs the configs, which import the families and so torch. The
script also times `import torch` alone, the floor of any command.
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
        "import torch": seconds(["-c", "import torch"], a.repeat),
        "python -c pass": seconds(["-c", "pass"], a.repeat),
    }
    report = {k: round(v, 3) for k, v in out.items()}
    report.update({"repeat": a.repeat, "omp_threads": os.environ.get("OMP_NUM_THREADS"), "load_avg": os.getloadavg()})
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
