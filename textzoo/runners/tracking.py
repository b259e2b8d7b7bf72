"""Metric sinks besides `metrics.jsonl` (which the trainer always writes): TensorBoard and W&B; both
also get the sample completions of `samples.jsonl` (TensorBoard as text, W&B as a table).

Both are optional extras (`pip install textzoo[tracking]`). A resumed run re-logs the steps after
its checkpoint; TensorBoard purges the events a killed run wrote past that point, W&B continues the
same run id (stored in `RUN_DIR/wandb_id`).
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any, Protocol

from textzoo.errors import TextzooError
from textzoo.runners.samples import SAMPLE_COLUMNS, flat_samples, samples_markdown


class Tracker(Protocol):
    def log(self, row: dict[str, Any], step: int) -> None: ...

    def log_samples(self, rows: list[dict[str, Any]], split: str, step: int) -> None:
        """Rows of `textzoo.runners.samples` (prompts, completions, rewards) of one split."""
        ...

    def close(self) -> None: ...


def _scalars(row: dict[str, Any]) -> dict[str, float]:
    return {
        k: float(v) for k, v in row.items() if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)
    }


class TensorBoardTracker:
    """Scalars into `RUN_DIR/tensorboard`; sample completions as Markdown text (`samples/<split>`)."""

    def __init__(self, run_dir: Path, resume_step: int = 0):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:
            raise TextzooError("report_to=tensorboard needs TensorBoard: pip install textzoo[tracking]") from e
        # purge_step drops events at or after it: those a killed run wrote past its last checkpoint
        self.writer = SummaryWriter(str(run_dir / "tensorboard"), purge_step=resume_step + 1 if resume_step else None)

    def log(self, row: dict[str, Any], step: int) -> None:
        for k, v in _scalars(row).items():
            self.writer.add_scalar(k, v, step)
        self.writer.flush()

    def log_samples(self, rows: list[dict[str, Any]], split: str, step: int) -> None:
        if rows:
            self.writer.add_text(f"samples/{split}", samples_markdown(rows), step)
            self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbTracker:
    """One W&B run per run dir (project from WANDB_PROJECT, default "textzoo"; WANDB_MODE=offline works);
    sample completions as a table (`samples/<split>`)."""

    def __init__(self, run_dir: Path, config: dict[str, Any]):
        try:
            import wandb
        except ImportError as e:
            raise TextzooError("report_to=wandb needs Weights & Biases: pip install textzoo[tracking]") from e
        id_file = run_dir / "wandb_id"
        run_id = id_file.read_text().strip() if id_file.is_file() else uuid.uuid4().hex[:12]
        id_file.write_text(run_id + "\n")
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", "textzoo"),
            id=run_id,
            resume="allow",
            dir=str(run_dir),
            name=run_dir.name,
            config=config,
        )

    def log(self, row: dict[str, Any], step: int) -> None:
        self.run.log(_scalars(row), step=step)

    def log_samples(self, rows: list[dict[str, Any]], split: str, step: int) -> None:
        if rows:
            import wandb

            table = wandb.Table(columns=list(SAMPLE_COLUMNS), data=flat_samples(rows))
            self.run.log({f"samples/{split}": table}, step=step)

    def close(self) -> None:
        self.run.finish()


def build_trackers(
    report_to: tuple[str, ...], run_dir: Path, config: dict[str, Any], resume_step: int = 0
) -> list[Tracker]:
    """The sinks named in `report_to` (validated by TrainConfig)."""
    trackers: list[Tracker] = []
    for name in report_to:
        trackers.append(
            TensorBoardTracker(run_dir, resume_step) if name == "tensorboard" else WandbTracker(run_dir, config)
        )
    return trackers
