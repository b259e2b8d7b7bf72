"""`check_env`: PettingZoo's conformance tests plus textzoo's text-task checks, for any task.

Run it on your own task before training on it::

    from textzoo.envs import check_env
    check_env(lambda: MyTask(split="train"))

It raises `EnvCheckError` (an `EnvError` and an `AssertionError`) whose message says what is wrong
and how to fix it, and returns None when the task passes.
"""

from __future__ import annotations

import contextlib
import copy
import io
import math
import numbers
from collections.abc import Callable
from typing import Any

from pettingzoo import ParallelEnv
from pettingzoo.test import parallel_api_test, parallel_seed_test

from textzoo.envs.base import StepResult, TextParallelEnv
from textzoo.errors import EnvError

# What a model (or a broken runner) may send; every one must be scored, never raise.
BAD_ACTIONS: dict[str, Any] = {
    "random": "qz7 Xv!! ##;; plo\tk\n 0x1f",
    "empty": "",
    "huge (1 MB)": "a" * (1 << 20),
    "control characters": "ok\x00\x01\x07\x1b[31m\x7f\x9bend",
    "lone surrogate": "bad \udcff text \ud800",
    "non-ASCII (emoji, CJK)": "héllo 🙂🚀 你好世界 안녕 Ωμέγα",
    "None": None,
    "int": 123,
    "bytes": b"\xff\xfe",
    "missing": ...,  # the agent is left out of the actions dict
}


class EnvCheckError(EnvError, AssertionError):
    """A task failed `check_env`; the message says how to fix it."""


def check_env(env_fn_or_env: Callable[[], ParallelEnv] | ParallelEnv, num_cycles: int = 1000) -> None:
    """Check a text task: PettingZoo's `parallel_api_test` (`num_cycles`) and `parallel_seed_test`,
    then textzoo's checks (bad actions of every kind for every agent, finite rewards, observations
    inside their spaces, `reward_terms`/`notes` infos, `state()`, `options={"index": i}`, seeding).

    Pass a zero-argument constructor (e.g. `lambda: MyTask(split="eval")`). Given an instance,
    fresh copies are made with `copy.deepcopy` of it as it was when passed in.
    """
    if isinstance(env_fn_or_env, ParallelEnv):
        pristine = copy.deepcopy(env_fn_or_env)

        def env_fn() -> ParallelEnv:
            return copy.deepcopy(pristine)
    elif callable(env_fn_or_env):
        env_fn = env_fn_or_env
    else:
        raise EnvCheckError(
            "check_env needs a ParallelEnv or a zero-argument callable that builds one, "
            f"got {type(env_fn_or_env).__name__}"
        )
    name = _name(env_fn())
    _check_task_outputs(env_fn, name)  # first: a NaN reward is named as one, not as a seeding failure
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # it prints "Passed Parallel API test"
            parallel_api_test(env_fn(), num_cycles=num_cycles)
    except AssertionError as e:
        raise EnvCheckError(f"{name}: PettingZoo parallel_api_test failed: {e or 'see the traceback'}") from e
    except Exception as e:
        raise EnvCheckError(f"{name}: PettingZoo parallel_api_test raised {_random_action_hint(e)}") from e
    try:
        parallel_seed_test(env_fn, num_cycles=num_cycles)
    except AssertionError as e:
        raise EnvCheckError(
            f"{name}: PettingZoo parallel_seed_test failed ({e or 'see the traceback'}): two copies reset "
            f"with seed=42 and given the same actions must return equal observations, rewards and infos; "
            f"draw all randomness from self.np_random (seeded in reset) and keep infos free of ids/times"
        ) from e
    except Exception as e:
        raise EnvCheckError(f"{name}: PettingZoo parallel_seed_test raised {_random_action_hint(e)}") from e
    _check_bad_actions(env_fn, name, num_cycles)
    _check_index_option(env_fn, name)
    _check_seeding(env_fn, name)


