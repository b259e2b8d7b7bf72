"""`JointActor`: one policy answers for every role of an env (the centralized mode).

The joint prompt lists each active role's observation in a tagged section and asks for one answer
per role; the joint completion is split into per-role actions. The sample a family learns from is
the joint completion, and its loss is computed by the same function as a decentralized agent's
(`textzoo.algorithms.rlmath.policy_gradient_loss`). The prompt goes through the actor's prompt format
(raw, or the tokenizer's chat template), as a decentralized agent's does.

Joint formats (`joint_format`):

- ``structured`` (the default): the roles answer one after the other in one completion; the runner
  writes everything that is not an answer as forced tokens (in the context, never sampled or scored),
  and the model writes only the sections (``{sampled}``), each of at most its role's budget
  (`section_tokens`). With a chat prompt format the joint completion is one conversation: the prompt
  is the first role's observation, exactly as its decentralized agent gets it, and each later role's
  observation comes as the next user turn of the chat template, so every role answers its own
  observation as an assistant turn, as a decentralized agent does, after the earlier roles' exchanges
  (ChatML shown; the template writes the markers)::

      <|im_start|>user
      {observation of summary}<|im_end|>
      <|im_start|>assistant
                                                         <- the prompt ends here
      {sampled}<|im_end|>
      <|im_start|>user
      {observation of elaboration}<|im_end|>
      <|im_start|>assistant
      {sampled}<|im_end|>

  A section ends at EOS (the end of the assistant turn, which the runner then does not write again)
  or at its budget. With a raw prompt format the sections are tagged: the prompt is the first role's
  task, and the runner writes each role's opening tag, its closing tag, and each later role's task
  before its answer::

      <task role="summary">
      {observation of summary}
      </task>                                            <- the prompt ends here
      <summary>{sampled}</summary>
      <task role="elaboration">
      {observation of elaboration}
      </task>
      <elaboration>{sampled}

  A tagged section ends at EOS, at its budget, or once it writes a role tag (its own closing tag,
  usually; the runner then skips writing that one). Every role gets its section, so parse failures cannot
  happen, and the sample and its loss are those of one joint completion over the model's own tokens.
  Each role answers right after its own task, as a decentralized agent does, and sees every earlier
  role's task and answer. (A tiny model trained from scratch has to learn to tell the sections apart:
  with all tasks up front, or a long shared preamble, the role-specific context is too diluted for
  it to learn; this layout keeps each section next to its own task.) `Generation.texts` hold the
  sections as ``<role>section</role>`` lines, which `parse` reads back exactly (a section never
  contains a tag). `task_tokens` cuts each observation to its last tokens, so that the whole
  completion fits the model's positions.
- ``tags``, ``labels``, ``json``: free-form answers, asked for as ``<role>...</role>`` sections, lines
  ``role: ...``, or one JSON object with role keys; the model writes everything and `parse_joint`
  finds the sections. A raw ``tags`` prompt ends with the first role's opening tag, so the completion
  starts inside that answer.

The free-form prompt for roles `summary`, `elaboration` (``tags``)::

    You answer for every role of a team: summary, elaboration.
    <task role="summary">
    {observation of summary}
    </task>
    <task role="elaboration">
    {observation of elaboration}
    </task>
    Answer every task, each inside its role's tags, in this order: <summary>...</summary> <elaboration>...</elaboration>
    <summary>

`parse_joint` tries, in order, and keeps the first method that finds any role's section:

1. tags: `<role>...</role>` (case-insensitive; an unclosed section runs to the next role tag or the end;
   a closing tag met before any opening tag closes a section that the prompt opened);
2. labelled sections: lines starting with `role:` (markdown decoration such as `**Role:**` allowed);
3. a JSON object with role keys (non-string values are written as JSON);
4. fenced blocks: ```` ```role ```` blocks by name, else unnamed blocks in role order.

A role the winning method misses gets an empty action; a duplicated section keeps its first
occurrence. When no method finds any section, parsing failed: every role gets an empty action (a
legal, low-reward outcome that runners count as a parse failure).

A lone role (an env with one agent, or a turn where only one role acts) gets its observation as
the prompt and the whole completion, of at most its section's budget, as its action, so with N = 1
the joint actor *is* the plain agent: same prompt, action, loss and gradient.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from textzoo.decoding.generation import Generation
from textzoo.decoding.sampling import Segment
from textzoo.errors import ConfigError
from textzoo.models.policy import Policy
from textzoo.models.prompting import PromptFormat
from textzoo.models.settings import JOINT_FORMATS
from textzoo.models.team import frozen_policy_copy

PromptBuilder = Callable[[dict[str, str]], str]
"""Observations of the active roles (in role order) -> the joint prompt."""
Parser = Callable[[str, tuple[str, ...]], tuple[dict[str, str], bool]]
"""(joint completion, active roles) -> (one action per role, whether parsing failed)."""


_ASK = {
    "tags": lambda roles: (
        "Answer every task, each inside its role's tags, in this order: " + " ".join(f"<{r}>...</{r}>" for r in roles)
    ),
    "labels": lambda roles: (
        "Answer every task in this order, each on its own line that starts with its role "
        "and a colon:\n" + "\n".join(f"{r}: ..." for r in roles)
    ),
    "json": lambda roles: (
        "Answer with one JSON object whose keys are the roles, in this order: {"
        + ", ".join(f'"{r}": "..."' for r in roles)
        + "}"
    ),
}


def task(role: str, observation: str) -> str:
    """One role's observation in its task tags."""
    return f'<task role="{role}">\n{observation}\n</task>'


