"""textzoo/Sudoku-v0: a tool agent and a plan agent solve 4x4 Sudoku puzzles with a unique solution.

Roles and turns (the PettingLLMs arrangement of `textzoo.envs._toolplan`): every turn `tool` writes
a Python program (run in the sandbox after `puzzle = [[...], ...]` is bound, 0 = empty cell) whose
printed output is its answer, and `plan` answers in text; from turn 1 on both see the tool's last
program and output, the plan's last answer and the feedback on both. The episode ends when either
answer solves the puzzle, else after `turns` turns (default 3).

Observations: the rules, the board (`.` = empty cell, rows top to bottom)::

    1 . . 4
    . . 1 .
    . 1 . .
    4 . . 1

the answer format and, from turn 1 on, the last turn.

Actions: any string. The answer is the text after the last `####` (all of it without one). It is
read as its **last 16 digits**, row by row (any separators: "1234 3412 ...", "[[1,2,3,4],...]");
it is valid when it holds at least 16 digits and those 16 are each 1-4.

Scores of an answer: `valid` (above); `progress` = the share of the puzzle's empty cells the
answer fills with the solution's digit (0 when not valid); `solved` = the answer is the solution
(the given cells unchanged). The terms, the per-agent scores (`WEIGHTS` of `_toolplan`) and the
rewards (score differences between turns, so an episode's return is its last turn's score) are
those of `textzoo.envs._toolplan`: plan = 0.6 solved + 0.3 plan_progress + 0.1 plan_valid;
tool = 0.6 solved + 0.2 tool_progress + 0.1 tool_valid + 0.1 tool_ran; team = their mean.

Items: puzzle k is generated from k alone: a random complete grid, then cells emptied in a random
order while the puzzle keeps exactly one solution (checked by an exhaustive solver), until
`blanks` cells are empty (retrying with a fresh grid when a minimal puzzle is reached first).
`num_items` (default 1000) sets the pool; `split="train"|"eval"|"all"` keeps puzzles k with
k % 5 != 4 | k % 5 == 4 | all (`textzoo.envs._sources`).

Presets (`PRESETS`, `textzoo.envs.presets`): `4x4-2-blanks`, two empty cells, 2 turns; budgets tool
256, plan 64 tokens (16 digits and a few words). Not measured: the probe of PlanPath's preset took 17
minutes on the loaded 2-core machine and this one did not fit the session.

Version history:
- v0: first version.
"""

from __future__ import annotations

import functools
import random
import re
from dataclasses import dataclass
from typing import Any

from textzoo.envs._toolplan import TOOLPLAN_ARGS, Outcome, ToolPlanEnv
from textzoo.envs.declare import entry_points, integer, task
from textzoo.envs.presets import TaskPreset
from textzoo.errors import EnvError

SIZE = 4
BOX = 2
CELLS = SIZE * SIZE
MAX_BLANKS = 12  # a 4x4 Sudoku needs at least 4 givens for a unique solution
ITEM_SEED = 17
PRESETS: dict[str, TaskPreset] = {
    "4x4-2-blanks": TaskPreset({"blanks": 2, "turns": 2}, {"tool": 256, "plan": 64}),
}
"""Settings a small model can start from (module docstring, Presets)."""
_ATTEMPTS = 500
Grid = tuple[tuple[int, ...], ...]


def _units() -> list[list[tuple[int, int]]]:
    rows = [[(r, c) for c in range(SIZE)] for r in range(SIZE)]
    cols = [[(r, c) for r in range(SIZE)] for c in range(SIZE)]
    boxes = [
        [(br + r, bc + c) for r in range(BOX) for c in range(BOX)]
        for br in range(0, SIZE, BOX)
        for bc in range(0, SIZE, BOX)
    ]
    return rows + cols + boxes


UNITS = _units()
"""The 12 units (4 rows, 4 columns, 4 boxes) as lists of (row, column) cells."""


def candidates(grid: list[list[int]], r: int, c: int) -> list[int]:
    """Digits that cell (r, c) of `grid` (0 = empty) can take without repeating one in its units."""
    used = set(grid[r]) | {grid[i][c] for i in range(SIZE)}
    br, bc = r - r % BOX, c - c % BOX
    used |= {grid[br + i][bc + j] for i in range(BOX) for j in range(BOX)}
    return [d for d in range(1, SIZE + 1) if d not in used]


def solutions(puzzle: Grid | list[list[int]], limit: int = 2) -> list[Grid]:
    """Up to `limit` solutions of `puzzle` (0 = empty), by exhaustive backtracking."""
    grid = [list(row) for row in puzzle]
    found: list[Grid] = []

    def fill() -> None:
        empty = [(r, c) for r in range(SIZE) for c in range(SIZE) if grid[r][c] == 0]
        if not empty:
            found.append(tuple(tuple(row) for row in grid))
            return
        r, c = min(empty, key=lambda rc: len(candidates(grid, *rc)))
        for d in candidates(grid, r, c):
            grid[r][c] = d
            fill()
            grid[r][c] = 0
            if len(found) >= limit:
                return

    fill()
    return found


