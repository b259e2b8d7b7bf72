"""textzoo/Debate-v0: N agents answer a question with an exact answer, read each other and revise.

Roles: `debater_0` .. `debater_{N-1}` (N = `num_agents`, default 2), all active in every turn.

Turns (`turns` = K, default 3): in turn 0 each agent answers the question alone; in turn t > 0
each sees the question, its own previous reply and the other agents' previous replies (each cut
to `response_chars` characters, with the answer the parser read from it) and answers again. The
episode ends after turn K - 1. The environment reveals nothing about correctness.

Observations, turn 0::

    Solve the problem.
    Mia has 4 boxes of stickers with 6 stickers in each box. Mia buys 9 more stickers. ...
    How many stickers does Mia have now?
    Reason briefly, then end your reply with '####' followed by the final answer as a number.

Actions: any string. The answer is read from the text after the last `####` when there is one
(its first number), else from the text after the last "answer" in any case (its first number),
else it is the last number of the text. Numbers: an optional minus sign, digits with optional
thousands commas ("1,234"), an optional decimal part ("2.5") or a fraction ("3/4"); they are
compared exactly (as fractions), so "0.5" and "1/2" are the same answer. `parse_answer` applies it.

Reward terms of agent i for the answers of a turn (its own values, so `credit="per_agent"` trains
each agent on its own reward): `solved` = its answer equals the gold answer; `agreement` = the
share of the other N - 1 agents that gave the same answer (0 when its answer is not a number);
`valid` = a number was read. Its score is 0.7 solved + 0.2 agreement + 0.1 valid (`WEIGHTS`); the
mean of the agents' scores is the team score (what `credit="shared"` trains on). Rewards are score
differences: the reward of turn t is score_t - score_{t-1} (score_{-1} = 0), so an agent's return
is the score of its final answer, and `reward_terms` are differences in the same way: summed over
an episode (what the `reward/<term>` metrics show) they are the final answers' terms, e.g.
`reward/solved` = the share of correct final answers. `infos[agent]["score_terms"]` holds the
terms of the turn itself and `infos[agent]["answer"]` the answer read (None when none).

Items: by default procedurally generated multi-step arithmetic word problems: item k is a pure
function of k (a start quantity, then `steps` operations, default 3: buying, giving away,
doubling/tripling, packs of several, equal sharing), with every intermediate value a positive
integer, and its exact answer. `num_items` (default 1000) sets the pool. Or `dataset=`: a JSONL
path, a `datasets.Dataset` or a list of dicts with a question and an answer (fields `question_field`,
`answer_field`; the answer a number or a string holding one). `split="train"|"eval"|"all"` keeps
items k with k % 5 != 4 | k % 5 == 4 | all (`textzoo.envs._sources`).

Presets (`PRESETS`, `textzoo.envs.presets`; docs/results/presets.md has the zero-shot probe of each):

- `sums-30`: the 1,365 questions "What is a + b?" (0 <= a, b < 30) and "What is a - b?" (0 <= b <= a < 30)
  (`sums_and_differences`; 273 held out), 2 debaters, 2 turns, 48 tokens each, sampled at temperature 0.5.
- `one-digit-sums`: the 100 questions "What is a + b?" for
one-digit a, b (`one_digit_sums`; 20 held out), 2 debaters, 2 turns, 48 tokens each. Measured zero-shot
(`benchmarks/preset_probe.py`, SmolLM2-135M-Instruct, chat format, 12 held-out items, G = 4 at
temperature 1): greedy solved 0.667, sampled 0.073, pass@4 0.583; valid 0.88; 53% / 68% of the two
debaters' sampled completions hit the 48-token budget (the last number of a cut reply is its answer).

Version history:
- v0: first version.
"""

from __future__ import annotations

import functools
import math
import random
import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from textzoo.envs._sources import load_records, split_indices
from textzoo.envs.base import StepResult, TextParallelEnv
from textzoo.envs.declare import SPLIT, Arg, anything, entry_points, integer, task, text_args
from textzoo.envs.presets import TaskPreset
from textzoo.errors import EnvError

WEIGHTS: dict[str, float] = {"solved": 0.7, "agreement": 0.2, "valid": 0.1}
TERMS = tuple(WEIGHTS)
ITEM_SEED = 53
ANSWER_MARK = "####"


