"""textzoo/ReasoningGym-v0: any reasoning-gym dataset (its generator and its verifier) as a team task.

Needs the extra `textzoo[reasoning-gym]` (`pip install "reasoning-gym>=0.1.25"`). `dataset` names one
of reasoning-gym's procedural datasets (`mini_sudoku`, `chain_sum`, `maze`, `countdown`, ...; an
unknown name fails with the closest ones) and `config` is its settings (the fields of the dataset's
config class, e.g. `{"min_terms": 2, "max_terms": 3}` for `chain_sum`; a field it does not have, or a
value its `validate()` refuses, fails with the fields and the reason).

Items and the held-out split, by seed: reasoning-gym builds item i of a dataset with seed s from
`Random(s + i)`. The train split is items 0..size-1 of seed `seed`; the eval split is items
0..eval_size-1 of seed `seed + size`, so the two draw from disjoint generator seeds, and an eval item
whose question also occurs in the train split is dropped (small configs can repeat a question), so
no held-out question is ever trained on. `split="all"` serves both (train first).
`options={"index": i}` picks item i of the split.

Arrangements (`arrangement`):
- "single": one agent, `solver`, one turn.
- "team": N agents (`num_agents`, default 2: `agent_0`..), one turn; each answers, and the team's
  answer is the most common answer among them (ties: the earliest agent's).
- "debate": N agents (`debater_0`..) over K turns (`turns`, default 3), as Debate-v0: in turn t > 0
  each sees the question, its own last reply and the others' (cut to `response_chars`) with the
  answers read from them, and answers again.
- "toolplan": the tool/plan pair of Sudoku-v0 (`textzoo.envs._toolplan`): `tool` writes a Python
  program, run in the sandbox with `question` bound to the question's text, whose printed answer
  counts as well as the `plan` agent's; up to `turns` turns, ending when either answer scores 1.

Observations: the question, then "end your reply with '####' followed by the final answer".
Actions: any string; the answer is the text after the last `####` (all of it without one), stripped
(`textzoo.envs._toolplan.answer_region`, the rule of the puzzle tasks).

Reward terms (per agent): `solved` = the verifier's score `dataset.score_answer(answer, entry)` in
[0, 1] (of the team's answer in "team"; a verifier that raises or returns a non-number scores 0
with a note), the format terms apart: `valid` = the reply holds '####' followed by a non-empty
answer. "team" adds `own_solved` (the verifier's score of the agent's own answer), "debate" adds
`agreement` (the share of the other agents that gave the same answer, 0 for an empty one).
Scores (`WEIGHTS`): single 0.9 solved + 0.1 valid; team 0.6 solved + 0.3 own_solved + 0.1 valid;
debate 0.7 solved + 0.2 agreement + 0.1 valid, rewarded as Debate-v0 (the reward of turn t is
score_t - score_{t-1}, so the return is the final answer's score and summed terms are the final
answer's terms). "toolplan" scores as Sudoku-v0 (plan 0.6 solved + 0.3 progress + 0.1 valid, with
progress = the verifier's score and solved = a score of 1).

Extra TRL reward functions (`reward_fns`, `reward_weights`, `reward_format`; "single" and "team"):
called as in Team-v0 with `prompts` (the question), `completions`, `agent_id`, `other_completions`
and the item's columns `answer` (reasoning-gym's reference answer) and `metadata`, in the standard
or the conversational format (`textzoo.envs.rewards`); each adds its weighted value to the agent's
reward and its value as a term.

Presets (`PRESETS`, `textzoo.envs.presets`): `chain-sum-team` (`chain_sum` with two one-digit terms,
"a + b" or "a - b") and `basic-arithmetic-team` (`basic_arithmetic` with two terms from 0-10, +, - or
*, no parentheses or negation), each as a two-agent "team" of one turn with 48 tokens per agent, 100
train items and the held-out items of 100 more seeds that are not among them (57 and 74 held out).
Measured zero-shot: docs/results/2026-12-01-real-model-cpu.md, "Presets, zero-shot" (`benchmarks/preset_probe.py`).

Version history:
- v0: first version.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from textzoo.envs._sources import import_extra
from textzoo.envs._toolplan import ANSWER_MARK, Outcome, ToolPlanEnv, answer_region
from textzoo.envs.base import StepResult, TextParallelEnv
from textzoo.envs.debate_v0 import OTHER, agent_names
from textzoo.envs.declare import SPLIT, Arg, anything, entry_points, instance_of, integer, one_of, task, text_args
from textzoo.envs.presets import TaskPreset
from textzoo.envs.rewards import RewardFn, RewardFunctions
from textzoo.envs.team_v0 import RESERVED
from textzoo.errors import EnvError
from textzoo.sandbox import SandboxLimits

ARRANGEMENTS = ("single", "team", "debate", "toolplan")
WEIGHTS: dict[str, dict[str, float]] = {
    "single": {"solved": 0.9, "valid": 0.1},
    "team": {"solved": 0.6, "own_solved": 0.3, "valid": 0.1},
    "debate": {"solved": 0.7, "agreement": 0.2, "valid": 0.1},
}
"""Per arrangement: term -> weight of an agent's score (each sums to 1; "toolplan" uses `_toolplan.WEIGHTS`)."""
_ONE_DIGIT = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}
_TEAM = {"arrangement": "team", "num_agents": 2, "size": 100, "eval_size": 100}
PRESETS: dict[str, TaskPreset] = {
    "chain-sum-team": TaskPreset(
        {"dataset": "chain_sum", "config": dict(_ONE_DIGIT), **_TEAM}, {"agent_0": 48, "agent_1": 48}
    ),
    "basic-arithmetic-team": TaskPreset(
        {
            "dataset": "basic_arithmetic",
            "config": {**_ONE_DIGIT, "operators": ["+", "-", "*"], "allow_parentheses": False, "allow_negation": False},
            **_TEAM,
        },
        {"agent_0": 48, "agent_1": 48},
    ),
}
"""Settings a small model can start from (module docstring, Presets)."""

