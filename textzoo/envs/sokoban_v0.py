"""textzoo/Sokoban-v0: a tool agent and a plan agent push boxes onto goals within a move budget.

Roles and turns (the PettingLLMs arrangement of `textzoo.envs._toolplan`): every turn `tool` writes
a Python program (run in the sandbox after `level`, `player`, `boxes` and `goals` are bound) whose
printed output is its answer, and `plan` answers in text; from turn 1 on both see the tool's last
program and output, the plan's last answer and the feedback on both. The episode ends when either
answer solves the level, else after `turns` turns (default 3).

Observations: the rules and the level (`size` x `size`, default 6x6, walled around; `#` wall,
`_` floor, `@` player, `$` box, `.` goal, `*` box on a goal, `+` player on a goal; row 0 at the
top), the move budget, the answer format and, from turn 1 on, the last turn.

Actions: any string. The answer is the text after the last `####` (all of it without one); its
moves are read as in PlanPath-v0 (the words up/down/left/right and standalone runs of U, D, L, R;
`textzoo.envs._toolplan.parse_moves`). It is valid when it holds at least one move.

Play: each move steps the player one cell; stepping onto a box pushes it one cell further when
that cell is floor or a goal without a box; a move into a wall, or against a box that cannot move,
does nothing. Play stops when every box is on a goal; only the first `max_moves` moves count.

Scores of an answer: `valid` (above); `solved` = every box on a goal; `progress` = the box
distance closed, max(0, (D(start) - D(end)) / D(start)) with D the sum over boxes of the Manhattan
distance to the nearest goal (1 exactly when solved; 0 when not valid). Terms, per-agent scores
(`WEIGHTS` of `_toolplan`) and rewards (score differences between turns: an episode's return is
its last turn's score) are those of `textzoo.envs._toolplan`: plan = 0.6 solved + 0.3
plan_progress + 0.1 plan_valid; tool = 0.6 solved + 0.2 tool_progress + 0.1 tool_valid + 0.1
tool_ran; team = their mean.

Items: level k is generated from k alone by reverse play: `walls` random interior walls, then
`num_boxes` boxes (default 1) on random goals and the player on a random floor cell, then
`reverse_steps` (default 30) random player moves, each of which pulls along the box right behind
the player, if any. Undoing the moves solves the level, so every level is solvable; it is kept
when it is not already solved and a breadth-first search over (player, boxes) finds a shortest
solution of `min_moves` (default 4) to `max_moves` (default 20) moves, else drawn again.
`num_items` (default 1000) sets the pool; `split="train"|"eval"|"all"` keeps levels k with
k % 5 != 4 | k % 5 == 4 | all (`textzoo.envs._sources`).

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
from textzoo.envs.declare import entry_points, integer, task
from textzoo.errors import EnvError

MOVES: dict[str, tuple[int, int]] = {"U": (-1, 0), "D": (1, 0), "L": (0, -1), "R": (0, 1)}
ITEM_SEED = 41
_ATTEMPTS = 2000
Cell = tuple[int, int]


@dataclass(frozen=True)
class SokobanLevel:
    """A level: walls (the border included), goals, the boxes and the player at the start."""

    size: int
    walls: frozenset[Cell]
    goals: frozenset[Cell]
    boxes: frozenset[Cell]
    player: Cell
    optimal: int
    """Moves of a shortest solution (BFS)."""
    solution: str
    """One shortest solution as moves ("UDLR")."""

    def rows(self) -> list[str]:
        """The level in the `#_@$.*+` notation, top row first."""
        out = []
        for r in range(self.size):
            row = ""
            for c in range(self.size):
                cell = (r, c)
                if cell in self.walls:
                    row += "#"
                elif cell == self.player:
                    row += "+" if cell in self.goals else "@"
                elif cell in self.boxes:
                    row += "*" if cell in self.goals else "$"
                else:
                    row += "." if cell in self.goals else "_"
            out.append(row)
        return out


def push(walls: frozenset[Cell], boxes: frozenset[Cell], player: Cell, move: str) -> tuple[Cell, frozenset[Cell]]:
    """The (player, boxes) after one move (unchanged when the move is blocked)."""
    dr, dc = MOVES[move]
    nxt = (player[0] + dr, player[1] + dc)
    if nxt in walls:
        return player, boxes
    if nxt in boxes:
        beyond = (nxt[0] + dr, nxt[1] + dc)
        if beyond in walls or beyond in boxes:
            return player, boxes
        return nxt, (boxes - {nxt}) | {beyond}
    return nxt, boxes


def solve(
    walls: frozenset[Cell], goals: frozenset[Cell], boxes: frozenset[Cell], player: Cell, max_moves: int
) -> str | None:
    """A shortest solution of at most `max_moves` moves (breadth-first over (player, boxes)), or None."""
    start = (player, boxes)
    parent: dict[tuple[Cell, frozenset[Cell]], tuple[Any, str]] = {start: (None, "")}
    frontier = deque([(start, 0)])
    while frontier:
        state, depth = frontier.popleft()
        if state[1] == goals:
            moves = []
            while parent[state][0] is not None:
                state, move = parent[state]
                moves.append(move)
            return "".join(reversed(moves))
        if depth == max_moves:
            continue
        for move in MOVES:
            nxt = push(walls, state[1], state[0], move)
            if nxt not in parent:
                parent[nxt] = (state, move)
                frontier.append((nxt, depth + 1))
    return None


@functools.lru_cache(maxsize=4096)
def make_level(
    k: int, size: int, num_boxes: int, walls: int, reverse_steps: int, min_moves: int, max_moves: int
) -> SokobanLevel:
    """Level `k`, by reverse play (see the module docstring): a shortest solution of
    `min_moves` to `max_moves` moves."""
    rng = random.Random(ITEM_SEED * 1_000_003 + k)
    border = {(r, c) for r in range(size) for c in range(size) if r in (0, size - 1) or c in (0, size - 1)}
    interior = [(r, c) for r in range(1, size - 1) for c in range(1, size - 1)]
    for _ in range(_ATTEMPTS):
        inner_walls = set(rng.sample(interior, walls))
        floor = [cell for cell in interior if cell not in inner_walls]
        placed = rng.sample(floor, num_boxes + 1)
        goals, player = frozenset(placed[:-1]), placed[-1]
        wall_set = frozenset(border | inner_walls)
        boxes = set(goals)
        for _ in range(reverse_steps):
            dr, dc = MOVES[rng.choice("UDLR")]
            nxt = (player[0] + dr, player[1] + dc)
            if nxt in wall_set or nxt in boxes:
                continue
            behind = (player[0] - dr, player[1] - dc)
            if behind in boxes:  # pull: the forward move is a push back
                boxes = (boxes - {behind}) | {player}
            player = nxt
        boxes_f = frozenset(boxes)
        if boxes_f == goals:
            continue
        solution = solve(wall_set, goals, boxes_f, player, max_moves)
        if solution is None or len(solution) < min_moves:
            continue
        return SokobanLevel(size, wall_set, goals, boxes_f, player, len(solution), solution)
    raise EnvError(
        f"no Sokoban level with these settings found for item {k}; raise max_moves or reverse_steps, "
        "lower min_moves, or use fewer boxes or walls"
    )


def box_distance(level: SokobanLevel, boxes: frozenset[Cell]) -> int:
    """Sum over boxes of the Manhattan distance to the nearest goal."""
    return sum(min(abs(b[0] - g[0]) + abs(b[1] - g[1]) for g in level.goals) for b in boxes)


def play(level: SokobanLevel, moves: str, max_moves: int) -> tuple[Cell, frozenset[Cell], int, bool]:
    """Play `moves` (the first `max_moves`): (player, boxes, blocked moves, solved)."""
    player, boxes, blocked = level.player, level.boxes, 0
    for move in moves[:max_moves]:
        nxt = push(level.walls, boxes, player, move)
        blocked += nxt == (player, boxes)
        player, boxes = nxt
        if boxes == level.goals:
            return player, boxes, blocked, True
    return player, boxes, blocked, False


def score_moves(level: SokobanLevel, answer: str, max_moves: int) -> Outcome:
    """Score one answer (see the module docstring)."""
    moves = parse_moves(answer)
    if not moves:
        return Outcome(False, False, 0.0, "no valid answer: no moves found (write U, D, L, R)")
    player, boxes, blocked, solved = play(level, moves, max_moves)
    notes = f"; {blocked} moves were blocked" if blocked else ""
    if len(moves) > max_moves:
        notes += f"; only the first {max_moves} moves count"
    if solved:
        return Outcome(True, True, 1.0, f"solved: every box is on a goal{notes}")
    d0, d = box_distance(level, level.boxes), box_distance(level, boxes)
    on_goals = len(boxes & level.goals)
    return Outcome(
        True,
        False,
        max(0.0, (d0 - d) / d0),
        f"{on_goals} of {len(boxes)} boxes on goals; the boxes are {d} steps from the goals (at the start {d0}); "
        f"the player ends at row {player[0]}, column {player[1]}{notes}",
    )


class SokobanGame:
    """Sokoban for `ToolPlanEnv`."""

    title = "a Sokoban puzzle"

    def __init__(
        self,
        size: int = 6,
        num_boxes: int = 1,
        walls: int = 2,
        reverse_steps: int = 30,
        min_moves: int = 4,
        max_moves: int = 20,
    ):
        if min_moves > max_moves:
            raise EnvError(f"min_moves must be an int in [1, max_moves = {max_moves}], got {min_moves!r}")
        room = (size - 2) ** 2
        if walls > room - 2 * num_boxes - 1:
            raise EnvError(
                f"walls must be an int in [0, {room - 2 * num_boxes - 1}] for a {size}x{size} level with "
                f"{num_boxes} boxes, got {walls!r}"
            )
        self.size, self.num_boxes, self.walls = size, num_boxes, walls
        self.reverse_steps, self.min_moves, self.max_moves = reverse_steps, min_moves, max_moves
        self.answer_format = (
            f"at most {max_moves} moves, each U (up), D (down), L (left) or R (right), e.g. #### U L L D"
        )

    def puzzle(self, k: int) -> SokobanLevel:
        return make_level(k, self.size, self.num_boxes, self.walls, self.reverse_steps, self.min_moves, self.max_moves)

    def task(self, level: SokobanLevel) -> str:
        return (
            "Push every box onto a goal. Symbols: # wall, _ floor, @ you, $ box, . goal, * box on a goal, "
            "+ you on a goal. U moves you up one row, D down, L left, R right; walking into a box pushes it "
            "one cell if the cell behind it is free; boxes cannot be pulled. Row 0 is the top row.\n"
            + "\n".join(level.rows())
            + f"\nSolve it in at most {self.max_moves} moves."
        )

    def variables(self, level: SokobanLevel) -> str:
        rows = ", ".join(f'"{row}"' for row in level.rows())
        return (
            f"level = [{rows}]  # '#' wall, '_' floor, '@' you, '$' box, '.' goal, '*' box on goal\n"
            f"player = {level.player}  # (row, column)\n"
            f"boxes = {sorted(level.boxes)}  # (row, column) of each box\n"
            f"goals = {sorted(level.goals)}  # (row, column) of each goal"
        )

    def score(self, level: SokobanLevel, answer: str) -> Outcome:
        return score_moves(level, answer, self.max_moves)


@task(
    "sokoban_v0",
    size=integer(6, low=4, high=12, doc="the level's side, walls included"),
    num_boxes=integer(1, low=1, high=4),
    walls=integer(2, low=0, doc="inner walls (at most the room the boxes leave)"),
    reverse_steps=integer(30, low=1, high=1000, doc="pulls that scatter the boxes from the goals"),
    min_moves=integer(4, low=1, doc="the least moves a level's solution needs (at most max_moves)"),
    max_moves=integer(20, low=1, high=200, doc="the most moves an answer may hold"),
    **TOOLPLAN_ARGS,
)
def _build(size, num_boxes, walls, reverse_steps, min_moves, max_moves, **common: Any) -> ToolPlanEnv:
    """Sokoban-v0 (see the module docstring)."""
    return ToolPlanEnv(SokobanGame(size, num_boxes, walls, reverse_steps, min_moves, max_moves), "sokoban_v0", **common)


parallel_env, env, raw_env = entry_points(_build)
