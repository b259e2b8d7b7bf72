"""Stopping a run cleanly: SIGTERM (a cluster's preemption) or a first Ctrl-C finishes the current step.

`GracefulStop` turns the first SIGTERM/SIGINT into a request the training loop reads between steps
(it then checkpoints and returns); a second signal, a second or more after the first, ends the
process at once the way the signal would have. Copies of one signal that arrive together (the
terminal's Ctrl-C reaches every process of its group, a launcher forwards it too) count once.
`agree` makes data-parallel replicas stop at the same step: the request of any replica stops all.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from types import FrameType

import torch
import torch.distributed as dist

logger = logging.getLogger(__name__)

SIGNALS = (signal.SIGTERM, signal.SIGINT)
DUPLICATE_S = 1.0
"""A repeat of the signal within this many seconds is the same request (delivered twice), not a second one."""


class GracefulStop:
    """While entered (in the main thread), SIGTERM/SIGINT request a stop instead of ending the process."""

    def __init__(self, signals: tuple[int, ...] = SIGNALS):
        self.signals = signals
        self.signum: int | None = None
        self._at = 0.0
        self._previous: dict[int, object] = {}

    @property
    def requested(self) -> bool:
        return self.signum is not None

    @property
    def name(self) -> str:
        """The signal that asked to stop, e.g. "SIGTERM" ("" when none did)."""
        return signal.Signals(self.signum).name if self.signum is not None else ""

    def __enter__(self) -> GracefulStop:
        if threading.current_thread() is threading.main_thread():  # signal handlers live there only
            for sig in self.signals:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        now = time.monotonic()
        if self.signum is None:
            self.signum, self._at = signum, now
            logger.warning(
                "%s received: finishing the current step, then writing a checkpoint and stopping "
                "(send it again to stop at once, without a checkpoint)",
                signal.Signals(signum).name,
            )
        elif now - self._at >= DUPLICATE_S:
            logger.warning("second %s: stopping at once", signal.Signals(signum).name)
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)


def agree(requested: bool) -> bool:
    """True on every replica when any replica's stop was requested (an all-reduce when distributed)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return requested
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"
    flag = torch.tensor([int(requested)], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def resume_hint(run_dir: os.PathLike | str, step: int, steps: int, signame: str, checkpointed: bool) -> str:
    """The lines the CLI prints after a graceful stop."""
    if not checkpointed:
        return f"stopped by {signame} before the first step finished; nothing to resume: run the command again"
    return (
        f"stopped by {signame} after step {step} of {steps}; its checkpoint is in {run_dir}\n"
        f"resume with: textzoo train --resume {run_dir}   (or --resume auto with the same config)"
    )