def joint_prompt(
    observations: dict[str, str], joint_format: str = "tags", open_first: bool = True, chat: bool = False
) -> str:
    """The joint prompt of ``joint_format`` (module docstring); a lone role's observation unchanged.

    ``open_first``: a ``tags`` prompt ends with the first role's opening tag (raw prompts; a chat
    prompt asks and lets the assistant turn begin). A ``structured`` prompt is the first role's task
    (``chat``: its observation, the first user turn of the conversation): the runner writes each later
    one before its role's section."""
    roles = list(observations)
    if len(roles) == 1:
        return observations[roles[0]]
    if joint_format == "structured":
        return observations[roles[0]] if chat else task(roles[0], observations[roles[0]])
    tasks = "\n".join(task(r, observations[r]) for r in roles)
    tail = f"\n<{roles[0]}>" if joint_format == "tags" and open_first else ""
    return f"You answer for every role of a team: {', '.join(roles)}.\n{tasks}\n{_ASK[joint_format](roles)}{tail}"


class JointPrompt(str):
    """A joint prompt (the text) that remembers the observations of the roles it asks for, in role order."""

    observations: dict[str, str]

    def __new__(cls, text: str, observations: dict[str, str]) -> JointPrompt:
        prompt = super().__new__(cls, text)
        prompt.observations = dict(observations)
        return prompt

    @property
    def roles(self) -> tuple[str, ...]:
        return tuple(self.observations)


def structured_text(sections: dict[str, str]) -> str:
    """The sections in the structured layout: ``<role>section</role>`` per role, one per line."""
    return "\n".join(f"<{r}>{text}</{r}>" for r, text in sections.items())


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


def structured_script(
    observations: dict[str, str],
    tokenizer: Any,
    prompt_format: PromptFormat,
    budgets: Sequence[int],
    stop_strings: Sequence[str] = (),
    eos_ids: Sequence[int] = (),
) -> list[Segment]:
    """The structured decoding script of one joint completion (module docstring): each role's section sampled
    (up to its entry of `budgets` tokens, ending at EOS or one of `stop_strings`; tagged sections also at a
    role tag), everything between them forced: with a chat `prompt_format` the template's next user turn
    (ending the section's own turn unless it wrote its end, an id of `eos_ids`, itself), else the tags and
    the next role's task. A lone role's script is one section."""
    roles = list(observations)
    stops = tuple(stop_strings)
    if len(roles) == 1:
        return [Segment(budget=budgets[0], stop_strings=stops)]

    def ids(text: str) -> tuple[int, ...]:
        return tuple(tokenizer(text, add_special_tokens=False)["input_ids"])

    if prompt_format.chat:  # one conversation: each later role's observation is the next user turn
        script = []
        for budget, role in zip(budgets, roles[1:]):
            script.append(Segment(budget=budget, stop_strings=stops, eos_is_stop=True))
            turn = ids(prompt_format.next_turn(tokenizer, observations[role]))
            ended = turn[1:] if turn[:1] and turn[0] in eos_ids else turn  # the section wrote the end itself
            script.append(Segment(forced=turn, after_stop=ended))
        return [*script, Segment(budget=budgets[-1], stop_strings=stops)]
    tags = [tag for r in roles for tag in (f"<{r}>", f"</{r}>")]
    stops = tuple(dict.fromkeys([*tags, *stops]))
    script = [Segment(forced=ids(f"\n<{roles[0]}>"))]
    for budget, prev, role in zip(budgets, roles, roles[1:]):
        script.append(Segment(budget=budget, stop_strings=stops))
        after = f"\n{task(role, observations[role])}\n<{role}>"
        script.append(Segment(forced=ids(f"</{prev}>{after}"), after_stop=ids(after)))
    script.append(Segment(budget=budgets[-1], stop_strings=stops))
    return script


