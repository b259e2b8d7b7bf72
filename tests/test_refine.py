"""Refine-v0: turns, activity, the per-refiner decomposition of the score, items, splits, arguments."""

import pytest
import torch

torch.set_num_threads(1)

from textzoo.envs import check_env, make  # noqa: E402
from textzoo.envs.base import words  # noqa: E402
from textzoo.envs.refine_v0 import KEYWORDS, loops  # noqa: E402
from textzoo.errors import EnvError  # noqa: E402


def test_passes_check_env_for_one_to_four_refiners():
    for n in (1, 2, 4):
        check_env(lambda n=n: make("textzoo/Refine-v0", num_refiners=n), num_cycles=50)


def test_two_turns_and_the_pipeline():
    env = make("textzoo/Refine-v0", num_refiners=2, keywords=[["apple"], ["river"]], rewrite_chars=20)
    assert env.possible_agents == ["refiner_0", "refiner_1", "generator"]
    obs, infos = env.reset(seed=0, options={"index": 0})
    assert 'use the word "apple"' in obs["refiner_0"] and 'use the word "river"' in obs["refiner_1"]
    assert "apple" not in obs["refiner_1"] and "river" not in obs["refiner_0"]  # each knows only its own
    assert infos["refiner_0"]["active"] and infos["refiner_1"]["active"] and not infos["generator"]["active"]

    long = "Mention apple please, it is really important to do so"
    obs, rewards, term, _, infos = env.step({"refiner_0": long, "refiner_1": "say river", "generator": "x"})
    assert rewards == {"refiner_0": 0.0, "refiner_1": 0.0, "generator": 0.0} and not any(term.values())
    assert infos["generator"]["active"] and not infos["refiner_0"]["active"] and not infos["refiner_1"]["active"]
    assert obs["generator"] == "Instructions:\nMention apple please\nsay river\nAnswer:"  # cut to 20 characters
    assert infos["refiner_0"]["notes"] == ["rewrite cut to its first 20 characters"]
    assert infos["generator"]["notes"] == ["inactive this turn; action ignored"]

    _, rewards, term, _, infos = env.step({"generator": "An Apple fell."})
    assert all(term.values())
    # refiner_0's constraint holds, refiner_1's does not: each refiner gets its own term, generator the mean
    assert rewards == {"refiner_0": 1.0, "refiner_1": 0.0, "generator": 0.5}
    assert infos["refiner_1"]["reward_terms"] == {
        "team": 0.5,
        "refiner_0": 1.0,
        "refiner_1": 0.0,
        "on_topic": 0.0,
        "no_loop": 1.0,
    }
    assert sum(rewards.values()) / len(rewards) == 0.5  # the mean over roles is the task score
    assert infos["generator"]["notes"] == ["answer misses the word(s) ['river']"]


@pytest.mark.parametrize("n", [1, 3, 4])
def test_mean_of_rewards_is_the_team_score(n):
    env = make("textzoo/Refine-v0", num_refiners=n)
    env.reset(seed=1, options={"index": 2})
    env.step({r: "" for r in env.refiners})
    hit = env.keywords["refiner_0"]
    _, rewards, _, _, infos = env.step({"generator": f"only {hit} here"})
    team = 1.0 / n
    assert rewards["refiner_0"] == 1.0 and all(rewards[r] == 0.0 for r in env.refiners[1:])
    assert rewards["generator"] == pytest.approx(team)
    assert sum(rewards.values()) / (n + 1) == pytest.approx(team)
    assert infos["generator"]["reward_terms"]["team"] == pytest.approx(team)


def test_words_are_matched_whole_and_case_insensitively():
    assert words("Apples, APPLE! pine-apple") == ["apples", "apple", "pine", "apple"]
    env = make("textzoo/Refine-v0", num_refiners=1, keywords=[["apple"]])
    env.reset(seed=0)
    env.step({"refiner_0": "hi"})
    assert env.step({"generator": "pineapples"})[1]["refiner_0"] == 0.0


def test_default_pools_are_disjoint_and_items_reproducible():
    env = make("textzoo/Refine-v0", num_refiners=3)
    assert sum(len(p) for p in env.pools) == len(KEYWORDS)
    assert not set(env.pools[0]) & set(env.pools[1])
    seen = []
    for _ in range(2):
        env.reset(seed=5, options={"index": 7})
        seen.append((env.topic, dict(env.keywords)))
    assert seen[0] == seen[1]
    assert all(env.keywords[r] in env.pools[i] for i, r in enumerate(env.refiners))


