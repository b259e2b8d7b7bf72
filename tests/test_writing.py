"""Writing-v0: reward terms against hand-computed values, items, splits, data, arguments."""

import json

import pytest

from textzoo.envs import check_env, make
from textzoo.envs import writing_v0 as w
from textzoo.envs._sources import procedural_paragraph
from textzoo.errors import EnvError

SOURCE = "In a desert outpost, the mayor painted a large mural."
S = "The mayor painted a mural."  # 5 words; content: mayor painted mural
E = (  # 16 words, "the" three times; content: mayor painted large mural desert outpost neighbors asked help
    "The mayor painted a large mural in the desert outpost because the neighbors asked for help."
)


def test_length_ratio():
    assert w.length_ratio_score(S, E) == pytest.approx(3 / 3.2)  # r = 16/5 = 3.2 > hi = 3
    assert w.length_ratio_score(S, S) == pytest.approx(0.5)  # r = 1 < lo = 2: r / lo
    assert w.length_ratio_score(S, " ".join([S] * 2) + " x") == 1.0  # r = 11/5 = 2.2 in [2, 3]
    assert w.length_ratio_score("", E) == 0.0 and w.length_ratio_score(S, "!!") == 0.0
    assert w.length_ratio_score(S, E, lo=4, hi=5) == pytest.approx(3.2 / 4)


def test_diversity():
    assert w.diversity_score(S, E) == pytest.approx((5 / 5 + 14 / 16) / 2)
    assert w.diversity_score("go go go go", "") == pytest.approx((1 / 4 + 0) / 2)


def test_length_limits():
    assert w.length_limits_score(S, E, 30, 90) == 1.0
    assert w.length_limits_score(S, E, 4, 90) == 0.5  # summary has 5 > 4 words
    assert w.length_limits_score("", E, 30, 15) == 0.0  # empty summary; elaboration 16 > 15


def test_coordination():
    assert w.content_words(S) == {"mayor", "painted", "mural"}
    # o_se = 3/3 -> 1; o_src = 6/9 in [0.3, 0.8] -> 1
    assert w.coordination_score(S, E, SOURCE) == 1.0
    # o_src = 0: nothing from the source -> band 0
    assert w.coordination_score(S, E, "A farmer sold apples.") == 0.5
    # copying the source: o_src = 1 -> (1 - 1) / (1 - 0.8) = 0
    assert w.coordination_score(SOURCE, SOURCE, SOURCE) == 0.5
    # content(S) = mayor paints harbor boats quickly; o_se = 1/5 -> 0.2 / 0.5 = 0.4; o_src = 6/13 -> 1
    assert w.coordination_score("Mayor paints harbor boats quickly.", E, SOURCE) == pytest.approx(0.7)
    assert w.coordination_score("", "", SOURCE) == 0.0


def _step(**kwargs):
    env = make("textzoo/Writing-v0", dataset=[SOURCE] * 5, split="all", **kwargs)
    env.reset(options={"index": 0})
    return env.step({"summary": S, "elaboration": E})


def test_team_reward_is_the_weighted_mean_for_every_agent():
    _, rewards, _, _, infos = _step()
    expected = {"length_ratio": 3 / 3.2, "diversity": (1 + 14 / 16) / 2, "length_limits": 1.0, "coordination": 1.0}
    assert infos["summary"]["reward_terms"] == pytest.approx(expected)
    assert infos["elaboration"]["reward_terms"] == pytest.approx(expected)
    assert rewards["summary"] == rewards["elaboration"] == pytest.approx(sum(expected.values()) / 4)

    _, rewards, _, _, infos = _step(terms={"length_ratio": 1.0, "length_limits": 3.0}, summary_max_words=4)
    assert set(infos["summary"]["reward_terms"]) == {"length_ratio", "length_limits"}
    assert rewards["summary"] == pytest.approx((3 / 3.2 + 3 * 0.5) / 4)
    assert infos["summary"]["notes"] == ["summary has 5 words, over its limit of 4"]

    _, rewards, _, _, _ = _step(terms={"length_ratio": 1.0})
    assert rewards["elaboration"] == pytest.approx(3 / 3.2)


