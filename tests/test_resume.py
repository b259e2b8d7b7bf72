"""Exact resume: SIGKILL at a seeded moment mid-run (and inside a save), config checks, damaged checkpoints.

The reference is an uninterrupted run in this process; killed and resumed runs go through the CLI in
subprocesses. Equality is exact: torch.equal on every trained weight, and identical metrics rows
apart from the `time/*` fields.
"""

import contextlib
import dataclasses
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from helpers import metrics_rows, tiny_config

from textzoo.config import AgentConfig
from textzoo.config_files import save_config
from textzoo.errors import CheckpointError
from textzoo.runners import checkpoint as ck
from textzoo.runners.cli import main as cli_main
from textzoo.runners.trainer import Trainer, find_resumable

torch.set_num_threads(1)

CFG = tiny_config(steps=4, threads=1, save_every=1, keep_last=2)
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}


def _final_weights(run_dir: Path) -> dict[str, dict[str, torch.Tensor]]:
    path, damage = ck.latest_intact(run_dir)
    assert path is not None and not damage, damage
    return ck.read_checkpoint(path).weights


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("reference")
    Trainer(dataclasses.replace(CFG, run_dir=str(run_dir))).train()
    return run_dir


def _assert_same_run(run_dir: Path, reference: Path) -> None:
    assert metrics_rows(run_dir) == metrics_rows(reference)
    got, want = _final_weights(run_dir), _final_weights(reference)
    assert sorted(got) == sorted(want) == ["elaboration", "summary"]
    for model in want:
        for name, tensor in want[model].items():
            assert torch.equal(got[model][name], tensor), f"{model}:{name}"


def _start_cli(run_dir: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "textzoo.runners.cli", "train", *args],
        env=ENV,
        cwd=run_dir.parent,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


GATED = """
import os, sys, time
from pathlib import Path
from textzoo.runners import preemption, trainer
from textzoo.runners.cli import main

step, phase, gate = int(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
enter = trainer.Trainer._phase
def gated(self, name):
    if self.step == step and name == phase:  # `step` steps done, the next one in `phase`: wait for the test
        gate.write_text(str(os.getpid()))
        while True:
            time.sleep(1)
    return enter(self, name)
trainer.Trainer._phase = gated
handle = preemption.GracefulStop._handle
def handled(self, signum, frame):  # says when the first signal was taken (the second one ends the process)
    handle(self, signum, frame)
    gate.with_suffix(".signalled").write_text(str(signum))
preemption.GracefulStop._handle = handled
sys.exit(main(["train", *sys.argv[4:]]))
"""


