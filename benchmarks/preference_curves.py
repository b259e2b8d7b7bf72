"""Task reward over environment steps, MARLHF vs MAGRPO, from the runs `preference_run.py` wrote.

    python benchmarks/preference_curves.py RUNS/<task> OUT.png   # RUNS/<task>/<variant>-s<seed>/metrics.jsonl

One line per variant (mean over its seeds, min-max band): the task reward of the training episodes
(`reward/task/mean` for marlhf, which trains on its reward model's scores; `reward/mean` otherwise)
against environment steps (episodes played, marlhf's reward-model episodes included), with each
variant's held-out sampled reward at the start and the end as points.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from textzoo.runners.plot import read_metrics  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402


def curve(run: Path) -> tuple[np.ndarray, np.ndarray, list[tuple[float, float]]]:
    """(env steps, task reward) per training step, and (env steps, held-out reward) per evaluation."""
    rows = read_metrics(run)
    config = json.loads((run / "config.json").read_text())
    per_step = config["batch_prompts"] * config["group_size"]
    offset = max((r.get("rm/episodes", 0) for r in rows), default=0)
    xs, ys, evals = [], [], []
    for r in rows:
        x = offset + r["step"] * per_step
        task = r.get("reward/task/mean", r.get("reward/mean"))
        if task is not None and r["step"] > 0:
            xs.append(x)
            ys.append(task)
        if "eval/sampled/reward/mean" in r:
            evals.append((offset * (r["step"] > 0) + r["step"] * per_step, r["eval/sampled/reward/mean"]))
    return np.array(xs), np.array(ys), evals


def main(root: str, out: str) -> None:
    runs: dict[str, list[Path]] = defaultdict(list)
    for run in sorted(Path(root).glob("*-s*")):
        if (run / "metrics.jsonl").is_file():
            runs[run.name.rsplit("-s", 1)[0]].append(run)
    fig, ax = plt.subplots(figsize=(7, 4))
    for variant, dirs in runs.items():
        curves = [curve(d) for d in dirs]
        n = min(len(c[0]) for c in curves)
        x = curves[0][0][:n]
        ys = np.stack([c[1][:n] for c in curves])
        k = max(1, n // 20)  # smooth over ~5% of the run
        smooth = np.stack([np.convolve(y, np.ones(k) / k, mode="valid") for y in ys])
        xv = x[k - 1 :]
        (line,) = ax.plot(xv, smooth.mean(0), label=f"{variant} (train episodes, {len(dirs)} seeds)")
        ax.fill_between(xv, smooth.min(0), smooth.max(0), color=line.get_color(), alpha=0.2)
        points = np.array([e for c in curves for e in c[2]])
        ax.scatter(points[:, 0], points[:, 1], color=line.get_color(), marker="o", s=18, label=f"{variant} held-out")
    ax.set_title(Path(root).name)
    harness.label(ax, "environment steps (episodes played)", "task reward", legend_size=8)
    harness.save(fig, out)
    print(out)


if __name__ == "__main__":
    main(*sys.argv[1:3])
