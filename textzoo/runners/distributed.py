"""Data parallelism over torch.distributed: K replicas of the team, each on its own prompts.

Every replica draws the same global batch of `batch_prompts` items and plays its own equal share;
gradients are averaged (all-reduce) before clipping and stepping, so the weights stay identical on
every replica. Replica 0 writes logs and checkpoints. Backend: NCCL on GPUs, gloo on CPU.

Launch: `textzoo train --num-processes K` starts K local processes (`launch`). `torchrun` and
`accelerate launch` describe the process group in the environment (RANK, WORLD_SIZE, MASTER_ADDR,
...); `DistContext.from_env` joins it, so multi-node runs need nothing else.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.tensor import DTensor

from textzoo.errors import TextzooError

logger = logging.getLogger(__name__)


@dataclass
class DistContext:
    """This process's place in the process group (rank 0 of 1 when not distributed)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @classmethod
    def from_env(cls) -> DistContext:
        """Join the process group a launcher describes in the environment; a lone process without one."""
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world <= 1:
            return cls()
        rank = int(os.environ["RANK"])
        local = int(os.environ.get("LOCAL_RANK", rank))
        if not dist.is_initialized():
            if torch.cuda.is_available():
                torch.cuda.set_device(local)
            dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        return cls(rank, world, local)

    def shard(self, n: int) -> slice:
        """This replica's equal share of `n` items."""
        per = n // self.world_size
        return slice(self.rank * per, (self.rank + 1) * per)

    def grad_sync(self, params: Sequence[torch.nn.Parameter]) -> None:
        """Average gradients over replicas (a parameter without a gradient counts as zero); FSDP-sharded
        parameters (DTensors) are left alone: their backward already averaged them."""
        params = [p for p in params if not isinstance(p, DTensor)]
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        groups: dict[tuple, list[torch.Tensor]] = {}
        for p in params:
            groups.setdefault((p.grad.device, p.grad.dtype), []).append(p.grad)
        for grads in groups.values():
            flat = torch.cat([g.reshape(-1) for g in grads])  # [sum of numels]
            dist.all_reduce(flat)
            flat /= self.world_size
            for g, part in zip(grads, flat.split([g.numel() for g in grads])):
                g.copy_(part.view_as(g))

    def gather(self, obj: Any) -> list[Any]:
        """`obj` of every replica, in rank order."""
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def broadcast(self, obj: Any) -> Any:
        """Replica 0's `obj` on every replica."""
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def broadcast_module(self, module: torch.nn.Module) -> None:
        """Copy replica 0's parameters and buffers into every replica's `module`."""
        with torch.no_grad():
            for t in [*module.parameters(), *module.buffers()]:
                dist.broadcast(t.data, src=0)

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()


def merge_rows(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """One metrics row from every replica's: equal values kept, other numbers averaged."""
    out: dict[str, Any] = {}
    for key in dict.fromkeys(k for row in rows for k in row):
        values = [row[key] for row in rows if key in row]
        if all(v == values[0] for v in values):
            out[key] = values[0]
        elif all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            out[key] = sum(values) / len(values)
        else:
            out[key] = values[0]
    return out


def _worker(env: dict[str, str], fn: Callable[..., None], args: tuple) -> None:
    os.environ.update(env)
    faulthandler.enable(all_threads=True)  # a native crash (abort, segfault) prints every thread's Python stack
    code = 0
    try:
        fn(DistContext.from_env(), *args)
    except TextzooError as e:
        _report(f"error (replica {env['RANK']}): {e}", exc_info=False)
        code = 2
    except BaseException:
        _report(f"replica {env['RANK']} failed", exc_info=True)
        code = 1
    finally:
        if dist.is_initialized() and code == 0:
            dist.destroy_process_group()
        sys.stdout.flush()
        sys.stderr.flush()
        # gloo can abort in its destructors at interpreter exit; leave without running them
        os._exit(code)


def _report(message: str, exc_info: bool) -> None:
    """Log a replica's failure; straight to stderr when no handler would show the record (a program that
    set up no logging), since the launcher's error points at these messages."""
    if _shows_errors(logger):
        logger.error(message, exc_info=exc_info)
        return
    print(message, file=sys.stderr)
    if exc_info:
        traceback.print_exc()


def _shows_errors(log: logging.Logger) -> bool:
    """Whether an ERROR record of `log` reaches a handler that emits it (`logging.NullHandler` does not)."""
    if not log.isEnabledFor(logging.ERROR):
        return False
    current: logging.Logger | None = log
    while current is not None:
        if any(not isinstance(h, logging.NullHandler) and h.level <= logging.ERROR for h in current.handlers):
            return True
        current = current.parent if current.propagate else None
    return False


@contextmanager
def _forward_signals(procs: list) -> Iterator[None]:
    """SIGTERM/SIGINT to the launcher reach every replica (which stop after their step together); a
    second one, a second or more later, kills them all at once."""
    from textzoo.runners.preemption import DUPLICATE_S, SIGNALS

    first: list[float] = []

    def forward(signum: int, frame: Any) -> None:
        if not first or time.monotonic() - first[0] < DUPLICATE_S:
            first[:] = first or [time.monotonic()]
            for p in procs:
                if p.is_alive():
                    os.kill(p.pid, signum)
            return
        for p in procs:
            if p.is_alive():
                p.kill()
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, forward) for sig in SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def launch(fn: Callable[..., None], num_processes: int, *args: Any) -> None:
    """Run `fn(ctx, *args)` in `num_processes` local processes joined in one process group.

    `fn` must be importable by a fresh interpreter (spawn). If one replica fails, the others are
    stopped (they would wait forever in the next all-reduce) and `TextzooError` names the failures.
    """
    # The launcher hosts the rendezvous store (as torchrun's agent does) on a port it holds from the
    # start: a port picked free and handed to rank 0 could be taken by another process (another launch,
    # an engine) in the seconds before rank 0 binds it, and two runs would then join one group.
    store = dist.TCPStore("127.0.0.1", 0, num_processes, is_master=True, wait_for_workers=False)
    base = {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(store.port),
        "WORLD_SIZE": str(num_processes),
        "LOCAL_WORLD_SIZE": str(num_processes),
        "TORCHELASTIC_USE_AGENT_STORE": "True",  # every replica is a client of the launcher's store
    }
    ctx = mp.get_context("spawn")
    procs = []
    for rank in range(num_processes):
        env = {**base, "RANK": str(rank), "LOCAL_RANK": str(rank)}
        p = ctx.Process(target=_worker, args=(env, fn, args))
        p.start()
        procs.append(p)
    with _forward_signals(procs):
        while any(p.is_alive() for p in procs):
            if any(p.exitcode not in (None, 0) for p in procs):
                for p in procs:
                    if p.is_alive():
                        p.kill()
                break
            time.sleep(0.1)
        for p in procs:
            p.join()
    del store  # the replicas are gone: stop serving
    failed = {rank: p.exitcode for rank, p in enumerate(procs) if p.exitcode != 0}
    if failed:
        raise TextzooError(f"data-parallel replicas failed (rank: exit code) {failed}; see their messages above")
