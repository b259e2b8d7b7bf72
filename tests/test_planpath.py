"""PlanPath-v0: every grid's goal is reachable and its stored path is a shortest one (checked by an
independent search), the walk rules, and each score term against hand-computed values."""

import pytest

from textzoo.envs import make
from textzoo.envs._toolplan import parse_moves
from textzoo.envs.planpath_v0 import PathPuzzle, make_puzzle, score_path, walk
from textzoo.errors import EnvError

STEP = {"U": (-1, 0), "D": (1, 0), "L": (0, -1), "R": (0, 1)}


def shortest_length(rows, start, goal):
    """Shortest path length by growing frontier sets (a different search from the env's queue BFS)."""
    n = len(rows)
    seen, frontier, d = {start}, {start}, 0
    while frontier:
        if goal in frontier:
            return d
        nxt = set()
        for r, c in frontier:
            for dr, dc in STEP.values():
                cell = (r + dr, c + dc)
                if 0 <= cell[0] < n and 0 <= cell[1] < n and rows[cell[0]][cell[1]] != "#" and cell not in seen:
                    nxt.add(cell)
        seen |= nxt
        frontier, d = nxt, d + 1
    return None


@pytest.mark.parametrize("size, wall_prob, min_distance", [(10, 0.25, 10), (6, 0.4, 3), (15, 0.3, 12)])
def test_goal_reachable_and_path_shortest(size, wall_prob, min_distance):
    for k in range(80):
        p = make_puzzle(k, size, wall_prob, min_distance)
        assert len(p.rows) == size and all(len(row) == size for row in p.rows)
        assert p.rows[p.start[0]][p.start[1]] == "S" and p.rows[p.goal[0]][p.goal[1]] == "G"
        assert "".join(p.rows).count("S") == "".join(p.rows).count("G") == 1
        d = shortest_length(p.rows, p.start, p.goal)
        assert d is not None and d >= min_distance and len(p.shortest) == d
        cell = p.start
        for move in p.shortest:  # the stored path walks from S to G through free cells
            cell = (cell[0] + STEP[move][0], cell[1] + STEP[move][1])
            assert p.free(cell)
        assert cell == p.goal
        assert p.distance[p.start] == d


def test_grids_are_a_pure_function_of_the_index():
    assert make_puzzle.__wrapped__(3, 10, 0.25, 10) == make_puzzle.__wrapped__(3, 10, 0.25, 10)
    assert len({make_puzzle(k, 10, 0.25, 10).rows for k in range(50)}) == 50


# S . .
# . # .
# . . G     distances to G: (0,0) 4, (0,1) 3, (1,0) 3, (0,2) 2, (2,0) 2, (1,2) 1, (2,1) 1
HAND = PathPuzzle(("S..", ".#.", "..G"), (0, 0), (2, 2), "RRDD")


@pytest.mark.parametrize(
    "answer, valid, solved, progress, end",
    [
        ("R", True, False, 0.25, (0, 1)),
        ("D D", True, False, 0.5, (2, 0)),
        ("U L", True, False, 0.0, (0, 0)),  # off the grid twice: stays at S
        ("R D", True, False, 0.25, (0, 1)),  # D hits the wall
        ("R R D D", True, True, 1.0, (2, 2)),
        ("down down right right up", True, True, 1.0, (2, 2)),  # stops at G; the extra move is ignored
        ("R R L L", True, False, 0.0, (0, 0)),  # walked back: no distance closed
        ("I cannot", False, False, 0.0, None),
    ],
)
def test_score_terms_by_hand(answer, valid, solved, progress, end):
    out = score_path(HAND, answer)
    assert (out.valid, out.solved, out.progress) == (valid, solved, progress)
    if end is not None:
        assert walk(HAND, parse_moves(answer))[0] == end


def test_walk_counts_bumps_and_caps_moves():
    assert walk(HAND, "RD") == ((0, 1), 1, False)
    assert walk(HAND, "UL") == ((0, 0), 2, False)
    long = "RL" * 10  # only size * size = 9 moves count
    assert score_path(HAND, " ".join(long)).feedback.endswith("only the first 9 moves count")


def test_env_terms_and_feedback():
    env = make("textzoo/PlanPath-v0", turns=2)
    obs, _ = env.reset(options={"index": 5})
    p = env.puzzle
    assert "\n".join(p.rows) in obs["plan"] and f"start = {p.start}" in obs["tool"]
    half = p.shortest[: len(p.shortest) // 2]
    obs, rewards, _, _, infos = env.step({"tool": f"print('####', '{p.shortest}')", "plan": "#### " + " ".join(half)})
    progress = len(half) / len(p.shortest)  # along a shortest path each move closes one step
    assert infos["plan"]["score_terms"]["plan_progress"] == pytest.approx(progress)
    assert infos["plan"]["score_terms"]["solved"] == 1.0  # the tool's program solved it
    assert rewards["tool"] == pytest.approx(1.0)
    assert rewards["plan"] == pytest.approx(0.6 + 0.3 * progress + 0.1)


def test_arguments():
    for bad in ({"size": 2}, {"wall_prob": 0.9}, {"min_distance": 0}, {"size": 5, "min_distance": 9}):
        with pytest.raises(EnvError):
            make("textzoo/PlanPath-v0", **bad)
