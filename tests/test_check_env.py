"""check_env: passes good tasks (every registered one), fails broken ones with a useful message."""

import importlib
import math
import random

import pytest

from textzoo.envs import StepResult, TextParallelEnv, check_env, make, register, registry
from textzoo.envs.checks import EnvCheckError
from textzoo.errors import EnvError

# `textzoo.envs.registry` the attribute is the function; the module must be looked up by name.
registry_module = importlib.import_module("textzoo.envs.registry")


# The README example ("Write and check your own task"), verbatim.
class EchoEnv(TextParallelEnv):
    """Echo-v0: both agents repeat a word. Reward term `exact`: 1 if the answer is the word."""

    metadata = {"name": "echo_v0", "render_modes": ["ansi"], "is_parallelizable": True}
    WORDS = ["apple", "river", "stone", "cloud"]

    def __init__(self, render_mode=None):
        super().__init__(["alice", "bob"], num_turns=1, max_prompt_chars=64, render_mode=render_mode)

    def num_items(self):
        return len(self.WORDS)

    def _reset_task(self, index):  # prompts depend on the index only
        self.word = self.WORDS[index]
        return {a: f"Repeat the word: {self.word}\nAnswer:" for a in self.possible_agents}

    def _step_task(self, actions, notes):  # actions are already cleaned str
        exact = {a: float(actions[a].strip() == self.word) for a in actions}
        team = sum(exact.values()) / len(exact)
        return StepResult(rewards=dict.fromkeys(actions, team), reward_terms={a: {"exact": exact[a]} for a in actions})


def test_readme_example_passes(monkeypatch):
    check_env(EchoEnv)
    monkeypatch.setattr(registry_module, "_REGISTRY", dict(registry_module._REGISTRY))  # keep me/Echo-v0 local
    register("me/Echo-v0", EchoEnv)
    check_env(lambda: make("me/Echo-v0"))


def test_instance_is_deep_copied():
    env = EchoEnv()
    check_env(env, num_cycles=10)
    assert env.agents == []  # the instance passed in was never stepped


def _brief(prompts, completions, **kwargs):
    return [1.0 if len(c.split()) <= 5 else 0.0 for c in completions]


# Tasks that need arguments to be built; every other registered task must work with defaults.
REQUIRED_KWARGS = {"textzoo/Team-v0": {"prompts": [f"Prompt {i}." for i in range(10)], "reward_fns": _brief}}


@pytest.mark.parametrize("env_id", registry())
@pytest.mark.parametrize("split", ["train", "eval"])
def test_every_registered_task_passes(env_id, split):
    check_env(lambda: make(env_id, split=split, **REQUIRED_KWARGS.get(env_id, {})), num_cycles=1000)


class NanReward(EchoEnv):
    def _step_task(self, actions, notes):
        result = super()._step_task(actions, notes)
        result.rewards = dict.fromkeys(actions, math.nan if actions["alice"] == "" else 1.0)
        return result


class RaisesOnEmoji(EchoEnv):
    def _step_task(self, actions, notes):
        actions["alice"].encode("ascii")  # a UnicodeEncodeError on non-ASCII text
        return super()._step_task(actions, notes)


class RandomPrompt(EchoEnv):
    def _reset_task(self, index):
        prompts = super()._reset_task(index)
        return {a: p + str(self.np_random.integers(10**6)) for a, p in prompts.items()}


class Unseeded(EchoEnv):
    def reset(self, seed=None, options=None):
        if options is None or "index" not in options:
            options = {"index": random.randrange(self.num_items())}  # ignores the seed
        return super().reset(seed=seed, options=options)


class BadTerms(EchoEnv):
    def _step_task(self, actions, notes):
        result = super()._step_task(actions, notes)
        result.reward_terms = {a: {"exact": math.inf} for a in actions}
        return result


class AlwaysNan(EchoEnv):
    """A NaN reward whatever the action: PettingZoo's seed test alone would call it a seeding problem."""

    def _step_task(self, actions, notes):
        result = super()._step_task(actions, notes)
        result.rewards = dict.fromkeys(actions, math.nan)
        return result


class MissingReward(EchoEnv):
    def _step_task(self, actions, notes):
        result = super()._step_task(actions, notes)
        result.rewards = {"alice": result.rewards["alice"]}  # bob's would be read as 0.0
        return result


class LongPrompt(EchoEnv):
    def _reset_task(self, index):
        return {a: "Repeat the word, slowly and with care: " * 3 + self.WORDS[index] for a in self.possible_agents}


@pytest.mark.parametrize(
    "env_cls, message",
    [
        (AlwaysNan, r"gave 'alice' the reward nan; rewards must be finite numbers"),
        (MissingReward, r"no reward for 'bob' \(read as 0.0"),
        (LongPrompt, r"item 0, reset: the prompt of 'alice' is 122 characters, longer than max_prompt_chars=64"),
        (NanReward, "finite"),
        (RaisesOnEmoji, "Any action must be legal"),
        (RandomPrompt, "index alone"),
        (Unseeded, "seed"),
        (BadTerms, "reward_terms"),
    ],
)
def test_broken_tasks_fail_with_a_fix(env_cls, message):
    with pytest.raises(EnvCheckError, match=message) as info:
        check_env(env_cls, num_cycles=10)
    assert isinstance(info.value, EnvError) and isinstance(info.value, AssertionError)


def test_not_an_env():
    with pytest.raises(EnvCheckError, match="callable"):
        check_env(42)
