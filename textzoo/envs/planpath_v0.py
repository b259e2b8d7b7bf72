"""textzoo/PlanPath-v0: a tool agent and a plan agent find a path from S to G on a grid with walls.

Roles and turns (the PettingLLMs arrangement of `textzoo.envs._toolplan`): every turn `tool` writes
a Python program (run in the sandbox after `grid`, `start` and `goal` are bound) whose printed
output is its answer, and `plan` answers in text; from turn 1 on both see the tool's last program
and output, the plan's last answer and the feedback on both. The episode ends when either answer
reaches the goal, else after `turns` turns (default 3).

Observations: the rules and the grid (`size` x `size`, default 10x10; `#` wall, `.` free, `S`
start, `G` goal; row 0 at the top, column 0 at the left), the answer format and, from turn 1 on,
the last turn.

Actions: any string. The answer is the text after the last `####` (all of it without one); its
moves are the words up/down/left/right (any case) and standalone runs of the capital letters
U, D, L, R, in order ("R R D", "RRD", "['R', 'D']" and "right, right, down" all read RRD; see
`textzoo.envs._toolplan.parse_moves`). It is valid when it holds at least one move.

Walk: from S, each move goes one cell (U: row - 1, D: row + 1, L: column - 1, R: column + 1); a
move into a wall or off the grid leaves the walker where it is; the walk stops at G. Only the
first size*size moves count.

Scores of an answer: `valid` (above); `solved` = the walk reaches G; `progress` = the distance
closed, max(0, (d(S) - d(end)) / d(S)) with d the shortest-path distance to G (BFS) and `end` where
the walk stops (0 when not valid). Terms, per-agent scores (`WEIGHTS` of `_toolplan`) and rewards
(score differences between turns: an episode's return is its last turn's score) are those of
`textzoo.envs._toolplan`: plan = 0.6 solved + 0.3 plan_progress + 0.1 plan_valid; tool = 0.6 solved
+ 0.2 tool_progress + 0.1 tool_valid + 0.1 tool_ran; team = their mean.

Items: grid k is generated from k alone: each cell is a wall with probability `wall_prob`
(default 0.25), then S and G are two random free cells; the grid is kept when G is reachable from
S and the shortest path has at least `min_distance` moves (default `size`), else drawn again.
`num_items` (default 1000) sets the pool; `split="train"|"eval"|"all"` keeps grids k with
k % 5 != 4 | k % 5 == 4 | all (`textzoo.envs._sources`).

Presets (`PRESETS`, `textzoo.envs.presets`): `open-4x4`, a 4x4 grid without walls, S and G at least 2
moves apart, 2 turns; budgets tool 256, plan 64 tokens. Measured zero-shot (`benchmarks/preset_probe.py`,
SmolLM2-135M-Instruct, chat format, 12 held-out items, G = 4 at temperature 1, budgets then tool 160 and
plan 32): greedy solved 0.000, sampled 0.021, pass@4 0.083; plan_valid 0.17, tool_ran 0.00; 91% of
the tool's and 88% of the plan's completions hit the budget, hence the larger budgets (not re-measured).

Version history:
- v0: first version.
"""

from __future__ import annotations

import functools
import random
from collections import deque
from dataclasses import dataclass
from typing import Any

from textzoo.envs._toolplan import TOOLPLAN_ARGS, Outcome, ToolPlanEnv, parse_moves
from textzoo.envs.declare import entry_points, integer, number, task
from textzoo.envs.presets import TaskPreset
from textzoo.errors import EnvError

MOVES: dict[str, tuple[int, int]] = {"U": (-1, 0), "D": (1, 0), "L": (0, -1), "R": (0, 1)}
ITEM_SEED = 29
PRESETS: dict[str, TaskPreset] = {
    "open-4x4": TaskPreset({"size": 4, "wall_prob": 0.0, "min_distance": 2, "turns": 2}, {"tool": 160, "plan": 32}),
}
"""Settings a small model can start from (module docstring, Presets)."""
_ATTEMPTS = 1000
Cell = tuple[int, int]


@dataclass(frozen=True)
class PathPuzzle:
    """A grid (`#` wall, `.` free, `S`, `G`), its start and goal, and one shortest path."""

    rows: tuple[str, ...]
    start: Cell
    goal: Cell
    shortest: str
    """A shortest path from start to goal as moves ("UDLR")."""

    @property
    def size(self) -> int:
        return len(self.rows)

    def free(self, cell: Cell) -> bool:
        r, c = cell
        return 0 <= r < self.size and 0 <= c < self.size and self.rows[r][c] != "#"

    @functools.cached_property
    def distance(self) -> dict[Cell, int]:
        """Shortest-path distance to the goal of every cell that can reach it."""
        return bfs(self.rows, self.goal)[0]


def bfs(rows: tuple[str, ...], source: Cell) -> tuple[dict[Cell, int], dict[Cell, tuple[Cell, str]]]:
    """Distances from `source` over free cells, and each reached cell's (parent, move from it)."""
    n = len(rows)
    dist, parent = {source: 0}, {}
    queue = deque([source])
    while queue:
        cell = queue.popleft()
        for move, (dr, dc) in MOVES.items():
            nxt = (cell[0] + dr, cell[1] + dc)
            if 0 <= nxt[0] < n and 0 <= nxt[1] < n and rows[nxt[0]][nxt[1]] != "#" and nxt not in dist:
                dist[nxt] = dist[cell] + 1
                parent[nxt] = (cell, move)
                queue.append(nxt)
    return dist, parent


