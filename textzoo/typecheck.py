"""Config values checked against their fields' annotations, with errors that name the field.

`check_fields(config)` checks a config dataclass's own values (its `__post_init__` calls it first, so
the Python API, command-line flags and files are all checked); `check_mapping(cls, data)` checks a
dict meant for `cls` (a file's table, an `agent_overrides` entry) before anything is built: an unknown
key is named with the closest valid one. Understood annotations: int, float (an int is accepted),
bool, str, None, Any, `X | None`, unions, `Literal[...]`, `tuple[X, ...]`, `tuple[X, Y]`, `list[X]`,
`dict[K, V]` and nested config dataclasses (checked field by field). Plain data code: no torch.
"""

from __future__ import annotations

import dataclasses
import difflib
import numbers
import types
import typing
from collections.abc import Mapping
from functools import cache
from typing import Any, Literal, Union

from textzoo.errors import ConfigError


@cache
def field_types(cls: type) -> dict[str, Any]:
    """Field name -> resolved annotation of the config dataclass `cls` (`Annotated` metadata dropped)."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def check_fields(config: Any, where: str = "") -> None:
    """Raise `ConfigError` naming the first field of `config` whose value does not match its annotation.

    `where` is the dotted prefix of the field names in messages ("agent.", "reinforce.").
    """
    for name, tp in field_types(type(config)).items():
        check_value(tp, getattr(config, name), where + name)


def check_mapping(cls: type, data: Mapping[str, Any], where: str = "") -> None:
    """Raise `ConfigError` for a key of `data` that `cls` has no field for (naming the closest one) or a value
    of the wrong type; a value for a nested config dataclass may be a mapping, checked the same way."""
    types_ = field_types(cls)
    for key in data:
        if key not in types_:
            raise ConfigError(unknown_key_message(str(key), list(types_), where, section_names(cls)))
    for key, value in data.items():
        check_value(types_[key], value, where + key)


def section_names(cls: type) -> dict[str, str]:
    """The fields of `cls`'s nested config dataclasses as flat names -> dotted ones ("lora_rank" -> "lora.rank"):
    what a misspelt key is also compared with, so that "lora_rnk" is answered with "lora.rank"."""
    return {
        f"{name}_{f.name}": f"{name}.{f.name}"
        for name, tp in field_types(cls).items()
        if dataclasses.is_dataclass(tp)
        for f in dataclasses.fields(tp)
    }


def unknown_key_message(key: str, valid: list[str], where: str = "", sections: Mapping[str, str] | None = None) -> str:
    """ "unknown config field 'agent.lrr'; did you mean 'agent.lr'? (valid: ...)"; `sections` (`section_names`)
    are candidates too, named by their dotted names."""
    sections = sections or {}
    close = difflib.get_close_matches(key, [*valid, *sections], n=1, cutoff=0.6)
    hint = f"; did you mean {where + sections.get(close[0], close[0])!r}?" if close else ""
    of = f" of {where[:-1]}" if where else ""
    return f"unknown config field {where + key!r}{hint} (valid fields{of}: {', '.join(sorted(valid))})"


def check_value(tp: Any, value: Any, name: str) -> None:
    """Raise `ConfigError` unless `value` matches the annotation `tp`; `name` is the field's dotted name."""
    if dataclasses.is_dataclass(tp) and isinstance(value, Mapping):
        check_mapping(tp, value, name + ".")
        return
    if matches(tp, value):
        return
    message = f"{name} must be {describe(tp)}, got {value!r} ({type(value).__name__})"
    choices = _literal_choices(tp)
    if isinstance(value, str) and choices:
        close = difflib.get_close_matches(value, [c for c in choices if isinstance(c, str)], n=1, cutoff=0.6)
        if close:
            message += f"; did you mean {close[0]!r}?"
    raise ConfigError(message)


def matches(tp: Any, value: Any) -> bool:
    """Whether `value` is of the annotation `tp` (sequences for tuples and lists: list or tuple)."""
    if tp is Any or tp is object:
        return True
    if tp is None or tp is type(None):
        return value is None
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:
        return isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if tp is float:
        return isinstance(value, numbers.Real) and not isinstance(value, bool)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Literal:
        return any(value == a and type(value) is type(a) for a in args)
    if origin is Union or origin is types.UnionType:
        return any(matches(a, value) for a in args)
    if origin in (tuple, list):
        if not isinstance(value, (tuple, list)):
            return False
        if origin is tuple and args and args[-1] is not Ellipsis:
            return len(value) == len(args) and all(matches(a, v) for a, v in zip(args, value))
        item = args[0] if args else Any
        return all(matches(item, v) for v in value)
    if origin is dict or tp is dict:
        if not isinstance(value, Mapping):
            return False
        key, val = args if args else (Any, Any)
        return all(matches(key, k) and matches(val, v) for k, v in value.items())
    if isinstance(tp, type):
        return isinstance(value, tp)
    return True  # an annotation this checker does not model is left to the field's own checks


def describe(tp: Any) -> str:
    """An annotation in words: "an int", "a list of strings", "one of 'a', 'b'", "a float or None"."""
    if tp is type(None) or tp is None:
        return "None (null)"
    names = {bool: "true or false (a bool)", int: "an int", float: "a float (an int is fine)", str: "a string"}
    if tp in names:
        return names[tp]
    if tp is Any:
        return "any value"
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if origin is Union or origin is types.UnionType:
        return " or ".join(describe(a) for a in args)
    if origin in (tuple, list):
        if origin is tuple and args and args[-1] is not Ellipsis:
            return f"a list of {len(args)} values ({', '.join(describe(a) for a in args)})"
        return f"a list of {_plural(args[0]) if args else 'values'}"
    if origin is dict or tp is dict:
        return "a JSON object / TOML table"
    if dataclasses.is_dataclass(tp):
        return f"a table of {tp.__name__} fields"
    return f"a {getattr(tp, '__name__', tp)}"


def _plural(tp: Any) -> str:
    plurals = {bool: "bools", int: "ints", float: "floats", str: "strings"}
    return plurals.get(tp, f"values of type {describe(tp)}")


def _literal_choices(tp: Any) -> tuple[Any, ...]:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return typing.get_args(tp)
    if origin is Union or origin is types.UnionType:
        return tuple(c for a in typing.get_args(tp) for c in _literal_choices(a))
    return ()
