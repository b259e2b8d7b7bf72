"""Running out of disk or GPU memory: checked before training, caught where it happens, explained.

- `checkpoint_bytes` estimates one checkpoint from the trainable weights and their optimizer states;
  `check_run_dir` refuses to start when the run dir is not writable, its disk has less room than
  that, or RLIMIT_FSIZE is below the largest file.
- `write_failure` turns a failed checkpoint write (disk full, quota, file-size limit) into a
  `ResourceError` naming the folder, the bytes needed and the fix; the checkpoint writer leaves
  the earlier checkpoints as they were.
- `out_of_memory` catches `torch.OutOfMemoryError` in one phase of a step (generate, score, update,
  evaluate), names the model it happened in and the settings that lower that phase's memory.
"""

from __future__ import annotations

import errno
import os
import resource
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from textzoo.errors import ResourceError
from textzoo.runners.checkpoint import model_weights

_MARGIN = 1.1  # torch.save and safetensors headers, RNG and family states: small next to the weights
_EXTRA = 1 << 20
DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
"""A write that failed for lack of room: disk full, quota, file-size limit."""


def _bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def optimizer_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of the optimizer's state: measured once it has stepped, estimated before."""
    measured = sum(_bytes(v) for state in optimizer.state.values() for v in state.values() if torch.is_tensor(v))
    if measured:
        return measured
    params = [p for group in optimizer.param_groups for p in group["params"] if p.requires_grad]
    slots = 2 if isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)) else 1  # Adam: two moments
    return slots * sum(_bytes(p) for p in params)


def checkpoint_bytes(learners: Mapping[str, Any]) -> tuple[int, int]:
    """(bytes of one checkpoint, bytes of its largest file) for learners with `.model` and `.optimizer`."""
    weights = {name: sum(_bytes(t) for t in model_weights(lrn.model).values()) for name, lrn in learners.items()}
    state = sum(optimizer_bytes(lrn.optimizer) for lrn in learners.values())
    total = int((sum(weights.values()) + state) * _MARGIN) + _EXTRA
    largest = int(max([*weights.values(), state]) * _MARGIN) + _EXTRA
    return total, largest


def _size(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def check_run_dir(run_dir: str | Path, needed: int, largest: int) -> None:
    """Raise `ResourceError` unless `run_dir` can take one more checkpoint of `needed` bytes."""
    run_dir = Path(run_dir)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=run_dir, prefix=".write-test-"):
            pass
    except OSError as e:
        raise ResourceError(
            f"the run dir {run_dir} is not writable ({e.strerror or e}); pass --run-dir a folder you can write to"
        ) from e
    free = shutil.disk_usage(run_dir).free
    if free < needed:
        raise ResourceError(
            f"the disk of {run_dir} has {_size(free)} free but a checkpoint needs about {_size(needed)} "
            f"({needed} bytes: trainable weights and optimizer state); free space there, pass --run-dir on "
            "another disk, or train fewer weights (agent.lora.rank, frozen agents)"
        )
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    if limit != resource.RLIM_INFINITY and limit < largest:
        raise ResourceError(
            f"this process may write files of at most {_size(limit)} (RLIMIT_FSIZE, `ulimit -f`) but a "
            f"checkpoint file needs about {_size(largest)}; raise the limit (ulimit -f unlimited) or train "
            "fewer weights (agent.lora.rank)"
        )


def write_failure(error: OSError, run_dir: str | Path, step: int, needed: int, previous: Path | None) -> ResourceError:
    """The error for a checkpoint write that failed with `error` (the earlier checkpoints are intact)."""
    root = Path(run_dir) / "checkpoints"
    kept = (
        f"the previous checkpoint {previous} is intact; after fixing, resume with --resume {run_dir}"
        if previous is not None
        else "no earlier checkpoint exists, so a restart begins at step 0"
    )
    if error.errno in DISK_ERRNOS:
        why = {errno.ENOSPC: "the disk is full", errno.EDQUOT: "the disk quota is exhausted"}.get(
            error.errno, "a file-size limit (RLIMIT_FSIZE, `ulimit -f`) was hit"
        )
        fix = "free space there (or raise the quota / limit), or point --run-dir at a disk with room"
    else:
        why, fix = error.strerror or str(error), "check that the folder is writable"
    return ResourceError(
        f"writing the checkpoint of step {step} into {root} failed: {why} ({error}). It needs about "
        f"{_size(needed)} ({needed} bytes). {fix}; {kept}"
    )