@functools.lru_cache(maxsize=4096)
def make_puzzle(k: int, size: int, wall_prob: float, min_distance: int) -> PathPuzzle:
    """Grid `k`: G reachable from S by a shortest path of at least `min_distance` moves."""
    rng = random.Random(ITEM_SEED * 1_000_003 + k)
    for _ in range(_ATTEMPTS):
        cells = [["#" if rng.random() < wall_prob else "." for _ in range(size)] for _ in range(size)]
        free = [(r, c) for r in range(size) for c in range(size) if cells[r][c] == "."]
        if len(free) < 2:
            continue
        start, goal = rng.sample(free, 2)
        rows = tuple("".join(row) for row in cells)
        dist, parent = bfs(rows, start)
        if dist.get(goal, -1) < min_distance:
            continue
        path, cell = [], goal
        while cell != start:
            cell, move = parent[cell]
            path.append(move)
        cells[start[0]][start[1]], cells[goal[0]][goal[1]] = "S", "G"
        return PathPuzzle(tuple("".join(row) for row in cells), start, goal, "".join(reversed(path)))
    raise EnvError(
        f"no {size}x{size} grid with a path of >= {min_distance} moves found for item {k}; "
        "lower min_distance or wall_prob"
    )


def walk(puzzle: PathPuzzle, moves: str) -> tuple[Cell, int, bool]:
    """Play `moves` from the start: (where the walk stops, moves that hit a wall or the edge, reached G)."""
    cell, bumps = puzzle.start, 0
    for move in moves[: puzzle.size**2]:
        dr, dc = MOVES[move]
        nxt = (cell[0] + dr, cell[1] + dc)
        if puzzle.free(nxt):
            cell = nxt
        else:
            bumps += 1
        if cell == puzzle.goal:
            return cell, bumps, True
    return cell, bumps, False


def score_path(puzzle: PathPuzzle, answer: str) -> Outcome:
    """Score one answer (see the module docstring)."""
    moves = parse_moves(answer)
    if not moves:
        return Outcome(False, False, 0.0, "no valid answer: no moves found (write U, D, L, R)")
    end, bumps, reached = walk(puzzle, moves)
    cut = f"; only the first {puzzle.size**2} moves count" if len(moves) > puzzle.size**2 else ""
    hits = f"; {bumps} moves hit a wall or the edge" if bumps else ""
    if reached:
        return Outcome(True, True, 1.0, f"solved: the path reaches G{hits}")
    d0, d = puzzle.distance[puzzle.start], puzzle.distance[end]
    return Outcome(
        True,
        False,
        max(0.0, (d0 - d) / d0),
        f"the path stops at row {end[0]}, column {end[1]}, {d} moves from G (S is {d0} moves from G){hits}{cut}",
    )


class PlanPathGame:
    """Grid path finding for `ToolPlanEnv`."""

    title = "a grid path-finding puzzle"
    answer_format = "the moves from S to G, each U (up), D (down), L (left) or R (right), e.g. #### R R D L"

    def __init__(self, size: int = 10, wall_prob: float = 0.25, min_distance: int | None = None):
        min_distance = size if min_distance is None else min_distance
        if not 1 <= min_distance <= 2 * size - 2:
            raise EnvError(f"min_distance must be an int in [1, 2*size - 2 = {2 * size - 2}], got {min_distance!r}")
        self.size, self.wall_prob, self.min_distance = size, float(wall_prob), min_distance

    def puzzle(self, k: int) -> PathPuzzle:
        return make_puzzle(k, self.size, self.wall_prob, self.min_distance)

    def task(self, puzzle: PathPuzzle) -> str:
        return (
            "Move from S to G through free cells (.) without entering walls (#). U moves up one row, "
            "D down, L left, R right; row 0 is the top row, column 0 the left column.\n" + "\n".join(puzzle.rows)
        )

    def variables(self, puzzle: PathPuzzle) -> str:
        rows = ", ".join(f'"{row}"' for row in puzzle.rows)
        return (
            f"grid = [{rows}]  # '#' wall, '.' free\n"
            f"start = {puzzle.start}  # (row, column) of S\n"
            f"goal = {puzzle.goal}  # (row, column) of G"
        )

    def score(self, puzzle: PathPuzzle, answer: str) -> Outcome:
        return score_path(puzzle, answer)


@task(
    "planpath_v0",
    size=integer(10, low=3, high=30, doc="the grid's side"),
    wall_prob=number(0.25, low=0, high=0.5, doc="the chance of a wall in a cell"),
    min_distance=integer(None, low=1, optional=True, doc="the shortest S-G path's least length (None: size)"),
    **TOOLPLAN_ARGS,
)
def _build(size, wall_prob, min_distance, **common: Any) -> ToolPlanEnv:
    """PlanPath-v0 (see the module docstring)."""
    return ToolPlanEnv(PlanPathGame(size, wall_prob, min_distance), "planpath_v0", **common)


parallel_env, env, raw_env = entry_points(_build)
