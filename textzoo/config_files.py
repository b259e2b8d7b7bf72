"""Configs in files and dicts: JSON/TOML in, JSON out, and old field names read as today's.

Fields missing from a file keep their defaults (so a config saved before a field existed still loads);
unknown fields are an error that names them. `migrate` needs the algorithm registry (which family an old
field belonged to), so it lives here, above both `textzoo.config` and the registry.
"""

from __future__ import annotations

import dataclasses
import json
import tomllib
from pathlib import Path
from typing import Any

from textzoo.algorithms.preference.config import PreferenceConfig
from textzoo.algorithms.registry import resolve_algorithm
from textzoo.config import AgentConfig, TrainConfig, migrate_agent
from textzoo.errors import ConfigError
from textzoo.typecheck import check_mapping

SECRETS = ("api_key",)
"""Config fields no file records (a run's config.json, a checkpoint, a tracker's config): they are blank there."""


def to_dict(config: Any) -> dict[str, Any]:
    """A JSON-ready dict of a (nested) config dataclass; values JSON cannot hold are described (`_describe`),
    secrets (`SECRETS`) are blank."""
    return _blank_secrets(json.loads(json.dumps(dataclasses.asdict(config), default=_describe)))


def _blank_secrets(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: "" if k in SECRETS and isinstance(v, str) else _blank_secrets(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_blank_secrets(v) for v in value]
    return value


def _describe(value: Any) -> str:
    """What config.json records for a value JSON cannot hold, such as a TRL-style reward function
    passed in `env_kwargs` through the Python API: a function as "module:qualname", else its type."""
    if callable(value) and hasattr(value, "__qualname__"):
        return f"{value.__module__}:{value.__qualname__}"
    return f"<{type(value).__module__}.{type(value).__qualname__} object>"


def migrate(data: dict[str, Any]) -> dict[str, Any]:
    """A `TrainConfig` dict written by an older textzoo, with today's field names (the input is not changed).

    - top-level `rl_algo` and `iterations` became `preference.rl_algo` and `preference.iterations`.
    - `reinforce.normalize_per_agent` and `actor_critic.normalize_advantages` became the one
      `normalize_per_agent`: it takes the value of the family the run learns with.
    - the agent's flat `engine_*`, `lora_*` and `dtype` fields moved (`textzoo.config.migrate_agent`, which
      `TrainConfig` applies to each `agent_overrides` entry itself).
    """
    if isinstance(data.get("agent"), dict):
        data = {**data, "agent": migrate_agent(data["agent"])}
    moved = {k: data[k] for k in ("rl_algo", "iterations") if k in data}
    if moved:
        preference = data.get("preference") if isinstance(data.get("preference"), dict) else {}
        clash = sorted(k for k in moved if k in preference and preference[k] != moved[k])
        if clash:
            raise ConfigError(
                f"the config sets {clash[0]} twice, at the top level (its old place) and in preference: "
                f"keep only preference.{clash[0]}"
            )
        data = {k: v for k, v in data.items() if k not in moved}
        data["preference"] = {**preference, **moved}
    renamed = {"reinforce": "normalize_per_agent", "actor_critic": "normalize_advantages"}
    old = {
        section: data[section][key]
        for section, key in renamed.items()
        if isinstance(data.get(section), dict) and key in data[section]
    }
    if not old:
        return data
    data = {k: ({f: x for f, x in v.items() if f != renamed[k]} if k in old else v) for k, v in data.items()}
    value = bool(old.get(_learning_family(data), False))
    if "normalize_per_agent" in data and bool(data["normalize_per_agent"]) != value:
        raise ConfigError(
            f"the config sets normalize_per_agent={data['normalize_per_agent']} and the older "
            f"{_learning_family(data)} field it replaces to {value}: keep only normalize_per_agent"
        )
    data["normalize_per_agent"] = value
    return data


def _learning_family(data: dict[str, Any]) -> str:
    """The family that learns in a run of the config dict `data` (marlhf: its online algorithm's)."""

    algorithm = resolve_algorithm(str(data.get("algo", TrainConfig.algo)))
    if algorithm.trains_with is not None:
        online = (data.get("preference") or {}).get("rl_algo", PreferenceConfig.rl_algo)
        algorithm = resolve_algorithm(str(online))
    return algorithm.family


def from_dict(cls: type, data: dict[str, Any], where: str = "") -> Any:
    """Build `cls` from a dict (a `TrainConfig` after `migrate`); missing fields keep defaults, unknown ones
    raise `ConfigError`."""
    if cls is TrainConfig:
        data = migrate(data)
    elif isinstance(cls, type) and issubclass(cls, AgentConfig):
        data = migrate_agent(data, where)
    check_mapping(cls, data, where)  # unknown keys (with the closest valid one) and mistyped values, by name
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for name, value in data.items():
        f = fields[name]
        sub = f.default_factory if f.default_factory is not dataclasses.MISSING else None
        if sub is not None and dataclasses.is_dataclass(sub) and isinstance(value, dict):
            kwargs[name] = from_dict(sub, value, f"{where}{name}.")
        elif isinstance(value, list):
            kwargs[name] = tuple(value)
        else:
            kwargs[name] = value
    try:
        return cls(**kwargs)
    except TypeError as e:
        raise ConfigError(f"bad config for {cls.__name__}: {e}") from e


def load_config(path: str | Path, cls: type = TrainConfig) -> Any:
    """Read a JSON or TOML config file into `cls`."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist")
    text = path.read_text()
    try:
        data = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"cannot parse config file {str(path)!r}: {e}") from e
    return from_dict(cls, data)


def save_config(config: Any, path: str | Path) -> None:
    Path(path).write_text(json.dumps(to_dict(config), indent=2, sort_keys=True) + "\n")