def _check_task_outputs(env_fn: Callable[[], ParallelEnv], name: str, max_items: int = 64) -> None:
    """For a `TextParallelEnv`: what its `_reset_task` / `_step_task` return, before the base class would hide
    it: a prompt longer than `max_prompt_chars` (the base cuts it), a reward missing for an agent (the base
    reads it as 0.0) and a reward that is not a finite number. Plays up to `max_items` items, empty actions."""
    env = env_fn()
    if not isinstance(env, TextParallelEnv):
        return
    reset_task, step_task = env._reset_task, env._step_task
    where = ["reset"]

    def check_prompts(prompts: dict[str, Any]) -> None:
        for agent, prompt in prompts.items():
            if isinstance(prompt, str) and len(prompt) > env.max_prompt_chars:
                _fail(
                    name,
                    f"{where[0]}: the prompt of {agent!r} is {len(prompt)} characters, longer than "
                    f"max_prompt_chars={env.max_prompt_chars}: the agent would see only its first "
                    f"{env.max_prompt_chars}. Raise the task's max_prompt_chars (text_args(max_prompt_chars=...)) "
                    f"or write shorter prompts",
                )

    def reset(index: int) -> Any:
        prompts = reset_task(index)
        check_prompts(prompts[0] if isinstance(prompts, tuple) else prompts)
        return prompts

    def step(actions: dict[str, str], notes: dict[str, list[str]]) -> StepResult:
        result = step_task(actions, notes)
        for agent in env.agents:
            if agent not in result.rewards:
                _fail(
                    name,
                    f"{where[0]}: _step_task gave no reward for {agent!r} (read as 0.0 without a word); give "
                    f"every agent in env.agents its reward each step, 0.0 explicitly when it scored nothing",
                )
            if not _is_finite_number(result.rewards[agent]):
                _fail(
                    name,
                    f"{where[0]}: _step_task gave {agent!r} the reward {result.rewards[agent]!r}; rewards must be "
                    f"finite numbers: score bad text low (e.g. 0.0) instead of nan/inf/None",
                )
        check_prompts(result.observations)
        return result

    env._reset_task, env._step_task = reset, step  # this copy only: the check reads what the task returns
    for index in range(min(env.num_items(), max_items)):
        where[0] = f"item {index}, reset"
        env.reset(seed=0, options={"index": index})
        turn = 0
        while env.agents:
            where[0] = f"item {index}, turn {turn}"
            env.step(dict.fromkeys(env.agents, ""))
            turn += 1
    env.close()


def _random_action_hint(e: Exception) -> str:
    return (
        f"{type(e).__name__}: {e}. It steps with random text from action_space(agent).sample(); "
        f"Any action must be legal: score garbage low and explain it in infos[agent]['notes']"
    )


def _name(env: ParallelEnv) -> str:
    return str(getattr(env, "metadata", {}).get("name", type(env).__name__))


def _fail(name: str, msg: str) -> None:
    raise EnvCheckError(f"{name}: {msg}")


def _check_obs(env: ParallelEnv, obs: dict, name: str, where: str) -> None:
    for agent in env.agents:
        if agent not in obs:
            _fail(name, f"{where}: no observation for live agent {agent!r}; return one prompt per agent in env.agents")
        o = obs[agent]
        if not isinstance(o, str):
            _fail(name, f"{where}: observation of {agent!r} is {type(o).__name__}, not str; observations are prompts")
        if not env.observation_space(agent).contains(o):
            _fail(
                name,
                f"{where}: observation of {agent!r} (len {len(o)}) is outside observation_space(agent); clip "
                f"prompts to max_prompt_chars and keep to TEXT_CHARSET (TextParallelEnv does both)",
            )


def _check_state(env: ParallelEnv, name: str, where: str) -> None:
    try:
        s = env.state()
    except Exception as e:  # a missing state() is a failed check, not a crash of the checker
        _fail(name, f"{where}: state() raised {type(e).__name__}: {e}; return the global text view (a str)")
    if not isinstance(s, str):
        _fail(name, f"{where}: state() returned {type(s).__name__}; it must return the global text view as a str")