def structured_overhead(roles: Sequence[str], tokenizer: Any, prompt_format: PromptFormat) -> tuple[int, int]:
    """What a structured joint answer spends besides its sections and the roles' tasks, in tokens of
    `tokenizer`: (the forced part of its completion, its prompt's own words: a chat prompt's template too),
    both with every task empty. What a builder subtracts from the model's positions to size the prompt and
    each task."""
    empty = dict.fromkeys(roles, "")
    forced = sum(len(s) for s in structured_script(empty, tokenizer, prompt_format, [1] * len(roles)) if s.forced)
    prompt = joint_prompt(empty, "structured", open_first=not prompt_format.chat, chat=prompt_format.chat)
    if prompt_format.chat:
        intro = len(prompt_format.chat_ids(tokenizer, prompt, 1 << 30))
    else:
        intro = len(tokenizer(prompt_format.raw_text(prompt))["input_ids"])
    return forced, intro


# ---- the actor ----------------------------------------------------------------------------------
class JointActor:
    """One policy answering for all `roles`: a joint prompt in, one completion out, split per role.

    `joint_format` is one of `JOINT_FORMATS` (module docstring). `prompt_builder` and `parser`
    replace a free-form format's prompt and parser (pass both when the format changes, since the
    parser has to read what the builder asks for); a `parser` needs a free-form `joint_format`.
    `prompt_format` (default "auto" for the policy's tokenizer) formats the joint prompt, as it does
    a decentralized agent's. `section_tokens`: the budget of each structured section, one for all
    roles or one per role (role -> tokens; default, and for a role the mapping does not name: the
    policy's budget split evenly over the roles that answer); `task_tokens` > 0 cuts each observation of
    a structured prompt to its last that many tokens.
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
        joint_format: str = "structured",
        section_tokens: int | Mapping[str, int] = 0,
        task_tokens: int = 0,
    ):
        if not roles or len(set(roles)) != len(roles):
            raise ConfigError(f"JointActor roles must be a non-empty list of distinct names, got {list(roles)!r}")
        if joint_format not in JOINT_FORMATS:
            raise ConfigError(f"joint_format must be one of {JOINT_FORMATS}, got {joint_format!r}")
        if parser is not None and joint_format == "structured":
            raise ConfigError(
                "a parser reads free-form joint answers, and joint_format='structured' has none to read: "
                "set joint_format to 'tags', 'labels' or 'json', or drop the parser"
            )
        budgets = section_tokens.values() if isinstance(section_tokens, Mapping) else [section_tokens]
        if any(not isinstance(b, int) or b < 0 for b in budgets) or task_tokens < 0:
            raise ConfigError(
                f"section_tokens and task_tokens must be ints >= 0 (0 = default), got {section_tokens}, {task_tokens}"
            )
        unknown = sorted(set(section_tokens) - set(roles)) if isinstance(section_tokens, Mapping) else []
        if unknown:
            raise ConfigError(f"section_tokens names {unknown}, which are not among the roles {list(roles)}")
        self.id = id
        self.roles = tuple(roles)
        self.policy = policy
        self.trainable = trainable
        self.joint_format = joint_format
        self.section_tokens = dict(section_tokens) if isinstance(section_tokens, Mapping) else section_tokens
        self.task_tokens = task_tokens
        self.prompt_format = prompt_format or PromptFormat.resolve(policy.tokenizer)
        chat = self.prompt_format.chat
        self.prompt_builder = prompt_builder or functools.partial(
            joint_prompt, joint_format=joint_format, open_first=not chat, chat=chat
        )
        self.parser = parser or parse_joint

    @property
    def structured(self) -> bool:
        return self.joint_format == "structured"

    def build_prompt(self, observations: dict[str, str]) -> JointPrompt:
        # role order, not dict order, so the joint prompt of the same observations is always the same
        active = {r: observations[r] for r in self.roles if r in observations}
        if self.structured and len(active) > 1 and self.task_tokens:
            active = {r: self._cut(o) for r, o in active.items()}
        return JointPrompt(self.prompt_builder(active), active)

    def _cut(self, observation: str) -> str:
        """The observation's last `task_tokens` tokens (the whole observation when it is that short)."""
        tokenizer = self.policy.tokenizer

        def length(text: str) -> int:
            return len(tokenizer(text, add_special_tokens=False)["input_ids"])

        ids = tokenizer(observation, add_special_tokens=False)["input_ids"]
        if len(ids) <= self.task_tokens:
            return observation
        text = tokenizer.decode(ids[-self.task_tokens :])
        while text and length(text) > self.task_tokens:  # a cut inside a character decodes to more tokens
            text = text[1:]
        return text

    def generate(
        self, prompts: list[str], *, greedy: bool = False, generator: torch.Generator | None = None
    ) -> Generation:
        if not self.structured:
            return self.prompt_format.generate(self.policy, prompts, greedy=greedy, generator=generator)
        roles = [getattr(p, "roles", self.roles) for p in prompts]
        ids, mask = self.prompt_format.encode(self.policy, prompts)
        scripts = [self.script(p.observations) for p in prompts]
        gen, sections = self.policy.generate_script(ids, mask, scripts, greedy=greedy, generator=generator)
        gen.texts = [
            structured_text(dict(zip(r, parts))) if len(r) > 1 else parts[0] for r, parts in zip(roles, sections)
        ]  # a lone role's whole completion is its action
        return gen

    def budget(self, role: str, answering: int) -> int:
        """The token budget of ``role``'s section when ``answering`` roles answer in one completion."""
        even = max(self.policy.generation.max_new_tokens // answering, 1)
        if isinstance(self.section_tokens, dict):
            return self.section_tokens.get(role) or even
        return self.section_tokens or even

    def script(self, observations: dict[str, str]) -> list[Segment]:
        """The structured decoding script of one joint completion (`structured_script`), each section's budget
        `budget` (a lone role's too)."""
        generation = self.policy.generation
        budgets = [self.budget(r, len(observations)) for r in observations]
        return structured_script(
            observations, self.policy.tokenizer, self.prompt_format, budgets, generation.stop_strings,
            self.policy.eos_ids,
        )  # fmt: skip

    def frozen_copy(self) -> JointActor:
        """A copy that answers the same and never trains (its own copy of the model: eval mode, no gradients)."""
        return JointActor(
            self.roles,
            frozen_policy_copy(self.policy),
            trainable=False,
            prompt_builder=self.prompt_builder,
            parser=None if self.structured else self.parser,
            id=self.id,
            prompt_format=self.prompt_format,
            joint_format=self.joint_format,
            section_tokens=self.section_tokens,
            task_tokens=self.task_tokens,
        )

    def parse(self, completion: str, roles: tuple[str, ...]) -> tuple[dict[str, str], bool]:
        if self.structured and len(roles) > 1:  # the sections in their tags: every role has one
            found = _tag_sections(completion, tuple(roles))
            return {r: found.get(r, "") for r in roles}, False
        return self.parser(completion, tuple(roles))

    def __repr__(self) -> str:
        fmt, trainable = self.joint_format, self.trainable
        return f"JointActor({self.id!r}, roles={list(self.roles)}, joint_format={fmt!r}, trainable={trainable})"
