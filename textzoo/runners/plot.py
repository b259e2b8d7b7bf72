"""Learning-curve PNGs from one or more run directories' `metrics.jsonl`.

The reward panel names each curve by what it measures (`LABELS`: the training batches, held-out
sampled, held-out greedy) and, for one run, its first -> last value, so a curve that learned and one
that stayed flat read as such.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from textzoo.errors import TextzooError
from textzoo.jsonl import read_jsonl

RM_KEYS = ("rm/heldout_accuracy", "rm/pearson", "rm/spearman", "rm/group_accuracy", "rm/hacking")
LABELS = {
    "reward/mean": "training batches (sampled)",
    "eval/sampled/reward/mean": "held-out, sampled",
    "eval/greedy/reward/mean": "held-out, greedy",
}
"""Legend names of the reward curves (other metrics are named by their key)."""
PANELS = (
    ("reward", lambda k: k in ("reward/mean", "eval/sampled/reward/mean", "eval/greedy/reward/mean")),
    # MARLHF: the task reward beside the reward model's score, and how well the two agree
    ("reward model vs task", lambda k: k in ("reward/rm", "reward/task/mean")),
    ("reward model", lambda k: k in RM_KEYS),
    ("loss", lambda k: k.startswith("agent/") and k.endswith("/loss")),
    ("KL", lambda k: k.startswith("agent/") and k.endswith("/kl")),
    ("completion tokens", lambda k: k.endswith("/completion_len") and "/turn" not in k),
    # groups with no reward variance (no gradient) and completions cut by the token budget, per agent
    ("learning signal", lambda k: k.endswith(("/frac_reward_zero_std", "/truncated")) and "/turn" not in k),
    ("action characters per role", lambda k: k.startswith("role/") and k.endswith("/completion_chars")),
)


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """Rows of `RUN_DIR/metrics.jsonl` (a truncated last line, from a killed run, is ignored)."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        raise TextzooError(f"{str(path)!r} does not exist: pass a run directory written by `textzoo train`")
    return [row for _, row in read_jsonl(path, "metrics file", torn_tail=True)]


def plot_runs(run_dirs: list[str | Path], out: str | Path, smooth: int = 1) -> Path:
    """Draw reward, loss, KL and length panels, one line per run and metric; return the PNG path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = {Path(d).name: read_metrics(d) for d in run_dirs}
    panels = [
        (title, match)
        for title, match in PANELS
        if any(match(k) for rows in runs.values() for row in rows for k in row)
    ]
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.6), squeeze=False)
    for ax, (title, match) in zip(axes[0], panels):
        for name, rows in runs.items():
            keys = sorted({k for row in rows for k in row if match(k)})
            for key in keys:
                pts = [(row["step"], row[key]) for row in rows if key in row and row[key] is not None]
                if not pts:
                    continue
                xs, ys = zip(*pts)
                label = curve_label(key, ys, name if len(runs) > 1 else None)
                ys = _smooth(list(ys), smooth)
                ax.plot(xs, ys, label=label, marker="o" if len(xs) < 4 else None)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def curve_label(key: str, values: list[float] | tuple[float, ...], run: str | None = None) -> str:
    """A curve's legend entry: its `LABELS` name (else its key), "first -> last" for a reward curve of one
    run, and the run's name when several runs share the plot."""
    label = LABELS.get(key, key)
    if key in LABELS and run is None and len(values) > 1:
        label += f": {values[0]:.2f} -> {values[-1]:.2f}"
    return label if run is None else f"{run}: {label}"


def _smooth(values: list[float], window: int) -> list[float]:
    if window <= 1:
        return values
    out = []
    for i in range(len(values)):
        chunk = values[max(0, i - window + 1) : i + 1]
        out.append(sum(chunk) / len(chunk))
    return out
