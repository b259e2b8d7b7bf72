"""Starting a fresh run in a run dir: refused when the dir already holds a run, unless told to overwrite it."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from textzoo.errors import ConfigError
from textzoo.runners.checkpoint import checkpoints_dir, list_checkpoints

logger = logging.getLogger(__name__)

RUN_FILES = (
    "metrics.jsonl",
    "samples.jsonl",
    "config.json",
    "placement.json",
    "provenance.jsonl",
    "curve.png",
    "wandb_id",
)
"""Files a run writes at the top of its run dir."""
RUN_FOLDERS = ("checkpoints", "tensorboard", "wandb")
"""Folders a run writes in its run dir."""


def holds_run(run_dir: str | Path) -> bool:
    """Whether `run_dir` already holds a run: a metrics.jsonl or a checkpoint."""
    return (Path(run_dir) / "metrics.jsonl").is_file() or bool(list_checkpoints(run_dir))


def start_fresh(run_dir: str | Path, overwrite: bool, resume_tried: bool = False) -> None:
    """Make `run_dir` ready for a run from step 0: raise `ConfigError` when it holds a run, unless
    `overwrite`, which first removes that run's files (and only those: other files stay).
    `resume_tried`: resume "auto" was asked for and found no checkpoint of this config there. A run that
    wrote no checkpoint at all (killed before its first) then starts over from step 0, which is what its
    resume is; checkpoints of another config are never deleted without `overwrite`."""
    run_dir = Path(run_dir)
    if not holds_run(run_dir):
        return
    if not overwrite and resume_tried and list_checkpoints(run_dir):
        raise ConfigError(
            f"the run dir {run_dir} holds a run that --resume auto cannot continue (no intact checkpoint with "
            "this config); pass --overwrite (TrainConfig.overwrite=True) to start over, which deletes its "
            "metrics, samples and checkpoints first, or pick another --run-dir"
        )
    if not overwrite and resume_tried:
        logger.warning("resume auto: %s holds a run that wrote no checkpoint; starting it over from step 0", run_dir)
        overwrite = True
    if not overwrite:
        raise ConfigError(
            f"the run dir {run_dir} already holds a run (metrics.jsonl or checkpoints); pass --resume auto "
            "(Trainer(resume='auto')) to continue it, or --overwrite (TrainConfig.overwrite=True) to start over, "
            "which deletes its metrics, samples and checkpoints first; or pick another --run-dir"
        )
    logger.warning("overwrite: deleting the earlier run's files in %s", run_dir)
    for name in RUN_FILES:
        (run_dir / name).unlink(missing_ok=True)
    for name in RUN_FOLDERS:
        folder = checkpoints_dir(run_dir) if name == "checkpoints" else run_dir / name
        if folder.is_dir():
            shutil.rmtree(folder)
