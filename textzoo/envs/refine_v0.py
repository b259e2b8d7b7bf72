"""textzoo/Refine-v0: N refiners rewrite a task prompt; a generator answers the combined rewrite.

Roles: `refiner_0` .. `refiner_{N-1}` (N = `num_refiners`, default 2) and `generator`.

Items: item k is a topic and one keyword per refiner; refiner i's keyword comes from its own pool
(`keywords[i]`; the default pools deal `KEYWORDS` out round-robin, so no two refiners share a
word). The task is "write about the topic"; refiner i alone is told that the answer must use its
keyword, so refiner i alone can make constraint i hold.

Turns:
- turn 0: every refiner sees the task and its own constraint and writes a rewrite of the task;
  the generator is inactive (`infos["generator"]["active"] is False`; its action is ignored)::

      Task: Write one sentence about the old harbor.
      Constraint: the answer must use the word "apple".
      Rewrite the task so the writer meets the constraint.
      Rewrite:

- turn 1: the generator sees only the combined refined prompt (each rewrite cut to
  `rewrite_chars` characters, in refiner order) and answers; the refiners are inactive::

      Instructions:
      {rewrite of refiner_0}
      {rewrite of refiner_1}
      Answer:

Actions: any string (cleaned by `TextParallelEnv`).

Score (turn 1): words(t) = the lower-cased `\\w+` runs of t. Constraint i holds, c_i = 1, when
refiner i's keyword is one of words(answer) (with `require_topic`: and the topic's noun is too), else
c_i = 0. The task score is team = mean_i c_i.
Rewards: refiner i gets its own term c_i, the generator gets team; turn 0 rewards 0. The mean of
all N + 1 rewards is (N·team + team) / (N + 1) = team, so `credit="shared"` (the mean over
roles) trains every agent on the task score and `credit="per_agent"` trains refiner i on c_i.
`infos[a]["reward_terms"]` (every agent, turn 1) = {"team": team, "refiner_i": c_i for each i, "on_topic",
"no_loop"}, where `on_topic` = 1 when words(answer) holds the topic's noun (its last word: "harbor" for "the
old harbor") and `no_loop` = 1 when no run of 1 to `LOOP_WORDS` words repeats `LOOP_TIMES` times in a row
in words(answer) ("green green green" loops). Without `require_topic`, `on_topic` enters no reward, and
`no_loop` never does: they show apart whether an answer that scores still writes about the topic, and
whether it writes text or a loop.

Split: items follow the shared rule of `textzoo.envs._sources` (every fifth item held out for
`split="eval"`); `num_items` sets the size of the pool before the split. Items are drawn from 12 topics
and 12 words per refiner (1,728 combinations), so in a large pool a held-out item can repeat a trained
combination of topic and words.

Presets (`PRESETS`, `textzoo.envs.presets`; docs/results/presets.md has the zero-shot probe):
`two-keywords`, 2 refiners (32 tokens each) and the generator (48 tokens), 1,000 items (200 held out),
sampled at temperature 0.7; `two-keywords-on-topic`, the same with `require_topic`: a team trained on
`two-keywords` learned to repeat the keywords in an answer about nothing (held-out `on_topic` 0.86 ->
0.01, docs/results/real-teams.md), which this preset scores 0.

Version history:
- v0: first version; 2026-12-07: the `on_topic` term (logged; no reward reads it unless `require_topic`,
  added with the `two-keywords-on-topic` preset); the `no_loop` term (logged; no reward reads it).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from textzoo.envs._sources import split_indices
from textzoo.envs.base import StepResult, TextParallelEnv, words
from textzoo.envs.declare import SPLIT, anything, entry_points, integer, one_of, task, text_args
from textzoo.envs.presets import TaskPreset
from textzoo.errors import EnvError

TOPICS = (
    "the old harbor",
    "a mountain village",
    "the city library",
    "a quiet farm",
    "the train station",
    "a forest camp",
    "the town square",
    "a small bakery",
    "the museum hall",
    "a busy market",
    "the school garden",
    "a coastal lab",
)
KEYWORDS = (
    "apple",
    "river",
    "green",
    "tiger",
    "candle",
    "violin",
    "silver",
    "rocket",
    "pepper",
    "island",
    "winter",
    "marble",
    "falcon",
    "lemon",
    "copper",
    "meadow",
    "anchor",
    "velvet",
    "cactus",
    "thunder",
    "walnut",
    "harbor",
    "ember",
    "tulip",
)
REFINER_PROMPT = (
    "Task: Write one sentence about {topic}.\n"
    'Constraint: the answer must use the word "{keyword}".\n'
    "Rewrite the task so the writer meets the constraint.\n"
    "Rewrite:"
)
GENERATOR_HEADER = "Instructions:\n"
GENERATOR_FOOTER = "\nAnswer:"
WAIT_PROMPT = "Wait: the refiners write the prompt this turn."
DONE_PROMPT = "Done: the generator answers this turn."
ITEM_SEED = 8
LOOP_WORDS = 4
LOOP_TIMES = 3
PRESETS: dict[str, TaskPreset] = {
    "two-keywords": TaskPreset(
        {"num_refiners": 2, "num_items": 1000}, {"refiner_0": 32, "refiner_1": 32, "generator": 48}, temperature=0.7
    ),
    "two-keywords-on-topic": TaskPreset(
        {"num_refiners": 2, "num_items": 1000, "require_topic": True},
        {"refiner_0": 32, "refiner_1": 32, "generator": 48},
        temperature=0.7,
    ),
}
"""Settings a small model can start from (module docstring, Presets)."""


def loops(ws: Sequence[str], longest: int = LOOP_WORDS, times: int = LOOP_TIMES) -> bool:
    """Whether some run of 1 to `longest` words repeats `times` times in a row in `ws`."""
    return any(
        list(ws[i : i + n * times]) == list(ws[i : i + n]) * times
        for n in range(1, longest + 1)
        for i in range(len(ws) - n * times + 1)
    )


def refiner_names(n: int) -> list[str]:
    return [f"refiner_{i}" for i in range(n)]


@task(
    "refine_v0",
    num_refiners=integer(2, low=1),
    keywords=anything(None, doc="one list of single words per refiner; None: the default pools"),
    num_items=integer(200, low=1),
    split=SPLIT,
    rewrite_chars=integer(160, low=1, doc="the longest rewrite the generator is shown"),
    require_topic=one_of(False, False, True, doc="a keyword counts only in an answer that names the topic's noun"),
    **text_args(max_prompt_chars=1024),
)
class RefineEnv(TextParallelEnv):
    """Refine-v0: N refiners rewrite a prompt, one generator answers it; see the module docstring."""

    def __init__(self, num_refiners, keywords, num_items, split, rewrite_chars, require_topic, **text: Any):
        self.refiners = refiner_names(num_refiners)
        super().__init__([*self.refiners, "generator"], num_turns=2, **text)
        max_prompt_chars = text["max_prompt_chars"]
        self.split = split
        self.pools = self._pools(keywords, num_refiners)
        self.rewrite_chars = rewrite_chars
        self.require_topic = require_topic
        longest = len(GENERATOR_HEADER) + num_refiners * (rewrite_chars + 1) + len(GENERATOR_FOOTER)
        if longest > max_prompt_chars:
            raise EnvError(
                f"max_prompt_chars={max_prompt_chars} cannot hold {num_refiners} rewrites of {rewrite_chars} "
                f"characters; use max_prompt_chars >= {longest} or a smaller rewrite_chars"
            )
        self._items = split_indices(num_items, self.split)
        if not self._items:
            raise EnvError(f"split={self.split!r} of {num_items} items is empty; give num_items >= 5 (or split='all')")
        self.topic = ""
        self.keywords: dict[str, str] = {}
        self.rewrites: dict[str, str] = {}

    @staticmethod
    def _pools(keywords: Sequence[Sequence[str]] | None, n: int) -> list[list[str]]:
        if keywords is None:
            if n > len(KEYWORDS):
                raise EnvError(f"the default keywords serve at most {len(KEYWORDS)} refiners; pass keywords for {n}")
            return [list(KEYWORDS[i::n]) for i in range(n)]
        if isinstance(keywords, str) or not isinstance(keywords, Sequence) or len(keywords) != n:
            raise EnvError(f"keywords must hold one list of words per refiner ({n}), got {keywords!r}")
        pools = []
        for i, pool in enumerate(keywords):
            pool = [pool] if isinstance(pool, str) else list(pool)
            if not pool or any(not isinstance(w, str) or words(w) != [w] for w in pool):
                raise EnvError(
                    f"keywords[{i}] = {pool!r}: each pool must be a non-empty list of single lower-case words "
                    "(letters, digits, underscores)"
                )
            pools.append(pool)
        shared = sorted({w for p in pools for w in p if sum(w in q for q in pools) > 1})
        if shared:
            raise EnvError(f"keywords {shared} belong to several refiners; give each refiner its own words")
        return pools

    def num_items(self) -> int:
        return len(self._items)

    def _reset_task(self, index: int) -> tuple[dict[str, str], set[str]]:
        rng = random.Random(ITEM_SEED * 1_000_003 + self._items[index])
        self.topic = rng.choice(TOPICS)
        self.keywords = {r: rng.choice(pool) for r, pool in zip(self.refiners, self.pools)}
        self.rewrites = {}
        prompts = {r: REFINER_PROMPT.format(topic=self.topic, keyword=self.keywords[r]) for r in self.refiners}
        prompts["generator"] = WAIT_PROMPT
        return prompts, set(self.refiners)

    def _step_task(self, actions: dict[str, str], notes: dict[str, list[str]]) -> StepResult:
        idle = ["generator"] if self.turn == 0 else self.refiners
        extra = {a: ["inactive this turn; action ignored"] for a in idle if actions[a]}
        if self.turn == 0:
            for r in self.refiners:
                self.rewrites[r] = actions[r][: self.rewrite_chars]
                if len(actions[r]) > self.rewrite_chars:
                    extra[r] = [f"rewrite cut to its first {self.rewrite_chars} characters"]
            combined = GENERATOR_HEADER + "\n".join(self.rewrites[r] for r in self.refiners) + GENERATOR_FOOTER
            observations = dict.fromkeys(self.refiners, DONE_PROMPT)
            observations["generator"] = combined
            return StepResult(
                rewards=dict.fromkeys(self.possible_agents, 0.0),
                observations=observations,
                active={"generator"},
                notes=extra,
            )
        said = words(actions["generator"])
        answer = set(said)
        noun = self.topic.split()[-1]
        on_topic = float(noun in answer)
        gate = on_topic if self.require_topic else 1.0
        held = {r: float(self.keywords[r] in answer) * gate for r in self.refiners}
        team = sum(held.values()) / len(held)
        missed = [self.keywords[r] for r in self.refiners if self.keywords[r] not in answer]
        if missed:
            extra["generator"] = [f"answer misses the word(s) {missed}"]
        if self.require_topic and not on_topic:
            extra.setdefault("generator", []).append(f"answer does not name the topic ({noun!r}): no keyword counts")
        rewards = {**held, "generator": team}
        terms = {"team": team, **held, "on_topic": on_topic, "no_loop": float(not loops(said))}
        return StepResult(
            rewards=rewards,
            reward_terms={a: dict(terms) for a in self.possible_agents},
            notes=extra,
            active=set(),
        )


parallel_env, env, raw_env = entry_points(RefineEnv)
