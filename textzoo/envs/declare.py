"""Declared tasks: one declaration of a task's arguments gives its validation and its entry points.

A task declares each argument once, with its default and the values it accepts (`Arg`, or the
shorthands `integer`, `number`, `one_of`, `instance_of`, `anything`); `@task(name, **args)` on the
task class (or on a function that builds it) checks every call against the declaration before the
task's own code runs, so a bad value raises an `EnvError` that names the task, the argument, what
it accepts and what it got::

    @task("count_v0", target=integer(5, low=1, high=50), split=SPLIT, render_mode=RENDER_MODE)
    class CountEnv(TextParallelEnv):
        def __init__(self, target, split, render_mode): ...   # the declared names, no defaults

    parallel_env, env, raw_env = entry_points(CountEnv)

`entry_points` gives PettingZoo's three module-level functions, each with the declared signature
(`inspect.signature` shows every argument and default, which `make` and the presets read):
`parallel_env(**kwargs)` builds the `ParallelEnv`; `raw_env(**kwargs)` is its AEC version
(`parallel_to_aec_wrapper`); `env(**kwargs)` is the AEC version with PettingZoo's order checks
(`parallel_to_aec`), for tools that step agents in turn. Declarations compose: a dict of `Arg`s
shared by several tasks (`textzoo.envs._toolplan.TOOLPLAN_ARGS`) is spread into each `@task(...)`.

What stays in the task's code is what a declaration cannot say: rules that tie arguments together
(a minimum that depends on another argument, a prompt budget that must hold the task's prompts).
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pettingzoo.utils.conversions import parallel_to_aec, parallel_to_aec_wrapper

from textzoo.errors import EnvError

_NAMES = {int: "an int", float: "a number", str: "a string", bool: "a bool"}


@dataclass(frozen=True)
class Arg:
    """One task argument: its default and the values it accepts.

    `types` are the accepted types (None: any value; `bool` never passes for `int` or `float`, and
    a `float` must be finite); `low`/`high` an inclusive range for numbers; `choices` the only
    accepted values; `optional` also accepts None. `doc` is a one-line description.
    """

    default: Any = None
    types: type | tuple[type, ...] | None = None
    low: float | None = None
    high: float | None = None
    choices: tuple[Any, ...] | None = None
    optional: bool = False
    doc: str = ""

    def allowed(self) -> str:
        """What the argument accepts, as a phrase: "an int in [3, 30]", "one of 'train', 'eval'"."""
        if self.choices is not None:
            text = "one of " + ", ".join(map(repr, self.choices))
        else:
            types = self.types if isinstance(self.types, tuple) else (self.types,)
            if self.types is None:
                text = "any value"
            elif types in ((int, float), (float,)):
                text = "a number"
            else:
                text = " or ".join(_NAMES.get(t, f"a {t.__name__}") for t in types)
            if self.low == 1 and self.high is None and types == (int,):
                text = "a positive int"
            elif self.low is not None and self.high is not None:
                text += f" in [{_num(self.low)}, {_num(self.high)}]"
            elif self.low is not None:
                text += f" >= {_num(self.low)}"
            elif self.high is not None:
                text += f" <= {_num(self.high)}"
        return text + " or None" if self.optional and self.choices is None else text

    def accepts(self, value: Any) -> bool:
        """Whether `value` is one this argument accepts."""
        if value is None and self.optional:
            return True
        if self.choices is not None:
            return any(value == c and type(value) is type(c) for c in self.choices)
        if self.types is not None:
            types = self.types if isinstance(self.types, tuple) else (self.types,)
            numeric = any(t in (int, float) for t in types)
            if not isinstance(value, types) or (numeric and isinstance(value, bool) and bool not in types):
                return False
            if isinstance(value, float) and not math.isfinite(value):
                return False
        if self.low is not None and not value >= self.low:
            return False
        return self.high is None or value <= self.high


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def integer(default: int | None, low: int | None = None, high: int | None = None, optional: bool = False, doc=""):
    """An int argument (never a bool), optionally in [low, high]."""
    return Arg(default, int, low, high, optional=optional, doc=doc)


def number(default: float | None, low: float | None = None, high: float | None = None, optional: bool = False, doc=""):
    """A finite int or float argument (never a bool), optionally in [low, high]."""
    return Arg(default, (int, float), low, high, optional=optional, doc=doc)


def one_of(default: Any, *choices: Any, doc: str = "") -> Arg:
    """An argument that takes one of `choices` (compared by value and type)."""
    return Arg(default, choices=tuple(choices), doc=doc)


def instance_of(cls: type, default: Any = None, optional: bool = True, doc: str = "") -> Arg:
    """An argument that takes an instance of `cls` (or None, by default)."""
    return Arg(default, cls, optional=optional, doc=doc)


def anything(default: Any = None, doc: str = "") -> Arg:
    """An argument the task checks itself (data, callables, nested settings)."""
    return Arg(default, doc=doc)


SPLIT = one_of("train", "train", "eval", "all", doc="which items: train, held-out eval, or all of them")
RENDER_MODE = one_of(None, None, "ansi", doc="None, or 'ansi' for render() to return the text view")


def text_args(max_prompt_chars: int = 8192, max_action_chars: int = 4096) -> dict[str, Arg]:
    """The arguments a `TextParallelEnv` passes to its base, with this task's defaults: spread last
    into `@task(...)` and forward them with `super().__init__(agents, num_turns, **text)`."""
    return {
        "max_prompt_chars": integer(max_prompt_chars, low=1, doc="the longest prompt, in characters"),
        "max_action_chars": integer(max_action_chars, low=1, doc="the longest action kept, in characters"),
        "render_mode": RENDER_MODE,
    }


class Declaration:
    """A task's declared arguments, in order: binds a call to values, defaults filled in."""

    def __init__(self, name: str, args: dict[str, Arg]):
        for key, arg in args.items():
            if not isinstance(arg, Arg):
                raise TypeError(f"task {name!r}: argument {key!r} must be declared with Arg, got {arg!r}")
            if not arg.accepts(arg.default):
                raise TypeError(f"task {name!r}: the default of {key!r} ({arg.default!r}) is not {arg.allowed()}")
        self.name = name
        self.args = dict(args)
        self.signature = inspect.Signature(
            [inspect.Parameter(k, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=a.default) for k, a in args.items()]
        )

    def bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        """The values of a call, defaults filled in; an `EnvError` naming the argument when one is bad."""
        unknown = sorted(set(kwargs) - set(self.args))
        if unknown:
            raise EnvError(f"{self.name} got unknown argument(s) {unknown}; it accepts: {', '.join(self.args)}")
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as e:
            raise EnvError(f"{self.name}: {e}; it accepts: {', '.join(self.args)}") from None
        bound.apply_defaults()
        for key, value in bound.arguments.items():
            arg = self.args[key]
            if not arg.accepts(value):
                raise EnvError(f"{self.name}: {key} must be {arg.allowed()}, got {value!r}")
        return dict(bound.arguments)