def one_digit_sums() -> list[dict[str, Any]]:
    """The 100 questions "What is a + b?" for one-digit a, b (in a fixed shuffled order), with their sums."""
    pairs = [(a, b) for a in range(10) for b in range(10)]
    random.Random(ITEM_SEED).shuffle(pairs)
    return [{"question": f"What is {a} + {b}?", "answer": a + b} for a, b in pairs]


def sums_and_differences(limit: int = 30) -> list[dict[str, Any]]:
    """The questions "What is a + b?" for 0 <= a, b < `limit` and "What is a - b?" for 0 <= b <= a < `limit`
    (in a fixed shuffled order), with their answers: 1,365 questions for `limit` 30 (273 held out)."""
    rows = [(f"{a} + {b}", a + b) for a in range(limit) for b in range(limit)]
    rows += [(f"{a} - {b}", a - b) for a in range(limit) for b in range(a + 1)]
    random.Random(ITEM_SEED).shuffle(rows)
    return [{"question": f"What is {q}?", "answer": answer} for q, answer in rows]


PRESETS: dict[str, TaskPreset] = {
    "one-digit-sums": TaskPreset(
        {"dataset": one_digit_sums(), "num_agents": 2, "turns": 2, "response_chars": 200},
        {"debater_0": 48, "debater_1": 48},
    ),
    "sums-30": TaskPreset(
        {"dataset": sums_and_differences(30), "num_agents": 2, "turns": 2, "response_chars": 200},
        {"debater_0": 48, "debater_1": 48},
        temperature=0.5,
    ),
}
"""Settings a small model can start from (module docstring, Presets)."""

FIRST_PROMPT = (
    "Solve the problem.\n{question}\n"
    "Reason briefly, then end your reply with '####' followed by the final answer as a number.\n"
)
REVISE_PROMPT = (
    "Solve the problem together with {others_count}.\n{question}\n\n"
    "Your previous reply (answer read: {own_answer}):\n{own}\n\n"
    "The other agents' previous replies:\n{others}\n\n"
    "Round {turn} of {turns}. Check the replies, then give your own final answer: reason briefly and "
    "end your reply with '####' followed by the final answer as a number.\n"
)
OTHER = "{agent} (answer read: {answer}):\n{text}\n"

_NUMBER = re.compile(r"(-?)(\d+(?:,\d{3})*)(?:\.(\d+)|\s*/\s*(\d+))?")
_ANSWER_WORD = re.compile(r"answer", re.IGNORECASE)


def _to_fraction(match: re.Match) -> Fraction | None:
    sign, whole, decimals, denominator = match.groups()
    whole = whole.replace(",", "")
    if decimals is not None:
        value = Fraction(f"{whole}.{decimals}")
    elif denominator is not None:
        if int(denominator) == 0:
            return None
        value = Fraction(int(whole), int(denominator))
    else:
        value = Fraction(int(whole))
    return -value if sign else value


def _numbers(text: str) -> list[Fraction]:
    return [v for v in (_to_fraction(m) for m in _NUMBER.finditer(text)) if v is not None]


def parse_answer(text: str) -> Fraction | None:
    """The answer a reply gives (see the module docstring), or None when it holds no number."""
    if ANSWER_MARK in text:
        found = _numbers(text.rsplit(ANSWER_MARK, 1)[1])
        return found[0] if found else None
    words = list(_ANSWER_WORD.finditer(text))
    if words:
        found = _numbers(text[words[-1].end() :])
        if found:
            return found[0]
    found = _numbers(text)
    return found[-1] if found else None


def format_number(value: Fraction | None) -> str:
    """An answer as text: "42", "-3/4"; "none" for None."""
    if value is None:
        return "none"
    return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"


# ---- procedural word problems ------------------------------------------------------------------
_NAMES = ("Mia", "Leo", "Ava", "Noah", "Zoe", "Omar", "Ines", "Ravi", "Lena", "Tom", "Sara", "Ken")
_FRIENDS = ("a friend", "a neighbour", "a cousin", "the teacher", "a classmate", "the library")
_ITEMS = ("stickers", "marbles", "apples", "stamps", "pencils", "coins", "cookies", "cards", "shells", "beads")
_CONTAINERS = ("boxes", "bags", "jars", "packs", "crates")


@dataclass(frozen=True)
class Problem:
    """A question with its exact answer; `work` lists the arithmetic of a generated one."""

    question: str
    answer: Fraction
    work: tuple[str, ...] = ()


