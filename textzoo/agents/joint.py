"""`JointActor`: one policy answers for every role of an env (the centralized mode).

The joint prompt lists each active role's observation in a tagged section and asks for one tagged
answer per role; the joint completion is parsed back into per-role actions. The sample a family
learns from is the joint completion, and its loss is computed by the same function as a
decentralized agent's (`textzoo.agents.rlmath.policy_gradient_loss`).

Default format for roles `summary`, `elaboration`::

    You answer for every role of a team: summary, elaboration.
    <task role="summary">
    {observation of summary}
    </task>
    <task role="elaboration">
    {observation of elaboration}
    </task>
    Answer every task, each inside its role's tags, in this order: <summary>...</summary> <elaboration>...</elaboration>
    <summary>

The prompt ends with the first role's opening tag, so the completion starts inside that answer; a
closing tag met before any opening tag closes a section that the prompt opened. Parsing tries, in
order, and keeps the first method that finds any role's section:

1. tags: `<role>...</role>` (case-insensitive; an unclosed section runs to the next role tag or the end);
2. labelled sections: lines starting with `role:` (markdown decoration such as `**Role:**` allowed);
3. a JSON object with role keys (non-string values are written as JSON);
4. fenced blocks: ```` ```role ```` blocks by name, else unnamed blocks in role order.

A role the winning method misses gets an empty action; a duplicated section keeps its first
occurrence. When no method finds any section, parsing failed: every role gets an empty action (a
legal, low-reward outcome that runners count as a parse failure).

A lone role (an env with one agent, or a turn where only one role acts) gets its observation as
the prompt and the whole completion as its action, so with N = 1 the joint actor *is* the plain
agent: same prompt, action, loss and gradient.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Sequence

import torch

from textzoo.agents.policy import Generation, Policy
from textzoo.agents.prompting import PromptFormat
from textzoo.errors import ConfigError

PromptBuilder = Callable[[dict[str, str]], str]
"""Observations of the active roles (in role order) -> the joint prompt."""
Parser = Callable[[str, tuple[str, ...]], tuple[dict[str, str], bool]]
"""(joint completion, active roles) -> (one action per role, whether parsing failed)."""


def joint_prompt(observations: dict[str, str]) -> str:
    """The default joint prompt (see the module docstring); a lone role's observation unchanged."""
    roles = list(observations)
    if len(roles) == 1:
        return observations[roles[0]]
    tasks = "\n".join(f'<task role="{r}">\n{observations[r]}\n</task>' for r in roles)
    answers = " ".join(f"<{r}>...</{r}>" for r in roles)
    return (
        f"You answer for every role of a team: {', '.join(roles)}.\n{tasks}\n"
        f"Answer every task, each inside its role's tags, in this order: {answers}\n<{roles[0]}>"
    )


def parse_joint(completion: str, roles: tuple[str, ...]) -> tuple[dict[str, str], bool]:
    """Per-role actions from a joint completion and whether parsing failed (module docstring)."""
    if len(roles) == 1:
        return {roles[0]: completion}, False
    for method in (_tag_sections, _labelled_sections, _json_sections, _fenced_sections):
        found = method(completion, tuple(roles))
        if found:
            return {r: found.get(r, "") for r in roles}, False
    return {r: "" for r in roles}, True


# ---- the four section finders: text, roles -> {role: section} (empty when nothing is found) -----
@functools.lru_cache(maxsize=256)
def _tag_pattern(roles: tuple[str, ...]) -> re.Pattern[str]:
    names = "|".join(re.escape(r) for r in sorted(roles, key=len, reverse=True))
    return re.compile(rf"<\s*(/?)\s*({names})\s*>", re.IGNORECASE)


def _canonical(roles: tuple[str, ...]) -> dict[str, str]:
    return {r.casefold(): r for r in roles}


def _tag_sections(text: str, roles: tuple[str, ...]) -> dict[str, str]:
    name = _canonical(roles)
    found: dict[str, str] = {}
    open_role: str | None = None
    start = 0
    first_event = True
    for m in _tag_pattern(roles).finditer(text):
        role, closing = name[m.group(2).casefold()], bool(m.group(1))
        if open_role is not None and (not closing or role == open_role):
            found.setdefault(open_role, text[start : m.start()].strip())
            open_role = None
        elif closing and first_event:
            # the prompt opened this section: the completion starts inside it
            found.setdefault(role, text[: m.start()].strip())
        if not closing:
            open_role, start = role, m.end()
        first_event = False
    if open_role is not None:  # cut off by the token budget: keep what was written
        found.setdefault(open_role, text[start:].strip())
    return found