def test_prompts_items_and_splits():
    env = make("textzoo/Writing-v0")
    assert env.num_items() == 320 and make("textzoo/Writing-v0", split="eval").num_items() == 80
    obs, _ = env.reset(options={"index": 4})
    assert procedural_paragraph(5) in obs["summary"]  # train item 4 is global item 5 (4 is held out)
    assert obs["summary"].endswith("Summary:") and obs["elaboration"].endswith("Elaboration:")
    sources = [procedural_paragraph(k) for k in range(400)]
    assert all(80 <= len(s) <= 300 for s in sources) and len(set(sources)) == 400
    train = {
        make("textzoo/Writing-v0", split="train").reset(options={"index": i})[0]["summary"] for i in range(0, 320, 7)
    }
    held = {make("textzoo/Writing-v0", split="eval").reset(options={"index": i})[0]["summary"] for i in range(80)}
    assert not train & held
    # the item set never depends on reset seeds
    a, b = make("textzoo/Writing-v0"), make("textzoo/Writing-v0")
    a.reset(seed=1), b.reset(seed=2)
    assert a.reset(options={"index": 9})[0] == b.reset(options={"index": 9})[0]
    long_env = make("textzoo/Writing-v0", dataset=["word " * 200] * 5, split="all", max_prompt_chars=200)
    assert all(len(p) <= 200 and p.endswith(":") for p in long_env.reset()[0].values())


def test_check_env_and_seeding():
    check_env(lambda: make("textzoo/Writing-v0", terms=["length_ratio"]), num_cycles=10)
    a, b = make("textzoo/Writing-v0"), make("textzoo/Writing-v0")
    assert a.reset(seed=5)[0] == b.reset(seed=5)[0]


def test_jsonl_and_dataset_objects(tmp_path):
    path = tmp_path / "src.jsonl"
    path.write_text("\n".join(json.dumps({"body": f"Paragraph number {i}."}) for i in range(10)) + "\n")
    env = make("textzoo/Writing-v0", dataset=str(path), text_field="body")
    assert env.num_items() == 8 and "Paragraph number 0." in env.reset(options={"index": 0})[0]["summary"]

    class FakeDataset(list):  # what matters of `datasets.Dataset`: column_names and dict rows
        column_names = ["text"]

    env = make("textzoo/Writing-v0", dataset=FakeDataset({"text": f"t{i}"} for i in range(5)), split="eval")
    assert env.num_items() == 1 and "t4" in env.reset()[0]["summary"]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"split": "test"}, "split"),
        ({"num_items": 0}, "num_items"),
        ({"terms": {"style": 1.0}}, "unknown term"),
        ({"terms": {"diversity": -1}}, "terms"),
        ({"terms": {}}, "at least one"),
        ({"summary_max_words": 0}, "summary_max_words"),
        ({"ratio_band": (3, 2)}, "ratio_band"),
        ({"max_prompt_chars": 50}, "max_prompt_chars"),
        ({"render_mode": "human"}, "render_mode"),
        ({"dataset": [{"body": "x"}]}, "text"),
        ({"dataset": 3.5}, "dataset"),
        ({"dataset": ["a", "b"], "split": "eval"}, "empty"),
        ({"colour": "red"}, "colour"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(EnvError, match=match):
        make("textzoo/Writing-v0", **kwargs)


def test_missing_file_names_the_path(tmp_path):
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(EnvError, match="nope.jsonl"):
        make("textzoo/Writing-v0", dataset=missing)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\nnot json\n')
    with pytest.raises(EnvError, match="line 2"):
        make("textzoo/Writing-v0", dataset=bad)


def test_aec_version():
    env = w.env()
    env.reset(seed=0)
    assert env.agent_selection == "summary"
