"""Debate-v0: generated problems' answers (recomputed from the question text by an independent
reader), the answer parser, per-agent terms and rewards by hand, what each agent sees, user data."""

import json
import re
from fractions import Fraction

import pytest

from textzoo.envs import check_env, make
from textzoo.envs.debate_v0 import WEIGHTS, format_number, load_problems, make_problem, parse_answer
from textzoo.errors import EnvError


def recompute(question):
    """The answer of a generated question, read from its sentences (not from the generator's record)."""
    *sentences, ask = re.split(r"(?<=[.?])\s+", question)
    assert ask.startswith("How many ") and ask.endswith(" have now?")
    value = None
    for s in sentences:
        if m := re.fullmatch(r"\w+ has (\d+) \w+ of \w+ with (\d+) \w+ in each\.", s):
            value = int(m[1]) * int(m[2])
        elif m := re.fullmatch(r"\w+ has (\d+) \w+\.", s):
            value = int(m[1])
        elif m := re.fullmatch(r"\w+ buys (\d+) more \w+\.", s):
            value += int(m[1])
        elif m := re.fullmatch(r"\w+ gets (\d+) packs with (\d+) \w+ in each pack\.", s):
            value += int(m[1]) * int(m[2])
        elif m := re.fullmatch(r"\w+ gives (\d+) \w+ to [\w ]+\.", s):
            value -= int(m[1])
        elif re.fullmatch(r"Then the number of \w+ \w+ has (doubles|triples)\.", s):
            value *= 2 if s.endswith("doubles.") else 3
        elif m := re.fullmatch(
            r"\w+ shares the \w+ equally among (\d+) people, \w+ included, and keeps one share\.", s
        ):
            assert value % int(m[1]) == 0
            value //= int(m[1])
        else:
            raise AssertionError(f"unknown sentence {s!r}")
        assert value > 0  # every intermediate value is a positive integer
    return value


@pytest.mark.parametrize("steps", [1, 3, 6])
def test_generated_answers_match_their_questions(steps):
    for k in range(300):
        p = make_problem(k, steps)
        assert Fraction(recompute(p.question)) == p.answer
        assert len(p.work) in (steps, steps + 1)  # + the product of a "boxes of" start


def test_a_generated_problem_by_hand():
    p = make_problem(1, 3)
    assert p.question == (
        "Ravi has 16 beads. Ravi gets 5 packs with 4 beads in each pack. Ravi buys 10 more beads. "
        "Ravi shares the beads equally among 2 people, Ravi included, and keeps one share. "
        "How many beads does Ravi have now?"
    )
    assert p.answer == 23  # (16 + 5 * 4 + 10) / 2
    assert len({make_problem(k).question for k in range(200)}) == 200


@pytest.mark.parametrize(
    "text, value",
    [
        ("so 12 + 3 = 15 #### 15", 15),
        ("#### $1,234.50", Fraction(2469, 2)),
        ("first 3 #### 7, not 8 #### 9 or 10", 9),  # the first number after the last mark
        ("#### none", None),  # a mark without a number: no answer, whatever came before
        ("The answer is 42. Check: 40 + 2", 42),  # the first number after the last "answer"
        ("ANSWER: 3/4", Fraction(3, 4)),
        ("my answer is below. I got 7 then 9", 7),
        ("I got 7 then 9", 9),  # no mark, no "answer": the last number
        ("it is -5", -5),
        ("x 2 then 1/0", 2),  # a zero denominator is not a number
        ("", None),
        ("no numbers here", None),
    ],
)
def test_answer_parsing(text, value):
    assert parse_answer(text) == value


def test_numbers_compare_exactly():
    assert parse_answer("#### 0.5") == parse_answer("#### 1/2") == Fraction(1, 2)
    assert parse_answer("#### 0.1") == Fraction(1, 10)
    assert format_number(Fraction(-3, 4)) == "-3/4" and format_number(Fraction(6)) == "6"


def test_weights():
    assert WEIGHTS == {"solved": 0.7, "agreement": 0.2, "valid": 0.1}


