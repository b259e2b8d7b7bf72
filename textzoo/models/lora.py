"""One frozen base model shared by N agents, each with its own LoRA adapter (Hu et al. 2021), via peft.

`SharedBase` holds one peft model with one adapter per agent, so N agents keep one copy of the base
weights in memory. `SharedBase.add(agent_id, ...)` returns that agent's `Policy`, whose model is an
`AdapterView`: a module that activates the agent's adapter before every forward (so generation and
scoring use the agent's weights) and whose parameters and state dict are the adapter's only. A
learner built on a view therefore optimizes only that adapter, and a checkpoint of a view holds only
the adapter (`adapter_state_dict` / `load_adapter_state_dict`, which the view's `state_dict` /
`load_state_dict` are). Moving one view moves the shared model: every agent of a base lives on one
device.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch

from textzoo.decoding.generation import GenerationConfig
from textzoo.decoding.modes import eval_mode
from textzoo.errors import ConfigError, ModelError
from textzoo.models.policy import Policy


def _peft():
    try:
        import peft
    except ImportError as e:  # peft is an optional extra
        raise ModelError("LoRA agents need peft: pip install 'textzoo[peft]'") from e
    return peft


def adapter_name(agent_id: str) -> str:
    """The peft adapter name of an agent: its id with characters peft cannot use replaced by '_'."""
    return "agent_" + re.sub(r"\W", "_", agent_id)


class SharedBase:
    """A frozen base model (from `policy`) that holds one LoRA adapter per agent."""

    def __init__(self, policy: Policy):
        self.tokenizer = policy.tokenizer
        self.generation = policy.generation
        self.base = policy.model
        self.precision = policy.precision  # the base's resolved precision, which every adapter computes in
        self.model: Any = None  # the peft model, made when the first adapter is added
        self.views: dict[str, AdapterView] = {}
        self.trainable: set[str] = set()
        self.active: str | None = None

    def add(
        self,
        agent_id: str,
        rank: int,
        alpha: float = 16.0,
        dropout: float = 0.0,
        target_modules: Sequence[str] = (),
        trainable: bool = True,
        generation: GenerationConfig | None = None,
        seed: int = 0,
        engine: Any = None,
    ) -> Policy:
        """Add an adapter for `agent_id` (initialised from `seed`) and return the agent's policy (sampling on
        `engine`, an `EngineClient` of this base's engine, when one is given)."""
        peft = _peft()
        name = adapter_name(agent_id)
        if name in self.views:
            raise ConfigError(
                f"agent {agent_id!r} maps to adapter {name!r}, which another agent of this base already has; "
                "give agents names that differ in letters, digits or underscores"
            )
        config = peft.LoraConfig(
            r=rank,
            lora_alpha=alpha,
            lora_dropout=dropout,
            target_modules=list(target_modules) or None,
            bias="none",
            task_type="CAUSAL_LM",
            fan_in_fan_out=getattr(self.base.config, "model_type", "") == "gpt2",  # GPT-2's Conv1D is (in, out)
        )
        # peft draws lora_A from the global RNG: seed it locally so an adapter does not depend on build order
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            try:
                if self.model is None:
                    self.model = peft.get_peft_model(self.base, config, adapter_name=name)
                else:
                    self.model.add_adapter(name, config)
            except ValueError as e:
                raise ConfigError(
                    f"cannot add a LoRA adapter for {agent_id!r}: {e}; set agent.lora.target_modules to module "
                    "names of this model (e.g. ['c_attn'] for GPT-2, ['q_proj', 'v_proj'] for Llama)"
                ) from e
        view = AdapterView(self, name)
        self.views[name] = view
        if trainable:
            self.trainable.add(name)
        self.active = None
        self._set_requires_grad()
        return Policy(
            view,
            self.tokenizer,
            generation or self.generation,
            name=f"{agent_id}@lora",
            precision=self.precision,
            engine=engine,
        )

    def frozen_copy(self, policy: Policy, agent_id: str) -> Policy:
        """A frozen copy of `policy`'s adapter on this same base (an adapter's worth of memory, not a
        second base): e.g. the reference a KL term or DPO compares an agent with."""
        source: AdapterView = policy.model
        name = adapter_name(agent_id)
        if name in self.views:
            raise ConfigError(f"adapter {name!r} already exists on this base; pick another name for the copy")
        self.model.add_adapter(name, self.model.peft_config[source.adapter])
        view = AdapterView(self, name, frozen=True)
        self.views[name] = view
        self.active = None
        self._set_requires_grad()
        load_adapter_state_dict(view, adapter_state_dict(source))
        return Policy(view, self.tokenizer, policy.generation, name=f"{agent_id}@lora", precision=policy.precision)

    def activate(self, name: str) -> None:
        """Route forwards through adapter `name` (a no-op when it is already active)."""
        if self.active != name:
            self.model.set_adapter(name)
            self.active = name
            self._set_requires_grad()

    def _set_requires_grad(self) -> None:
        # peft's set_adapter freezes every adapter but the active one; a trainable agent's adapter
        # must keep requires_grad so its learner (built once) sees its parameters. An adapter that is
        # not active takes no part in a forward, so it still gets no gradient.
        for name, view in self.views.items():
            for p in view.adapter_parameters().values():
                p.requires_grad_(name in self.trainable)

    def base_parameters(self) -> Iterator[tuple[str, torch.nn.Parameter]]:
        """The shared (frozen) base weights: every parameter that belongs to no adapter."""
        for name, p in self.model.named_parameters():
            if ".lora_" not in name:
                yield name, p


