"""The plain decoder's elementwise regions compiled for the update: `region(fn, ...)` runs ``fn`` through
`torch.compile` in a bfloat16-autocast CPU forward with gradients on (an update's micro-batch), and as it is
everywhere else (sampling, scoring without gradients, float32, GPUs, under a dispatch mode).

Between its matrix products a Llama layer runs ~20 elementwise ops forward and more backward (residual adds,
RMSNorm, RoPE, casts, SwiGLU), each a pass over memory; compiled, each region is one or two fused loops.
The matrix products stay outside, so the weight gradients still go straight into float32
(`fastlm._LinearIntoGrad`). Only the token dimensions are dynamic (`torch._dynamo.mark_dynamic`), the model's
widths fixed: one compile (~15 s the first time on a machine, a few seconds from inductor's disk cache after)
serves every micro-batch. SmolLM2-135M, bf16, 1 thread: an 8-row micro-batch's forward and backward 826-863
vs 897-988 ms; in the trainer (`benchmarks/real_model.py`, B=8, G=4) the update -15%, the step -11%, peak
RSS ~150 MiB lower (docs/results/2026-12-04-compiled-regions.md).

A pass under a dispatch mode (`torch.utils.flop_counter.FlopCounterMode`, an op timer) runs the regions as
written: torch.compile skips a frame it meets under such a mode for good, so one counted pass would otherwise
leave every later one uncompiled.

Needs a C++ compiler (inductor's CPU backend); without one, or when a compile fails, the regions run as
written (one warning).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
import shutil
import threading
from collections.abc import Callable, Iterator

import torch
from torch.utils import _python_dispatch

COMPILE_UPDATE = True
"""Compile the elementwise regions of bf16 update passes on CPU (`region`), process-wide. Off: every region runs
as written (a run turns them off with `UpdateConfig.compile_regions`, through `allowed`)."""
MIN_WIDTH = 256
"""Regions whose first argument has fewer elements per token (its fixed trailing dimensions) run as written:
a tiny model's elementwise ops are too small to gain from fusion, and it would pay a compile per model shape
(the test suite's many)."""

log = logging.getLogger(__name__)
_failed: list[str] = []  # the first compile error, once one happened: the regions then run as written


@functools.cache
def compiler_available() -> bool:
    """Whether inductor's CPU backend finds a C++ compiler (``CXX`` or g++, as it looks for one)."""
    return shutil.which(os.environ.get("CXX") or "g++") is not None


_one_at_a_time = threading.Lock()
"""Held around each compiled call: two threads (`UpdateConfig.parallel_jobs`) that first meet a region at once
would each compile it (8 graphs instead of 4 in a tiny model's two-thread update), the second as a recompile
that dynamo itself calls unexpected."""
_local = threading.local()  # .on: what `allowed` set in this thread (unset: allowed)


@contextlib.contextmanager
def allowed(on: bool) -> Iterator[None]:
    """Inside, in this thread: the regions compile only if ``on`` (an update job's
    `UpdateConfig.compile_regions`) and `COMPILE_UPDATE`."""
    before = getattr(_local, "on", True)
    _local.on = on
    try:
        yield
    finally:
        _local.on = before


def _applies(first: torch.Tensor, width: int) -> bool:
    """Whether a region whose first argument is ``first``, of ``width`` elements per token, runs compiled now."""
    return (
        COMPILE_UPDATE
        and getattr(_local, "on", True)
        and not _failed
        and first.device.type == "cpu"
        and width >= MIN_WIDTH
        and torch.is_grad_enabled()
        and torch.is_autocast_enabled("cpu")
        and torch.get_autocast_dtype("cpu") == torch.bfloat16
        and not torch.compiler.is_dynamo_compiling()  # is_compiling() is process-wide: true in other threads
        and _python_dispatch._get_current_dispatch_mode() is None  # else skipped for good (docstring)
        and compiler_available()
    )


def region(fn: Callable, fixed: tuple[int | None, ...]) -> Callable:
    """``fn`` (a pure function of tensors and constants), compiled when `_applies`. ``fixed[i]``: how many
    trailing dimensions of argument i are the model's (fixed); the ones before them count tokens and are
    dynamic. None: an argument that is not a token tensor (a weight, a constant). ``torch.compile`` is called
    at the first compiled call: calling it imports inductor (1.2 s on a 2-core Xeon), which a process that
    never runs a bf16 update (sampling, scoring, a tiny model, every test process) should not pay."""
    compiled: list[Callable] = []  # torch.compile(fn), once made

    @functools.wraps(fn)
    def call(*args):
        first = args[0]
        if not _applies(first, math.prod(first.shape[first.dim() - (fixed[0] or 0) :])):
            return fn(*args)
        for arg, trailing in zip(args, fixed):
            if trailing is not None and isinstance(arg, torch.Tensor):
                for dim in range(arg.dim() - trailing):
                    if arg.shape[dim] > 1:  # sizes 0 and 1 are specialised
                        torch._dynamo.mark_dynamic(arg, dim)
        try:
            with _one_at_a_time:
                if not compiled:
                    compiled.append(torch.compile(fn, dynamic=None))
                return compiled[0](*args)
        except Exception as error:  # no working toolchain, an unsupported op: run as written from now on
            _failed.append(repr(error))
            log.warning("compiled update regions are off for this process (%s); running them as written", error)
            return fn(*args)

    return call
