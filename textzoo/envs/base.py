"""`TextParallelEnv`: the base of every textzoo task.

A task is a PettingZoo `ParallelEnv` whose observations are prompts (`str`) and whose actions are
completions (`str`). This base owns what every text task shares, so a task only writes its data,
its prompts and its reward:

- spaces: one `gymnasium.spaces.Text` per agent with `TEXT_CHARSET` (tab, newline and every
  printable Basic-Multilingual-Plane character), created once and returned as the same object;
  observations are at most `max_prompt_chars` characters, actions at most `max_action_chars`;
- seeding (`reset(seed=...)`) and item selection (`options={"index": i}`);
- turns: `step` asks the task for the next prompts until the last turn, then terminates everyone;
- `state()`: the global text view (every prompt and action so far) for centralized critics;
- `render()`: the same view as text;
- bad actions: anything that is not a `str`, is too long, or carries control characters is
  cleaned, scored as usual (low reward) and reported in `infos[agent]["notes"]`; never an exception.

Per-agent `infos` always carry `turn`, `active` (False when the agent has nothing to do this
turn: the runner then neither generates for it nor trains it on that turn), `item` (the dataset
index) and, after a step, `reward_terms` (a dict of floats) and `notes` (a list of strings).

Subclasses implement `num_items`, `_reset_task(index)` and `_step_task(actions)`.
"""

from __future__ import annotations

import copy
import functools
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from gymnasium import spaces
from gymnasium.utils import seeding
from pettingzoo import ParallelEnv

from textzoo.envs.declare import Declaration, integer, text_args
from textzoo.errors import EnvError

_RANGES = [(0x20, 0x7E), (0xA0, 0xD7FF), (0xE000, 0xFFFD)]


def _build_charset() -> frozenset[str]:
    chars = {"\t", "\n"}
    for lo, hi in _RANGES:
        chars.update(chr(c) for c in range(lo, hi + 1))
    return frozenset(chars)


TEXT_CHARSET: frozenset[str] = _build_charset()
"""Characters a textzoo observation or action may hold: tab, newline and printable BMP text."""

# one regex pass finds characters outside TEXT_CHARSET (a per-character Python loop cost ~1 ms per
# 4,000 characters, tens of ms per training step)
_OUTSIDE = re.compile("[^\t\n" + "".join(f"\\U{lo:08x}-\\U{hi:08x}" for lo, hi in _RANGES) + "]")


class _TextSpace(spaces.Text):
    """`spaces.Text` over `TEXT_CHARSET` whose charset tables are shared, not rebuilt or copied.

    Building a `Text` space over ~63k characters takes ~60 ms and deep-copying one copies its
    63k-entry index; every env holds 2N spaces and runners hold B*G env copies, so copies share
    the (never mutated) tables and own only their RNG.
    """

    def __deepcopy__(self, memo: dict) -> _TextSpace:
        new = copy.copy(self)
        new._np_random = copy.deepcopy(self._np_random, memo)
        return new


@functools.cache
def _text_prototype(max_length: int) -> _TextSpace:
    return _TextSpace(max_length, min_length=0, charset=TEXT_CHARSET)


def text_space(max_length: int) -> spaces.Text:
    """A new `Text` space of up to `max_length` characters of `TEXT_CHARSET`, with its own RNG."""
    space = copy.copy(_text_prototype(max_length))
    space._np_random = None  # seeded lazily, as in a freshly built space
    return space


_WORD = re.compile(r"\w+")


def words(text: str) -> list[str]:
    """The lower-cased word tokens (`\\w+` runs) of `text`: what the tasks count and match."""
    return _WORD.findall(text.lower())


def clean_text(text: Any, max_chars: int) -> tuple[str, list[str]]:
    """Coerce `text` to a `str` inside `TEXT_CHARSET` and `max_chars`; return it with notes on fixes."""
    notes: list[str] = []
    if not isinstance(text, str):
        notes.append(f"action was {type(text).__name__}, not str; converted with str()")
        try:
            text = str(text)
        except Exception:  # an object whose __str__ raises is still just a bad action
            text = ""
    if len(text) > max_chars:
        notes.append(f"action truncated from {len(text)} to {max_chars} characters")
        text = text[:max_chars]
    if _OUTSIDE.search(text):
        text = _OUTSIDE.sub("?", text)
        notes.append("characters outside TEXT_CHARSET (control or non-BMP) replaced by '?'")
    return text, notes


@dataclass
class StepResult:
    """What a task returns for one turn.

    `observations` are the next prompts (ignored on the last turn); `rewards[agent]` is the agent's
    reward this turn; `reward_terms[agent]` its decomposition; `done` ends the episode early.
    `active` lists the agents that act next turn (default: all); `info` adds per-agent extras.
    """

    rewards: dict[str, float]
    observations: dict[str, str] = field(default_factory=dict)
    reward_terms: dict[str, dict[str, float]] = field(default_factory=dict)
    notes: dict[str, list[str]] = field(default_factory=dict)
    active: set[str] | None = None
    done: bool = False
    info: dict[str, dict[str, Any]] = field(default_factory=dict)


_BASE_ARGS = Declaration("TextParallelEnv", {"num_turns": integer(1, low=1), **text_args()})


