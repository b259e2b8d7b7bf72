"""Metric sinks: TensorBoard scalars (and purge on resume), W&B offline, clear errors for missing extras."""

import importlib.util
import sys

import features
import pytest
import torch
from conftest import wait_until

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


def _wandb_records(path):
    """The records of a W&B run file (`run-<id>.wandb`): a 7-byte header (":W&B", magic, version), then
    LevelDB-log chunks in 32 KiB blocks (crc32, length, type: 1 full, 2 first, 3 middle, 4 last) of
    protobuf `Record`s."""
    import struct

    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    block, pos, parts = 32768, 7, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if pos + 7 + length > len(data):  # still being written
            return
        parts += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(parts)
            parts = b""
            yield record


@features.requires("tracking", importlib.util.find_spec("wandb") is not None, "wandb is not installed")
def test_wandb_offline_run_holds_the_config_and_every_numeric_row(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    tracker = WandbTracker(tmp_path, {"seed": 3})
    tracker.log({"step": 1, "reward/mean": 0.5, "note": "text"}, 1)
    tracker.log({"step": 2, "reward/mean": 0.75, "agent/a/loss": -1.25}, 2)
    tracker.close()
    run_id = (tmp_path / "wandb_id").read_text().strip()

    def finished() -> list:  # W&B's own service process writes the file, and may finish it after close()
        found = list(tmp_path.glob(f"wandb/offline-run-*/run-{run_id}.wandb"))
        records = list(_wandb_records(found[0])) if found else []
        return records if any(r.WhichOneof("record_type") == "exit" for r in records) else []

    records = wait_until(finished)
    (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert run.run_id == run_id and run.project == "textzoo"
    assert {u.key: u.value_json for u in run.config.update}["seed"] == "3"
    rows = [r.history.item for r in records if r.WhichOneof("record_type") == "history"]
    named = [{i.key or "/".join(i.nested_key): i.value_json for i in items} for items in rows]  # "a/b": nested
    history = [{k: v for k, v in row.items() if k not in ("_runtime", "_timestamp")} for row in named]
    # numeric fields only, at W&B's step (the row's own "step" is that step; text is left out)
    assert history == [
        {"_step": "1", "reward/mean": "0.5"},
        {"_step": "2", "reward/mean": "0.75", "agent/a/loss": "-1.25"},
    ]


@features.requires("tracking", importlib.util.find_spec("wandb") is not None, "wandb is not installed")
def test_wandb_offline_run_keeps_its_id(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    tracker = WandbTracker(tmp_path, {"seed": 0})
    tracker.log({"step": 1, "reward/mean": 0.5}, 1)
    tracker.close()
    run_id = (tmp_path / "wandb_id").read_text().strip()
    again = WandbTracker(tmp_path, {"seed": 0})
    assert again.run.id == run_id
    again.close()
