"""Declared tasks: one declaration checks every argument and gives the three PettingZoo entry points."""

import importlib
import inspect

import pytest
from pettingzoo.utils.conversions import parallel_to_aec_wrapper

from textzoo.envs import (
    SPLIT,
    Arg,
    StepResult,
    TextParallelEnv,
    entry_points,
    instance_of,
    integer,
    number,
    one_of,
    registry,
    spec,
    task,
)
from textzoo.errors import EnvError


@task("count_v0", target=integer(5, low=1, high=50), split=SPLIT, scale=number(1.0, low=0))
class CountEnv(TextParallelEnv):
    def __init__(self, target, split, scale):
        super().__init__(["writer"], num_turns=1, max_prompt_chars=64)
        self.target, self.split, self.scale = target, split, scale

    def num_items(self):
        return 1

    def _reset_task(self, index):
        return {"writer": f"Write {self.target} words:"}

    def _step_task(self, actions, notes):
        return StepResult(rewards={"writer": self.scale * float(len(actions["writer"].split()) == self.target)})


parallel_env, env, raw_env = entry_points(CountEnv)


@pytest.mark.parametrize(
    "arg, value, ok",
    [
        (integer(1, low=1), 1, True),
        (integer(1, low=1), 0, False),
        (integer(1, low=1), True, False),  # a bool is not an int here
        (integer(1, low=1), 2.0, False),
        (integer(None, low=1, optional=True), None, True),
        (integer(3, low=3, high=30), 30, True),
        (integer(3, low=3, high=30), 31, False),
        (number(0.5, low=0, high=0.5), 0, True),
        (number(0.5, low=0, high=0.5), 0.51, False),
        (number(0.5), float("nan"), False),
        (number(0.5), float("inf"), False),
        (number(0.5), False, False),
        (one_of(1, 1, 2), 2, True),
        (one_of(1, 1, 2), 2.0, False),  # compared by value and type
        (one_of(1, 1, 2), True, False),
        (SPLIT, "eval", True),
        (SPLIT, "test", False),
        (instance_of(dict), {}, True),
        (instance_of(dict), None, True),
        (instance_of(dict), [], False),
        (Arg(False, bool), 1, False),
    ],
)
def test_accepts(arg, value, ok):
    assert arg.accepts(value) is ok


@pytest.mark.parametrize(
    "arg, phrase",
    [
        (integer(1, low=1), "a positive int"),
        (integer(0, low=0), "an int >= 0"),
        (integer(3, low=3, high=30), "an int in [3, 30]"),
        (integer(None, low=1, optional=True), "a positive int or None"),
        (number(0.25, low=0, high=0.5), "a number in [0, 0.5]"),
        (SPLIT, "one of 'train', 'eval', 'all'"),
        (one_of(None, None, "ansi"), "one of None, 'ansi'"),
        (instance_of(dict), "a dict or None"),
    ],
)
def test_allowed_phrase(arg, phrase):
    assert arg.allowed() == phrase


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"target": 0}, r"count_v0: target must be an int in \[1, 50\], got 0"),
        ({"target": True}, r"count_v0: target must be an int in \[1, 50\], got True"),
        ({"split": "dev"}, r"count_v0: split must be one of 'train', 'eval', 'all', got 'dev'"),
        ({"scale": -1}, r"count_v0: scale must be a number >= 0, got -1"),
        ({"colour": 1}, r"count_v0 got unknown argument\(s\) \['colour'\]; it accepts: target, split, scale"),
    ],
)
def test_a_bad_call_names_the_argument_and_what_it_accepts(kwargs, message):
    for build in (CountEnv, parallel_env, env, raw_env):
        with pytest.raises(EnvError, match=message):
            build(**kwargs)


def test_defaults_filled_and_positional_calls_bound():
    e = CountEnv()
    assert (e.target, e.split, e.scale) == (5, "train", 1.0)
    e = parallel_env(7, "eval")
    assert (e.target, e.split, e.scale) == (7, "eval", 1.0)
    assert e.metadata["name"] == "count_v0"
    with pytest.raises(EnvError, match="count_v0: too many positional arguments"):
        parallel_env(1, "eval", 1.0, 4)


def test_entry_points_show_the_declared_signature():
    expected = "(target=5, split='train', scale=1.0)"
    for fn in (CountEnv, parallel_env, env, raw_env):
        assert str(inspect.signature(fn)) == expected


def test_env_and_raw_env_are_the_aec_versions():
    raw = raw_env(target=2)
    assert isinstance(raw, parallel_to_aec_wrapper) and raw.env.target == 2
    aec = env(target=2)
    aec.reset(seed=0)
    assert aec.agent_selection == "writer"
    aec.step("two words")
    assert aec.rewards["writer"] == 1.0


def test_a_declaration_that_disagrees_with_its_class_fails_at_import():
    with pytest.raises(TypeError, match="must take the declared arguments"):

        @task("bad_v0", a=integer(1))
        class Bad(TextParallelEnv):
            def __init__(self, b):
                pass

    with pytest.raises(TypeError, match="without defaults"):

        @task("bad_v0", a=integer(1))
        def build(a=2):
            pass

    with pytest.raises(TypeError, match="the default of 'a'"):
        task("bad_v0", a=integer(0, low=1))


BUILT_IN = sorted(i for i in registry() if i.startswith("textzoo/") and i != "textzoo/TextArena-v0")


@pytest.mark.parametrize("env_id", BUILT_IN)
def test_every_built_in_task_is_declared(env_id):
    """Each built-in module's entry points come from one declaration (TextArena's is its AEC class's)."""
    module = importlib.import_module(spec(env_id).entry_point.partition(":")[0])
    declaration = module.parallel_env.declaration
    for name in ("parallel_env", "env", "raw_env"):
        fn = getattr(module, name)
        assert fn.declaration is declaration
        assert list(inspect.signature(fn).parameters) == list(declaration.args)
    assert "split" in declaration.args and declaration.args["split"] is SPLIT


def test_entry_points_pickle_by_reference():
    import pickle

    from textzoo.envs import writing_v0

    for name in ("parallel_env", "env", "raw_env"):
        fn = getattr(writing_v0, name)
        assert pickle.loads(pickle.dumps(fn)) is fn