class TextParallelEnv(ParallelEnv):
    """Base class for text tasks: prompts in, completions out; see the module docstring."""

    metadata: dict[str, Any] = {"name": "textzoo_base", "render_modes": ["ansi"], "is_parallelizable": True}

    def __init__(
        self,
        agents: list[str],
        num_turns: int = 1,
        max_prompt_chars: int = 8192,
        max_action_chars: int = 4096,
        render_mode: str | None = None,
    ):
        if not agents or len(set(agents)) != len(agents):
            raise EnvError(f"agents must be a non-empty list of distinct names, got {agents!r}")
        _BASE_ARGS.bind((num_turns, max_prompt_chars, max_action_chars, render_mode), {})
        self.possible_agents = list(agents)
        self.agents: list[str] = []
        self.num_turns = num_turns
        self.max_prompt_chars = max_prompt_chars
        self.max_action_chars = max_action_chars
        self.render_mode = render_mode
        self._obs_spaces = {a: text_space(max_prompt_chars) for a in agents}
        self._act_spaces = {a: text_space(max_action_chars) for a in agents}
        self.np_random, self._seed = seeding.np_random(None)
        self.turn = 0
        self.item_index = -1
        self.transcript: list[dict[str, tuple[str, str]]] = []  # per turn: agent -> (prompt, action)
        self._prompts: dict[str, str] = {}
        self._active: set[str] = set(agents)

    # ---- what a task implements ------------------------------------------------------------
    def num_items(self) -> int:
        """Number of dataset items (prompts) the task can serve."""
        raise NotImplementedError

    def _reset_task(self, index: int) -> dict[str, str] | tuple[dict[str, str], set[str]]:
        """Load item `index`; return turn-0 prompts, optionally with the set of agents active in
        turn 0 (default: all). The prompts must depend on `index` only, so that
        `options={"index": i}` reproduces them (G copies of one prompt); keep `self.np_random`
        for randomness later in the episode."""
        raise NotImplementedError

    def _step_task(self, actions: dict[str, str], notes: dict[str, list[str]]) -> StepResult:
        """Score this turn's cleaned `actions` (`notes` holds the cleaning notes so far)."""
        raise NotImplementedError

    # ---- PettingZoo API ----------------------------------------------------------------------
    # The spaces live in dicts built once, so each call returns the same object; no lru_cache,
    # which would keep every env instance alive for the life of the process.
    def observation_space(self, agent: str) -> spaces.Text:
        return self._obs_spaces[agent]

    def action_space(self, agent: str) -> spaces.Text:
        return self._act_spaces[agent]

    def reset(self, seed: int | None = None, options: dict | None = None):
        if seed is not None:
            self.np_random, self._seed = seeding.np_random(seed)
        n = self.num_items()
        if n < 1:
            raise EnvError(f"{type(self).__name__} has no items to serve (num_items() = {n})")
        index = (options or {}).get("index")
        if index is None:
            index = int(self.np_random.integers(n))
        elif not isinstance(index, (int, np.integer)) or not 0 <= int(index) < n:
            raise EnvError(f"options['index'] must be an int in [0, {n}), got {index!r}")
        self.item_index = int(index)
        self.turn = 0
        self.transcript = []
        self.agents = list(self.possible_agents)
        self._active = set(self.agents)
        prompts = self._reset_task(self.item_index)
        if isinstance(prompts, tuple):
            prompts, active = prompts
            self._active = set(active)
        self._prompts = {a: self._clip_prompt(prompts.get(a, "")) for a in self.agents}
        infos = {a: self._base_info(a) for a in self.agents}
        return dict(self._prompts), infos

    def step(self, actions: dict[str, Any]):
        if not self.agents:
            raise EnvError("step() called on a finished episode; call reset() first")
        cleaned: dict[str, str] = {}
        notes: dict[str, list[str]] = {}
        for a in self.agents:
            text, n = clean_text(actions.get(a, ""), self.max_action_chars)
            if a not in actions and a in self._active:
                n.append("no action given; treated as empty")
            cleaned[a], notes[a] = text, n
        self.transcript.append({a: (self._prompts[a], cleaned[a]) for a in self.agents})
        result = self._step_task(cleaned, notes)
        self.turn += 1
        done = result.done or self.turn >= self.num_turns
        agents = list(self.agents)
        rewards = {a: float(result.rewards.get(a, 0.0)) for a in agents}
        terms = {a: dict(result.reward_terms.get(a, {})) for a in agents}
        self._active = set(agents) if result.active is None else set(result.active)
        if not done:
            self._prompts = {a: self._clip_prompt(result.observations.get(a, "")) for a in agents}
        infos = {}
        for a in agents:
            info = self._base_info(a)
            info["reward_terms"] = terms[a]
            info["notes"] = notes.get(a, []) + result.notes.get(a, [])
            info.update(result.info.get(a, {}))
            infos[a] = info
        obs = {a: (self._prompts[a] if not done else "") for a in agents}
        terminations = {a: done for a in agents}
        truncations = {a: False for a in agents}
        if done:
            self.agents = []
        return obs, rewards, terminations, truncations, infos

    def state(self) -> str:
        """Global text view: every role's prompt and action so far, then the current prompts."""
        parts = []
        for t, turn in enumerate(self.transcript):
            for a, (prompt, action) in turn.items():
                parts.append(f"[turn {t}] <{a} prompt>\n{prompt}\n<{a} action>\n{action}")
        if self.agents:
            for a in self.agents:
                parts.append(f"[turn {self.turn}] <{a} prompt>\n{self._prompts[a]}")
        return "\n".join(parts)

    def render(self) -> str | None:
        """Return the text view (`render_mode="ansi"`); None when rendering is off."""
        if self.render_mode is None:
            return None
        return self.state()

    def close(self) -> None:
        pass

    # ---- helpers -------------------------------------------------------------------------------
    def _clip_prompt(self, prompt: str) -> str:
        text, _ = clean_text(prompt, self.max_prompt_chars)
        return text

    def _base_info(self, agent: str) -> dict[str, Any]:
        return {"turn": self.turn, "active": agent in self._active, "item": self.item_index}
