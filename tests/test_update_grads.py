"""`run_jobs` frees each learner's gradients after its job: the same weights as `run_job`, no gradients kept."""

import torch

from textzoo.algorithms.batch import Job, SampleBatch
from textzoo.algorithms.reinforce.family import ReinforceConfig, reinforce_loss
from textzoo.models.policy import Policy
from textzoo.runners.update import Learner, UpdateConfig, run_job, run_jobs


def _setup():
    policies = [Policy.tiny(seed=s) for s in (1, 2)]
    jobs, learners = [], {}
    for name, policy in zip("ab", policies):
        torch.manual_seed(0)
        gen = policy.generate([f"prompt {i} " * (i + 1) for i in range(6)])
        batch = SampleBatch(gen, torch.linspace(-1, 1, 6))
        loss = (lambda p: lambda b, n: reinforce_loss(p, ReinforceConfig(), b, n))(policy)
        jobs.append(Job(name, batch, loss, max_new_tokens=32))
        learners[name] = Learner(policy.model, torch.optim.AdamW(policy.model.parameters(), lr=1e-2))
    return jobs, learners


def test_run_jobs_frees_gradients_and_steps_like_run_job():
    cfg = UpdateConfig(micro_batch_size=2)
    jobs, learners = _setup()
    kept = [run_job(job, learners[job.learner], cfg) for job in jobs]
    assert all(p.grad is not None for x in learners.values() for p in x.params)  # run_job keeps them by default
    want = [torch.cat([p.detach().flatten() for p in x.params]) for x in learners.values()]
    jobs, learners = _setup()
    freed = run_jobs(jobs, learners, cfg)
    assert all(p.grad is None for x in learners.values() for p in x.params)
    got = [torch.cat([p.detach().flatten() for p in x.params]) for x in learners.values()]
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    assert [freed[j.learner]["optimizer_steps"] for j in jobs] == [k["optimizer_steps"] for k in kept] == [1, 1]
    assert not torch.equal(want[0], torch.cat([p.detach().flatten() for p in Policy.tiny(seed=1).model.parameters()]))


HEAP_BLOCK, HEAP_BLOCKS = 4 << 20, 24  # 96 MiB in all: below the mmap threshold, within the trim threshold
_HEAP_PROBE = f"""
import resource
import torch
from textzoo.runners.update import tune_heap
assert tune_heap()
def touch():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    blocks = [torch.ones({HEAP_BLOCK // 4}) for _ in range({HEAP_BLOCKS})]  # written, so every page is mapped
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    del blocks
    return faults
touch()  # at most every page fresh (fewer where the heap already had room)
print(touch())
"""


def test_tuned_heap_reuses_freed_memory_instead_of_faulting_fresh_pages():
    """After `tune_heap` (which the first job calls), blocks freed below the mmap threshold stay mapped:
    allocating them again takes no fresh pages (glibc's defaults fault nearly all 24,576 in again).

    In a fresh process: what glibc keeps depends on the heap's history (free memory at the top beyond
    the trim threshold is given back whole), which a long test session makes anything."""
    import platform
    import subprocess
    import sys

    import pytest

    from textzoo.runners.update import HEAP_MMAP_THRESHOLD

    if platform.libc_ver()[0] != "glibc":
        pytest.skip("the heap thresholds are glibc's")
    assert HEAP_BLOCK < HEAP_MMAP_THRESHOLD
    out = subprocess.run([sys.executable, "-c", _HEAP_PROBE], capture_output=True, text=True, check=True)
    pages, again = HEAP_BLOCKS * HEAP_BLOCK // 4096, int(out.stdout.split()[-1])
    assert again < pages / 10, (pages, again)  # reused: glibc's defaults fault nearly all of them in again
