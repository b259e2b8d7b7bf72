"""A fresh run refuses a run dir that already holds a run, unless told to overwrite it; resume is unaffected."""

import dataclasses
import json

import pytest
import torch
from helpers import tiny_config

from textzoo.config import AgentConfig
from textzoo.errors import ConfigError
from textzoo.runners import checkpoint as ck
from textzoo.runners.cli import main as cli_main
from textzoo.runners.rundir import holds_run, start_fresh
from textzoo.runners.trainer import Trainer

torch.set_num_threads(1)

CFG = tiny_config(steps=1, agent=AgentConfig(max_new_tokens=4), threads=1, log_completions=1)


def _steps(run_dir) -> list[int]:
    return [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_empty_or_foreign_dir_is_not_a_run(tmp_path):
    assert not holds_run(tmp_path / "missing")
    (tmp_path / "notes.txt").write_text("mine")
    assert not holds_run(tmp_path)
    start_fresh(tmp_path, overwrite=False)  # nothing to refuse
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_rerun_refused_then_overwrite_starts_over_then_resume(tmp_path):
    cfg = dataclasses.replace(CFG, run_dir=str(tmp_path))
    Trainer(cfg).train()
    assert _steps(tmp_path) == [0, 1]
    first = ck.list_checkpoints(tmp_path)
    assert [p.name for p in first] == ["step-00000001"]
    (tmp_path / "notes.txt").write_text("mine")

    with pytest.raises(ConfigError) as e:
        Trainer(cfg).train()
    message = str(e.value)
    assert str(tmp_path) in message and "--resume auto" in message and "--overwrite" in message
    assert _steps(tmp_path) == [0, 1]  # nothing appended, checkpoint untouched
    assert ck.list_checkpoints(tmp_path) == first

    # resume is unaffected: a longer run continues from the checkpoint and appends only new rows
    longer = dataclasses.replace(cfg, steps=2)
    Trainer(longer, resume="auto").train()
    assert _steps(tmp_path) == [0, 1, 2]

    # overwrite clears the old run's files (and only those), then writes a fresh run
    (tmp_path / "samples.jsonl").write_text('{"step": 99, "split": "train"}\n')
    Trainer(dataclasses.replace(cfg, overwrite=True)).train()
    assert _steps(tmp_path) == [0, 1]
    assert [p.name for p in ck.list_checkpoints(tmp_path)] == ["step-00000001"]
    samples = [json.loads(line)["step"] for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert 99 not in samples
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_resume_auto_restarts_a_run_without_checkpoints_and_refuses_another_configs(tmp_path):
    # a run killed before its first checkpoint: resume auto starts it over (no duplicated rows)
    (tmp_path / "metrics.jsonl").write_text('{"step": 0, "stale": 1}\n')
    Trainer(dataclasses.replace(CFG, run_dir=str(tmp_path)), resume="auto").train()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1] and not any("stale" in r for r in rows)
    # checkpoints of another config are not this run's to delete: refused, nothing touched
    other = dataclasses.replace(CFG, run_dir=str(tmp_path), seed=CFG.seed + 1)
    with pytest.raises(ConfigError, match="--resume auto cannot continue"):
        Trainer(other, resume="auto").train()
    assert _steps(tmp_path) == [0, 1]
    assert ck.list_checkpoints(tmp_path)


def test_cli_refuses_a_rerun_and_overwrite_starts_over(tmp_path, capsys):
    args = ["train", "--run-dir", str(tmp_path), "--steps", "1", "--batch-prompts", "2", "--group-size", "2"]
    args += ["--agent.max-new-tokens", "4", "--eval-prompts", "1", "--threads", "1", "--no-progress", "--no-plot"]
    assert cli_main(args) == 0
    capsys.readouterr()
    assert cli_main(args) == 2
    err = capsys.readouterr().err
    assert "already holds a run" in err and "--resume auto" in err and "--overwrite" in err
    assert _steps(tmp_path) == [0, 1]
    assert cli_main([*args, "--overwrite"]) == 0
    assert _steps(tmp_path) == [0, 1]
