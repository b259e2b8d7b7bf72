"""Metric sinks: TensorBoard scalars (and purge on resume), W&B offline, clear errors for missing extras."""

import importlib.util
import sys

import pytest
import torch

from textzoo.config import TrainConfig
from textzoo.errors import TextzooError
from textzoo.runners.tracking import TensorBoardTracker, WandbTracker, build_trackers

torch.set_num_threads(1)


def _scalars(log_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_tensorboard_writes_numeric_fields_and_purges_after_resume(tmp_path):
    tracker = TensorBoardTracker(tmp_path)
    for step in range(4):
        tracker.log({"step": step, "reward/mean": step / 10, "note": "text", "flag": True}, step)
    tracker.close()
    got = _scalars(tmp_path / "tensorboard")
    assert set(got) == {"reward/mean"}
    assert [s for s, _ in got["reward/mean"]] == [0, 1, 2, 3]
    # resumed from the checkpoint of step 1: steps 2 and 3 are re-logged with new values
    tracker = TensorBoardTracker(tmp_path, resume_step=1)
    for step in (2, 3):
        tracker.log({"reward/mean": 1.0 + step}, step)
    tracker.close()
    values = dict(_scalars(tmp_path / "tensorboard")["reward/mean"])
    assert values == pytest.approx({0: 0.0, 1: 0.1, 2: 3.0, 3: 4.0})


def test_missing_wandb_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import fails as if not installed
    with pytest.raises(TextzooError, match=r"pip install textzoo\[tracking\]"):
        build_trackers(("wandb",), tmp_path, {})


def test_unknown_sink_is_a_config_error():
    with pytest.raises(ValueError, match="report_to"):
        TrainConfig(report_to=("mlflow",))


@pytest.mark.skipif(importlib.util.find_spec("wandb") is None, reason="wandb is an optional extra (textzoo[tracking])")
def test_wandb_offline_run_keeps_its_id(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    tracker = WandbTracker(tmp_path, {"seed": 0})
    tracker.log({"step": 1, "reward/mean": 0.5}, 1)
    tracker.close()
    run_id = (tmp_path / "wandb_id").read_text().strip()
    again = WandbTracker(tmp_path, {"seed": 0})
    assert again.run.id == run_id
    again.close()
