"""Update scheduling: one optimizer per trainable model, micro-batches and per-sample backward.

`run_job` executes a family's `Job`: for each optimizer step it back-propagates the per-sample loss
contributions of one micro-batch at a time (one sample at a time with `per_sample_backward`), so
peak activation memory is one micro-batch's while the gradient equals the batched one; clips the
gradient; skips the step when every gradient is exactly zero; and skips non-finite samples.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import math
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch

from textzoo.algorithms.batch import Job
from textzoo.algorithms.rlmath import BatchNorm
from textzoo.config import UpdateConfig
from textzoo.decoding import compiled
from textzoo.decoding.backends.module import has_dropout
from textzoo.decoding.fastlm import forget_casts, forget_packed
from textzoo.runners import sharding


@dataclass
class Learner:
    """A trainable model with its optimizer, schedule, clip target and weight version."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None
    max_grad_norm: float | None = 1.0
    version: int = 0
    params: list[torch.nn.Parameter] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.params:
            self.params = [p for p in self.model.parameters() if p.requires_grad]

    @property
    def device(self) -> torch.device:
        """Where the trained parameters live (what a job's batch is moved to)."""
        return self.params[0].device if self.params else torch.device("cpu")

    def state_dict(self) -> dict:
        """Optimizer (whole, for an FSDP-sharded model: a collective), scheduler and weight version."""
        sharded = sharding.is_sharded(self.model)
        return {
            "optimizer": sharding.full_optimizer_state(self.model, self.optimizer)
            if sharded
            else self.optimizer.state_dict(),
            "scheduler": None if self.scheduler is None else self.scheduler.state_dict(),
            "version": self.version,
        }

    def load_state_dict(self, state: dict) -> None:
        if sharding.is_sharded(self.model):
            sharding.load_optimizer_state(self.model, self.optimizer, state["optimizer"])
        else:
            self.optimizer.load_state_dict(state["optimizer"])
        if self.scheduler is not None and state.get("scheduler") is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        self.version = int(state["version"])


def disjoint_models(models: list[torch.nn.Module]) -> bool:
    """Whether no two models share a module or parameter (a LoRA base or a shared trunk holds state
    that threads running them at once would race on)."""
    seen: set[int] = set()
    for model in models:
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        ids = {id(x) for m in (model, base) for x in (*m.modules(), *m.parameters())}
        if ids & seen:
            return False
        seen |= ids
    return True


def _independent(jobs: list[Job], learners: dict[str, Learner]) -> bool:
    """Whether the jobs can run at once without changing results: disjoint models, no dropout and no
    reshuffling (both draw from the global RNG, whose order threads would make arbitrary)."""
    models = [learners[job.learner].model for job in jobs]
    if any(job.epochs > 1 or job.minibatches > 1 for job in jobs) or not disjoint_models(models):
        return False
    return not any(has_dropout(model) for model in models)


def run_jobs(
    jobs: list[Job],
    learners: dict[str, Learner],
    cfg: UpdateConfig,
    grad_sync: Callable[[list[torch.nn.Parameter]], None] | None = None,
) -> dict[str, dict[str, float]]:
    """`run_job` for each job (learner id -> statistics); independent jobs run in `parallel_jobs` threads.

    Torch ops release the GIL, so two learners' forwards and backwards use two cores. Gradient
    synchronisation across replicas keeps jobs sequential (collectives must be issued in one order).
    The rollout's packed weight copies (`textzoo.decoding.fastlm.packed_weight`) are dropped first; each
    learner's gradients are freed once its job is done, so the next job and the next rollout do not
    hold them (a 135M-parameter model's: 513 MiB); one at a time, a learner's job runs without the bf16
    weight copies (`textzoo.decoding.fastlm.autocast_weight`) of the learners after it, which their own
    jobs cast again (256 MiB at that size, for a cast that takes a tenth of a second).
    """
    workers = min(cfg.parallel_jobs, len(jobs))
    forget_packed()  # the rollout's packed weight copies: the update reads none
    if workers < 2 or grad_sync is not None or not _independent(jobs, learners):
        stats = {}
        for k, job in enumerate(jobs):
            for later in jobs[k + 1 :]:  # their bf16 weight copies are cast again in their own jobs
                forget_casts(learners[later.learner].optimizer)
            stats[job.learner] = run_job(job, learners[job.learner], cfg, grad_sync=grad_sync, free_grads=True)
        return stats
    # Longest first (by tokens) keeps the threads busy to the end: e.g. MAAC's critic over long states
    # starts at once instead of after an actor. Order cannot change results: the jobs are independent.
    order = sorted(jobs, key=_job_tokens, reverse=True)
    with ThreadPoolExecutor(workers) as pool:
        stats = dict(
            zip(
                (job.learner for job in order),
                pool.map(lambda job: run_job(job, learners[job.learner], cfg, free_grads=True), order),
            )
        )
    return {job.learner: stats[job.learner] for job in jobs}


HEAP_MMAP_THRESHOLD = 32 << 20
"""Allocations from this size on get pages of their own (glibc's ``M_MMAP_THRESHOLD``): its largest
automatic value, fixed (setting the trim threshold turns the automatic one off)."""
HEAP_TRIM_THRESHOLD = 256 << 20
"""Free memory at the top of the heap that glibc keeps mapped for reuse (``M_TRIM_THRESHOLD``)."""


