"""Running out of disk or GPU memory: refused before training, or stopped with the earlier
checkpoints intact and a message that names the folder, the bytes and the fix.

The disk runs out on a real tiny filesystem (a tmpfs in a private mount namespace) and under a real
file-size limit (RLIMIT_FSIZE), both in subprocesses; GPU memory runs out by an injected
`torch.OutOfMemoryError` raised inside the policy's generate or score call, on CPU.
"""

import dataclasses
import errno
import json
import resource
import sys

import pytest
import torch
from confined import REPO, run_on_tiny_disk
from helpers import tiny_config

from textzoo.config_files import save_config
from textzoo.errors import ResourceError
from textzoo.runners import checkpoint as ck
from textzoo.runners import trainer as trainer_module
from textzoo.runners.resources import checkpoint_bytes, optimizer_bytes
from textzoo.runners.trainer import Trainer

torch.set_num_threads(1)

CFG = tiny_config(steps=3, threads=1, save_every=1, keep_last=0)
MiB = 1 << 20


def _folder_bytes(path) -> int:
    return sum(f.stat().st_size for f in path.iterdir())


def test_the_estimate_covers_a_real_checkpoint(tmp_path):
    trainer = Trainer(dataclasses.replace(CFG, steps=1, run_dir=str(tmp_path)))
    before, largest_before = checkpoint_bytes(trainer.learners)
    trainer.train()
    actual = _folder_bytes(ck.list_checkpoints(tmp_path)[-1])
    largest = max(f.stat().st_size for f in ck.list_checkpoints(tmp_path)[-1].iterdir())
    # estimated before any step (Adam's moments not yet allocated) and measured after: both cover it
    assert actual <= before <= 1.5 * actual + 2 * MiB
    assert largest <= largest_before
    assert checkpoint_bytes(trainer.learners)[0] >= actual
    adam = trainer.learners["summary"].optimizer
    params = sum(p.numel() * p.element_size() for g in adam.param_groups for p in g["params"])
    assert optimizer_bytes(adam) >= 2 * params  # exp_avg and exp_avg_sq, measured


