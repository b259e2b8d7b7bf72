"""Sudoku-v0: every puzzle has exactly one solution (checked against all 288 4x4 Sudoku grids),
the answer parser's rules, and each score term against hand-computed values."""

import itertools

import pytest

from textzoo.envs import make
from textzoo.envs.sudoku_v0 import SudokuPuzzle, make_puzzle, parse_grid, score_grid, solutions
from textzoo.errors import EnvError
from textzoo.sandbox import SandboxLimits


def all_grids():
    """Every valid 4x4 Sudoku grid, by brute force over row permutations (independent of the env's solver)."""
    rows = list(itertools.permutations(range(1, 5)))
    grids = []
    for grid in itertools.product(rows, repeat=4):
        cols_ok = all(len({grid[r][c] for r in range(4)}) == 4 for c in range(4))
        boxes_ok = all(
            len({grid[br + i][bc + j] for i in range(2) for j in range(2)}) == 4 for br in (0, 2) for bc in (0, 2)
        )
        if cols_ok and boxes_ok:
            grids.append(grid)
    return grids


GRIDS = all_grids()


def test_there_are_288_grids():
    assert len(GRIDS) == 288  # the known count of 4x4 Sudoku grids


@pytest.mark.parametrize("blanks", [4, 8, 10, 12])
def test_puzzles_have_exactly_one_solution(blanks):
    for k in range(60):
        p = make_puzzle(k, blanks)
        assert sum(v == 0 for row in p.givens for v in row) == blanks
        fits = [g for g in GRIDS if all(p.givens[r][c] in (0, g[r][c]) for r in range(4) for c in range(4))]
        assert fits == [p.solution]


def test_puzzles_are_a_pure_function_of_the_index():
    assert make_puzzle.__wrapped__(7, 8) == make_puzzle.__wrapped__(7, 8)
    assert len({make_puzzle(k, 8).givens for k in range(50)}) == 50


def test_solver_counts_solutions():
    empty = [[0] * 4 for _ in range(4)]
    assert len(solutions(empty, limit=1000)) == 288
    assert len(solutions(GRIDS[0])) == 1


def test_parse_rules():
    grid = ((1, 2, 3, 4), (3, 4, 1, 2), (2, 1, 4, 3), (4, 3, 2, 1))
    for text in (
        "1234 3412 2143 4321",
        "[[1,2,3,4],[3,4,1,2],[2,1,4,3],[4,3,2,1]]",
        "1 2 3 4\n3 4 1 2\n2 1 4 3\n4 3 2 1",
    ):
        assert parse_grid(text)[0] == grid
    assert parse_grid("row 1 is ... 1234341221434321")[0] == grid  # the last 16 digits count
    assert parse_grid("123 456")[0] is None and "6 digits found" in parse_grid("123 456")[1]
    assert parse_grid("1234 3412 2143 4320")[0] is None  # 0 is not a digit of the grid
    assert parse_grid("")[0] is None


# a hand-made puzzle: 8 empty cells (.)
#   1 . 3 .        solution 1 2 3 4
#   . 4 . 2                 3 4 1 2
#   2 . 4 .                 2 1 4 3
#   . 3 . 1                 4 3 2 1
HAND = SudokuPuzzle(
    ((1, 0, 3, 0), (0, 4, 0, 2), (2, 0, 4, 0), (0, 3, 0, 1)),
    ((1, 2, 3, 4), (3, 4, 1, 2), (2, 1, 4, 3), (4, 3, 2, 1)),
)


def test_score_terms_by_hand():
    assert solutions(HAND.givens) == [HAND.solution]
    solved = score_grid(HAND, "1234 3412 2143 4321")
    assert (solved.valid, solved.solved, solved.progress) == (True, True, 1.0)
    # two empty cells wrong ((0,1) and (3,0) swapped values): 6 of 8 right
    partial = score_grid(HAND, "1434 3412 2143 2321")
    assert (partial.valid, partial.solved, partial.progress) == (True, False, 0.75)
    assert "6 of the 8 empty cells are right" in partial.feedback and "repeat a digit" in partial.feedback
    # the empty cells right but a given changed (1 -> 4 at (0,0)): not solved, progress counts empty cells only
    changed = score_grid(HAND, "4234 3412 2143 4321")
    assert (changed.solved, changed.progress) == (False, 1.0) and "1 given cells were changed" in changed.feedback
    bad = score_grid(HAND, "12")
    assert (bad.valid, bad.solved, bad.progress) == (False, False, 0.0)


def test_env_rewards_by_hand():
    # limits a loaded machine cannot exhaust: the brute force below ran past the default 5 s wall clock at load 8
    env = make("textzoo/Sudoku-v0", turns=2, sandbox_limits=SandboxLimits(timeout_s=120.0, cpu_s=60))
    obs, _ = env.reset(options={"index": 0})
    p = env.puzzle
    assert "puzzle = [" in obs["tool"] and str(list(p.givens[0])) in obs["tool"]
    wrong = [list(row) for row in p.solution]
    r, c = p.blanks[0]
    wrong[r][c] = wrong[r][c] % 4 + 1  # one empty cell wrong
    answer = "#### " + " ".join("".join(map(str, row)) for row in wrong)
    _, rewards, _, _, infos = env.step({"tool": "", "plan": answer})
    progress = (len(p.blanks) - 1) / len(p.blanks)
    assert infos["plan"]["score_terms"]["plan_progress"] == progress
    assert rewards["plan"] == pytest.approx(0.3 * progress + 0.1)
    assert rewards["tool"] == 0.0
    # a tool program that brute-forces the puzzle solves it
    code = (
        "import itertools\n"
        "rows = list(itertools.permutations([1, 2, 3, 4]))\n"
        "def ok(g):\n"
        "    cols = all(len({g[r][c] for r in range(4)}) == 4 for c in range(4))\n"
        "    boxes = all(len({g[a + i][b + j] for i in (0, 1) for j in (0, 1)}) == 4 for a in (0, 2) for b in (0, 2))\n"
        "    return cols and boxes\n"
        "for g in itertools.product(rows, repeat=4):\n"
        "    if ok(g) and all(puzzle[r][c] in (0, g[r][c]) for r in range(4) for c in range(4)):\n"
        "        print('####', ' '.join(''.join(map(str, row)) for row in g))\n"
        "        break\n"
    )
    _, rewards, term, _, infos = env.step({"tool": f"```python\n{code}```", "plan": answer})
    assert infos["tool"]["score_terms"]["solved"] == 1.0 and all(term.values())
    assert rewards["tool"] == pytest.approx(1.0)  # 0 -> 1.0
    assert rewards["plan"] == pytest.approx(0.6 + 0.3 * progress + 0.1 - (0.3 * progress + 0.1))


def test_arguments():
    with pytest.raises(EnvError, match="blanks"):
        make("textzoo/Sudoku-v0", blanks=13)
    with pytest.raises(EnvError, match="blanks"):
        make("textzoo/Sudoku-v0", blanks=0)