def task(name: str, **args: Arg) -> Callable[[Any], Any]:
    """Declare a task's arguments on its class (or on a function that builds it); see the module docstring.

    The class's `__init__` (or the function) takes the declared names in order, without defaults
    (a trailing `**kwargs` takes the rest, e.g. `**text` for `text_args()`), and is called with
    every value checked and every default filled in. A class's
    `metadata["name"]` becomes `name`.
    """

    declaration = Declaration(name, args)

    def decorate(build: Any) -> Any:
        target = build.__init__ if isinstance(build, type) else build
        params = list(inspect.signature(target).parameters.values())[1 if isinstance(build, type) else 0 :]
        named = [p for p in params if p.kind is not inspect.Parameter.VAR_KEYWORD]
        names = [p.name for p in named]
        rest = len(named) < len(params)  # a **kwargs takes the declared names it does not list
        if (names != list(args)[: len(names)] if rest else names != list(args)) or any(
            p.default is not inspect.Parameter.empty for p in named
        ):
            raise TypeError(
                f"task {name!r}: {getattr(build, '__qualname__', build)} must take the declared arguments "
                f"{list(args)}, in order and without defaults (it takes {names}{' and **kwargs' if rest else ''})"
            )
        if isinstance(build, type):
            init = build.__init__

            @functools.wraps(init)
            def __init__(self, *a: Any, **kw: Any) -> None:
                init(self, **declaration.bind(a, kw))

            __init__.__signature__ = declaration.signature.replace(  # type: ignore[attr-defined]
                parameters=[inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY)]
                + list(declaration.signature.parameters.values())
            )
            build.__init__ = __init__
            build.metadata = {**getattr(build, "metadata", {}), "name": name}
            build.declaration = declaration
            return build

        @functools.wraps(build)
        def make(*a: Any, **kw: Any) -> Any:
            return build(**declaration.bind(a, kw))

        make.__signature__ = declaration.signature  # type: ignore[attr-defined]
        make.declaration = declaration  # type: ignore[attr-defined]
        return make

    return decorate


def entry_points(build: Any) -> tuple[Callable[..., Any], Callable[..., Any], Callable[..., Any]]:
    """PettingZoo's `(parallel_env, env, raw_env)` for a declared task class or builder."""
    declaration: Declaration = build.declaration

    def parallel_env(*args: Any, **kwargs: Any):
        return build(*args, **kwargs)

    def env(*args: Any, **kwargs: Any):
        return parallel_to_aec(build(*args, **kwargs))

    def raw_env(*args: Any, **kwargs: Any):
        return parallel_to_aec_wrapper(build(*args, **kwargs))

    docs = {
        parallel_env: f"PettingZoo entry point: the {declaration.name} `ParallelEnv`.",
        env: f"The AEC version of {declaration.name} (`parallel_to_aec`), for tools that step agents in turn.",
        raw_env: f"The AEC version of {declaration.name} without PettingZoo's order checks.",
    }
    for fn, doc in docs.items():
        fn.__doc__ = doc
        fn.__qualname__ = fn.__name__  # found by pickle as `module.parallel_env`, like a def at module level
        fn.__signature__ = declaration.signature  # type: ignore[attr-defined]
        fn.declaration = declaration  # type: ignore[attr-defined]
        fn.__module__ = build.__module__
    return parallel_env, env, raw_env
