"""The tool/plan arrangement of PettingLLMs (arXiv 2510.11062) shared by the puzzle tasks.

`ToolPlanEnv` plays one `Game` (Sudoku-v0, PlanPath-v0, Sokoban-v0) with two roles that act at
the same time in every turn:

- `tool` writes a Python program. The program runs in `textzoo.sandbox` after a preamble
  that binds the puzzle's data to variables (`Game.variables`); what it prints is read as the
  tool's answer, with the same parser as the plan agent's text.
- `plan` answers in text: the team's answer.

On the next turn both see the puzzle again plus the last turn: the tool's program, its output, the
plan's answer and the environment's feedback on both answers (what each one got right).

Answers: the answer is the text after the last `####` (the whole text when there is none); each
game parses it leniently but deterministically (its module docstring gives the rules).

Scores: each answer gets `valid` (it has the game's format), `progress` in [0, 1] (the game's
partial credit) and `solved`. The team solves the puzzle when either answer solves it, and the
episode then ends; otherwise it ends after `turns` turns. Terms of a turn (the same dict for both
agents): `solved`, `plan_valid`, `plan_progress`, `tool_ran` (the program ran to its end without
an exception or a time-out), `tool_valid`, `tool_progress`. Each agent's score of a turn is a
weighted sum of the terms (`WEIGHTS`)::

    plan = 0.6 solved + 0.3 plan_progress + 0.1 plan_valid
    tool = 0.6 solved + 0.2 tool_progress + 0.1 tool_valid + 0.1 tool_ran

and the team score (their mean, what `credit="shared"` trains on) is
0.6 solved + 0.15 plan_progress + 0.05 plan_valid + 0.1 tool_progress + 0.05 tool_valid + 0.05 tool_ran.

Rewards are score differences: the reward of turn t is score_t - score_{t-1} (score_{-1} = 0), so
an episode's return is the score of its last turn (a team that solves in turn 0 gets as much as
one that solves later, and a turn is credited with what it improved). `reward_terms` are the
differences of the terms in the same way, so summed over an episode (what the `reward/<term>`
metrics show) they are the last turn's terms: `reward/solved` is the success rate.
`infos[agent]["score_terms"]` holds the terms of the turn itself.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Protocol

from textzoo.envs._sources import split_indices
from textzoo.envs.base import StepResult, TextParallelEnv
from textzoo.envs.code_v0 import extract_code
from textzoo.envs.declare import SPLIT, Declaration, instance_of, integer, text_args
from textzoo.errors import EnvError
from textzoo.sandbox import Program, SandboxLimits, SandboxResult, run

AGENTS = ("tool", "plan")
TERMS = ("solved", "plan_valid", "plan_progress", "tool_ran", "tool_valid", "tool_progress")
WEIGHTS: dict[str, dict[str, float]] = {
    "plan": {"solved": 0.6, "plan_progress": 0.3, "plan_valid": 0.1},
    "tool": {"solved": 0.6, "tool_progress": 0.2, "tool_valid": 0.1, "tool_ran": 0.1},
}
"""Per agent: term -> weight of its score (each sums to 1)."""
ANSWER_MARK = "####"
CODE_SHOWN = 1200  # characters of the last program shown again
OUTPUT_SHOWN = 400  # characters of its output
ANSWER_SHOWN = 300  # characters of the plan agent's last answer
FEEDBACK_SHOWN = 240  # characters of each feedback sentence

TOOL_PROMPT = (
    "You are the tool agent of a two-agent team solving {title}. You write a Python program; the plan "
    "agent gives the team's answer and sees your program and what it prints.\n\n"
    "{task}\n\n"
    "Your program starts with these variables already defined:\n{variables}\n"
    "Answer format: {answer_format}\n"
    "Make the program print '{mark}' and then the answer in that format (compute it, e.g. by search). "
    "Reply with one ```python code block.\n"
)
PLAN_PROMPT = (
    "You are the plan agent of a two-agent team solving {title}. The tool agent writes Python programs; "
    "you give the team's answer.\n\n"
    "{task}\n\n"
    "Answer format: {answer_format}\n"
    "Think briefly, then end your reply with '{mark}' followed by the answer.\n"
)
HISTORY = (
    "\nTurn {turn} of {turns}. Last turn the puzzle was not solved.\n"
    "The tool agent's program:\n```python\n{code}\n```\n"
    "Its output:\n{output}\n"
    "Feedback on the program's answer: {tool_feedback}\n"
    "The plan agent's answer: {plan_answer}\n"
    "Feedback on the plan agent's answer: {plan_feedback}\n"
)
TRY_AGAIN = {
    "tool": "Write an improved program. Reply with one ```python code block.\n",
    "plan": "Give an improved answer, ending with '{mark}' followed by the answer.\n",
}


@dataclass(frozen=True)
class Outcome:
    """The score of one answer."""

    valid: bool
    """The answer has the game's format."""
    solved: bool
    progress: float
    """Partial credit in [0, 1] (1 when solved)."""
    feedback: str
    """One sentence on what the answer got right, shown on the next turn."""