@contextlib.contextmanager
def _gated(tmp_path: Path, step: int, phase: str):
    """The CLI training `CFG` in a subprocess that stops, and waits, when it enters `phase` of step
    `step + 1` (`step` steps and their checkpoints done): (process, run dir, gate file written then).
    A process still waiting when the test ends (it failed) is killed."""
    run_dir, config, gate = tmp_path / "run", tmp_path / "config.json", tmp_path / "gate"
    save_config(dataclasses.replace(CFG, run_dir=str(run_dir)), config)
    script = tmp_path / "gated.py"
    script.write_text(textwrap.dedent(GATED))
    args = [sys.executable, str(script), str(step), phase, str(gate), "--config", str(config)]
    proc = subprocess.Popen(args, env=ENV, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        yield proc, run_dir, gate
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def _wait_for(path: Path, proc: subprocess.Popen) -> None:
    deadline = time.time() + 300
    while not path.exists():
        assert proc.poll() is None, proc.stdout.read()
        assert time.time() < deadline
        time.sleep(0.02)


# the moment of the kill: a seeded draw of a step after the first checkpoint and before the last step,
# and of the phase of the step the kill falls in
KILL_STEP, KILL_PHASE = (lambda r: (r.randint(1, CFG.steps - 1), r.choice(["generate", "score", "update"])))(
    random.Random(2024)
)


def test_sigkill_mid_run_then_resume_is_bit_identical(tmp_path, reference):
    with _gated(tmp_path, KILL_STEP, KILL_PHASE) as (proc, run_dir, gate):
        _wait_for(gate, proc)
        proc.send_signal(signal.SIGKILL)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL, out
    # killed inside step KILL_STEP + 1: the newest checkpoint and the last metrics row are step KILL_STEP's
    newest = ck.list_checkpoints(run_dir)[-1]
    assert newest.name == f"step-{KILL_STEP:08d}" and KILL_STEP < CFG.steps and ck.verify(newest) is None
    assert len(metrics_rows(run_dir)) == KILL_STEP + 1
    resumed = _start_cli(run_dir, "--resume", str(run_dir))
    out, _ = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, out
    assert [p.name for p in ck.list_checkpoints(run_dir)] == ["step-00000003", "step-00000004"]  # keep_last=2
    _assert_same_run(run_dir, reference)


KILL_IN_SAVE = """
import os, signal, sys
import textzoo.runners.checkpoint as ck
from textzoo.config_files import load_config
from textzoo.runners.trainer import Trainer

real = ck._sha256
def dying_sha256(path):
    if ".staging-step-00000002" in str(path):
        os.kill(os.getpid(), signal.SIGKILL)  # the weights are written, the manifest is not
    return real(path)
ck._sha256 = dying_sha256
Trainer(load_config(sys.argv[1])).train()
"""


def test_kill_inside_a_save_keeps_the_previous_checkpoint(tmp_path, reference):
    run_dir = tmp_path / "run"
    config = tmp_path / "config.json"
    save_config(dataclasses.replace(CFG, run_dir=str(run_dir)), config)
    script = tmp_path / "kill_in_save.py"
    script.write_text(textwrap.dedent(KILL_IN_SAVE))
    proc = subprocess.run(
        [sys.executable, str(script), str(config)], env=ENV, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    root = ck.checkpoints_dir(run_dir)
    assert [p.name for p in ck.list_checkpoints(run_dir)] == ["step-00000001"]
    assert ck.verify(root / "step-00000001") is None
    assert any(p.name.startswith(".staging-step-00000002") for p in root.iterdir())
    Trainer(dataclasses.replace(CFG, run_dir=str(run_dir)), resume=run_dir).train()
    assert not any(p.name.startswith(".staging") for p in root.iterdir())
    _assert_same_run(run_dir, reference)


def _short_run(tmp_path: Path, steps: int = 2) -> Path:
    run_dir = tmp_path / "run"
    Trainer(dataclasses.replace(CFG, run_dir=str(run_dir), steps=steps)).train()
    return run_dir


def test_changed_config_is_refused_before_anything_changes(tmp_path):
    run_dir = _short_run(tmp_path)
    before = (run_dir / "metrics.jsonl").read_bytes()
    changed = dataclasses.replace(CFG, run_dir=str(run_dir), seed=3, agent=AgentConfig(max_new_tokens=8, lr=5e-4))
    with pytest.raises(CheckpointError) as err:
        Trainer(changed, resume=run_dir)
    assert "seed: 0 -> 3" in str(err.value) and "agent.lr: 0.001 -> 0.0005" in str(err.value)
    assert (run_dir / "metrics.jsonl").read_bytes() == before
    assert find_resumable(changed) is None
    # safe fields (a longer run, other eval and checkpoint settings) resume
    extended = dataclasses.replace(CFG, run_dir=str(run_dir), steps=3, eval_prompts=1, keep_last=1)
    assert find_resumable(extended) == run_dir
    trainer = Trainer(extended, resume="auto")
    assert trainer.step == 2 and trainer.run_dir == run_dir


def test_field_added_after_the_checkpoint_resumes_with_its_default(tmp_path, reference):
    run_dir = tmp_path / "run"
    Trainer(dataclasses.replace(CFG, run_dir=str(run_dir))).train()
    # keep step 3 only, rewritten as an older textzoo would have: without two fields (manifest updated)
    path, last = ck.list_checkpoints(run_dir)
    shutil.rmtree(last)
    config = json.loads((path / "config.json").read_text())
    del config["devices"], config["update"]["skip_zero_grad_steps"]
    (path / "config.json").write_text(json.dumps(config))
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["files"]["config.json"] = {
        "bytes": (path / "config.json").stat().st_size,
        "sha256": ck._sha256(path / "config.json"),
    }
    (path / "manifest.json").write_text(json.dumps(manifest))
    trainer = Trainer(dataclasses.replace(CFG, run_dir=str(run_dir)), resume=run_dir)
    assert trainer.step == 3
    trainer.train()
    _assert_same_run(run_dir, reference)


def test_corrupt_newest_checkpoint_falls_back_to_the_previous_one(tmp_path, reference, caplog):
    run_dir = _short_run(tmp_path, steps=3)
    rows_after_3 = len(metrics_rows(run_dir))
    newest = ck.list_checkpoints(run_dir)[-1]
    weights = newest / "weights-summary.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0x01
    weights.write_bytes(bytes(data))
    trainer = Trainer(dataclasses.replace(CFG, run_dir=str(run_dir)), resume=run_dir)
    assert trainer.step == 2 and "sha256" in caplog.text  # the skipped checkpoint is logged, with its damage
    assert len(trainer.history) == rows_after_3 - 1  # the step-3 row was written after the used checkpoint
    trainer.train()
    _assert_same_run(run_dir, reference)


def test_every_checkpoint_damaged_is_a_clear_error(tmp_path):
    run_dir = _short_run(tmp_path)
    for path in ck.list_checkpoints(run_dir):
        (path / "state.pt").write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match="no intact checkpoint.*state.pt"):
        Trainer(dataclasses.replace(CFG, run_dir=str(run_dir)), resume=run_dir)


def test_truncated_metrics_file_is_refused(tmp_path):
    run_dir = _short_run(tmp_path)
    (run_dir / "metrics.jsonl").write_text("")
    with pytest.raises(CheckpointError, match="metrics"):
        Trainer(dataclasses.replace(CFG, run_dir=str(run_dir)), resume=run_dir)


def test_eval_cli_loads_the_final_weights(tmp_path, capsys):
    run_dir = _short_run(tmp_path)
    trainer = Trainer(dataclasses.replace(CFG, run_dir=str(run_dir)), run_dir=run_dir)
    assert trainer.load_final_weights() == 2
    saved = _final_weights(run_dir)["summary"]
    for name, tensor in saved.items():
        assert torch.equal(trainer.learners["summary"].model.state_dict()[name], tensor)
    capsys.readouterr()
    assert cli_main(["eval", "--run-dir", str(run_dir), "--prompts", "2"]) == 0
    assert "eval/greedy/reward/mean" in json.loads(capsys.readouterr().out)
    empty = tmp_path / "empty"
    empty.mkdir()
    save_config(CFG, empty / "config.json")
    assert cli_main(["eval", "--run-dir", str(empty), "--prompts", "2"]) == 2
    assert "no checkpoints" in capsys.readouterr().err


# ---- preemption: SIGTERM / Ctrl-C finish the step, checkpoint, exit 0 ------------------------------
# a stop or the end writes a checkpoint. 24 steps: an idle machine runs a tiny step in ~25 ms, so 8 steps
# ended before a signal sent 0.15 s after step 3 arrived; 21 steps left keep the run going ~0.5 s longer
# than the latest signal here, and a loaded machine only widens that margin (its steps slow down too)
PREEMPT = dataclasses.replace(CFG, steps=24, save_every=0, keep_last=0)


@pytest.fixture(scope="module")
def long_reference(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("long-reference")
    Trainer(dataclasses.replace(PREEMPT, run_dir=str(run_dir))).train()
    return run_dir


def _wait_rows(run_dir: Path, n: int, proc: subprocess.Popen) -> None:
    deadline = time.time() + 300
    metrics = run_dir / "metrics.jsonl"
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= n):
        assert proc.poll() is None, proc.stdout.read()
        assert time.time() < deadline
        time.sleep(0.02)


@pytest.mark.parametrize(
    "sig, rows, delay",
    [
        (signal.SIGTERM, 1, 0.0),  # right after the step-0 evaluation
        (signal.SIGTERM, 3, 0.15),  # inside step 3
        (signal.SIGINT, 5, 0.0),  # a first Ctrl-C, as step 5 starts
    ],
    ids=["term-after-eval", "term-in-a-step", "ctrl-c"],
)
def test_a_signal_finishes_the_step_checkpoints_and_resume_auto_is_bit_identical(
    tmp_path, long_reference, sig, rows, delay
):
    run_dir = tmp_path / "run"
    config = tmp_path / "config.json"
    save_config(dataclasses.replace(PREEMPT, run_dir=str(run_dir)), config)
    proc = _start_cli(run_dir, "--config", str(config))
    _wait_rows(run_dir, rows, proc)
    time.sleep(delay)
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    (saved,) = ck.list_checkpoints(run_dir)
    step = int(saved.name.split("-")[1])
    assert step < PREEMPT.steps and ck.verify(saved) is None
    assert len(metrics_rows(run_dir)) == step + 1  # the checkpoint holds the last finished step
    assert f"stopped by {signal.Signals(sig).name} after step {step} of {PREEMPT.steps}" in out
    assert f"resume with: textzoo train --resume {run_dir}" in out
    resumed = _start_cli(run_dir, "--config", str(config), "--resume", "auto")
    out, _ = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, out
    assert "stopped by" not in out
    _assert_same_run(run_dir, long_reference)


def test_a_second_signal_stops_at_once_and_the_last_checkpoint_survives(tmp_path, reference):
    from textzoo.runners.preemption import DUPLICATE_S

    with _gated(tmp_path, 2, "update") as (proc, run_dir, gate):  # held inside step 3
        _wait_for(gate, proc)
        proc.send_signal(signal.SIGTERM)  # a graceful stop, which waits for the step to end
        _wait_for(gate.with_suffix(".signalled"), proc)
        time.sleep(DUPLICATE_S + 0.2)  # a second signal, not a copy of the first
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGTERM, out
    assert "second SIGTERM: stopping at once" in out
    assert [p.name for p in ck.list_checkpoints(run_dir)] == ["step-00000001", "step-00000002"]
    path, damage = ck.latest_intact(run_dir)
    assert path.name == "step-00000002" and not damage
    Trainer(dataclasses.replace(CFG, run_dir=str(run_dir)), resume="auto").train()
    _assert_same_run(run_dir, reference)


def _replicas(launcher: int, n: int) -> list[int]:
    """Pids of the data-parallel replicas under the CLI process, in rank order (they start in order)."""
    import psutil

    deadline = time.time() + 120
    while time.time() < deadline:
        found = []
        for child in psutil.Process(launcher).children():
            try:
                if any("spawn_main" in part for part in child.cmdline()):
                    found.append((child.create_time(), child.pid))
            except psutil.Error:
                continue
        if len(found) == n:
            return [pid for _, pid in sorted(found)]
        time.sleep(0.1)
    raise AssertionError("the replicas did not start")


def test_data_parallel_replicas_stop_at_the_same_step(tmp_path):
    # SIGTERM reaches only replica 1; the stop flag's all-reduce stops replica 0 (the writer) with it
    cfg = dataclasses.replace(PREEMPT, steps=3, num_processes=2)
    ref_dir, run_dir = tmp_path / "reference", tmp_path / "run"
    for d in (ref_dir, run_dir):
        save_config(dataclasses.replace(cfg, run_dir=str(d)), tmp_path / f"{d.name}.json")
    ref = _start_cli(ref_dir, "--config", str(tmp_path / "reference.json"))
    out, _ = ref.communicate(timeout=600)
    assert ref.returncode == 0, out
    proc = _start_cli(run_dir, "--config", str(tmp_path / "run.json"))
    ranks = _replicas(proc.pid, 2)
    _wait_rows(run_dir, 2, proc)
    os.kill(ranks[1], signal.SIGTERM)
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out
    (saved,) = ck.list_checkpoints(run_dir)
    step = int(saved.name.split("-")[1])
    assert step < cfg.steps and "stopped by a signal to another replica" in out
    assert len(ck.read_checkpoint(saved).state["replicas"]) == 2  # both replicas saved at that step
    resumed = _start_cli(run_dir, "--config", str(tmp_path / "run.json"), "--resume", "auto")
    out, _ = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, out
    assert metrics_rows(run_dir) == metrics_rows(ref_dir)
    got, want = _final_weights(run_dir), _final_weights(ref_dir)
    for model in want:
        for name, tensor in want[model].items():
            assert torch.equal(got[model][name], tensor), f"{model}:{name}"