@functools.lru_cache(maxsize=8192)
def make_problem(k: int, steps: int = 3) -> Problem:
    """Word problem `k`: a start quantity and `steps` operations (see the module docstring)."""
    rng = random.Random(ITEM_SEED * 1_000_003 + k)
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    if rng.random() < 0.5:
        boxes, each = rng.randint(2, 9), rng.randint(2, 12)
        value = boxes * each
        container = rng.choice(_CONTAINERS)
        sentences = [f"{name} has {boxes} {container} of {item} with {each} {item} in each."]
        work = [f"{boxes} * {each} = {value}"]
    else:
        value = rng.randint(5, 60)
        sentences = [f"{name} has {value} {item}."]
        work = []
    for _ in range(steps):
        options = ["buy", "packs"]
        if value > 1:
            options.append("give")
        if value <= 500:
            options.append("times")
        divisors = [d for d in range(2, 7) if value % d == 0 and value // d > 0]
        if divisors:
            options.append("share")
        op = rng.choice(options)
        if op == "buy":
            x = rng.randint(2, 30)
            sentences.append(f"{name} buys {x} more {item}.")
            work.append(f"{value} + {x} = {value + x}")
            value += x
        elif op == "packs":
            packs, per = rng.randint(2, 6), rng.randint(2, 10)
            sentences.append(f"{name} gets {packs} packs with {per} {item} in each pack.")
            work.append(f"{value} + {packs} * {per} = {value + packs * per}")
            value += packs * per
        elif op == "give":
            x = rng.randint(1, min(value - 1, 40))
            sentences.append(f"{name} gives {x} {item} to {rng.choice(_FRIENDS)}.")
            work.append(f"{value} - {x} = {value - x}")
            value -= x
        elif op == "times":
            factor, word = rng.choice(((2, "doubles"), (3, "triples")))
            sentences.append(f"Then the number of {item} {name} has {word}.")
            work.append(f"{value} * {factor} = {value * factor}")
            value *= factor
        else:
            d = rng.choice(divisors)
            sentences.append(
                f"{name} shares the {item} equally among {d} people, {name} included, and keeps one share."
            )
            work.append(f"{value} / {d} = {value // d}")
            value //= d
    question = " ".join(sentences) + f" How many {item} does {name} have now?"
    return Problem(question, Fraction(value), tuple(work))


def load_problems(data: Any, question_field: str = "question", answer_field: str = "answer") -> list[Problem]:
    """Problems from user data (a JSONL path, a `datasets.Dataset` or a list of dicts)."""
    rows = load_records(data, question_field, "dataset")
    problems = []
    for i, row in enumerate(rows):
        question, answer = row[question_field], row.get(answer_field)
        if not isinstance(question, str) or not question.strip():
            raise EnvError(f"dataset row {i}: {question_field!r} must be a non-empty string, got {question!r}")
        if isinstance(answer, bool) or not isinstance(answer, (int, float, str)):
            raise EnvError(
                f"dataset row {i}: {answer_field!r} must be a number or a string holding one, got {answer!r}; "
                "name the answer column with answer_field"
            )
        if isinstance(answer, float) and not math.isfinite(answer):
            raise EnvError(f"dataset row {i}: answer {answer!r} is not a finite number")
        found = [Fraction(str(answer))] if isinstance(answer, (int, float)) else _numbers(answer)
        if not found:
            raise EnvError(f"dataset row {i}: answer {answer!r} holds no number; Debate-v0 needs exact numeric answers")
        problems.append(Problem(question.strip(), found[0]))
    return problems


def agent_names(n: int) -> list[str]:
    return [f"debater_{i}" for i in range(n)]


@task(
    "debate_v0",
    num_agents=integer(2, low=2, doc="debaters (a debate needs others to read)"),
    turns=integer(3, low=1),
    steps=integer(3, low=1, high=8, doc="additions in a procedural problem"),
    num_items=integer(1000, low=1, doc="procedural problems (without dataset)"),
    dataset=anything(None, doc="a JSONL path or a list of rows with a question and a numeric answer"),
    question_field=Arg("question", str),
    answer_field=Arg("answer", str),
    split=SPLIT,
    response_chars=integer(400, low=1, doc="the longest reply the others are shown"),
    **text_args(),
)
class DebateEnv(TextParallelEnv):
    """Debate-v0: N agents answer, read each other's answers and revise; see the module docstring."""

    def __init__(
        self,
        num_agents,
        turns,
        steps,
        num_items,
        dataset,
        question_field,
        answer_field,
        split,
        response_chars,
        **text: Any,
    ):
        super().__init__(agent_names(num_agents), num_turns=turns, **text)
        max_prompt_chars = text["max_prompt_chars"]
        self.split = split
        self.steps = steps
        self.response_chars = response_chars
        if dataset is None:
            self._problems: list[Problem] | None = None
            self._items = split_indices(num_items, self.split)
        else:
            self._problems = load_problems(dataset, question_field, answer_field)
            self._items = split_indices(len(self._problems), self.split)
        if not self._items:
            raise EnvError(f"split={split!r} keeps no items; give at least 5 items (or split='all')")
        self.problem = self._problem(self._items[0])
        self._last_scores: dict[str, float] = {}
        self._last_terms: dict[str, dict[str, float]] = {}
        self._replies: dict[str, str] = {}
        self._answers: dict[str, Fraction | None] = {}
        longest = self._longest_prompt()
        if longest > max_prompt_chars:
            raise EnvError(
                f"max_prompt_chars={max_prompt_chars} cannot hold {num_agents} replies of {response_chars} "
                f"characters; use max_prompt_chars >= {longest} or a smaller response_chars"
            )

    def _problem(self, k: int) -> Problem:
        return make_problem(k, self.steps) if self._problems is None else self._problems[k]

    def _longest_prompt(self) -> int:
        question = max((self._problem(k).question for k in self._items[:50]), key=len)
        reply, answer = "x" * (self.response_chars + 6), "-" + "9" * 20
        return len(
            self._revise_prompt(
                self.possible_agents[0],
                question,
                dict.fromkeys(self.possible_agents, reply),
                dict.fromkeys(self.possible_agents, answer),
                self.num_turns,
            )
        )

    def num_items(self) -> int:
        return len(self._items)

    def _revise_prompt(
        self, agent: str, question: str, replies: dict[str, str], answers: dict[str, str], turn: int
    ) -> str:
        others = [a for a in self.possible_agents if a != agent]
        return REVISE_PROMPT.format(
            others_count="1 other agent" if len(others) == 1 else f"{len(others)} other agents",
            question=question,
            own_answer=answers[agent],
            own=replies[agent],
            others="\n".join(OTHER.format(agent=a, answer=answers[a], text=replies[a]) for a in others).rstrip("\n"),
            turn=turn,
            turns=self.num_turns,
        )

    def _reset_task(self, index: int) -> dict[str, str]:
        self.problem = self._problem(self._items[index])
        self._last_scores = dict.fromkeys(self.possible_agents, 0.0)
        self._last_terms = {a: dict.fromkeys(TERMS, 0.0) for a in self.possible_agents}
        self._replies, self._answers = {}, {}
        return dict.fromkeys(self.possible_agents, FIRST_PROMPT.format(question=self.problem.question))

    def _step_task(self, actions: dict[str, str], notes: dict[str, list[str]]) -> StepResult:
        agents = self.possible_agents
        answers = {a: parse_answer(actions[a]) for a in agents}
        rewards, terms_out, info, extra = {}, {}, {}, {}
        for a in agents:
            mine = answers[a]
            same = sum(mine is not None and answers[b] == mine for b in agents if b != a)
            terms = {
                "solved": float(mine == self.problem.answer),
                "agreement": same / (len(agents) - 1),
                "valid": float(mine is not None),
            }
            score = round(sum(WEIGHTS[k] * terms[k] for k in TERMS), 12)
            rewards[a] = round(score - self._last_scores[a], 12)
            terms_out[a] = {k: round(terms[k] - self._last_terms[a][k], 12) for k in TERMS}
            info[a] = {
                "score_terms": terms,
                "score": score,
                "answer": format_number(mine) if mine is not None else None,
            }
            self._last_scores[a], self._last_terms[a] = score, terms
            if mine is None:
                extra[a] = ["no answer read: end the reply with '####' and a number"]
        self._replies = {a: actions[a][: self.response_chars] for a in agents}
        self._answers = answers
        observations = {}
        if self.turn + 1 < self.num_turns:
            shown = {a: format_number(answers[a]) for a in agents}
            replies = {a: self._replies[a].strip() or "(empty)" for a in agents}
            observations = {
                a: self._revise_prompt(a, self.problem.question, replies, shown, self.turn + 2) for a in agents
            }
        return StepResult(rewards=rewards, observations=observations, reward_terms=terms_out, notes=extra, info=info)


parallel_env, env, raw_env = entry_points(DebateEnv)