class Game(Protocol):
    """A family of procedurally generated puzzles: what `ToolPlanEnv` needs to pose and score one."""

    title: str
    """The puzzle's name in prompts, with an article ("a 4x4 Sudoku")."""
    answer_format: str
    """How to write an answer, with an example."""

    def puzzle(self, k: int) -> Any:
        """Puzzle `k` of the pool: a pure function of `k` and the game's arguments."""
        ...

    def task(self, puzzle: Any) -> str:
        """The rules and the board, as text."""
        ...

    def variables(self, puzzle: Any) -> str:
        """Python source that binds the puzzle's data (run before the tool's program)."""
        ...

    def score(self, puzzle: Any, answer: str) -> Outcome:
        """Score `answer` (the text after the last '####', see `answer_region`)."""
        ...


def answer_region(text: str) -> str:
    """The text after the last '####' (the whole text when there is none)."""
    return text.rsplit(ANSWER_MARK, 1)[-1]


_MOVE = re.compile(r"(?i:\b(up|down|left|right)\b)|\b([UDLR]+)\b")


def parse_moves(text: str) -> str:
    """Moves in `text` as a string over "UDLR": the words up/down/left/right (any case) and runs of
    the capital letters U, D, L, R that stand alone as words ("R R D", "RRD", "['R', 'D']"), in order."""
    return "".join(word[0].upper() if word else run for word, run in _MOVE.findall(text))


def _cut(text: str, n: int) -> str:
    return text if len(text) <= n else text[:n] + " [...]"


def _compile_error(source: str) -> str | None:
    """None when `source` compiles, else a short reason."""
    try:
        compile(source, "<program>", "exec", dont_inherit=True)
    except SyntaxError as e:
        return f"{type(e).__name__}: {e.msg}"
    except (ValueError, RecursionError, MemoryError, OverflowError) as e:
        return type(e).__name__
    return None


def _run_summary(result: SandboxResult) -> str:
    """Why a program that ran did not finish cleanly (empty when it did)."""
    if result.timed_out:
        return "the program ran out of time"
    if result.source_error and result.source_error != "missing":
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        last = lines[-1].strip() if lines else result.source_error
        return f"the program raised {_cut(last, 160)}"
    if not result.passed:
        return "the program stopped before its end (a CPU, memory or process limit, or an early exit)"
    return ""


TOOLPLAN_ARGS = {
    "num_items": integer(1000, low=1, doc="puzzles (the eval split keeps every 5th)"),
    "split": SPLIT,
    "turns": integer(3, low=1, doc="turns before the episode ends unsolved"),
    "sandbox_limits": instance_of(SandboxLimits, doc="time and memory limits of the tool's programs"),
    **text_args(),
}
"""The arguments every tool/plan task takes after its game's own: spread into its `@task(...)`."""