def _random_solution(rng: random.Random) -> Grid:
    grid = [[0] * SIZE for _ in range(SIZE)]

    def fill(i: int) -> bool:
        if i == CELLS:
            return True
        r, c = divmod(i, SIZE)
        options = candidates(grid, r, c)
        rng.shuffle(options)
        for d in options:
            grid[r][c] = d
            if fill(i + 1):
                return True
        grid[r][c] = 0
        return False

    fill(0)
    return tuple(tuple(row) for row in grid)


@dataclass(frozen=True)
class SudokuPuzzle:
    """A puzzle (0 = empty cell) and its unique solution."""

    givens: Grid
    solution: Grid

    @property
    def blanks(self) -> list[tuple[int, int]]:
        return [(r, c) for r in range(SIZE) for c in range(SIZE) if self.givens[r][c] == 0]


@functools.lru_cache(maxsize=4096)
def make_puzzle(k: int, blanks: int) -> SudokuPuzzle:
    """Puzzle `k`: exactly `blanks` empty cells and a unique solution (see the module docstring)."""
    rng = random.Random(ITEM_SEED * 1_000_003 + k)
    for _ in range(_ATTEMPTS):
        solution = _random_solution(rng)
        grid = [list(row) for row in solution]
        order = [(r, c) for r in range(SIZE) for c in range(SIZE)]
        rng.shuffle(order)
        emptied = 0
        for r, c in order:
            if emptied == blanks:
                break
            grid[r][c] = 0
            if len(solutions(grid)) == 1:
                emptied += 1
            else:
                grid[r][c] = solution[r][c]
        if emptied == blanks:
            return SudokuPuzzle(tuple(tuple(row) for row in grid), solution)
    raise EnvError(f"no 4x4 Sudoku with {blanks} empty cells found for item {k}; use fewer blanks")


_DIGIT = re.compile(r"\d")


def parse_grid(answer: str) -> tuple[Grid | None, str]:
    """The grid an answer gives (its last 16 digits, row by row), or None and why it is not valid."""
    digits = [int(d) for d in _DIGIT.findall(answer)]
    if len(digits) < CELLS:
        return None, f"no valid answer: {len(digits)} digits found, need {CELLS} (digits 1-4, row by row)"
    digits = digits[-CELLS:]
    if not all(1 <= d <= SIZE for d in digits):
        return None, f"no valid answer: the last {CELLS} digits must each be 1-4"
    return tuple(tuple(digits[r * SIZE : (r + 1) * SIZE]) for r in range(SIZE)), ""


def score_grid(puzzle: SudokuPuzzle, answer: str) -> Outcome:
    """Score one answer (see the module docstring)."""
    grid, why = parse_grid(answer)
    if grid is None:
        return Outcome(False, False, 0.0, why)
    blanks = puzzle.blanks
    right = sum(grid[r][c] == puzzle.solution[r][c] for r, c in blanks)
    if grid == puzzle.solution:
        return Outcome(True, True, 1.0, "solved")
    changed = sum(puzzle.givens[r][c] not in (0, grid[r][c]) for r in range(SIZE) for c in range(SIZE))
    broken = sum(len({grid[r][c] for r, c in unit}) < SIZE for unit in UNITS)
    feedback = (
        f"{right} of the {len(blanks)} empty cells are right; {broken} of the 12 rows, columns and boxes repeat a digit"
    )
    if changed:
        feedback += f"; {changed} given cells were changed"
    return Outcome(True, False, right / len(blanks), feedback)


class SudokuGame:
    """4x4 Sudoku for `ToolPlanEnv`."""

    title = "a 4x4 Sudoku"
    answer_format = "the full grid as 16 digits 1-4, row by row, e.g. #### 1234 3412 2143 4321"

    def __init__(self, blanks: int = 8):
        self.blanks = blanks

    def puzzle(self, k: int) -> SudokuPuzzle:
        return make_puzzle(k, self.blanks)

    def task(self, puzzle: SudokuPuzzle) -> str:
        board = "\n".join(" ".join(str(d) if d else "." for d in row) for row in puzzle.givens)
        return (
            "Fill the empty cells (.) so that every row, every column and every 2x2 box holds each of "
            f"the digits 1-4 exactly once.\n{board}"
        )

    def variables(self, puzzle: SudokuPuzzle) -> str:
        rows = ", ".join(str(list(row)) for row in puzzle.givens)
        return f"puzzle = [{rows}]  # rows top to bottom, 0 = empty cell"

    def score(self, puzzle: SudokuPuzzle, answer: str) -> Outcome:
        return score_grid(puzzle, answer)


@task("sudoku_v0", blanks=integer(8, low=1, high=MAX_BLANKS, doc="empty cells"), **TOOLPLAN_ARGS)
def _build(blanks, **common: Any) -> ToolPlanEnv:
    """Sudoku-v0 (see the module docstring)."""
    return ToolPlanEnv(SudokuGame(blanks), "sudoku_v0", **common)


parallel_env, env, raw_env = entry_points(_build)