def test_an_unwritable_run_dir_is_refused_before_training(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    trainer = Trainer(dataclasses.replace(CFG, run_dir=str(blocker / "run")))
    with pytest.raises(ResourceError, match="not writable.*--run-dir"):
        trainer.train()
    assert trainer.step == 0


TRAIN = """
import sys
from textzoo.config_files import load_config
from textzoo.runners.cli import main
sys.exit(main(["train", "--config", sys.argv[1]]))
"""


def _config(tmp_path, run_dir, **changes):
    path = tmp_path / "config.json"
    save_config(dataclasses.replace(CFG, run_dir=str(run_dir), **changes), path)
    return path


def test_a_disk_too_small_for_one_checkpoint_is_refused_before_training(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    config = _config(tmp_path, disk / "run")
    proc = run_on_tiny_disk(["-c", TRAIN, str(config)], disk, 2 * MiB)
    assert proc.returncode == 2, proc.stderr
    assert "free but a checkpoint needs about" in proc.stderr and str(disk / "run") in proc.stderr
    assert "bytes" in proc.stderr and "--run-dir" in proc.stderr
    assert "train reward" not in proc.stdout  # no step ran


def test_a_full_disk_mid_run_keeps_the_previous_checkpoint_and_says_what_to_do(tmp_path):
    # room for one checkpoint (about 3.7 MB here) but not two: step 1 is saved, step 2 cannot be
    disk = tmp_path / "disk"
    disk.mkdir()
    run_dir = disk / "run"
    config = _config(tmp_path, run_dir)
    check = f"""
import json, sys
sys.path.insert(0, {REPO!r})
from textzoo.runners import checkpoint as ck
code = {TRAIN!r}
try:
    exec(code.replace("sys.exit(", "rc = ("), {{"__name__": "__main__"}})
finally:
    path, damage = ck.latest_intact({str(run_dir)!r})
    print(json.dumps({{"intact": path.name if path else None, "damage": damage,
                       "left": sorted(p.name for p in ck.checkpoints_dir({str(run_dir)!r}).iterdir())}}))
"""
    proc = run_on_tiny_disk(["-c", check, str(config)], disk, 6 * MiB)
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out == {"intact": "step-00000001", "damage": [], "left": ["step-00000001"]}  # no staging left behind
    message = proc.stderr
    assert "writing the checkpoint of step 2" in message and str(run_dir / "checkpoints") in message
    assert "the disk is full" in message and "bytes)" in message and "free space" in message
    assert "step-00000001 is intact" in message and f"--resume {run_dir}" in message


def test_a_file_size_limit_is_refused_before_training(tmp_path):
    import subprocess

    config = _config(tmp_path, tmp_path / "run")
    limit = 1 * MiB  # below the largest checkpoint file; above any log line

    def limited():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    env = {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": REPO, "PATH": "/usr/bin:/bin"}
    proc = subprocess.run(
        [sys.executable, "-c", TRAIN, str(config)], preexec_fn=limited, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 2, proc.stderr
    assert "RLIMIT_FSIZE" in proc.stderr and "ulimit -f" in proc.stderr


def test_a_file_size_limit_hit_while_saving_keeps_the_earlier_checkpoint(tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    trainer = Trainer(dataclasses.replace(CFG, run_dir=str(run_dir)))
    real = ck.save_file
    calls = []

    def efbig(tensors, path, *args, **kwargs):  # what the kernel answers past RLIMIT_FSIZE
        calls.append(path)
        if ".staging-step-00000002" in str(path):
            raise OSError(errno.EFBIG, "File too large", str(path))
        return real(tensors, path, *args, **kwargs)

    monkeypatch.setattr(ck, "save_file", efbig)
    with pytest.raises(ResourceError) as err:
        trainer.train()
    assert "file-size limit" in str(err.value) and "step-00000001 is intact" in str(err.value)
    assert [p.name for p in ck.list_checkpoints(run_dir)] == ["step-00000001"]
    assert ck.verify(ck.list_checkpoints(run_dir)[0]) is None
    assert not any(p.name.startswith(".staging") for p in ck.checkpoints_dir(run_dir).iterdir())


# ---- GPU memory --------------------------------------------------------------------------------
def _fail_in(monkeypatch, policy, method: str):
    """Make `policy.<method>` raise CUDA's out-of-memory error (from a frame of `policy`) while armed."""
    real, armed = getattr(type(policy), method), [False]

    def failing(self, *args, **kwargs):
        if armed[0] and self is policy:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB (GPU 0)")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(type(policy), method, failing)
    return armed


def _arm_during(monkeypatch, target, name, armed, at_step, trainer):
    real = getattr(target, name)

    def wrapped(*args, **kwargs):
        armed[0] = trainer.step + 1 == at_step
        try:
            return real(*args, **kwargs)
        finally:
            armed[0] = False

    monkeypatch.setattr(target, name, wrapped)


@pytest.mark.parametrize("phase", ["generate", "score", "update"])
def test_out_of_memory_names_the_phase_the_model_and_the_knobs(phase, tmp_path, monkeypatch):
    cfg = dataclasses.replace(CFG, run_dir=str(tmp_path / "run"))
    if phase == "score":  # a frozen reference to score against
        cfg = dataclasses.replace(cfg, reinforce=dataclasses.replace(cfg.reinforce, kl_coef=0.1))
    trainer = Trainer(cfg)
    if phase == "generate":  # sampling and scoring run the fast decoder, not forward(): fail in the policy
        armed = _fail_in(monkeypatch, next(a.policy for a in trainer.actors if a.id == "elaboration"), "generate")
        _arm_during(monkeypatch, trainer.collector, "collect", armed, 2, trainer)
        culprit = "elaboration"
    elif phase == "score":
        reference = trainer.family.references["summary"]
        armed = _fail_in(monkeypatch, reference, "score")
        _arm_during(monkeypatch, trainer.family, "jobs", armed, 2, trainer)
        culprit = next(name for name, (m, *_rest) in trainer._team_models.items() if m is reference.model)
    else:  # the loss's forward with gradients
        armed = _fail_in(monkeypatch, next(a.policy for a in trainer.actors if a.id == "summary"), "score")
        _arm_during(monkeypatch, trainer_module, "run_jobs", armed, 2, trainer)
        culprit = "summary"
    with pytest.raises(ResourceError) as err:
        trainer.train()
    message = str(err.value)
    assert f"GPU memory ran out during {phase} ({culprit})" in message
    assert "Tried to allocate 20.00 GiB" in message
    assert "step-00000001 is intact" in message and "--resume" in message
    if phase == "update":
        knobs = ("micro_batch_size", "per_sample_backward", "gradient_checkpointing", "lora.rank", "logits_chunk")
        for knob in knobs:
            assert knob in message
    if phase == "score":
        assert "chunked log-probs" in message and "logits_chunk" in message and "CHUNK" in message
    assert isinstance(err.value.__cause__, torch.OutOfMemoryError)
    assert [p.name for p in ck.list_checkpoints(tmp_path / "run")] == ["step-00000001"]
    assert ck.verify(ck.list_checkpoints(tmp_path / "run")[0]) is None