def as_write_error(error: BaseException, run_dir: str | Path, needed: int) -> OSError | None:
    """The OSError behind a failed checkpoint write, or None when it was not about the disk.

    torch.save and safetensors report a full disk as their own errors (e.g. "unexpected pos" from
    torch's zip writer): a disk with less room than a checkpoint, or a file-size limit below it,
    identifies them.
    """
    for e in (error, error.__cause__, error.__context__):
        if isinstance(e, OSError):
            return e
    if shutil.disk_usage(run_dir).free < needed:
        return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(run_dir))
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    if limit != resource.RLIM_INFINITY and limit < needed:
        return OSError(errno.EFBIG, os.strerror(errno.EFBIG), str(run_dir))
    return None


# ---- GPU memory --------------------------------------------------------------------------------
ADVICE = {
    "generate": "fewer batch_prompts or group_size, a smaller agent.max_new_tokens, LoRA adapters on one "
    "shared base (agent.lora.rank), or devices= / device_map to spread the models",
    "score": "smaller chunks: the chunked log-probs (Policy.logits_chunk logit elements at a time) and "
    "the no-grad scorer's textzoo.decoding.inference.CHUNK samples per forward; a smaller batch "
    "(batch_prompts, group_size), or a device_map that puts the reference/critic on another GPU",
    "update": "a smaller update.micro_batch_size, update.per_sample_backward=True (one sample's "
    "activations at a time), agent.gradient_checkpointing=True, LoRA (agent.lora.rank) to drop the "
    "full optimizer state, agent.precision='bf16-mixed', or smaller chunked log-probs "
    "(Policy.logits_chunk; textzoo.decoding.inference.CHUNK for scoring)",
    "evaluate": "fewer eval_prompts or a smaller agent.max_new_tokens",
}


def _culprit(tb, owners: Mapping[int, str]) -> str | None:
    """The name of the innermost traceback frame's `self` (or its `.model`) among the named objects."""
    found = None
    while tb is not None:
        obj = tb.tb_frame.f_locals.get("self")
        for candidate in (obj, getattr(obj, "model", None)):  # a model, or a policy over one
            if candidate is not None and id(candidate) in owners:
                found = owners[id(candidate)]
                break
        tb = tb.tb_next
    return found


def _memory_report() -> str:
    if not torch.cuda.is_available():
        return ""
    parts = []
    for i in range(torch.cuda.device_count()):
        free, total = torch.cuda.mem_get_info(i)
        parts.append(f"cuda:{i} {_size(total - free)} of {_size(total)} in use")
        parts[-1] += f" ({_size(torch.cuda.memory_allocated(i))} by torch)"
    return "; ".join(parts)


@contextmanager
def out_of_memory(
    phase: str, owners: Mapping[int, str], last_checkpoint: Callable[[], Path | None], settings: str = ""
) -> Iterator[None]:
    """Re-raise a CUDA out-of-memory error in `phase` as a `ResourceError` that says what to change.

    `owners`: id of a model or policy -> its name (the culprit is found in the traceback);
    `settings`: the current values of the knobs, for the message.
    """
    try:
        yield
    except torch.OutOfMemoryError as e:
        model = _culprit(sys.exc_info()[2], owners)
        where = f"{phase} ({model})" if model else phase
        first = str(e).strip().splitlines()[0] if str(e).strip() else "CUDA out of memory"
        checkpoint = last_checkpoint()
        kept = f"the last checkpoint {checkpoint} is intact" if checkpoint else "no checkpoint was written yet"
        report = _memory_report()
        raise ResourceError(
            f"GPU memory ran out during {where}: {first}"
            + (f" [{report}]" if report else "")
            + f". What lowers it: {ADVICE.get(phase, ADVICE['update'])}"
            + (f" (now {settings})" if settings else "")
            + f"; {kept}, resume from it with --resume after changing these settings"
        ) from e


def owners_of(named: Iterable[tuple[str, Any]]) -> dict[int, str]:
    """id -> name for each (name, model or policy) pair, a policy's model and a LoRA model's base too."""
    out: dict[int, str] = {}
    for name, obj in named:
        out[id(obj)] = name
        model = getattr(obj, "model", None)
        if model is not None:
            out.setdefault(id(model), name)
            base = model.get_base_model() if hasattr(model, "get_base_model") else None
            if base is not None:
                out.setdefault(id(base), name)
    return out