PROMPT = "{question}\n\nThink briefly, then end your reply with '####' followed by your final answer.\n"
REVISE_PROMPT = (
    "Solve the task together with {others_count}.\n{question}\n\n"
    "Your previous reply (answer read: {own_answer}):\n{own}\n\n"
    "The other agents' previous replies:\n{others}\n\n"
    "Round {turn} of {turns}. Check the replies, then give your own final answer: think briefly and "
    "end your reply with '####' followed by your final answer.\n"
)


def _rg() -> Any:
    return import_extra("reasoning_gym", "textzoo/ReasoningGym-v0", "reasoning-gym", "reasoning-gym>=0.1.25")


def dataset_names() -> list[str]:
    """The names of reasoning-gym's registered datasets, sorted."""
    _rg()
    from reasoning_gym.factory import DATASETS

    return sorted(DATASETS)


def _create(name: str, config: dict[str, Any], seed: int, size: int) -> Any:
    """reasoning-gym's dataset `name`; user mistakes become `EnvError`s that name the fix."""
    rg = _rg()
    from reasoning_gym.factory import DATASETS

    if name not in DATASETS:
        close = difflib.get_close_matches(name, list(DATASETS), n=3, cutoff=0.5)
        hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
        raise EnvError(
            f"dataset={name!r} is not a reasoning-gym dataset.{hint} "
            f"textzoo.envs.reasoning_gym_v0.dataset_names() lists all {len(DATASETS)}"
        )
    config_cls = DATASETS[name][1]
    fields = sorted(f.name for f in dataclasses.fields(config_cls) if f.name not in ("seed", "size"))
    taken = sorted({"seed", "size"} & set(config))
    if taken:
        raise EnvError(f"config must not set {taken}: pass seed= and size= to the env (they define the split)")
    unknown = sorted(set(config) - set(fields))
    if unknown:
        raise EnvError(f"config of {name!r} has no field(s) {unknown}; its fields are {fields}")
    try:
        return rg.create_dataset(name, seed=seed, size=size, **config)
    except (AssertionError, ValueError, TypeError) as e:
        raise EnvError(f"config {config!r} of {name!r} is refused by reasoning-gym: {e or type(e).__name__}") from e