@functools.lru_cache(maxsize=256)
def _label_pattern(roles: tuple[str, ...]) -> re.Pattern[str]:
    names = "|".join(re.escape(r) for r in sorted(roles, key=len, reverse=True))
    return re.compile(rf"^[ \t>#*_-]*({names})[ \t*_]*:[*_]*[ \t]*", re.IGNORECASE | re.MULTILINE)


def _labelled_sections(text: str, roles: tuple[str, ...]) -> dict[str, str]:
    name = _canonical(roles)
    labels = list(_label_pattern(roles).finditer(text))
    found: dict[str, str] = {}
    for m, nxt in zip(labels, labels[1:] + [None]):
        end = len(text) if nxt is None else nxt.start()
        found.setdefault(name[m.group(1).casefold()], text[m.end() : end].strip())
    return found


def _json_sections(text: str, roles: tuple[str, ...]) -> dict[str, str]:
    name = _canonical(roles)
    decoder = json.JSONDecoder()
    for m in re.finditer(r"\{", text):
        try:
            value, _ = decoder.raw_decode(text, m.start())
        except json.JSONDecodeError:
            continue
        if not isinstance(value, dict):
            continue
        found: dict[str, str] = {}
        for key, v in value.items():
            role = name.get(str(key).casefold())
            if role is not None:
                found.setdefault(role, v if isinstance(v, str) else json.dumps(v))
        if found:
            return found
    return {}


_FENCE = re.compile(r"```[ \t]*([^\n`]*)\n(.*?)(?:```|\Z)", re.DOTALL)


def _fenced_sections(text: str, roles: tuple[str, ...]) -> dict[str, str]:
    name = _canonical(roles)
    blocks = [(info.strip().casefold(), body.strip()) for info, body in _FENCE.findall(text)]
    found: dict[str, str] = {}
    for info, body in blocks:
        if info in name:
            found.setdefault(name[info], body)
    if found:
        return found
    unnamed = [body for info, body in blocks if not info]
    return dict(zip(roles, unnamed))


# ---- the actor ----------------------------------------------------------------------------------
class JointActor:
    """One policy answering for all `roles`: a joint prompt in, one completion out, parsed per role.

    `prompt_builder` and `parser` replace the default format (`joint_prompt`, `parse_joint`); pass
    both when the format changes, since the parser has to read what the builder asks for.
    `prompt_format` (default "auto" for the policy's tokenizer) formats the joint prompt, as it does
    a decentralized agent's.
    """

    def __init__(
        self,
        roles: Sequence[str],
        policy: Policy,
        trainable: bool = True,
        prompt_builder: PromptBuilder | None = None,
        parser: Parser | None = None,
        id: str = "joint",
        prompt_format: PromptFormat | None = None,
    ):
        if not roles or len(set(roles)) != len(roles):
            raise ConfigError(f"JointActor roles must be a non-empty list of distinct names, got {list(roles)!r}")
        self.id = id
        self.roles = tuple(roles)
        self.policy = policy
        self.trainable = trainable
        self.prompt_builder = prompt_builder or joint_prompt
        self.parser = parser or parse_joint
        self.prompt_format = prompt_format or PromptFormat.resolve(getattr(policy, "tokenizer", None))

    def build_prompt(self, observations: dict[str, str]) -> str:
        # role order, not dict order, so the joint prompt of the same observations is always the same
        return self.prompt_builder({r: observations[r] for r in self.roles if r in observations})

    def generate(
        self, prompts: list[str], *, greedy: bool = False, generator: torch.Generator | None = None
    ) -> Generation:
        return self.prompt_format.generate(self.policy, prompts, greedy=greedy, generator=generator)

    def parse(self, completion: str, roles: tuple[str, ...]) -> tuple[dict[str, str], bool]:
        return self.parser(completion, tuple(roles))

    def __repr__(self) -> str:
        return f"JointActor({self.id!r}, roles={list(self.roles)}, trainable={self.trainable})"