@functools.cache
def tune_heap() -> bool:
    """Set glibc's heap thresholds (`HEAP_MMAP_THRESHOLD`, `HEAP_TRIM_THRESHOLD`) for this process, once;
    False without glibc (macOS, musl), where nothing changes.

    By default glibc gives memory back to the system as soon as a few MiB are free at the top of the
    heap, so each micro-batch's activations, each learner's gradients and each step's weight copies
    land on fresh pages that the kernel zeroes and maps one fault at a time. Keeping up to 256 MiB free
    for reuse cuts that: SmolLM2-135M, two agents, B=8 (`benchmarks/real_model.py`): 396-462k minor page
    faults per update -> 166-186k, 18.8-20.9 -> 17.2-18.2 CPU s per step, peak RSS +110 MiB."""
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h
    return bool(mallopt(M_MMAP_THRESHOLD, HEAP_MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, HEAP_TRIM_THRESHOLD))


def _job_tokens(job: Job) -> int:
    """A job's size: the prompt and completion tokens its batch runs through the model."""
    gen = job.batch.gen
    return int(gen.prompt_mask.sum()) + int(gen.completion_mask.sum())


def run_job(
    job: Job,
    learner: Learner,
    cfg: UpdateConfig,
    generator: torch.Generator | None = None,
    grad_sync: Callable[[list[torch.nn.Parameter]], None] | None = None,
    free_grads: bool = False,
) -> dict[str, float]:
    """Train `learner` on `job`; return averaged statistics (loss, grad norm, skips). With ``free_grads``,
    the parameters' gradients are dropped at the end (`run_jobs` does; else they stay for inspection).

    `grad_sync(params)`, when given, runs once per optimizer step before the zero-gradient check and
    clipping (data parallelism averages gradients over replicas there). The first job of a process sets
    its heap thresholds (`tune_heap`). The elementwise regions of bf16 passes compile as
    ``cfg.compile_regions`` says (`textzoo.decoding.compiled.allowed`).
    """
    with compiled.allowed(cfg.compile_regions):
        return _run_job(job, learner, cfg, generator, grad_sync, free_grads)


def _run_job(
    job: Job,
    learner: Learner,
    cfg: UpdateConfig,
    generator: torch.Generator | None,
    grad_sync: Callable[[list[torch.nn.Parameter]], None] | None,
    free_grads: bool,
) -> dict[str, float]:
    tune_heap()
    batch = job.batch.to(learner.device)
    n = len(batch)
    micro = 1 if cfg.per_sample_backward else cfg.micro_batch_size
    learner.model.train()
    totals: dict[str, float] = {"loss": 0.0, "grad_norm": 0.0, "steps": 0, "skipped_zero_grad": 0, "nonfinite": 0}
    extra: dict[str, list[float]] = {}
    for _ in range(job.epochs):
        order = torch.randperm(n, generator=generator) if job.epochs > 1 or job.minibatches > 1 else torch.arange(n)
        for mb in torch.tensor_split(order, min(job.minibatches, n)):
            if len(mb) == 0:
                continue
            norm = BatchNorm.of(batch.gen.completion_mask[mb], job.max_new_tokens)
            for p in learner.params:
                p.grad = None
            loss_sum = 0.0
            # per-sample backward: the samples of one prompt share its forward (exact; one prompt +
            # one sample of activations); the context runs the prompt's backward before the step
            shared = job.prompt_cache if micro == 1 and job.prompt_cache is not None else nullcontext
            with shared():
                for chunk in torch.split(mb, micro):
                    contrib, stats = job.loss(batch.select(chunk), norm)  # [m]
                    finite = torch.isfinite(contrib)
                    totals["nonfinite"] += int((~finite).sum())
                    if finite.any():
                        loss = contrib[finite].sum()
                        loss.backward()
                        loss_sum += float(loss.detach())
                    for k, v in stats.items():
                        extra.setdefault(k, []).append(float(v))
            totals["loss"] += loss_sum
            if grad_sync is not None:
                grad_sync(learner.params)
            grads = [p.grad for p in learner.params if p.grad is not None]
            if cfg.skip_zero_grad_steps and all(not bool(g.any()) for g in grads):
                totals["skipped_zero_grad"] += 1
                continue
            max_norm = learner.max_grad_norm if learner.max_grad_norm else math.inf
            grad_norm = torch.nn.utils.clip_grad_norm_(learner.params, max_norm)
            if not torch.isfinite(grad_norm):
                totals["nonfinite"] += 1
                continue
            totals["grad_norm"] += float(grad_norm)
            learner.optimizer.step()
            if learner.scheduler is not None:
                learner.scheduler.step()
            learner.version += 1
            totals["steps"] += 1
    if free_grads:  # the next pass starts from None anyway; later jobs and the next rollout then run without them
        for p in learner.params:
            p.grad = None
    passes = max(job.epochs * min(job.minibatches, max(n, 1)), 1)
    out = {
        "loss": totals["loss"] / passes,
        "grad_norm": totals["grad_norm"] / max(totals["steps"], 1),
        "optimizer_steps": totals["steps"],
        "skipped_zero_grad": totals["skipped_zero_grad"],
        "nonfinite_skipped": totals["nonfinite"],
    }
    out.update({k: sum(v) / len(v) for k, v in extra.items()})
    return out
