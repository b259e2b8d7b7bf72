"""Task registry: `make("textzoo/Name-vN", **kwargs)`, `register(...)`, `registry()`.

Ids follow Gymnasium/PettingZoo: `namespace/Name-vN`; bump N when a change alters learning results.
Built-in tasks are also registered with PettingZoo's own registry where the installed PettingZoo
has one, so `pettingzoo.make("parallel", "textzoo/Writing-v0")` works too.

A namespace may stand for a whole library of tasks (`NAMESPACES`): `make("textarena/KuhnPoker-v0")`
builds any TextArena game through `textzoo.interop.textarena`, without registering 700 ids.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from textzoo.errors import EnvError
from textzoo.plugins import TASKS, load_entry_points, split_module


@dataclass(frozen=True)
class EnvSpec:
    """How to build one registered task: an entry point (callable or "module:attr") and defaults."""

    id: str
    entry_point: Callable[..., Any] | str
    kwargs: dict[str, Any] = field(default_factory=dict)

    def load(self) -> Callable[..., Any]:
        if callable(self.entry_point):
            return self.entry_point
        module, _, attr = self.entry_point.partition(":")
        try:
            return getattr(importlib.import_module(module), attr or "parallel_env")
        except (ImportError, AttributeError) as e:
            raise EnvError(f"cannot load entry point {self.entry_point!r} of {self.id!r}: {e}") from e


_REGISTRY: dict[str, EnvSpec] = {}
NAMESPACES: dict[str, tuple[str, str]] = {"textarena": ("textzoo.interop.textarena:parallel_env", "game")}
"""namespace -> (entry point, the keyword that receives the rest of the id)."""


def register(id: str, entry_point: Callable[..., Any] | str, **kwargs: Any) -> None:
    """Register a task under `id` (e.g. "me/MyTask-v0"); `kwargs` become its default arguments."""
    if not isinstance(id, str) or not id:
        raise EnvError(f"env id must be a non-empty string, got {id!r}")
    _REGISTRY[id] = EnvSpec(id, entry_point, dict(kwargs))
    _register_with_pettingzoo(id, entry_point, kwargs)


def registry() -> list[str]:
    """Ids of every registered task, sorted (the packages that register tasks through entry points loaded)."""
    load_entry_points(TASKS, EnvError)
    return sorted(_REGISTRY)


def spec(id: str) -> EnvSpec:
    """The `EnvSpec` of `id`; an `EnvError` naming close matches when unknown.

    ``my_pkg.tasks:me/Echo-v0`` imports ``my_pkg.tasks`` first (Gymnasium's ``module:id``: its `register`
    calls run); an id not found loads the packages that register tasks through entry points and looks again.
    """
    if isinstance(id, str):
        id = split_module(id, EnvError, "env id")
    namespace, _, rest = id.partition("/") if isinstance(id, str) else ("", "", "")
    if id not in _REGISTRY and namespace in NAMESPACES and rest:
        entry_point, keyword = NAMESPACES[namespace]
        return EnvSpec(id, entry_point, {keyword: rest})
    if id not in _REGISTRY:
        load_entry_points(TASKS, EnvError)
    try:
        return _REGISTRY[id]
    except KeyError:
        close = difflib.get_close_matches(id, list(_REGISTRY), n=3)
        hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
        raise EnvError(f"unknown env id {id!r}.{hint} Registered: {', '.join(registry())}.") from None


def takes(id: str, argument: str) -> bool:
    """Whether the task registered as `id` accepts the keyword `argument` (or any keyword)."""
    try:
        params = inspect.signature(spec(id).load()).parameters
    except (TypeError, ValueError):
        return True
    return argument in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def make(id: str, **kwargs: Any):
    """Build the task registered as `id`, with `kwargs` overriding its defaults."""
    s = spec(id)
    fn = s.load()
    merged = {**s.kwargs, **kwargs}
    _check_kwargs(id, fn, merged)
    return fn(**merged)


def _check_kwargs(id: str, fn: Callable[..., Any], kwargs: dict[str, Any]) -> None:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    unknown = sorted(set(kwargs) - set(params))
    if unknown:
        raise EnvError(f"{id!r} got unknown argument(s) {unknown}; it accepts: {', '.join(sorted(params)) or 'none'}.")


def _register_with_pettingzoo(id: str, entry_point: Callable[..., Any] | str, kwargs: dict[str, Any]) -> None:
    try:
        from pettingzoo import register as pz_register
    except ImportError:  # older PettingZoo without a registry
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # re-registering after a reload is fine
        try:
            pz_register("parallel", id, entry_point=entry_point, kwargs=dict(kwargs))
        except Exception:  # PettingZoo's id rules may differ; our registry still works
            pass
