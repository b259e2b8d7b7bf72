"""TextParallelEnv: spaces, action cleaning, turns, state, errors."""

import copy
import gc
import weakref

import pytest

from textzoo.envs import TEXT_CHARSET, StepResult, TextParallelEnv, clean_text
from textzoo.errors import EnvError


class Echo(TextParallelEnv):
    metadata = {"name": "echo", "render_modes": ["ansi"], "is_parallelizable": True}
    WORDS = ["apple", "river", "stone"]

    def __init__(self, num_turns=1, render_mode=None):
        super().__init__(
            ["a", "b"], num_turns=num_turns, max_prompt_chars=64, max_action_chars=16, render_mode=render_mode
        )

    def num_items(self):
        return len(self.WORDS)

    def _reset_task(self, index):
        self.word = self.WORDS[index]
        return {a: f"Say {self.word}" for a in self.possible_agents}

    def _step_task(self, actions, notes):
        exact = {a: float(actions[a] == self.word) for a in actions}
        return StepResult(
            rewards=exact,
            observations={a: f"turn {self.turn + 1}: again" for a in actions},
            reward_terms={a: {"exact": exact[a]} for a in actions},
        )


def test_clean_text_cases():
    assert clean_text("fine text", 100) == ("fine text", [])
    text, notes = clean_text(None, 100)
    assert text == "None" and "NoneType" in notes[0]
    text, notes = clean_text("x" * 50, 10)
    assert text == "x" * 10 and "truncated" in notes[0]
    text, notes = clean_text("a\x00b\udcffc🙂", 100)
    assert text == "a?b?c?" and all(c in TEXT_CHARSET for c in text) and len(notes) == 1
    assert clean_text("héllo 你好\tok\n", 100) == ("héllo 你好\tok\n", [])


def test_spaces_are_stable_shared_and_independent():
    env1, env2 = Echo(), Echo()
    assert env1.observation_space("a") is env1.observation_space("a")
    assert env1.action_space("a") is not env2.action_space("a")
    assert env1.action_space("a")._char_index is env2.action_space("a")._char_index  # tables shared
    env1.action_space("a").seed(3)
    clone = copy.deepcopy(env1)
    assert clone.action_space("a").sample() == env1.action_space("a").sample()
    assert env1.observation_space("a").max_length == 64 and env1.action_space("a").max_length == 16


def test_envs_are_garbage_collected():
    env = Echo()
    env.observation_space("a"), env.action_space("b")
    ref = weakref.ref(env)
    del env
    gc.collect()
    assert ref() is None  # no lru_cache on methods holding every env forever


def test_turns_notes_state_and_render():
    env = Echo(num_turns=2, render_mode="ansi")
    obs, infos = env.reset(seed=0, options={"index": 1})
    assert obs == {"a": "Say river", "b": "Say river"}
    assert infos["a"] == {"turn": 0, "active": True, "item": 1}
    obs, rew, term, trunc, infos = env.step({"a": "river", "b": "z" * 40})
    assert rew == {"a": 1.0, "b": 0.0} and not any(term.values())
    assert obs["a"] == "turn 1: again"
    assert infos["b"]["notes"] == ["action truncated from 40 to 16 characters"]
    assert infos["a"]["reward_terms"] == {"exact": 1.0}
    obs, rew, term, trunc, infos = env.step({"a": "x"})
    assert all(term.values()) and env.agents == []
    assert infos["b"]["notes"] == ["no action given; treated as empty"]
    state = env.state()
    assert "Say river" in state and "<a action>\nriver" in state and env.render() == state
    with pytest.raises(EnvError, match="reset"):
        env.step({"a": "x"})


def test_bad_arguments_raise_env_error():
    with pytest.raises(EnvError, match="index"):
        Echo().reset(options={"index": 3})
    with pytest.raises(EnvError, match="distinct"):
        TextParallelEnv(["a", "a"])
    with pytest.raises(EnvError, match="render_mode"):
        Echo(render_mode="human")
    with pytest.raises(EnvError, match="num_turns"):
        Echo(num_turns=0)
    with pytest.raises(EnvError, match="max_prompt_chars"):
        TextParallelEnv(["a"], max_prompt_chars=0)


def test_empty_task_raises_env_error():
    class Empty(Echo):
        WORDS = []

    with pytest.raises(EnvError, match="no items"):
        Empty().reset()
