"""TRL-style reward functions: validation, weighting, `None` handling, finiteness.

A reward function has TRL's signature::

    def reward_fn(prompts: list, completions: list[str], **kwargs) -> list[float | None]

one value per completion; `None` means "not applicable" (scored 0 with a note). textzoo passes
extra keyword arguments (`agent_id`, `other_completions`, dataset columns); a function without
`**kwargs` receives only the ones it names. `RewardFunctions` combines several functions into a
weighted sum, as TRL does (`sum_k w_k r_k`, `None` skipped), and returns the per-function terms.
A function that raises stops with an `EnvError` naming it, the item and the exception; with
`on_error="score"` the samples it was scoring get `error_value` instead, a note, and a count in the
`reward_errors` term, and the run goes on. Tasks (Team-v0, ReasoningGym-v0) and reward models reuse it.

Formats (TRL's two dataset formats): a "standard" function gets `completions` as `list[str]`; a
"conversational" one gets each completion as a message list `[{"role": "assistant", "content": c}]`,
`prompts` as message lists (a text prompt becomes `[{"role": "user", "content": p}]`) and
`other_completions` as message lists too. A function's format is, in order: the one declared
(`reward_format`, for all functions or one per function); else its `completions` annotation
(`list[str]` is standard; one that names `dict` or `Message`, e.g. `list[list[dict]]`, is
conversational); else the data's, as TRL decides (`conversational_data`: True when every prompt is
a message list). A declared format that contradicts the annotation, or data that mixes text and
message-list prompts with nothing declared, is ambiguous: an `EnvError` that says what to declare.
"""

from __future__ import annotations

import inspect
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from textzoo.envs.declare import number
from textzoo.errors import EnvError

WEIGHT = number(1.0)  # a finite int or float, never a bool

RewardFn = Callable[..., Sequence[float | None]]
ON_ERROR = ("raise", "score")
"""What a reward function that raises does: stop the run with an `EnvError`, or score `error_value`."""
ERRORS_TERM = "reward_errors"
FORMATS = ("auto", "standard", "conversational")
"""`reward_format` values: "auto" (annotation, then the data decide) or a declared format."""


def reward_name(fn: Callable[..., Any]) -> str:
    """A readable name for a reward function: its `__name__`, or its class name."""
    return getattr(fn, "__name__", None) or type(fn).__name__


@dataclass(frozen=True)
class _Signature:
    takes_var_kwargs: bool
    names: frozenset[str]
    required: frozenset[str]
    annotated: str | None = None
    """The format the `completions` annotation says ("standard" | "conversational"), None when it says none."""


def _annotated_format(annotation: Any) -> str | None:
    if annotation is inspect.Parameter.empty:
        return None
    text = annotation if isinstance(annotation, str) else repr(annotation)
    if re.search(r"\b(dict|Dict|Mapping|Message\w*)\b", text):
        return "conversational"
    if re.search(r"\bstr\b", text):
        return "standard"
    return None


def as_messages(prompt: Any, role: str = "user") -> list[dict[str, Any]]:
    """A prompt or completion in TRL's conversational form: message lists as they are, text as one message."""
    if is_messages(prompt):
        return list(prompt)
    return [{"role": role, "content": prompt if isinstance(prompt, str) else str(prompt)}]


def is_messages(value: Any) -> bool:
    """True for a chat message list: a non-empty list of mappings with a `content`."""
    return (
        isinstance(value, Sequence)
        and not isinstance(value, (str, bytes))
        and len(value) > 0
        and all(isinstance(m, Mapping) and "content" in m for m in value)
    )


def _inspect(fn: Callable[..., Any], what: str) -> _Signature:
    if not callable(fn):
        raise EnvError(f"{what} must be callable, got {type(fn).__name__}")
    try:
        parameters = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # builtins without a signature: trust the TRL convention
        return _Signature(True, frozenset(), frozenset())
    params = parameters.values()
    completions = parameters.get("completions")
    positional_only = [p.name for p in params if p.kind is inspect.Parameter.POSITIONAL_ONLY]
    if positional_only:
        raise EnvError(
            f"{what} {reward_name(fn)!r} has positional-only parameters {positional_only}; reward "
            f"functions are called with keywords: def f(prompts, completions, **kwargs)"
        )
    keyword = [p for p in params if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)]
    return _Signature(
        takes_var_kwargs=any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params),
        names=frozenset(p.name for p in keyword),
        required=frozenset(p.name for p in keyword if p.default is inspect.Parameter.empty),
        annotated=None if completions is None else _annotated_format(completions.annotation),
    )


