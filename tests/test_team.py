"""Team-v0 and the TRL-style reward plumbing (`textzoo.envs.rewards`)."""

import json
import math

import pytest

from textzoo.envs import check_env, make
from textzoo.envs.rewards import RewardFunctions
from textzoo.envs.team_v0 import render_prompt
from textzoo.errors import EnvError


def brief(prompts, completions, **kwargs):
    return [1.0 if len(c.split()) <= 3 else 0.0 for c in completions]


def exact(prompts, completions, answer, **kwargs):
    return [float(c.strip() == a) for c, a in zip(completions, answer)]


ROWS = [{"prompt": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(10)]


def test_docstring_example():
    def brief(prompts, completions, **kwargs):
        return [1.0 if len(c.split()) <= 20 else 0.0 for c in completions]  # noqa: E704

    env = make("textzoo/Team-v0", prompts=["Name a color.", "Describe rain."], agents=2, reward_fns=brief, split="all")
    obs, _ = env.reset(seed=0)
    assert set(obs) == {"agent_0", "agent_1"}
    assert env.step({"agent_0": "red", "agent_1": "x " * 30})[1] == {"agent_0": 1.0, "agent_1": 0.0}


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_n_agents_pass_check_env(n):
    env_fn = lambda: make("textzoo/Team-v0", prompts=ROWS, agents=n, reward_fns=[brief, exact])  # noqa: E731
    check_env(env_fn, num_cycles=1000)
    env = env_fn()
    assert env.possible_agents == [f"agent_{i}" for i in range(n)]
    obs, _ = env.reset(options={"index": 0})
    assert set(obs.values()) == {"What is 0 + 0?"}


def test_weights_none_nan_team_and_arguments_passed():
    seen = {}

    def spy(prompts, completions, agent_id, other_completions, answer):
        seen[agent_id] = (prompts, completions, other_completions, answer)
        return [None] if agent_id == "b" else [math.nan] if agent_id == "c" else [1.0]

    def team(prompts, completions, answer, **kwargs):
        return [sum(c == answer[0] for c in completions[0].values()) / len(completions[0])]

    env = make(
        "textzoo/Team-v0",
        prompts=ROWS,
        agents=["a", "b", "c"],
        reward_fns=[exact, spy],
        reward_weights=[2.0, 0.5],
        team_reward_fn=team,
        split="all",
    )
    env.reset(options={"index": 2})
    _, rewards, _, _, infos = env.step({"a": "4", "b": "4", "c": "5"})
    team_value = 2 / 3
    assert rewards["a"] == pytest.approx(2.0 * 1 + 0.5 * 1 + team_value)
    assert rewards["b"] == pytest.approx(2.0 * 1 + team_value)
    assert rewards["c"] == pytest.approx(team_value)
    assert infos["a"]["reward_terms"] == pytest.approx({"exact": 1.0, "spy": 1.0, "team": team_value})
    assert infos["b"]["notes"] == ["reward 'spy' not applicable (None); scored 0"]
    assert infos["c"]["notes"] == ["reward 'spy' returned nan; scored 0"]
    assert seen["a"] == (["What is 2 + 2?"], ["4"], {"b": ["4"], "c": ["5"]}, ["4"])


def test_team_reward_only_and_per_agent_fns():
    def team(prompts, completions, **kwargs):
        return [float(len({c for c in completions[0].values()}) == 1)]

    env = make("textzoo/Team-v0", prompts=ROWS, agents=2, team_reward_fn=team)
    env.reset()
    assert env.step({"agent_0": "x", "agent_1": "x"})[1] == {"agent_0": 1.0, "agent_1": 1.0}

    env = make(
        "textzoo/Team-v0",
        prompts=ROWS,
        agents=["w", "r"],
        reward_fns={"w": brief, "r": [exact]},
        reward_weights={"r": [3.0]},
    )
    env.reset(options={"index": 1})
    _, rewards, _, _, infos = env.step({"w": "one two three four", "r": "2"})
    assert rewards == {"w": 0.0, "r": 3.0} and infos["r"]["reward_terms"] == {"exact": 1.0}


def test_prompt_sources(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text("\n".join(json.dumps({"q": r["prompt"], "answer": r["answer"]}) for r in ROWS))
    env = make("textzoo/Team-v0", prompts=path, prompt_field="q", reward_fns=exact, split="eval")
    assert env.num_items() == 2 and env.reset(options={"index": 0})[0]["agent_0"] == "What is 4 + 4?"

    chat = [{"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]}] * 5
    env = make("textzoo/Team-v0", prompts=chat, reward_fns=brief, agents=1)
    assert env.reset()[0]["agent_0"] == "system: Be brief.\nuser: Hi" == render_prompt(chat[0]["prompt"])

    rows = [{"ask": f"Ask {i}", "tell": f"Tell {i}"} for i in range(5)]
    env = make(
        "textzoo/Team-v0",
        prompts=rows,
        agents=["x", "y"],
        prompt_field={"x": "ask", "y": "tell"},
        reward_fns=brief,
        split="all",
    )
    assert env.reset(options={"index": 3})[0] == {"x": "Ask 3", "y": "Tell 3"}


def needs_foo(prompts, completions, foo):
    return [0.0] * len(completions)


def positional_only(prompts, completions, /):
    return [0.0]


def no_completions(prompts):
    return [0.0]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({}, "reward_fns"),
        ({"prompts": None}, "prompts is required"),
        ({"agents": 0}, "agents"),
        ({"agents": ["a", "a"]}, "agents"),
        ({"reward_fns": needs_foo}, "needs_foo.*foo"),
        ({"reward_fns": positional_only}, "positional-only"),
        ({"reward_fns": no_completions}, "completions"),
        ({"reward_fns": [brief, "nope"]}, "callable"),
        ({"reward_fns": [brief], "reward_weights": [1.0, 2.0]}, "weights"),
        ({"reward_fns": {"agent_0": brief}}, "one entry per agent"),
        ({"reward_fns": brief, "prompt_field": "question"}, "question"),
        ({"reward_fns": brief, "split": "validation"}, "split"),
        ({"reward_fns": brief, "prompts": [{"prompt": "p", "completions": "c"}] * 5}, "clash"),
        ({"reward_fns": brief, "prompts": ["p"] * 4, "split": "eval"}, "empty"),
        ({"reward_fns": brief, "max_prompt_chars": -1}, "max_prompt_chars"),
    ],
)
def test_bad_arguments(kwargs, match):
    kwargs = {"prompts": ROWS, **kwargs}
    with pytest.raises(EnvError, match=match):
        make("textzoo/Team-v0", **kwargs)


def test_missing_file_names_the_path(tmp_path):
    with pytest.raises(EnvError, match="missing.jsonl"):
        make("textzoo/Team-v0", prompts=tmp_path / "missing.jsonl", reward_fns=brief)


def test_reward_functions_batch_and_output_checks():
    fns = RewardFunctions([brief, lambda prompts, completions, **kw: [None, 2.0]], weights=[1.0, -0.5])
    totals, terms, notes = fns(["p", "q"], ["short", "far too many words here"])
    assert totals == [1.0, -1.0]
    assert terms == [{"brief": 1.0, "<lambda>": 0.0}, {"brief": 0.0, "<lambda>": 2.0}]
    assert notes == [["reward '<lambda>' not applicable (None); scored 0"], []]
    assert RewardFunctions([brief, brief]).names == ["brief", "brief_1"]
    with pytest.raises(EnvError, match="2 values for 1"):
        RewardFunctions(lambda prompts, completions: [1.0, 2.0])(["p"], ["c"])
    with pytest.raises(EnvError, match="number or None"):
        RewardFunctions(lambda prompts, completions: ["good"])(["p"], ["c"])
    with pytest.raises(EnvError, match="list"):
        RewardFunctions(lambda prompts, completions: 1.0)(["p"], ["c"])
