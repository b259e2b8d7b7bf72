"""The tool/plan arrangement: answer regions, move parsing, sandboxed programs, rewards as score
differences (hand-computed), early end, what each role sees next turn, arguments."""

import importlib

import pytest

from textzoo.envs import make
from textzoo.envs._toolplan import WEIGHTS, ToolPlanEnv, answer_region, parse_moves
from textzoo.envs.planpath_v0 import PathPuzzle, PlanPathGame
from textzoo.errors import EnvError
from textzoo.sandbox import SandboxLimits

LIMITS = SandboxLimits(timeout_s=3.0, cpu_s=1)
# S . .
# . # .
# . . G    shortest path: 4 moves; distances to G: S 4, (0,1) 3, (1,0) 3, (2,0) 2, (0,2) 2, (1,2) 1
FIXED = PathPuzzle(("S..", ".#.", "..G"), (0, 0), (2, 2), "RRDD")


class FixedPath(PlanPathGame):
    def puzzle(self, k):
        return FIXED


def fixed_env(turns=3):
    return ToolPlanEnv(FixedPath(size=3), "fixed", num_items=10, turns=turns, sandbox_limits=LIMITS)


def program(body):
    return f"Here is my program:\n```python\n{body}\n```\n"


def test_answer_region_and_moves():
    assert answer_region("think R R #### L U") == " L U"
    assert answer_region("a #### b #### c") == " c"
    assert answer_region("no mark R") == "no mark R"
    assert parse_moves("R R D") == parse_moves("RRD") == parse_moves("['R', 'R', 'D']") == "RRD"
    assert parse_moves("right, Right, DOWN then up") == "RRDU"
    assert parse_moves('**Actions List**: ["U", "L"]') == "UL"
    assert parse_moves("Let's see: Down is good") == "D"  # L of "Let's" is not a word of its own
    assert parse_moves("rrd urld") == ""  # small letters are words, not moves
    assert parse_moves("") == ""


def test_weights_sum_to_one():
    assert all(sum(w.values()) == pytest.approx(1.0) for w in WEIGHTS.values())


def test_rewards_are_score_differences_and_a_solve_ends_the_episode():
    env = fixed_env()
    obs, infos = env.reset(seed=0, options={"index": 0})
    assert set(obs) == {"tool", "plan"} and all(i["active"] for i in infos.values())
    assert 'grid = ["S..", ".#.", "..G"]' in obs["tool"] and "start = (0, 0)" in obs["tool"]
    assert "grid =" not in obs["plan"] and "S..\n.#.\n..G" in obs["plan"]

    # turn 0: the program prints R (1 of 4 moves closed), the plan says D D (2 of 4)
    obs, rewards, term, trunc, infos = env.step({"tool": program("print('####', 'R')"), "plan": "go down #### D D"})
    terms = {"solved": 0.0, "plan_valid": 1.0, "plan_progress": 0.5, "tool_ran": 1.0, "tool_valid": 1.0}
    terms["tool_progress"] = 0.25
    assert infos["plan"]["score_terms"] == infos["tool"]["score_terms"] == terms
    assert infos["plan"]["reward_terms"] == terms  # first turn: the difference from zero
    # plan = 0.3 * 0.5 + 0.1 = 0.25; tool = 0.2 * 0.25 + 0.1 + 0.1 = 0.25
    assert rewards == {"plan": 0.25, "tool": 0.25}
    assert not any(term.values()) and not any(trunc.values())
    for role in ("tool", "plan"):  # both see the program, its output, the plan's answer and both feedbacks
        assert "Turn 2 of 3" in obs[role] and "print('####', 'R')" in obs[role]
        assert "Its output:\n#### R\n" in obs[role] and "The plan agent's answer: D D\n" in obs[role]
        assert "row 0, column 1, 3 moves from G" in obs[role] and "row 2, column 0, 2 moves from G" in obs[role]
    assert obs["tool"].rstrip().endswith("code block.") and obs["plan"].rstrip().endswith("the answer.")

    # turn 1: the program does not compile, the plan solves it
    obs, rewards, term, _, infos = env.step({"tool": program("print(("), "plan": "#### R R D D"})
    assert infos["tool"]["score_terms"] == {
        "solved": 1.0,
        "plan_valid": 1.0,
        "plan_progress": 1.0,
        "tool_ran": 0.0,
        "tool_valid": 0.0,
        "tool_progress": 0.0,
    }
    assert infos["tool"]["reward_terms"] == {
        "solved": 1.0,
        "plan_valid": 0.0,
        "plan_progress": 0.5,
        "tool_ran": -1.0,
        "tool_valid": -1.0,
        "tool_progress": -0.25,
    }
    # plan: 1.0 - 0.25; tool: 0.6 - 0.25
    assert rewards == {"plan": 0.75, "tool": 0.35}
    assert infos["plan"]["score"] == 1.0 and infos["tool"]["score"] == 0.6
    assert all(term.values()) and env.agents == []  # solved in turn 1 of 3: the episode ends
    assert any("does not compile" in n for n in infos["tool"]["notes"])


