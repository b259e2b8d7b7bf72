"""An exported team read back (`textzoo eval --team DIR`): team.json and training_config.json become the
run's config with every model taken from the export, so the team is evaluated by the training code itself.

A merged folder becomes its role's model; an adapter folder's role gets the adapter's base (the export's
`bases/` copy, a hub id or a folder) and the adapter's weights, loaded as a checkpoint's are
(`Trainer.load_weights`); a frozen role keeps its base. Everything else (the task and its held-out split,
prompt formats, sampling settings, the seed, the LoRA settings) is the run's, so the local decoder on CPU
reproduces the run's held-out greedy rewards at the exported step exactly.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from textzoo.config import TrainConfig, replaced
from textzoo.config_files import load_config
from textzoo.errors import ConfigError

TEAM_FILE = "team.json"
"""The manifest at the top of an export."""
TRAINING_CONFIG = "training_config.json"
"""The run's config in an export."""
FORMATS = (1,)
"""team.json formats this textzoo reads."""


def with_engine(cfg: TrainConfig, engine: str) -> TrainConfig:
    """`cfg` with every agent sampling on `engine` (`agent.engine.kind`: "local" or "vllm")."""
    return with_agents(cfg, {"engine": {"kind": engine}})


def with_agents(cfg: TrainConfig, changes: dict[str, Any]) -> TrainConfig:
    """`cfg` with `changes` (AgentConfig fields; a section as a table) on `agent` and every override."""
    overrides = {role: _merged(values, changes) for role, values in cfg.agent_overrides.items()}
    return dataclasses.replace(cfg, agent=replaced(cfg.agent, changes), agent_overrides=overrides)


def _merged(values: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """An `agent_overrides` entry with `changes` on top, a section's table (engine, lora) key by key."""
    out = dict(values)
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = {**out[key], **value}
        else:
            out[key] = value
    return out


@dataclass
class ExportedTeam:
    """An export read back: the run's config over the exported models, and the adapters' weights."""

    root: Path
    manifest: dict[str, Any]
    """team.json."""
    config: TrainConfig
    weights: dict[str, dict[str, torch.Tensor]]
    """Each adapter's weights by actor id, named as a checkpoint names them."""
    step: int
    """The run's step the export holds."""


def read_team(root: str | Path, engine: str = "local") -> ExportedTeam:
    """Read the export at `root` for evaluation on `engine` (module docstring); a `ConfigError` names what
    is missing or unreadable."""
    root = Path(root)
    path = root / TEAM_FILE
    if not path.is_file():
        raise ConfigError(f"{root} holds no {TEAM_FILE}: pass a folder written by textzoo export")
    try:
        manifest = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path} is not valid JSON ({e}): export the run again") from e
    if manifest.get("format") not in FORMATS:
        raise ConfigError(
            f"{path} has format {manifest.get('format')!r}; this textzoo reads {FORMATS}: export with this version"
        )
    cfg = load_config(root / manifest["training_config"])
    agent, overrides = cfg.agent, {role: dict(values) for role, values in cfg.agent_overrides.items()}
    weights = {}
    for model_id, model in manifest["models"].items():
        if model["kind"] == "merged":
            values: dict[str, Any] = {"model": str(root / model["folder"]), "lora": {"rank": 0}}
        else:  # an adapter on its base, or a frozen model: its base
            values = {"model": _base_path(root, model["base"])}
        if model["kind"] == "adapter":
            weights[model_id] = _adapter(root / model["folder"])
        if cfg.collaboration == "centralized":
            agent = replaced(agent, values)
        else:
            overrides[model_id] = _merged(overrides.get(model_id, {}), values)
    cfg = dataclasses.replace(
        cfg, agent=agent, agent_overrides=overrides, run_dir="", num_processes=1, sharding="replicate", report_to=()
    )
    return ExportedTeam(root, manifest, with_engine(cfg, engine), weights, int(manifest["run"]["step"]))


def _base_path(root: Path, base: dict[str, Any]) -> str:
    """What loads a model's base: its copy in the export, else its hub id or folder."""
    if base.get("folder"):
        return str(root / base["folder"])
    if base.get("load_path"):
        return base["load_path"]
    raise ConfigError(f"the export at {root} holds no loadable copy of the base {base.get('setting')!r}")


def _adapter(folder: Path) -> dict[str, torch.Tensor]:
    path = folder / "adapter_model.safetensors"
    if not path.is_file():
        raise ConfigError(f"{folder} holds no adapter_model.safetensors: export the run again")
    return load_file(path)


def team_trainer(team: ExportedTeam):
    """A `Trainer` of the team's config with the exported weights loaded, at the exported step (whose number
    seeds the sampled evaluation, as it did in the run): `evaluate` is the run's evaluation."""
    from textzoo.runners.trainer import Trainer

    trainer = Trainer(team.config)
    trainer.load_weights(team.weights, str(team.root))
    trainer.step = team.step
    return trainer