def test_per_agent_terms_and_rewards_by_hand():
    env = make("textzoo/Debate-v0", num_agents=3, turns=2)
    env.reset(options={"index": 0})
    gold = format_number(env.problem.answer)
    a = ["debater_0", "debater_1", "debater_2"]
    # turn 0: two right, one wrong
    obs, rewards, term, _, infos = env.step({a[0]: f"#### {gold}", a[1]: f"It is {gold}.", a[2]: "#### 99999"})
    assert infos[a[0]]["reward_terms"] == {"solved": 1.0, "agreement": 0.5, "valid": 1.0}
    assert infos[a[2]]["reward_terms"] == {"solved": 0.0, "agreement": 0.0, "valid": 1.0}
    assert rewards == {a[0]: 0.9, a[1]: 0.9, a[2]: 0.1}  # 0.7 + 0.2 * 1/2 + 0.1; 0.1
    assert not any(term.values())
    assert infos[a[2]]["answer"] == "99999"
    # turn 1: debater_2 is persuaded, debater_1 gives no number
    _, rewards, term, _, infos = env.step({a[0]: f"#### {gold}", a[1]: "I am not sure", a[2]: f"#### {gold}"})
    assert rewards == {a[0]: 0.0, a[1]: -0.9, a[2]: 0.8}  # scores 0.9, 0.0, 0.9
    assert infos[a[1]]["reward_terms"] == {"solved": -1.0, "agreement": -0.5, "valid": -1.0}
    assert infos[a[1]]["score_terms"] == {"solved": 0.0, "agreement": 0.0, "valid": 0.0}
    assert infos[a[1]]["answer"] is None and any("no answer" in n for n in infos[a[1]]["notes"])
    assert all(term.values())


def test_agreement_on_a_wrong_answer():
    env = make("textzoo/Debate-v0", num_agents=2, turns=1)
    env.reset(options={"index": 0})
    _, rewards, _, _, infos = env.step({"debater_0": "#### 99999", "debater_1": "answer: 99,999"})
    assert rewards == {"debater_0": pytest.approx(0.3), "debater_1": pytest.approx(0.3)}  # 0.2 + 0.1 each


def test_each_agent_sees_the_others_previous_replies():
    env = make("textzoo/Debate-v0", num_agents=3, turns=3, response_chars=20)
    obs, _ = env.reset(options={"index": 2})
    question = env.problem.question
    assert all(question in o and "####" in o for o in obs.values())
    obs, *_ = env.step({"debater_0": "I think #### 5", "debater_1": "x" * 50, "debater_2": ""})
    o = obs["debater_1"]
    assert "Round 2 of 3" in o and question in o
    assert "Your previous reply (answer read: none):\n" + "x" * 20 + "\n" in o and "x" * 21 not in o
    assert "debater_0 (answer read: 5):\nI think #### 5" in o and "debater_2 (answer read: none):\n(empty)" in o
    assert "debater_1 (answer read" not in o  # its own reply is not listed among the others
    assert "debater_0 (answer read" not in obs["debater_0"]


def test_user_data(tmp_path):
    rows = [{"q": f"What is {i} + {i}?", "a": str(2 * i)} for i in range(4)] + [{"q": "Half of one?", "a": 0.5}]
    path = tmp_path / "qa.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    env = make("textzoo/Debate-v0", dataset=str(path), question_field="q", answer_field="a", split="all")
    assert env.num_items() == 5
    env.reset(options={"index": 4})
    assert env.problem.answer == Fraction(1, 2)
    _, rewards, *_ = env.step({"debater_0": "#### 1/2", "debater_1": "#### 0.5"})
    assert rewards == {"debater_0": pytest.approx(1.0), "debater_1": pytest.approx(1.0)}
    held = make("textzoo/Debate-v0", dataset=rows, question_field="q", answer_field="a", split="eval")
    assert held.num_items() == 1 and held.reset(options={"index": 0}) and held.problem.question == "Half of one?"
    assert load_problems([{"question": "Q?", "answer": 3}])[0].answer == 3


@pytest.mark.parametrize(
    "rows, message",
    [
        ([{"question": "Q?"}], "must be a number"),
        ([{"question": "Q?", "answer": "many"}], "holds no number"),
        ([{"question": "Q?", "answer": True}], "must be a number"),
        ([{"question": "Q?", "answer": float("nan")}], "finite"),
        ([{"question": "", "answer": 1}], "non-empty"),
        ([{"text": "Q?", "answer": 1}], "no field 'question'"),
    ],
)
def test_bad_user_data(rows, message):
    with pytest.raises(EnvError, match=message):
        make("textzoo/Debate-v0", dataset=rows, split="all")


def test_arguments():
    for bad in ({"num_agents": 1}, {"turns": 0}, {"steps": 9}, {"response_chars": 0}, {"num_items": 0}):
        with pytest.raises(EnvError):
            make("textzoo/Debate-v0", **bad)
    with pytest.raises(EnvError, match="max_prompt_chars"):
        make("textzoo/Debate-v0", num_agents=4, response_chars=2000, max_prompt_chars=4000)


def test_user_data_task_passes_check_env():
    rows = [{"question": f"What is {i} times 3?", "answer": 3 * i} for i in range(6)]
    check_env(lambda: make("textzoo/Debate-v0", dataset=rows, split="all", num_agents=3), num_cycles=50)