class ToolPlanEnv(TextParallelEnv):
    """A tool agent (Python programs) and a plan agent (answers) solve a `Game` over several turns;
    see the module docstring."""

    def __init__(self, game: Game, name: str, **args: Any):
        """`game` played under the metadata name `name`; `args` are `TOOLPLAN_ARGS` (checked here)."""
        values = Declaration(name, TOOLPLAN_ARGS).bind((), args)
        num_items, split, max_prompt_chars = values["num_items"], values["split"], values["max_prompt_chars"]
        super().__init__(list(AGENTS), num_turns=values["turns"], **{k: values[k] for k in text_args()})
        self.metadata = {"name": name, "render_modes": ["ansi"], "is_parallelizable": True}
        self.game = game
        self.split = split
        self._items = split_indices(num_items, self.split)
        if not self._items:
            raise EnvError(f"split={split!r} of {num_items} items is empty; give num_items >= 5 (or split='all')")
        self.sandbox_limits = values["sandbox_limits"] or SandboxLimits()
        self.puzzle: Any = None
        self._base: dict[str, str] = {}
        self._last_scores: dict[str, float] = dict.fromkeys(AGENTS, 0.0)
        self._last_terms: dict[str, float] = dict.fromkeys(TERMS, 0.0)
        longest = max(len(p) for p in self._prompts_for(game.puzzle(self._items[0]), worst_case=True).values())
        if longest > max_prompt_chars:
            raise EnvError(f"max_prompt_chars={max_prompt_chars} cannot hold this task's prompts; use >= {longest}")

    def num_items(self) -> int:
        return len(self._items)

    def _prompts_for(self, puzzle: Any, worst_case: bool = False) -> dict[str, str]:
        """Turn-0 prompts (with `worst_case`: the longest later-turn prompts, to check the limit)."""
        fields = {
            "title": self.game.title,
            "task": self.game.task(puzzle),
            "variables": self.game.variables(puzzle),
            "answer_format": self.game.answer_format,
            "mark": ANSWER_MARK,
        }
        prompts = {"tool": TOOL_PROMPT.format(**fields), "plan": PLAN_PROMPT.format(**fields)}
        if worst_case:
            long = {"code": CODE_SHOWN + 6, "output": OUTPUT_SHOWN + 6, "plan_answer": ANSWER_SHOWN + 6}
            long.update(tool_feedback=FEEDBACK_SHOWN + 6, plan_feedback=FEEDBACK_SHOWN + 6)
            history = HISTORY.format(turn=self.num_turns, turns=self.num_turns, **{k: "x" * n for k, n in long.items()})
            prompts = {a: p + history + TRY_AGAIN[a].format(mark=ANSWER_MARK) for a, p in prompts.items()}
        return prompts

    def _reset_task(self, index: int) -> dict[str, str]:
        self.puzzle = self.game.puzzle(self._items[index])
        self._last_scores = dict.fromkeys(AGENTS, 0.0)
        self._last_terms = dict.fromkeys(TERMS, 0.0)
        self._base = self._prompts_for(self.puzzle)
        return dict(self._base)

    def _run_tool(self, text: str) -> tuple[bool, str, str, list[str]]:
        """Run the tool's program: (ran, its output, the code shown again, notes)."""
        code = extract_code(text).strip("\n")
        if not code.strip():
            return False, "", code, ["no program: the reply holds no code"]
        source = f"{self.game.variables(self.puzzle)}\n{code}\n"
        error = _compile_error(source)
        if error is not None:
            return False, "", code, [f"not run: the program does not compile ({error})"]
        result = run(Program(source), self.sandbox_limits)
        why = _run_summary(result)
        return not why, result.stdout, code, [why] if why else []

    def _step_task(self, actions: dict[str, str], notes: dict[str, list[str]]) -> StepResult:
        ran, output, code, tool_notes = self._run_tool(actions["tool"])
        if output.strip():
            tool = self.game.score(self.puzzle, answer_region(output))
        else:
            tool = Outcome(False, False, 0.0, "no answer: the program printed nothing")
        plan = self.game.score(self.puzzle, answer_region(actions["plan"]))
        terms = {
            "solved": float(plan.solved or tool.solved),
            "plan_valid": float(plan.valid),
            "plan_progress": plan.progress,
            "tool_ran": float(ran),
            "tool_valid": float(tool.valid),
            "tool_progress": tool.progress,
        }
        # rounded to 12 places, so that 0.6 + 0.3 + 0.1 is 1.0 and a repeated score is a 0.0 reward
        scores = {a: round(sum(w * terms[k] for k, w in WEIGHTS[a].items()), 12) for a in AGENTS}
        rewards = {a: round(scores[a] - self._last_scores[a], 12) for a in AGENTS}
        deltas = {k: round(terms[k] - self._last_terms[k], 12) for k in TERMS}
        self._last_scores, self._last_terms = scores, terms
        extra = {"tool": tool_notes + ([] if tool.valid else [tool.feedback]), "plan": []}
        if not plan.valid:
            extra["plan"].append(plan.feedback)
        done = bool(terms["solved"])
        observations = {}
        if not done and self.turn + 1 < self.num_turns:
            shown_output = _cut(output.strip("\n"), OUTPUT_SHOWN) if output.strip() else "(nothing printed)"
            if tool_notes:
                shown_output += f"\n({tool_notes[0]})"
            history = HISTORY.format(
                turn=self.turn + 2,
                turns=self.num_turns,
                code=_cut(code, CODE_SHOWN),
                output=shown_output,
                tool_feedback=_cut(tool.feedback, FEEDBACK_SHOWN),
                plan_answer=_cut(answer_region(actions["plan"]).strip(), ANSWER_SHOWN) or "(empty)",
                plan_feedback=_cut(plan.feedback, FEEDBACK_SHOWN),
            )
            observations = {a: self._base[a] + history + TRY_AGAIN[a].format(mark=ANSWER_MARK) for a in AGENTS}
        return StepResult(
            rewards=rewards,
            observations=observations,
            reward_terms={a: dict(deltas) for a in AGENTS},
            notes=extra,
            done=done,
            info={a: {"score_terms": dict(terms), "score": scores[a]} for a in AGENTS},
        )