class RewardFunctions:
    """Several TRL-style reward functions with weights, called as one.

    `provided` lists the keyword names every call will pass; a function that requires anything
    else fails here, at construction, with an error that names it. `reward_format` (one of
    `FORMATS`, or one per function) and `conversational_data` (True, False, or None for mixed data)
    set each function's format (see the module docstring); `formats` holds what was decided.
    """

    def __init__(
        self,
        reward_fns: RewardFn | Sequence[RewardFn],
        weights: Sequence[float] | None = None,
        provided: Sequence[str] = ("prompts", "completions"),
        arg: str = "reward_fns",
        on_error: str = "raise",
        error_value: float = 0.0,
        reward_format: str | Sequence[str] = "auto",
        conversational_data: bool | None = False,
    ):
        fns = [reward_fns] if callable(reward_fns) else list(reward_fns)
        if not fns:
            raise EnvError(f"{arg} must be a callable or a non-empty list of callables")
        self.signatures = [_inspect(fn, f"{arg}[{i}]") for i, fn in enumerate(fns)]
        for i, (fn, sig) in enumerate(zip(fns, self.signatures)):
            missing = sorted(sig.required - set(provided))
            if missing:
                raise EnvError(
                    f"{arg}[{i}] {reward_name(fn)!r} requires {missing}, which is not passed; it may "
                    f"take any of {sorted(provided)} (TRL signature: def f(prompts, completions, **kwargs))"
                )
            if not sig.takes_var_kwargs and "completions" not in sig.names:
                raise EnvError(
                    f"{arg}[{i}] {reward_name(fn)!r} takes neither `completions` nor **kwargs; "
                    f"use the TRL signature: def f(prompts, completions, **kwargs) -> list[float | None]"
                )
        if weights is None:
            weights = [1.0] * len(fns)
        weights = list(weights)
        if len(weights) != len(fns) or not all(WEIGHT.accepts(w) for w in weights):
            raise EnvError(
                f"reward weights must be {len(fns)} finite numbers (one per reward function), got {weights!r}"
            )
        if on_error not in ON_ERROR:
            raise EnvError(f"on_reward_error must be one of {ON_ERROR}, got {on_error!r}")
        if not WEIGHT.accepts(error_value):
            raise EnvError(f"reward_error_value must be a finite number, got {error_value!r}")
        self.on_error, self.error_value = on_error, float(error_value)
        self.fns = fns
        self.weights = [float(w) for w in weights]
        self.names = _unique_names([reward_name(fn) for fn in fns])
        self.formats = _formats(fns, self.signatures, reward_format, conversational_data, arg)

    def __call__(
        self, prompts: list[Any], completions: list[str], **kwargs: Any
    ) -> tuple[list[float], list[dict[str, float]], list[list[str]]]:
        """Score a batch: per sample the weighted sum, the per-function terms and notes."""
        return self.score(prompts, completions, kwargs)

    def score(
        self, prompts: list[Any], completions: list[str], kwargs: dict[str, Any], where: str = ""
    ) -> tuple[list[float], list[dict[str, float]], list[list[str]]]:
        """`__call__` with `where` (e.g. "item 3, agent_0") to name the batch in errors."""
        n = len(completions)
        totals = [0.0] * n
        terms: list[dict[str, float]] = [{ERRORS_TERM: 0.0} if self.on_error == "score" else {} for _ in range(n)]
        notes: list[list[str]] = [[] for _ in range(n)]
        standard = {"prompts": prompts, "completions": completions, **kwargs}
        chat: dict[str, Any] | None = None
        for fn, sig, name, weight, fmt in zip(self.fns, self.signatures, self.names, self.weights, self.formats):
            if fmt == "conversational":
                chat = chat if chat is not None else _conversational(standard)
                call_kwargs = chat
            else:
                call_kwargs = standard
            passed = call_kwargs if sig.takes_var_kwargs else {k: v for k, v in call_kwargs.items() if k in sig.names}
            try:
                raw = fn(**passed)
            except Exception as e:  # the user's function: its error, named, or a counted failure score
                if self.on_error == "raise":
                    raise self._error(name, e, where, completions, fmt) from e
                raw = [self.error_value] * n
                for i in range(n):
                    notes[i].append(
                        f"reward {name!r} raised {type(e).__name__}: {_short(e)}; scored {self.error_value}"
                    )
                    terms[i][ERRORS_TERM] += 1.0
            values = check_reward_values(raw, n, name)
            for i, value in enumerate(values):
                if value is None:
                    notes[i].append(f"reward {name!r} not applicable (None); scored 0")
                    value = 0.0
                elif not math.isfinite(value):
                    notes[i].append(f"reward {name!r} returned {value}; scored 0")
                    value = 0.0
                terms[i][name] = value
                totals[i] += weight * value
        return totals, terms, notes

    def _error(self, name: str, e: Exception, where: str, completions: list[Any], fmt: str) -> EnvError:
        sample = f" for completion {str(completions[0])[:120]!r}" if len(completions) == 1 else ""
        hint = ""
        if isinstance(e, (TypeError, KeyError, IndexError)):
            other = "standard" if fmt == "conversational" else "conversational"
            hint = (
                f" It was called with {fmt} completions; if it expects {other} ones "
                f"({'list[str]' if other == 'standard' else 'message lists'}), pass reward_format={other!r}."
            )
        return EnvError(
            f"reward function {name!r} raised {type(e).__name__}: {_short(e)} while scoring "
            f"{where or f'{len(completions)} completions'}{sample}. Fix the function (it must return one "
            "number or None per completion for any text), or pass on_reward_error='score' to give such "
            f"samples reward_error_value (now {self.error_value}) and go on; failures are counted in the "
            f"{ERRORS_TERM!r} reward term.{hint}"
        )


