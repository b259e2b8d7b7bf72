"""Actors: who answers for which roles of an env.

A decentralized team has one `AgentActor` per role. A centralized team has one joint actor that
answers for every role. Runners only see the `Actor` protocol, so both modes share every loop.
"""

from __future__ import annotations

import copy
from typing import Protocol

import torch

from textzoo.decoding.generation import Generation
from textzoo.models.lora import AdapterView
from textzoo.models.policy import Policy
from textzoo.models.prompting import PromptFormat


class Actor(Protocol):
    """Turns the observations of its roles into one prompt, and one completion into actions."""

    id: str
    roles: tuple[str, ...]
    policy: Policy
    trainable: bool
    prompt_format: PromptFormat
    """How the prompt text becomes model input (raw, or the tokenizer's chat template)."""

    def build_prompt(self, observations: dict[str, str]) -> str:
        """One prompt (plain text, before formatting) from the observations of this actor's active roles."""
        ...

    def generate(
        self, prompts: list[str], *, greedy: bool = False, generator: torch.Generator | None = None
    ) -> Generation:
        """One completion per prompt built by `build_prompt`, sampled from the formatted prompt."""
        ...

    def parse(self, completion: str, roles: tuple[str, ...]) -> tuple[dict[str, str], bool]:
        """Actions for `roles` from a completion, and whether parsing failed."""
        ...

    def frozen_copy(self) -> Actor:
        """A copy that acts the same and never trains (its own copy of the model: eval mode, no gradients)."""
        ...


class AgentActor:
    """A decentralized agent: one policy playing one role, prompt in, completion out.

    `prompt_format` defaults to "auto" for the policy's tokenizer: the chat template when it has one.
    """

    def __init__(self, role: str, policy: Policy, trainable: bool = True, prompt_format: PromptFormat | None = None):
        self.id = role
        self.roles = (role,)
        self.policy = policy
        self.trainable = trainable
        self.prompt_format = prompt_format or PromptFormat.resolve(policy.tokenizer)

    def build_prompt(self, observations: dict[str, str]) -> str:
        return observations[self.id]

    def generate(
        self, prompts: list[str], *, greedy: bool = False, generator: torch.Generator | None = None
    ) -> Generation:
        return self.prompt_format.generate(self.policy, prompts, greedy=greedy, generator=generator)

    def parse(self, completion: str, roles: tuple[str, ...]) -> tuple[dict[str, str], bool]:
        return {self.id: completion}, False

    def frozen_copy(self) -> AgentActor:
        return AgentActor(self.id, frozen_policy_copy(self.policy), trainable=False, prompt_format=self.prompt_format)

    def __repr__(self) -> str:
        return f"AgentActor({self.id!r}, trainable={self.trainable})"


def frozen_policy_copy(policy: Policy) -> Policy:
    """A deep copy of `policy` whose model is in eval mode and needs no gradients (a copy samples with its
    own decoder: an engine client is not copied)."""
    twin = copy.deepcopy(policy)
    twin.model.eval().requires_grad_(False)
    return twin


def frozen_references(actors: list[Actor]) -> dict[str, Policy]:
    """Frozen copies of every trainable actor's policy (taken before any checkpoint is loaded).

    A LoRA agent's copy is a frozen second adapter on its shared base, not a copy of the base.
    """
    refs: dict[str, Policy] = {}
    for a in actors:
        if not a.trainable:
            continue
        if isinstance(a.policy.model, AdapterView):
            refs[a.id] = a.policy.model.shared.frozen_copy(a.policy, f"{a.id}-reference")
            continue
        refs[a.id] = frozen_policy_copy(a.policy)
    return refs


def reference_models(references: dict[str, Policy]) -> dict[str, torch.nn.Module]:
    """The models of frozen references by placement name, "<actor id>-ref"."""
    return {f"{actor_id}-ref": policy.model for actor_id, policy in references.items()}