@functools.lru_cache(maxsize=64)
def _pool(name: str, config_json: str, seed: int, size: int, split: str, eval_size: int) -> tuple[Any, tuple]:
    """(the dataset that scores, the split's entries); built once per process and shared by env copies."""
    config = json.loads(config_json)
    train = _create(name, config, seed, size)
    train_items = tuple(train[i] for i in range(size))
    if split == "train":
        return train, train_items
    held = _create(name, config, seed + size, eval_size)
    seen = {item["question"] for item in train_items}
    eval_items = tuple(item for item in (held[i] for i in range(eval_size)) if item["question"] not in seen)
    return train, eval_items if split == "eval" else train_items + eval_items


def verify(dataset: Any, entry: dict[str, Any], answer: str) -> tuple[float, list[str]]:
    """The verifier's score of `answer` in [0, 1], with a note when the verifier failed on it."""
    try:
        score = dataset.score_answer(answer=answer, entry=entry)
        score = float(score)
    except Exception as e:  # a verifier that breaks on odd text is scored, never a crash
        return 0.0, [f"the verifier raised {type(e).__name__} on this answer; scored 0"]
    if not math.isfinite(score):
        return 0.0, [f"the verifier returned {score}; scored 0"]
    return min(1.0, max(0.0, score)), []


def read_answer(text: str) -> tuple[str, bool]:
    """The answer of a reply (the text after the last '####', stripped) and whether it is well-formed."""
    answer = answer_region(text).strip()
    return answer, ANSWER_MARK in text and bool(answer)