def test_splits_are_disjoint():
    train = make("textzoo/Refine-v0", num_items=20, split="train")
    held = make("textzoo/Refine-v0", num_items=20, split="eval")
    assert (train.num_items(), held.num_items()) == (16, 4)
    assert not set(train._items) & set(held._items)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"num_refiners": 0}, "num_refiners"),
        ({"num_refiners": 2, "keywords": [["apple"]]}, "one list of words per refiner"),
        ({"num_refiners": 2, "keywords": [["apple"], ["apple"]]}, "several refiners"),
        ({"num_refiners": 1, "keywords": [["two words"]]}, "single lower-case words"),
        ({"num_refiners": 1, "keywords": [[]]}, "non-empty"),
        ({"num_refiners": 30}, "at most"),
        ({"num_refiners": 8, "rewrite_chars": 200, "max_prompt_chars": 512}, "max_prompt_chars"),
        ({"num_items": 3, "split": "eval"}, "empty"),
    ],
)
def test_bad_arguments_name_the_fix(kwargs, message):
    with pytest.raises(EnvError, match=message):
        make("textzoo/Refine-v0", **kwargs)


def _answer(env, answer: str) -> tuple[dict[str, float], dict]:
    """Play item 0 with filler rewrites and `answer`; its rewards and the generator's info."""
    env.reset(seed=0, options={"index": 0})
    env.step(dict.fromkeys(env.refiners, "a rewrite"))
    _, rewards, _, _, infos = env.step({"generator": answer})
    return rewards, infos["generator"]


def test_on_topic_is_shown_apart_from_the_score():
    """`on_topic` says whether the answer names the topic's noun; no reward reads it."""
    env = make("textzoo/Refine-v0", num_refiners=1, keywords=[["apple"]])
    env.reset(seed=0, options={"index": 0})
    noun = env.topic.split()[-1]
    rewards, info = _answer(env, f"An apple near the {noun.upper()}.")
    assert info["reward_terms"] == {"team": 1.0, "refiner_0": 1.0, "on_topic": 1.0, "no_loop": 1.0}
    off, info = _answer(env, 'The writer meets the word "apple".')
    assert info["reward_terms"]["on_topic"] == 0.0 and off == rewards  # the rewards ignore it


@pytest.mark.parametrize(
    ("text", "loop"),
    [
        ("green green green", True),  # one word three times in a row
        ("green green", False),  # twice is not a loop
        ("the green oasis, green and green", False),  # three times, not in a row
        ("a b c d a b c d a b c d", True),  # four words, three times
        ("a b c d e a b c d e a b c d e", False),  # five words: longer than LOOP_WORDS
        ("x y z x y z x y", False),  # the third time is cut short
        ("", False),
    ],
)
def test_loops_by_hand(text, loop):
    assert loops(words(text)) is loop


def test_no_loop_is_shown_apart_from_the_score():
    """`no_loop` is 0 for an answer that loops; no reward reads it."""
    env = make("textzoo/Refine-v0", num_refiners=1, keywords=[["green"]], require_topic=True)
    env.reset(seed=0, options={"index": 0})
    noun = env.topic.split()[-1]
    looped, info = _answer(env, f"The {noun} was green green green green.")
    assert info["reward_terms"] == {"team": 1.0, "refiner_0": 1.0, "on_topic": 1.0, "no_loop": 0.0}
    plain, info = _answer(env, f"The {noun} was green.")
    assert info["reward_terms"]["no_loop"] == 1.0 and plain == looped  # the rewards ignore it


def test_require_topic_counts_a_keyword_only_on_topic():
    env = make("textzoo/Refine-v0", num_refiners=2, keywords=[["apple"], ["river"]], require_topic=True)
    env.reset(seed=0, options={"index": 0})
    noun = env.topic.split()[-1]
    rewards, info = _answer(env, "The writer meets apple and river.")  # both words, no topic
    assert rewards == {"refiner_0": 0.0, "refiner_1": 0.0, "generator": 0.0}
    assert info["reward_terms"] == {
        "team": 0.0,
        "refiner_0": 0.0,
        "refiner_1": 0.0,
        "on_topic": 0.0,
        "no_loop": 1.0,
    }
    assert info["notes"] == [f"answer does not name the topic ({noun!r}): no keyword counts"]
    rewards, info = _answer(env, f"An apple by the {noun}.")  # on topic, one word of two
    assert rewards == {"refiner_0": 1.0, "refiner_1": 0.0, "generator": 0.5}
    assert info["notes"] == ["answer misses the word(s) ['river']"]


def test_the_on_topic_preset_requires_the_topic():
    from textzoo.envs.refine_v0 import PRESETS

    preset = PRESETS["two-keywords-on-topic"]
    assert preset.env_kwargs == {**PRESETS["two-keywords"].env_kwargs, "require_topic": True}
    assert make("textzoo/Refine-v0", **preset.env_kwargs).require_topic
