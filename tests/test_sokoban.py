"""Sokoban-v0: every level is solvable within its move budget (checked by an independent search
with its own push rules), the play rules, and each score term against hand-computed values."""

import pytest

from textzoo.envs import make
from textzoo.envs._toolplan import parse_moves
from textzoo.envs.sokoban_v0 import SokobanLevel, box_distance, make_level, play, score_moves
from textzoo.errors import EnvError

STEP = {"U": (-1, 0), "D": (1, 0), "L": (0, -1), "R": (0, 1)}


def move(walls, player, boxes, m):
    """The test's own rules: step, push one box into a free cell, else stay."""
    dr, dc = STEP[m]
    a = (player[0] + dr, player[1] + dc)
    b = (a[0] + dr, a[1] + dc)
    if a in walls:
        return player, boxes
    if a in boxes:
        if b in walls or b in boxes:
            return player, boxes
        return a, tuple(sorted(b if x == a else x for x in boxes))
    return a, boxes


def optimal_moves(level, limit):
    """Fewest moves to put every box on a goal, by layered search over (player, sorted boxes)."""
    goals = tuple(sorted(level.goals))
    layer = {(level.player, tuple(sorted(level.boxes)))}
    seen = set(layer)
    for depth in range(limit + 1):
        if any(boxes == goals for _, boxes in layer):
            return depth
        layer = {move(level.walls, p, b, m) for p, b in layer for m in "UDLR"} - seen
        seen |= layer
    return None


@pytest.mark.parametrize(
    "size, boxes, walls, min_moves, max_moves",
    [(6, 1, 2, 4, 20), (6, 2, 2, 4, 20), (7, 2, 3, 6, 24), (5, 1, 0, 1, 10)],
)
def test_levels_are_solvable_within_the_budget(size, boxes, walls, min_moves, max_moves):
    for k in range(40):
        level = make_level(k, size, boxes, walls, 30, min_moves, max_moves)
        n = optimal_moves(level, max_moves)
        assert n is not None and min_moves <= n <= max_moves and n == level.optimal
        assert level.boxes != level.goals and len(level.boxes) == len(level.goals) == boxes
        border = {(r, c) for r in range(size) for c in range(size) if r in (0, size - 1) or c in (0, size - 1)}
        assert border <= level.walls and len(level.walls - border) == walls
        assert level.player not in level.walls | level.boxes
        p, b = level.player, tuple(sorted(level.boxes))
        for m in level.solution:  # the stored solution solves it under the test's own rules
            p, b = move(level.walls, p, b, m)
        assert b == tuple(sorted(level.goals))


def test_levels_are_a_pure_function_of_the_index():
    args = (6, 1, 2, 30, 4, 20)
    assert make_level.__wrapped__(9, *args) == make_level.__wrapped__(9, *args)
    assert len({tuple(make_level(k, *args).rows()) for k in range(50)}) >= 45


def room(size, inner=()):
    return frozenset(
        {(r, c) for r in range(size) for c in range(size) if r in (0, size - 1) or c in (0, size - 1)}
    ) | set(inner)


# ######
# #@___#     player (1,1)
# #__$_#     box (2,3)
# #____#
# #__._#     goal (4,3): the box is 2 steps from it
# ######
HAND = SokobanLevel(6, room(6), frozenset({(4, 3)}), frozenset({(2, 3)}), (1, 1), optimal=4, solution="RRDD")


def test_rows_notation_and_hand_level():
    assert HAND.rows() == ["######", "#@___#", "#__$_#", "#____#", "#__._#", "######"]
    assert optimal_moves(HAND, 10) == 4


@pytest.mark.parametrize(
    "answer, solved, progress, player, blocked",
    [
        ("R R", False, 0.0, (1, 3), 0),
        ("R R D", False, 0.5, (2, 3), 0),  # one push down: 1 step left
        ("R R D D", True, 1.0, (3, 3), 0),
        ("R R D D D U", True, 1.0, (3, 3), 0),  # play stops when solved
        ("L", False, 0.0, (1, 1), 1),  # into the wall
        ("D D D D", False, 0.0, (4, 1), 1),
        ("R R R D L", False, 0.0, (2, 3), 0),  # pushes the box left, away from the goal: no credit
        ("right right down", False, 0.5, (2, 3), 0),
    ],
)
def test_score_terms_by_hand(answer, solved, progress, player, blocked):
    out = score_moves(HAND, answer, max_moves=20)
    assert (out.valid, out.solved, out.progress) == (True, solved, progress)
    end, _, n_blocked, _ = play(HAND, parse_moves(answer), 20)
    assert (end, n_blocked) == (player, blocked)


def test_invalid_answers_and_the_move_budget():
    out = score_moves(HAND, "no idea", max_moves=20)
    assert (out.valid, out.solved, out.progress) == (False, False, 0.0)
    capped = score_moves(HAND, "R R D D", max_moves=3)  # only 3 moves count
    assert (capped.solved, capped.progress) == (False, 0.5) and "only the first 3 moves count" in capped.feedback
    blocked = score_moves(HAND, "L R R D", max_moves=20)
    assert blocked.progress == 0.5 and "1 moves were blocked" in blocked.feedback


def test_box_distance_sums_over_boxes():
    two = SokobanLevel(6, room(6), frozenset({(4, 3), (1, 2)}), frozenset({(2, 3), (1, 1)}), (3, 1), 0, "")
    assert box_distance(two, two.boxes) == 2 + 1
    assert box_distance(two, two.goals) == 0


def test_env_rewards_by_hand():
    env = make("textzoo/Sokoban-v0", turns=2)
    obs, _ = env.reset(options={"index": 0})
    level = env.puzzle
    assert "\n".join(level.rows()) in obs["plan"] and f"player = {level.player}" in obs["tool"]
    assert f"at most {env.game.max_moves} moves" in obs["plan"]
    _, rewards, term, _, infos = env.step({"tool": "print('#### ' + 'U' * 0)", "plan": "#### " + level.solution})
    assert infos["plan"]["score_terms"] == {
        "solved": 1.0,
        "plan_valid": 1.0,
        "plan_progress": 1.0,
        "tool_ran": 1.0,
        "tool_valid": 0.0,
        "tool_progress": 0.0,
    }
    assert rewards == {"plan": 1.0, "tool": pytest.approx(0.6 + 0.1)}
    assert all(term.values())


def test_arguments():
    for bad in ({"size": 3}, {"num_boxes": 0}, {"walls": 14}, {"min_moves": 30}, {"max_moves": 0}):
        with pytest.raises(EnvError):
            make("textzoo/Sokoban-v0", **bad)