class ReasoningGymEnv(TextParallelEnv):
    """ReasoningGym-v0 in the "single", "team" and "debate" arrangements; see the module docstring."""

    metadata = {"name": "reasoning_gym_v0", "render_modes": ["ansi"], "is_parallelizable": True}

    def __init__(
        self,
        dataset: str,
        config: Mapping[str, Any] | None,
        arrangement: str,
        num_agents: int,
        turns: int,
        seed: int,
        size: int,
        eval_size: int,
        split: str,
        reward_fns: RewardFn | Sequence[RewardFn] | None,
        reward_weights: Sequence[float] | None,
        reward_format: str | Sequence[str],
        response_chars: int,
        max_prompt_chars: int,
        max_action_chars: int,
        render_mode: str | None,
    ):
        """Built by `parallel_env`, which checks the arguments against their declaration."""
        self.arrangement = arrangement
        if arrangement == "single":
            names, num_turns = ["solver"], 1
        elif arrangement == "team":
            names, num_turns = [f"agent_{i}" for i in range(num_agents)], 1
        else:
            if num_agents < 2:
                raise EnvError(f"num_agents must be an int >= 2 for arrangement='debate', got {num_agents!r}")
            names, num_turns = agent_names(num_agents), turns
        super().__init__(names, num_turns, max_prompt_chars, max_action_chars, render_mode)
        self.split = split
        self.response_chars = response_chars
        self.dataset_name = dataset
        self.dataset, self._items = load_items(dataset, config, seed, size, eval_size, self.split)
        self.extra: RewardFunctions | None = None
        if reward_fns is not None:
            if arrangement == "debate":
                raise EnvError("reward_fns are for the one-turn arrangements 'single' and 'team', not 'debate'")
            self.extra = RewardFunctions(
                reward_fns,
                reward_weights,
                (*RESERVED, "answer", "metadata"),
                arg="reward_fns",
                reward_format=reward_format,
            )
        self.entry: dict[str, Any] = self._items[0]
        self._last_scores: dict[str, float] = {}
        self._last_terms: dict[str, dict[str, float]] = {}

    def num_items(self) -> int:
        return len(self._items)

    def _reset_task(self, index: int) -> dict[str, str]:
        self.entry = self._items[index]
        terms = WEIGHTS[self.arrangement]
        self._last_scores = dict.fromkeys(self.possible_agents, 0.0)
        self._last_terms = {a: dict.fromkeys(terms, 0.0) for a in self.possible_agents}
        return dict.fromkeys(self.possible_agents, PROMPT.format(question=self.entry["question"]))

    def _step_task(self, actions: dict[str, str], notes: dict[str, list[str]]) -> StepResult:
        agents = self.possible_agents
        read = {a: read_answer(actions[a]) for a in agents}
        extra: dict[str, list[str]] = {a: [] for a in agents}
        own: dict[str, float] = {}
        for a in agents:
            own[a], extra[a] = verify(self.dataset, self.entry, read[a][0])
            if not read[a][1]:
                extra[a].append("no answer read: end the reply with '####' followed by the answer")
        terms: dict[str, dict[str, float]] = {}
        if self.arrangement == "single":
            terms = {a: {"solved": own[a], "valid": float(read[a][1])} for a in agents}
        elif self.arrangement == "team":
            team_answer = _vote([read[a][0] for a in agents])
            team, _ = verify(self.dataset, self.entry, team_answer)
            terms = {a: {"solved": team, "own_solved": own[a], "valid": float(read[a][1])} for a in agents}
        else:
            for a in agents:
                same = sum(bool(read[a][0]) and read[b][0] == read[a][0] for b in agents if b != a)
                terms[a] = {"solved": own[a], "agreement": same / (len(agents) - 1), "valid": float(read[a][1])}
        weights = WEIGHTS[self.arrangement]
        rewards, deltas, info = {}, {}, {}
        for a in agents:
            score = round(sum(w * terms[a][k] for k, w in weights.items()), 12)
            rewards[a] = round(score - self._last_scores[a], 12)
            deltas[a] = {k: round(terms[a][k] - self._last_terms[a][k], 12) for k in weights}
            info[a] = {"score_terms": dict(terms[a]), "score": score, "answer": read[a][0]}
            self._last_scores[a], self._last_terms[a] = score, terms[a]
        if self.extra is not None:
            self._add_extra(actions, rewards, deltas, extra)
        observations = {}
        if self.arrangement == "debate" and self.turn + 1 < self.num_turns:
            observations = {a: self._revise_prompt(a, actions, read) for a in agents}
        return StepResult(rewards=rewards, observations=observations, reward_terms=deltas, notes=extra, info=info)

    def _add_extra(self, actions, rewards, terms, notes) -> None:
        columns = {"answer": [self.entry["answer"]], "metadata": [self.entry.get("metadata", {})]}
        for a in self.possible_agents:
            others = {b: [actions[b]] for b in self.possible_agents if b != a}
            kwargs = {"agent_id": a, "other_completions": others, **columns}
            where = f"item {self.item_index} of {self.dataset_name!r} split {self.split!r}, agent {a!r}"
            totals, per_fn, fn_notes = self.extra.score([self.entry["question"]], [actions[a]], kwargs, where=where)
            rewards[a] = round(rewards[a] + totals[0], 12)
            terms[a].update(per_fn[0])
            notes[a] += fn_notes[0]

    def _revise_prompt(self, agent: str, actions: dict[str, str], read: dict[str, tuple[str, bool]]) -> str:
        others = [a for a in self.possible_agents if a != agent]

        def reply(a: str) -> str:
            return actions[a][: self.response_chars].strip() or "(empty)"

        def shown(a: str) -> str:
            return read[a][0][: self.response_chars] or "none"

        return REVISE_PROMPT.format(
            others_count="1 other agent" if len(others) == 1 else f"{len(others)} other agents",
            question=self.entry["question"],
            own_answer=shown(agent),
            own=reply(agent),
            others="\n".join(OTHER.format(agent=a, answer=shown(a), text=reply(a)) for a in others).rstrip("\n"),
            turn=self.turn + 2,
            turns=self.num_turns,
        )


def _vote(answers: list[str]) -> str:
    """The most common non-empty answer (ties: the earliest); "" when every answer is empty."""
    counts = Counter(a for a in answers if a)
    if not counts:
        return ""
    best = max(counts.values())
    return next(a for a in answers if a and counts[a] == best)


