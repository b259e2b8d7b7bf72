"""FSDP2 sharding (`torch.distributed.fsdp.fully_shard`) of the trainable models over the processes.

With ``TrainConfig.sharding = "fsdp"``, the processes of a data-parallel run (`textzoo train
--num-processes K`, torchrun, accelerate launch) each hold 1/K of every trainable model's parameters,
gradients and AdamW state instead of a whole copy: each decoder block (the classes a transformers
model lists in ``_no_split_modules``) is one FSDP unit and the root holds the rest (embeddings, final
norm, LM head). Everything else is data parallelism as with ``"replicate"``: every process plays its
share of the prompts; FSDP all-gathers a unit's parameters for its forward and backward and
reduce-scatters (averages) the gradients, which is the same gradient as the all-reduce of replicated
training. Frozen models (references, frozen agents) stay whole on every process.

Two rules keep the processes' collectives in step:
- sampling runs inside `gathered`: every unit is unsharded once (all-gathered) before the rollout and
  kept whole until it ends, so each process decodes as many tokens as its own rows need;
- scoring runs the transformers module with one forward per call (a sharded model's plain-torch
  decoder would read sharded parameters, and sharing prompts makes the number of forwards depend on
  the batch), so every process makes the same calls.

Checkpoints hold full (gathered) weights and optimizer states (`torch.distributed.checkpoint.state_dict`),
so a sharded run resumes on any number of processes that divides its batch, sharded or not.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard

_FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


def is_sharded(model: torch.nn.Module) -> bool:
    return isinstance(model, FSDPModule)


def shard(model: torch.nn.Module, device: torch.device, world_size: int) -> None:
    """Shard ``model`` in place over the ``world_size`` processes: one FSDP unit per decoder block,
    then the root. Its weights must already be equal on every process."""
    mesh = init_device_mesh(device.type, (world_size,))
    blocks = _block_classes(model)
    for module in model.modules():
        if module is not model and type(module).__name__ in blocks:
            fully_shard(module, mesh=mesh)
    fully_shard(model, mesh=mesh)


def _block_classes(model: torch.nn.Module) -> set[str]:
    """The class names of a model's repeated blocks (transformers' ``_no_split_modules``)."""
    names: set[str] = set()
    for module in model.modules():
        names.update(getattr(module, "_no_split_modules", None) or ())
    return names


@contextmanager
def gathered(models: Sequence[torch.nn.Module]) -> Iterator[None]:
    """Within: every FSDP unit of ``models`` holds its whole parameters (one all-gather each on entry,
    none in the forwards inside, so processes may run different numbers of forwards)."""
    units = [m for model in models for m in model.modules() if isinstance(m, FSDPModule)]
    roots = {id(model) for model in models}
    for unit in units:
        unit.unshard()
        unit.set_reshard_after_forward(False, recurse=False)
    try:
        yield
    finally:
        for unit in units:
            unit.reshard()
            # the root keeps its parameters after forward by default (its backward needs them first)
            unit.set_reshard_after_forward(id(unit) not in roots, recurse=False)


class FullState:
    """A sharded model as a checkpoint sees it: `state_dict` gathers the full weights (a collective:
    every process calls it, or ``state`` is given), `load_state_dict` loads full weights into the shards."""

    def __init__(self, model: torch.nn.Module, state: dict[str, torch.Tensor] | None = None) -> None:
        self.model = model
        self.state = state

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Whole weights, a tied parameter once, under its first name (as an unsharded model's checkpoint)."""
        state = self.state if self.state is not None else full_weights(self.model, everywhere=True)
        first: dict[int, str] = {}
        for name, p in self.model.named_parameters(remove_duplicate=False):
            first.setdefault(id(p), name)
        aliases = {name for name, p in self.model.named_parameters(remove_duplicate=False) if first[id(p)] != name}
        return {k: v for k, v in state.items() if k not in aliases}

    def load_state_dict(self, state: dict[str, torch.Tensor], strict: bool = False) -> None:
        set_model_state_dict(self.model, dict(state), options=StateDictOptions(full_state_dict=True, strict=strict))


def full_weights(model: torch.nn.Module, everywhere: bool = False) -> dict[str, torch.Tensor]:
    """The whole weights of a sharded model (every process must call it): on rank 0's CPU (other
    ranks get an empty dict), or with ``everywhere`` on every process's device."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=not everywhere)
    return get_model_state_dict(model, options=options)


def full_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer state of a sharded model, whole and keyed by parameter names (a collective)."""
    return get_optimizer_state_dict(model, optimizer, options=_FULL)


def load_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """Load a state from `full_optimizer_state` into the sharded optimizer."""
    set_optimizer_state_dict(model, optimizer, state, options=StateDictOptions(full_state_dict=True))
