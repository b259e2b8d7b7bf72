"""Placement: which device each model of a run lives on.

`resolve_placement` is a pure function of the models' memory needs, the devices' capacities and an
explicit map: explicitly placed models go where they are told; the others go, largest first, to the
device whose memory would be least full after adding them (with equal devices and equal models this
is round-robin). Without devices (no GPU) everything stays on the CPU. `place_models` measures the
built models, resolves, moves them and returns a log of the result.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from textzoo.algorithms.family import Family
from textzoo.errors import ConfigError
from textzoo.models.critic import Critic, LMTrunk
from textzoo.models.lora import AdapterView
from textzoo.models.team import Actor

ADAM_COPIES = 3
"""Besides its weights, a trained parameter holds a gradient and AdamW's two moments."""


@dataclass(frozen=True)
class ModelSpec:
    """One model to place: its name, what it is, and the bytes it needs on its device."""

    name: str
    kind: str  # actor | critic | reference | model
    bytes: int


@dataclass(frozen=True)
class DeviceSpec:
    """One device models may go to, and the bytes free on it."""

    name: str
    capacity: int


def resolve_placement(
    models: Sequence[ModelSpec], devices: Sequence[DeviceSpec], overrides: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Model name -> device name. Pure: tests pass fake device lists."""
    overrides = dict(overrides or {})
    _check_device_map(overrides, [m.name for m in models])
    out = {m.name: overrides[m.name] for m in models if m.name in overrides}
    if not devices:
        return {m.name: out.get(m.name, "cpu") for m in models}
    load = {d.name: 0 for d in devices}
    for m in models:
        if m.name in out and out[m.name] in load:
            load[out[m.name]] += m.bytes
    order = {d.name: i for i, d in enumerate(devices)}
    for m in sorted((m for m in models if m.name not in out), key=lambda m: -m.bytes):  # stable: ties keep order
        best = min(devices, key=lambda d: ((load[d.name] + m.bytes) / max(d.capacity, 1), order[d.name]))
        out[m.name] = best.name
        load[best.name] += m.bytes
    return {m.name: out[m.name] for m in models}


def _check_device_map(overrides: Mapping[str, str], names: Sequence[str]) -> None:
    unknown = sorted(set(overrides) - set(names))
    if unknown:
        raise ConfigError(f"device_map names {unknown}, which are not models of this run; models: {list(names)}")


def model_bytes(module: torch.nn.Module, trained: bool) -> int:
    """Weights, plus gradient and optimizer moments of the trained parameters."""
    total = sum(p.numel() * p.element_size() for p in module.parameters())
    if trained:
        total += ADAM_COPIES * sum(p.numel() * p.element_size() for p in module.parameters() if p.requires_grad)
    return total


def _capacity(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    import psutil

    return int(psutil.virtual_memory().available)


def visible_devices(spec: str, local_rank: int | None = None) -> list[DeviceSpec]:
    """Devices of `TrainConfig.devices`; a data-parallel replica uses only its own GPU."""
    if spec == "cpu":
        return []
    if spec == "auto":
        if not torch.cuda.is_available():
            return []
        indices = [local_rank] if local_rank is not None else list(range(torch.cuda.device_count()))
        names = [torch.device("cuda", i) for i in indices]
    else:
        try:
            names = [torch.device(s.strip()) for s in spec.split(",") if s.strip()]
        except RuntimeError as e:
            raise ConfigError(
                f"devices must be 'auto', 'cpu' or a list like 'cuda:0,cuda:1', got {spec!r} ({e})"
            ) from e
        if any(d.type == "cuda" for d in names) and not torch.cuda.is_available():
            raise ConfigError(f"devices={spec!r} names GPUs but none is visible: use devices='auto' or 'cpu'")
    return [DeviceSpec(str(d), _capacity(d)) for d in names]


def place_models(
    models: Mapping[str, tuple[torch.nn.Module, str, bool]],
    devices: Sequence[DeviceSpec],
    overrides: Mapping[str, str],
) -> list[dict[str, Any]]:
    """Resolve and move `models` (name -> (module, kind, trained)); return one log row per model.

    Models that share weights (LoRA agents of one base and their references, a value head on an
    actor's trunk) are placed as one unit: moving one moves the others, so they share a device.
    """
    units = shared_units({name: module for name, (module, _, _) in models.items()})
    specs, members = [], {}
    for unit in units:
        name = "+".join(unit)
        members[name] = unit
        params = {id(p): p for member in unit for p in _footprint(models[member][0])}
        total = sum(p.numel() * p.element_size() for p in params.values())
        trained = {
            id(p): p for member in unit if models[member][2] for p in models[member][0].parameters() if p.requires_grad
        }
        total += ADAM_COPIES * sum(p.numel() * p.element_size() for p in trained.values())
        specs.append(ModelSpec(name, models[unit[0]][1], total))
    unit_overrides: dict[str, str] = {}
    _check_device_map(overrides, list(models))
    for name, unit in members.items():
        asked = {overrides[m] for m in unit if m in overrides}
        if len(asked) > 1:
            raise ConfigError(
                f"device_map puts {unit}, which share weights, on different devices {sorted(asked)}: "
                "give them one device"
            )
        if asked:
            unit_overrides[name] = asked.pop()
    placement = resolve_placement(specs, devices, unit_overrides)
    rows = []
    for spec in specs:
        for member in members[spec.name]:
            module, kind, trained = models[member]
            module.to(placement[spec.name])
            rows.append(
                {
                    "model": member,
                    "kind": kind,
                    "device": placement[spec.name],
                    "gib": round(model_bytes(module, trained) / 2**30, 3),
                    **(
                        {"shares_weights_with": [m for m in members[spec.name] if m != member]}
                        if len(members[spec.name]) > 1
                        else {}
                    ),
                }
            )
    return rows


def shared_units(modules: Mapping[str, torch.nn.Module]) -> list[list[str]]:
    """Names grouped by shared weights (in first-seen order): modules that hold a parameter in common."""
    owner: dict[int, int] = {}  # parameter id -> unit index
    units: list[list[str]] = []
    for name, module in modules.items():
        hits = sorted({owner[id(p)] for p in _footprint(module) if id(p) in owner})
        if not hits:
            units.append([name])
            index = len(units) - 1
        else:
            index = hits[0]
            for other in hits[1:]:  # this module joins units that were separate so far
                units[index] += units[other]
                units[other] = []
                owner.update({k: index for k, v in owner.items() if v == other})
            units[index].append(name)
        owner.update({id(p): index for p in _footprint(module)})
    return [u for u in units if u]


def _footprint(module: torch.nn.Module) -> list[torch.nn.Parameter]:
    """Every parameter a module needs on its device, including weights it uses but does not own
    (a LoRA view's shared base, a value head's shared trunk)."""
    if isinstance(module, AdapterView):
        return list(module.shared.model.parameters())
    if isinstance(module, Critic) and module.shared_trunk:  # a value head on an actor's trunk
        return [*module.parameters(), *_footprint(module.trunk)]
    if isinstance(module, LMTrunk):  # a whole LM read as a trunk (e.g. a LoRA view)
        return _footprint(module.lm)
    return list(module.parameters())


def team_models(actors: Sequence[Actor], family: Family) -> dict[str, tuple[torch.nn.Module, str, bool]]:
    """Every model of a run: actors, the family's trained models (critics, reward models) and its frozen
    ones (`family.frozen_models()`: reference copies, placed as "<actor id>-ref")."""
    out: dict[str, tuple[torch.nn.Module, str, bool]] = {}
    for a in actors:
        out[a.id] = (a.policy.model, "actor", a.trainable)
    for name, (module, _settings) in family.trainable_models().items():
        out[name] = (module, "critic" if "critic" in name else "model", True)
    for name, module in family.frozen_models().items():
        out[name] = (module, "reference", False)
    return out


def format_placement(rows: list[dict[str, Any]]) -> str:
    """One line: each model, its kind and size, and its device (and what it shares weights with)."""

    def shares(r: dict[str, Any]) -> str:
        return f", with {'+'.join(r['shares_weights_with'])}" if r.get("shares_weights_with") else ""

    return "placement: " + ", ".join(
        f"{r['model']} ({r['kind']}, {r['gib']} GiB{shares(r)}) -> {r['device']}" for r in rows
    )
