"""Data parallelism on CPU (gloo): two replicas equal one process with the combined batch, stay
identical through `Trainer` runs, and resume exactly. The replicas run in subprocesses (spawn)."""

import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch
from helpers import metrics_rows
from replicas import assert_states_equal, run_script

from textzoo.models.policy import Policy
from textzoo.runners import checkpoint as ck
from textzoo.runners.distributed import DistContext, merge_rows

torch.set_num_threads(1)

SCRIPT = '''
import sys
from functools import partial
from pathlib import Path

import torch

from textzoo.algorithms.batch import Job, SampleBatch
from textzoo.decoding.generation import GenerationConfig
from textzoo.models.policy import Policy
from textzoo.algorithms.reinforce.family import ReinforceConfig, reinforce_loss
from helpers import tiny_config
from textzoo.algorithms.batch import Job, SampleBatch
from textzoo.decoding.generation import GenerationConfig
from textzoo.models.policy import Policy
from textzoo.algorithms.reinforce.family import ReinforceConfig, reinforce_loss
from textzoo.config import AgentConfig, TrainConfig
from textzoo.runners.distributed import launch
from textzoo.runners.trainer import Trainer
from textzoo.runners.update import Learner, UpdateConfig, run_job

N = 8  # samples in the combined batch


def fixed_update(rows, grad_sync):
    """Three SGD steps of REINFORCE (seq_sum) on `rows` of one fixed batch; the final weights.

    SGD, not AdamW: Adam divides each gradient by its own scale, so on parameters whose true
    gradient is 0 (GPT-2's key bias) it turns float noise into full-size steps.
    """
    torch.manual_seed(0)
    policy = Policy.tiny("gpt2", n_layer=1, n_embd=32, n_head=2, seed=0, generation=GenerationConfig(max_new_tokens=6))
    gen = policy.generate([f"prompt number {i}" for i in range(N)], generator=torch.Generator().manual_seed(0))
    advantages = torch.linspace(-1.0, 1.0, N)
    learner = Learner(policy.model, torch.optim.SGD(policy.model.parameters(), lr=0.5), max_grad_norm=1.0)
    job = Job("a", SampleBatch(gen.select(rows), advantages[rows]), partial(reinforce_loss, policy, ReinforceConfig()),
              max_new_tokens=6)
    for _ in range(3):
        run_job(job, learner, UpdateConfig(micro_batch_size=3), grad_sync=grad_sync)
    return {k: v.clone() for k, v in policy.model.state_dict().items()}


def replica(ctx, mode, out, run_dir):
    torch.set_num_threads(1)
    if mode == "train":
        share = torch.arange(N)[ctx.shard(N)]
        torch.save(fixed_update(share, ctx.grad_sync), Path(out) / f"fixed-rank{ctx.rank}.pt")
    cfg = tiny_config(steps=3, threads=1, save_every=1, keep_last=3, run_dir=run_dir)
    trainer = Trainer(cfg, dist=ctx, resume=run_dir if mode == "resume" else None)
    trainer.train()
    weights = {n: {k: v.clone() for k, v in l.model.state_dict().items()} for n, l in trainer.learners.items()}
    torch.save(weights, Path(out) / f"{mode}-rank{ctx.rank}.pt")


if __name__ == "__main__":
    mode, out, run_dir = sys.argv[1:]
    launch(replica, 2, mode, out, run_dir)
    if mode == "train":
        torch.set_num_threads(1)
        torch.save(fixed_update(torch.arange(N), None), Path(out) / "fixed-single.pt")
'''


@pytest.fixture(scope="module")
def two_replicas(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dp")
    script = tmp / "dp.py"
    script.write_text(textwrap.dedent(SCRIPT))
    run_script(script, "train", tmp, tmp / "run")
    return script, tmp


def test_two_replicas_equal_one_process_with_the_combined_batch(two_replicas):
    _, out = two_replicas
    rank0, rank1 = torch.load(out / "fixed-rank0.pt"), torch.load(out / "fixed-rank1.pt")
    single = torch.load(out / "fixed-single.pt")
    assert_states_equal(rank0, rank1)
    for name, tensor in single.items():
        torch.testing.assert_close(rank0[name], tensor, rtol=1e-5, atol=1e-6, msg=name)
    # the check has teeth: the three steps moved the weights far beyond the tolerance
    init = Policy.tiny("gpt2", n_layer=1, n_embd=32, n_head=2, seed=0).model.state_dict()
    assert max(float((single[k] - init[k]).abs().max()) for k in init) > 1e-2


def test_trainer_replicas_stay_identical_and_rank0_writes(two_replicas):
    _, out = two_replicas
    assert_states_equal(torch.load(out / "train-rank0.pt"), torch.load(out / "train-rank1.pt"))
    run_dir = out / "run"
    assert len(metrics_rows(run_dir)) == 4  # one writer: steps 0..3
    state = ck.read_checkpoint(ck.list_checkpoints(run_dir)[-1]).state
    assert len(state["replicas"]) == 2


def test_two_replicas_resume_exactly(two_replicas):
    script, out = two_replicas
    run_dir = out / "run"
    shutil.copytree(run_dir, out / "run-uninterrupted")
    shutil.rmtree(ck.list_checkpoints(run_dir)[-1])  # as if killed before step 3 was saved
    run_script(script, "resume", out, run_dir)
    assert_states_equal(torch.load(out / "resume-rank0.pt"), torch.load(out / "train-rank0.pt"))
    assert_states_equal(torch.load(out / "resume-rank1.pt"), torch.load(out / "train-rank1.pt"))
    assert metrics_rows(run_dir) == metrics_rows(out / "run-uninterrupted")


def test_shards_and_merged_rows():
    assert [DistContext(r, 2).shard(8) for r in range(2)] == [slice(0, 4), slice(4, 8)]
    assert DistContext().shard(5) == slice(0, 5)
    rows = [{"step": 3, "reward/mean": 1.0, "eval/x": 0.5}, {"step": 3, "reward/mean": 0.0}]
    assert merge_rows(rows) == {"step": 3, "reward/mean": 0.5, "eval/x": 0.5}


FAILING = """
import os
import sys

import torch.distributed as dist

from textzoo.errors import TextzooError
from textzoo.runners.distributed import launch


def replica(ctx, how):
    if ctx.rank == 1:
        if how == "raise":
            raise ValueError("replica one cannot go on")
        os.abort()  # a native crash, as a C++ library's failed check would make
    dist.barrier()  # waits for a peer that never comes: the launcher (or gloo) stops it


if __name__ == "__main__":
    try:
        launch(replica, 2, sys.argv[1])
    except TextzooError as e:
        print(f"launcher: {e}")
        sys.exit(3)
"""


@pytest.mark.parametrize("how", ["raise", "abort"])
def test_a_failing_replica_stops_the_run_and_its_message_is_shown(tmp_path, how):
    """A program that set up no logging still sees why a replica failed: the exception's traceback, or
    for a native crash every thread's Python stack (faulthandler)."""
    script = tmp_path / "failing.py"
    script.write_text(FAILING)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(script), how], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "launcher: data-parallel replicas failed" in proc.stdout
    if how == "raise":
        assert "1: 1" in proc.stdout
        assert "replica 1 failed" in proc.stderr
        assert "ValueError: replica one cannot go on" in proc.stderr
    else:
        assert "1: -6" in proc.stdout
        assert "Fatal Python error: Aborted" in proc.stderr
        line = next(n for n, text in enumerate(FAILING.splitlines(), 1) if "os.abort()" in text)
        assert f'failing.py", line {line} in replica' in proc.stderr  # the stack names the crashing line
