"""Atomic, self-checking checkpoints for an exact resume.

`RUN_DIR/checkpoints/step-XXXXXXXX/` holds
    weights-<model>.safetensors  trainable weights of each learner's model (adapters only, for peft models)
    state.pt                     optimizers, schedulers, weight versions, RNG states, step, data cursor,
                                 family state, and how many metrics rows had been written
    config.json                  the resolved run config
    manifest.json                size and sha256 of every file above; written last
A checkpoint is written into a staging folder and renamed into place, so a kill during a save leaves
the earlier checkpoints as they were and never a half-written `step-*` folder. Frozen models are not
saved: they are rebuilt from the config exactly as the first run built them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from textzoo.errors import CheckpointError

FORMAT = 1
PREFIX = "step-"
STAGING = ".staging-"


def checkpoints_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints"


def step_name(step: int) -> str:
    return f"{PREFIX}{step:08d}"


# ---- weights -----------------------------------------------------------------------------------
def _is_peft(model: torch.nn.Module) -> bool:
    return hasattr(model, "peft_config")


def model_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """What a checkpoint stores of a trainable model: its adapters (peft) or its state dict.

    Tied weights (GPT-2's embedding and LM head) are stored once, under their first name.
    """
    if _is_peft(model):
        from peft import get_peft_model_state_dict

        return {k: v.detach() for k, v in get_peft_model_state_dict(model).items()}
    out: dict[str, torch.Tensor] = {}
    seen: set[tuple] = set()
    for name, tensor in model.state_dict().items():
        key = (tensor.data_ptr(), tensor.dtype, tuple(tensor.shape), tensor.stride(), str(tensor.device))
        if tensor.numel() and key in seen:
            continue
        seen.add(key)
        out[name] = tensor
    return out


def check_weights(model: torch.nn.Module, weights: dict[str, torch.Tensor], name: str) -> None:
    """Raise `CheckpointError` unless `weights` have exactly the names, shapes and dtypes of `model`'s."""
    expected = model_weights(model)
    missing = sorted(set(expected) - set(weights))
    extra = sorted(set(weights) - set(expected))
    if missing or extra:
        raise CheckpointError(
            f"checkpoint weights of {name!r} do not match the model built from the config "
            f"(missing {missing[:5]}, unexpected {extra[:5]}): was the model or adapter setting changed?"
        )
    for key, tensor in expected.items():
        saved = weights[key]
        if saved.shape != tensor.shape or saved.dtype != tensor.dtype:
            raise CheckpointError(
                f"checkpoint weight {name}:{key} is {saved.dtype}{list(saved.shape)} but the model has "
                f"{tensor.dtype}{list(tensor.shape)}: resume with the model settings the run was started with"
            )


def apply_weights(model: torch.nn.Module, weights: dict[str, torch.Tensor]) -> None:
    """Copy checked `weights` into `model` (in place, so optimizers keep their parameters)."""
    if _is_peft(model):
        from peft import set_peft_model_state_dict

        set_peft_model_state_dict(model, weights)
        return
    with torch.no_grad():
        model.load_state_dict(weights, strict=False)  # names left out are tied aliases of stored ones


# ---- RNG ---------------------------------------------------------------------------------------
def capture_rng() -> dict[str, Any]:
    """Python, numpy, torch CPU and every CUDA device's RNG state."""
    np_state = np.random.get_state(legacy=False)
    return {
        "python": random.getstate(),
        "numpy": {
            **np_state,
            "state": {"key": np_state["state"]["key"].tolist(), "pos": int(np_state["state"]["pos"])},
        },
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def restore_rng(state: dict[str, Any]) -> None:
    random.setstate((state["python"][0], tuple(state["python"][1]), state["python"][2]))
    np_state = dict(state["numpy"])
    np_state["state"] = {"key": np.asarray(np_state["state"]["key"], dtype=np.uint32), "pos": np_state["state"]["pos"]}
    np.random.set_state(np_state)
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        if len(state["cuda"]) != torch.cuda.device_count():
            raise CheckpointError(
                f"the checkpoint holds RNG states of {len(state['cuda'])} GPUs but {torch.cuda.device_count()} are "
                "visible: resume with the same CUDA_VISIBLE_DEVICES for an exact continuation"
            )
        torch.cuda.set_rng_state_all(state["cuda"])


# ---- files -------------------------------------------------------------------------------------
def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _weights_file(model_name: str) -> str:
    return f"weights-{model_name}.safetensors"


def _write_staging(
    staging: Path, step: int, models: dict[str, torch.nn.Module], state: dict[str, Any], config: dict[str, Any]
) -> None:
    """Every file of a checkpoint, fsynced, the manifest last."""
    files: list[str] = []
    for name, model in models.items():
        tensors = {k: v.detach().cpu().contiguous() for k, v in model_weights(model).items()}
        save_file(tensors, staging / _weights_file(name))
        files.append(_weights_file(name))
    torch.save({**state, "step": step}, staging / "state.pt")
    (staging / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    files += ["state.pt", "config.json"]
    entries = {}
    for f in files:
        _fsync(staging / f)
        entries[f] = {"bytes": (staging / f).stat().st_size, "sha256": _sha256(staging / f)}
    manifest = {"format": FORMAT, "step": step, "models": sorted(models), "files": entries}
    (staging / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    _fsync(staging / "manifest.json")
    _fsync(staging)


def write_checkpoint(
    run_dir: str | Path,
    step: int,
    models: dict[str, torch.nn.Module],
    state: dict[str, Any],
    config: dict[str, Any],
    keep_last: int = 0,
) -> Path:
    """Write a checkpoint of `step` atomically; keep the newest `keep_last` (0 = all). Returns its folder."""
    root = checkpoints_dir(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(f"{STAGING}*"):  # left by a process killed while saving
        shutil.rmtree(stale, ignore_errors=True)
    staging = root / f"{STAGING}{step_name(step)}-{os.getpid()}"
    staging.mkdir()
    try:
        _write_staging(staging, step, models, state, config)
    except BaseException:  # disk full, quota, a signal: free the room, keep the earlier checkpoints
        shutil.rmtree(staging, ignore_errors=True)
        raise
    final = root / step_name(step)
    if final.exists():  # saving a step again (a resumed run that had nothing left to do)
        trash = root / f"{STAGING}old-{step_name(step)}-{os.getpid()}"
        final.rename(trash)
        shutil.rmtree(trash)
    staging.rename(final)
    _fsync(root)
    if keep_last > 0:
        for old in list_checkpoints(run_dir)[:-keep_last]:
            shutil.rmtree(old, ignore_errors=True)
    return final


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """`step-*` folders of a run, oldest first (staging folders are never listed)."""
    root = checkpoints_dir(run_dir)
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        if p.is_dir() and p.name.startswith(PREFIX) and p.name[len(PREFIX) :].isdigit():
            found.append((int(p.name[len(PREFIX) :]), p))
    return [p for _, p in sorted(found)]


def verify(path: Path) -> str | None:
    """None when the checkpoint at `path` is intact, else a sentence naming the damage."""
    manifest_path = path / "manifest.json"
    if not manifest_path.is_file():
        return f"{path.name}: manifest.json is missing (partial checkpoint)"
    try:
        manifest = json.loads(manifest_path.read_text())
        entries = manifest["files"]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        return f"{path.name}: manifest.json is unreadable ({e})"
    if manifest.get("format") != FORMAT:
        return f"{path.name}: checkpoint format {manifest.get('format')!r}, this textzoo reads format {FORMAT}"
    for name, entry in entries.items():
        f = path / name
        if not f.is_file():
            return f"{path.name}: {name} is missing"
        if f.stat().st_size != entry["bytes"]:
            return f"{path.name}: {name} has {f.stat().st_size} bytes, the manifest says {entry['bytes']}"
        if _sha256(f) != entry["sha256"]:
            return f"{path.name}: {name} fails its sha256 checksum (corrupt file)"
    return None


def latest_intact(run_dir: str | Path) -> tuple[Path | None, list[str]]:
    """The newest intact checkpoint of a run (None if there is none) and the damage of newer ones."""
    damage = []
    for path in reversed(list_checkpoints(run_dir)):
        problem = verify(path)
        if problem is None:
            return path, damage
        damage.append(problem)
    return None, damage


@dataclass
class LoadedCheckpoint:
    """A verified checkpoint read into CPU memory."""

    path: Path
    step: int
    weights: dict[str, dict[str, torch.Tensor]]
    state: dict[str, Any]
    config: dict[str, Any]


def read_checkpoint(path: Path) -> LoadedCheckpoint:
    """Verify and read a checkpoint folder; raise `CheckpointError` naming any damage."""
    problem = verify(path)
    if problem is not None:
        raise CheckpointError(f"checkpoint {path} is damaged: {problem}")
    manifest = json.loads((path / "manifest.json").read_text())
    try:
        weights = {name: load_file(path / _weights_file(name)) for name in manifest["models"]}
        state = torch.load(path / "state.pt", map_location="cpu", weights_only=True)
        config = json.loads((path / "config.json").read_text())
    except Exception as e:  # the checksums passed, so this is a file written by another version
        raise CheckpointError(f"cannot read checkpoint {path}: {e}") from e
    return LoadedCheckpoint(path, int(manifest["step"]), weights, state, config)


# ---- config comparison -------------------------------------------------------------------------
def config_diff(saved: Any, current: Any, safe: frozenset[str], prefix: str = "") -> list[str]:
    """Fields of two config dataclasses that differ, except those named in `safe`, as 'name: a -> b'.

    Nested config dataclasses are compared field by field under dotted names (`agent.lr`).
    """
    out = []
    for f in dataclasses.fields(saved):
        name = f"{prefix}{f.name}"
        a, b = getattr(saved, f.name), getattr(current, f.name)
        if name in safe or a == b:
            continue
        if dataclasses.is_dataclass(a) and dataclasses.is_dataclass(b):
            out += config_diff(a, b, safe, f"{name}.")
        else:
            out.append(f"{name}: {a!r} -> {b!r}")
    return out