def test_the_tool_alone_can_solve_with_the_bound_variables():
    env = fixed_env()
    env.reset(options={"index": 0})
    code = "print('####', 'R' * (goal[1] - start[1]) + 'D' * (goal[0] - start[0]))"
    _, rewards, term, _, infos = env.step({"tool": program(code), "plan": "no idea"})
    assert infos["tool"]["score_terms"]["solved"] == 1.0 and infos["tool"]["score_terms"]["tool_progress"] == 1.0
    assert rewards == {"tool": 1.0, "plan": 0.6}  # the plan gives no moves: 0.6 solved only
    assert all(term.values())
    assert any("no moves found" in n for n in infos["plan"]["notes"])


def test_a_failed_program_still_shows_and_scores_what_it_printed():
    env = fixed_env()
    env.reset(options={"index": 0})
    obs, rewards, _, _, infos = env.step({"tool": program("print('#### R')\n1 / 0"), "plan": ""})
    t = infos["tool"]["score_terms"]
    assert (t["tool_ran"], t["tool_valid"], t["tool_progress"]) == (0.0, 1.0, 0.25)
    assert rewards["tool"] == pytest.approx(0.2 * 0.25 + 0.1)
    assert "the program raised ZeroDivisionError: division by zero" in infos["tool"]["notes"]
    assert "#### R\n(the program raised ZeroDivisionError" in obs["plan"]


@pytest.mark.parametrize(
    "code, note",
    [
        # the CPU limit kills it, or on a loaded machine the wall-clock limit comes first
        ("while True:\n    pass", ("stopped before its end", "ran out of time")),
        ("", "no program"),
        ("x = 1", None),  # runs, prints nothing
    ],
)
def test_programs_that_give_no_answer(code, note):
    env = fixed_env()
    env.reset(options={"index": 0})
    _, rewards, _, _, infos = env.step({"tool": program(code) if code else "", "plan": "#### R"})
    t = infos["tool"]["score_terms"]
    assert t["tool_valid"] == 0.0 and t["tool_progress"] == 0.0
    assert t["tool_ran"] == float(note is None)
    assert rewards["tool"] == pytest.approx(0.1 * (note is None))
    notes = (note,) if isinstance(note, str) else note
    if note:
        assert any(text in n for n in infos["tool"]["notes"] for text in notes), infos["tool"]["notes"]
    else:
        assert "the program printed nothing" in str(infos)


def test_unsolved_episodes_last_all_turns_and_return_the_last_score():
    env = fixed_env(turns=2)
    env.reset(options={"index": 0})
    total = {"tool": 0.0, "plan": 0.0}
    for plan in ("#### D D", "#### R"):  # progress 0.5, then 0.25: the return is the last score
        _, rewards, term, _, infos = env.step({"tool": "", "plan": plan})
        total = {a: total[a] + rewards[a] for a in total}
    assert all(term.values())
    assert total["plan"] == pytest.approx(0.3 * 0.25 + 0.1) == infos["plan"]["score"]
    assert total["tool"] == 0.0


def test_items_splits_and_arguments():
    train = make("textzoo/PlanPath-v0", num_items=20)
    held = make("textzoo/PlanPath-v0", num_items=20, split="eval")
    assert train.num_items() == 16 and held.num_items() == 4
    assert held._items == [4, 9, 14, 19]
    first = [train.reset(options={"index": i})[0]["plan"] for i in range(16)]
    assert len(set(first)) == 16  # distinct puzzles
    assert {held.reset(options={"index": i})[0]["plan"] for i in range(4)}.isdisjoint(first)
    for bad in ({"turns": 0}, {"num_items": 0}, {"sandbox_limits": {"timeout_s": 1}}, {"split": "test"}):
        with pytest.raises(EnvError):
            make("textzoo/Sudoku-v0", **bad)
    with pytest.raises(EnvError, match="max_prompt_chars"):
        make("textzoo/Sokoban-v0", max_prompt_chars=500)
    with pytest.raises(EnvError, match="empty"):
        make("textzoo/Sudoku-v0", num_items=3, split="eval")


def test_state_holds_both_roles_and_metadata_names_the_task():
    env = make("textzoo/Sokoban-v0")
    env.reset(options={"index": 3})
    env.step({"tool": "print(1)", "plan": "#### U"})
    state = env.state()
    assert "<tool action>\nprint(1)" in state and "<plan action>\n#### U" in state
    assert env.metadata["name"] == "sokoban_v0"
    assert make("textzoo/Sudoku-v0").metadata["name"] == "sudoku_v0"


@pytest.mark.parametrize("module", ["sudoku_v0", "planpath_v0", "sokoban_v0", "debate_v0"])
def test_aec_versions_step_agents_in_turn(module):
    # PettingZoo's AEC api_test compares observations by dtype, which a Text space's str has not
    aec = importlib.import_module(f"textzoo.envs.{module}").env(turns=2)
    aec.reset(seed=0)
    steps = 0
    for _ in aec.agent_iter(max_iter=20):
        obs, reward, termination, truncation, info = aec.last()
        assert isinstance(obs, str) and isinstance(reward, (int, float))
        aec.step(None if termination or truncation else "#### 1")
        steps += 1
    assert not aec.agents and steps == 2 * 2 + 2  # two turns of two agents, then each agent's final last()