def _conversational(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments of a standard call in TRL's conversational form."""
    out = dict(kwargs)
    out["prompts"] = [as_messages(p) for p in kwargs["prompts"]]
    out["completions"] = [as_messages(c, "assistant") if isinstance(c, str) else c for c in kwargs["completions"]]
    others = kwargs.get("other_completions")
    if isinstance(others, Mapping):
        out["other_completions"] = {k: [as_messages(c, "assistant") for c in v] for k, v in others.items()}
    return out


def _formats(
    fns: list[Callable[..., Any]],
    signatures: list[_Signature],
    declared: str | Sequence[str],
    conversational_data: bool | None,
    arg: str,
) -> list[str]:
    """Each function's format: declared, else its annotation, else the data's (module docstring)."""
    per_fn = [declared] * len(fns) if isinstance(declared, str) else list(declared)
    if len(per_fn) != len(fns) or any(f not in FORMATS for f in per_fn):
        raise EnvError(
            f"reward_format must be one of {FORMATS} or a list of them, one per reward function "
            f"({len(fns)}), got {declared!r}"
        )
    out = []
    for i, (fn, sig, fmt) in enumerate(zip(fns, signatures, per_fn)):
        name = f"{arg}[{i}] {reward_name(fn)!r}"
        if fmt != "auto":
            if sig.annotated is not None and sig.annotated != fmt:
                raise EnvError(
                    f"{name} is declared reward_format={fmt!r} but its `completions` annotation says "
                    f"{sig.annotated!r}; the two disagree: fix the annotation or the declaration"
                )
            out.append(fmt)
        elif sig.annotated is not None:
            out.append(sig.annotated)
        elif conversational_data is None:
            raise EnvError(
                f"{name}: the prompts mix text and chat message lists, so the completions' format is "
                "ambiguous (TRL decides it from the data); pass reward_format='standard' (list[str]) or "
                "'conversational' (message lists), or annotate `completions`"
            )
        else:
            out.append("conversational" if conversational_data else "standard")
    return out


def _short(e: Exception) -> str:
    text = str(e).strip().replace("\n", " ")
    return text[:200] + ("..." if len(text) > 200 else "")


def check_reward_values(values: Any, n: int, name: str) -> list[float | None]:
    """Validate a reward function's output: `n` numbers or `None`s (programming errors raise)."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) and not hasattr(values, "tolist"):
        raise EnvError(f"reward {name!r} must return a list of float | None, got {type(values).__name__}")
    values = values.tolist() if hasattr(values, "tolist") else list(values)
    if len(values) != n:
        raise EnvError(f"reward {name!r} returned {len(values)} values for {n} completions; return one per completion")
    out: list[float | None] = []
    for v in values:
        if v is None:
            out.append(None)
        elif isinstance(v, (int, float)) or hasattr(v, "__float__") and not isinstance(v, str):
            out.append(float(v))
        else:
            raise EnvError(f"reward {name!r} returned {v!r}; each value must be a number or None")
    return out


def _unique_names(names: list[str]) -> list[str]:
    used: set[str] = set()
    out = []
    for name in names:
        candidate, k = name, 1
        while candidate in used:  # the same function twice, or two lambdas
            candidate, k = f"{name}_{k}", k + 1
        used.add(candidate)
        out.append(candidate)
    return out
