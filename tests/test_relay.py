"""Relay-v0: turns, activity, answer parsing, rewards, items, splits, arguments."""

import pytest

from textzoo.envs import check_env, make
from textzoo.envs.relay_v0 import match_symbol, parse_answer
from textzoo.errors import EnvError


def test_answer_parsing_rules():
    symbols = ["A", "B", "C", "D"]
    assert parse_answer("  (B). because") == "B"
    assert match_symbol(" b.", symbols) == "B"  # case-insensitive: symbols are distinct ignoring case
    assert match_symbol("C is it", symbols) == "C"
    assert match_symbol("Bravo", symbols) is None
    assert match_symbol("", symbols) is None
    assert match_symbol("a", ["a", "A"]) == "a" and match_symbol("A", ["a", "A"]) == "A"
    assert match_symbol("Dog!", ["cat", "dog"]) == "dog"


def test_two_turns():
    env = make("textzoo/Relay-v0", message_chars=5)
    obs, infos = env.reset(seed=0, options={"index": 2})
    assert env.symbols == ["A", "B", "C", "D"] and "Secret: C" in obs["sender"]
    assert infos["sender"]["active"] and not infos["receiver"]["active"]
    assert "Wait" in obs["receiver"] and infos["receiver"]["allowed_outputs"] == ["A", "B", "C", "D"]

    obs, rewards, term, _, infos = env.step({"sender": "It is C, trust me", "receiver": "ignored"})
    assert rewards == {"sender": 0.0, "receiver": 0.0} and not any(term.values())
    assert infos["receiver"]["active"] and not infos["sender"]["active"]
    assert obs["receiver"].startswith("Message: It is\n") and "Secret" not in obs["receiver"]
    assert infos["sender"]["notes"] == ["message cut to its first 5 characters"]
    assert infos["receiver"]["notes"] == ["inactive this turn; action ignored"]
    assert infos["sender"]["reward_terms"] == {}

    _, rewards, term, _, infos = env.step({"receiver": "C"})
    assert rewards == {"sender": 1.0, "receiver": 1.0} and all(term.values())
    assert infos["sender"]["reward_terms"] == {"correct": 1.0, "answered_symbol": 1.0}


@pytest.mark.parametrize(
    "answer, correct, answered", [("D", 0.0, 1.0), ("zebra", 0.0, 0.0), ("", 0.0, 0.0), ("c!", 1.0, 1.0)]
)
def test_reward_terms(answer, correct, answered):
    env = make("textzoo/Relay-v0")
    env.reset(options={"index": 2})
    env.step({"sender": "C"})
    _, rewards, _, _, infos = env.step({"receiver": answer})
    assert rewards["receiver"] == rewards["sender"] == correct
    assert infos["receiver"]["reward_terms"] == {"correct": correct, "answered_symbol": answered}


def test_items_and_splits():
    train, held = make("textzoo/Relay-v0"), make("textzoo/Relay-v0", split="eval", num_symbols=6)
    assert train.num_items() == 16 and held.num_items() == 6
    assert make("textzoo/Relay-v0", split="all").num_items() == 20
    train_prompts = {train.reset(options={"index": i})[0]["sender"] for i in range(16)}
    assert len(train_prompts) == 16
    assert [train.reset(options={"index": i})[0]["sender"] for i in range(4)] == [
        f"Secret: {s}\nSend a short message so your partner can tell the secret.\nMessage:" for s in "ABCD"
    ]
    held4 = make("textzoo/Relay-v0", split="eval")
    assert not train_prompts & {held4.reset(options={"index": i})[0]["sender"] for i in range(4)}


def test_custom_symbols():
    env = make("textzoo/Relay-v0", symbols="red green blue")
    assert env.symbols == ["red", "green", "blue"] and env.num_items() == 12
    env.reset(options={"index": 1})
    env.step({"sender": "green"})
    assert env.step({"receiver": "Green."})[1]["receiver"] == 1.0


@pytest.mark.parametrize("split", ["train", "eval"])
def test_check_env(split):
    check_env(lambda: make("textzoo/Relay-v0", split=split, num_symbols=3), num_cycles=1000)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"num_symbols": 1}, "num_symbols"),
        ({"num_symbols": 27}, "num_symbols"),
        ({"symbols": ["A", "A"]}, "symbols"),
        ({"symbols": ["A", "two words"]}, "symbols"),
        ({"symbols": ["A", "B."]}, "symbols"),
        ({"symbols": ["A", "B"], "num_symbols": 3}, "num_symbols"),
        ({"message_chars": 0}, "message_chars"),
        ({"message_chars": 500}, "max_prompt_chars"),
        ({"split": "dev"}, "split"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(EnvError, match=match):
        make("textzoo/Relay-v0", **kwargs)