def _is_finite_number(x: Any) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(float(x))


def _check_step_output(env: ParallelEnv, agents: list[str], out: tuple, name: str, where: str) -> None:
    obs, rewards, terminations, truncations, infos = out
    for agent in agents:
        if not _is_finite_number(rewards.get(agent)):
            _fail(
                name,
                f"{where}: reward of {agent!r} is {rewards.get(agent)!r}; rewards must be finite floats; "
                f"score bad text low (e.g. 0.0) instead of nan/inf/None",
            )
        info = infos.get(agent)
        if not isinstance(info, dict):
            _fail(name, f"{where}: infos[{agent!r}] is {type(info).__name__}; give every agent an info dict")
        terms = info.get("reward_terms")
        if not isinstance(terms, dict) or not all(
            isinstance(k, str) and _is_finite_number(v) for k, v in terms.items()
        ):
            _fail(
                name,
                f"{where}: infos[{agent!r}]['reward_terms'] is {terms!r}; after a step it must be a dict of "
                f"term name -> finite float (an empty dict when nothing was scored this turn)",
            )
        notes = info.get("notes")
        if not isinstance(notes, list) or not all(isinstance(n, str) for n in notes):
            _fail(
                name,
                f"{where}: infos[{agent!r}]['notes'] is {notes!r}; after a step it must be a list of str "
                f"saying what was wrong with the action (empty when nothing was)",
            )
    _check_obs(env, obs, name, where)
    _check_state(env, name, where)


def _check_bad_actions(env_fn: Callable[[], ParallelEnv], name: str, num_cycles: int) -> None:
    env = env_fn()
    for kind, action in BAD_ACTIONS.items():
        obs, _ = env.reset(seed=0)
        _check_obs(env, obs, name, f"reset(seed=0) before the {kind!r} actions")
        _check_state(env, name, "after reset")
        for turn in range(num_cycles):
            if not env.agents:
                break
            agents = list(env.agents)
            actions = {} if action is ... else {a: action for a in agents}
            where = f"step {turn} with a {kind} action for every agent"
            try:
                out = env.step(actions)
            except Exception as e:
                raise EnvCheckError(
                    f"{name}: {where} raised {type(e).__name__}: {e}. Any action must be legal: score "
                    f"garbage low and explain it in infos[agent]['notes'] (TextParallelEnv.step cleans "
                    f"non-str, oversized and control-character actions before _step_task)"
                ) from e
            _check_step_output(env, agents, out, name, where)
    env.close()


def _check_index_option(env_fn: Callable[[], ParallelEnv], name: str) -> None:
    env = env_fn()
    n = env.num_items() if hasattr(env, "num_items") else 1
    for index in sorted({0, n // 2, n - 1}):
        first, _ = env.reset(seed=1, options={"index": index})
        second, _ = env.reset(seed=2, options={"index": index})
        if first != second:
            _fail(
                name,
                f"reset(options={{'index': {index}}}) gave different first observations for seeds 1 and 2; "
                f"a runner resets G copies with one index to sample a group for one prompt, so build "
                f"turn-0 prompts from the index alone (item-specific randomness: random.Random(index))",
            )
    env.close()


def _check_seeding(env_fn: Callable[[], ParallelEnv], name: str) -> None:
    env1, env2 = env_fn(), env_fn()
    for seed in (0, 7):
        obs1, _ = env1.reset(seed=seed)
        obs2, _ = env2.reset(seed=seed)
        if obs1 != obs2:
            _fail(
                name,
                f"two envs reset with seed={seed} gave different observations; derive every random "
                f"choice (the item, too) from self.np_random, which reset(seed=...) seeds",
            )
        seq1 = [env1.reset()[0] for _ in range(3)]
        seq2 = [env2.reset()[0] for _ in range(3)]
        if seq1 != seq2:
            _fail(
                name,
                f"after reset(seed={seed}), further unseeded resets differ between two envs; keep one "
                f"generator (self.np_random) for the episode stream and do not reseed it in reset()",
            )
    env1.close()
    env2.close()