class AdapterView(torch.nn.Module):
    """One agent's model: the shared base with this agent's adapter; parameters = the adapter's."""

    def __init__(self, shared: SharedBase, name: str, frozen: bool = False):
        super().__init__()
        self.shared = shared  # a plain object, not a submodule: parameters() must not list the base
        self.adapter = name
        self._infix = f".{name}."
        self.frozen = frozen
        """A frozen copy (`SharedBase.frozen_copy`): runs in eval mode whatever the base's mode."""
        self.training = not frozen  # its own mode only: `train()` would set the shared base's too

    # ---- what a model is to Policy, learners and checkpoints ---------------------------------
    @property
    def config(self) -> Any:
        return self.shared.model.config

    @property
    def generation_config(self) -> Any:
        return getattr(self.shared.model, "generation_config", None)

    def get_base_model(self) -> torch.nn.Module:
        return self.shared.model.get_base_model()

    def gradient_checkpointing_enable(self, **kwargs: Any) -> None:
        self.shared.model.gradient_checkpointing_enable(**kwargs)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        self.shared.activate(self.adapter)
        if self.frozen and self.shared.model.training:  # a frozen copy never drops anything
            with eval_mode(self.shared.model):
                return self.shared.model(*args, **kwargs)
        return self.shared.model(*args, **kwargs)

    def adapter_parameters(self) -> dict[str, torch.nn.Parameter]:
        """This adapter's parameters under their names in the peft model (adapter name included)."""
        return {n: p for n, p in self.shared.model.named_parameters() if self._infix in n}

    def named_parameters(
        self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True
    ) -> Iterator[tuple[str, torch.nn.Parameter]]:
        for name, p in self.adapter_parameters().items():
            yield prefix + name, p

    def train(self, mode: bool = True) -> AdapterView:
        self.training = mode
        self.shared.model.train(mode)
        return self

    def _apply(self, fn: Callable, recurse: bool = True) -> AdapterView:
        self.shared.model._apply(fn)
        return self

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, torch.Tensor]:  # type: ignore[override]
        return adapter_state_dict(self)

    def load_state_dict(  # type: ignore[override]
        self, state_dict: Mapping[str, torch.Tensor], strict: bool = True, assign: bool = False
    ) -> None:
        load_adapter_state_dict(self, state_dict, strict)

    def __repr__(self) -> str:
        return f"AdapterView({self.adapter!r})"


def adapter_state_dict(view: AdapterView) -> dict[str, torch.Tensor]:
    """An agent's trainable weights: its adapter, keyed as peft saves adapters (no adapter name)."""
    return {n.replace(view._infix, "."): p.detach() for n, p in view.adapter_parameters().items()}


def load_adapter_state_dict(view: AdapterView, state: Mapping[str, torch.Tensor], strict: bool = True) -> None:
    """Copy `state` (from `adapter_state_dict`) into the agent's adapter, in place."""
    params = {n.replace(view._infix, "."): p for n, p in view.adapter_parameters().items()}
    missing, unexpected = sorted(set(params) - set(state)), sorted(set(state) - set(params))
    if strict and (missing or unexpected):
        raise ModelError(
            f"adapter weights of {view.adapter!r} do not match (missing {missing[:3]}, unexpected {unexpected[:3]}): "
            "load the adapter saved for this agent with the same LoRA settings"
        )
    with torch.no_grad():
        for n, p in params.items():
            if n in state:
                p.copy_(state[n])