def load_items(
    dataset: str, config: Mapping[str, Any] | None, seed: int, size: int, eval_size: int, split: str
) -> tuple[Any, tuple]:
    """(the verifying dataset, the entries of `split`), validated; see the module docstring."""
    if not isinstance(dataset, str):
        raise EnvError(f"dataset must be a reasoning-gym dataset name (a str), got {dataset!r}")
    config = dict(config or {})
    try:
        config_json = json.dumps(config, sort_keys=True)
    except TypeError as e:
        raise EnvError(f"config must be JSON data (numbers, strings, lists, dicts): {e}") from e
    verifier, items = _pool(dataset, config_json, seed, size, split, eval_size)
    if not items:
        raise EnvError(f"split={split!r} of {dataset!r} is empty: every eval question repeats a train one")
    return verifier, items


class ReasoningGymGame:
    """A reasoning-gym split as a `textzoo.envs._toolplan.Game`: item k is entry k, the verifier scores."""

    answer_format = "the final answer exactly as the task asks for it"

    def __init__(self, dataset_name: str, verifier: Any, items: tuple):
        self.title = f"a reasoning task ({dataset_name})"
        self.verifier, self.items = verifier, items

    def puzzle(self, k: int) -> dict[str, Any]:
        return self.items[k]

    def task(self, puzzle: dict[str, Any]) -> str:
        return puzzle["question"]

    def variables(self, puzzle: dict[str, Any]) -> str:
        return f"question = {puzzle['question']!r}\n"

    def score(self, puzzle: dict[str, Any], answer: str) -> Outcome:
        answer = answer.strip()
        score, notes = verify(self.verifier, puzzle, answer)
        feedback = notes[0] if notes else f"the verifier scored this answer {score:.2f} of 1"
        return Outcome(valid=bool(answer), solved=score >= 1.0, progress=score, feedback=feedback)


TOOLPLAN_ONLY = ("sandbox_limits",)
ONE_TURN_ONLY = ("num_agents", "reward_fns", "reward_weights", "reward_format", "response_chars")


ARGS = dict(
    dataset=Arg("mini_sudoku", str, doc="a reasoning-gym dataset name"),
    config=anything(None, doc="the dataset's settings (JSON data)"),
    arrangement=one_of("single", *ARRANGEMENTS),
    num_agents=integer(2, low=1, doc="agents of 'team' (>= 1) and 'debate' (>= 2)"),
    turns=integer(3, low=1, doc="turns of 'debate' and 'toolplan'"),
    seed=integer(0, low=0, doc="the seed of the generated questions"),
    size=integer(1000, low=1, doc="questions generated for the train split"),
    eval_size=integer(200, low=1, doc="questions generated for the eval split"),
    split=SPLIT,
    reward_fns=anything(None, doc="extra TRL-style reward function(s) ('single' and 'team')"),
    reward_weights=anything(None),
    reward_format=anything("auto"),
    response_chars=integer(400, low=1, doc="the longest reply the others are shown ('debate')"),
    sandbox_limits=instance_of(SandboxLimits, doc="limits of the tool's programs ('toolplan')"),
    **text_args(),
)
"""The declared arguments of ReasoningGym-v0."""


@task("reasoning_gym_v0", **ARGS)
def _build(**args: Any) -> TextParallelEnv:
    """A `ReasoningGymEnv`, or for arrangement="toolplan" a `ToolPlanEnv`."""
    toolplan = args["arrangement"] == "toolplan"
    given = [k for k in (ONE_TURN_ONLY if toolplan else TOOLPLAN_ONLY) if args[k] != ARGS[k].default]
    if given and not toolplan:
        raise EnvError("sandbox_limits is for arrangement='toolplan' (the tool agent's programs)")
    if given:
        raise EnvError(f"arrangement='toolplan' does not take {given}; they are for the other arrangements")
    if not toolplan:
        return ReasoningGymEnv(**{k: v for k, v in args.items() if k not in TOOLPLAN_ONLY})
    verifier, items = load_items(*(args[k] for k in ("dataset", "config", "seed", "size", "eval_size", "split")))
    game = ReasoningGymGame(args["dataset"], verifier, items)
    return ToolPlanEnv(
        game,
        "reasoning_gym_v0",
        num_items=len(items),
        split="all",  # the items are already the split's (by seed)
        turns=args["turns"],
        sandbox_limits=args["sandbox_limits"],
        **{k: args[k] for k in text_args()},
    )


parallel_env, env, raw_env = entry_points(_build)
