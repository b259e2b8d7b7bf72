"""Where task items come from: user data (JSONL, `datasets`, lists), the train/eval split, and the
procedural paragraphs of Writing-v0.

Split rule shared by every built-in task: global item k is held out for `split="eval"` when
`k % EVAL_EVERY == EVAL_EVERY - 1` (every fifth item, 20 %), and used for `split="train"`
otherwise; `split="all"` keeps every item (for data that is already split). The rule depends on
the index only, so it is deterministic and the two splits are disjoint.
"""

from __future__ import annotations

import importlib
import os
import random
from collections.abc import Mapping, Sequence
from typing import Any

from textzoo.errors import EnvError
from textzoo.jsonl import read_jsonl

EVAL_EVERY = 5


def import_extra(module: str, needed_by: str, extra: str, requirement: str) -> Any:
    """`module` imported, or an `EnvError` saying which textzoo extra (or requirement) installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise EnvError(
            f"{needed_by} needs {module}: pip install 'textzoo[{extra}]' (or pip install '{requirement}')"
        ) from e


def split_indices(total: int, split: str) -> list[int]:
    """Global indices of the items of `split` (declared as `textzoo.envs.declare.SPLIT`) among `total` items."""
    if split == "all":
        return list(range(total))
    held_out = EVAL_EVERY - 1
    if split == "eval":
        return [k for k in range(total) if k % EVAL_EVERY == held_out]
    return [k for k in range(total) if k % EVAL_EVERY != held_out]


def load_records(data: Any, field: str, arg: str) -> list[dict[str, Any]]:
    """Rows of `data` as dicts that all hold `field`.

    `data` is a JSONL path, a `datasets.Dataset` (anything with `column_names` whose rows are
    mappings; `datasets` itself is not imported) or a list of dicts or strings (a string `s`
    becomes the row `{field: s}`). `arg` names the argument in error messages.
    """
    if isinstance(data, (str, os.PathLike)):
        rows = [row for _, row in read_jsonl(data, arg, EnvError)]
    elif hasattr(data, "column_names"):
        rows = [dict(row) for row in data]
    elif isinstance(data, Sequence) and not isinstance(data, (bytes, bytearray)):
        rows = []
        for i, row in enumerate(data):
            if isinstance(row, str):
                rows.append({field: row})
            elif isinstance(row, Mapping):
                rows.append(dict(row))
            else:
                raise EnvError(f"{arg}[{i}] must be a str or a dict, got {type(row).__name__}")
    else:
        raise EnvError(
            f"{arg} must be a JSONL path, a `datasets.Dataset` or a list of str/dict rows, got {type(data).__name__}"
        )
    if not rows:
        raise EnvError(f"{arg} holds no rows")
    for i, row in enumerate(rows):
        if field not in row:
            raise EnvError(
                f"row {i} of {arg} has no field {field!r} (fields: {sorted(map(str, row))}); "
                f"name the column that holds the text with the field argument"
            )
    return rows


# ---- procedural paragraphs (Writing-v0) -------------------------------------------------------
# Word lists are small on purpose: a byte-level tiny model can learn them, yet the templates
# combine into thousands of distinct paragraphs of 2-3 sentences (~120-260 characters).
_PLACES = [
    "the river town",
    "a mountain village",
    "the old harbor",
    "a busy market",
    "the city library",
    "a quiet farm",
    "the school garden",
    "a coastal lab",
    "the train station",
    "a forest camp",
    "the town square",
    "a small bakery",
    "the north bridge",
    "a desert outpost",
    "the museum hall",
]
_PEOPLE = [
    "a young engineer",
    "the local teacher",
    "an old fisherman",
    "two curious students",
    "the night nurse",
    "a retired pilot",
    "the mayor",
    "a group of volunteers",
    "the head chef",
    "a traveling musician",
    "the park ranger",
    "a shy painter",
    "the bus driver",
    "a new doctor",
]
_ACTIONS = [
    "repaired the broken water pump",
    "planted a row of apple trees",
    "opened a free reading room",
    "built a wooden boat",
    "found a lost map",
    "started a weekly market",
    "cleaned the polluted stream",
    "taught children to code",
    "restored an old clock",
    "organized a winter festival",
    "designed a solar lamp",
    "collected stories from elders",
    "painted a large mural",
]
_TIMES = [
    "last spring",
    "during the storm",
    "after the flood",
    "one cold morning",
    "over the summer",
    "before the harvest",
    "in a single week",
    "late at night",
    "on a rainy weekend",
]
_REASONS = [
    "because the neighbors had asked for help",
    "to save money for the school",
    "since nobody else knew how",
    "after reading an old report",
    "to bring people together",
    "because the winter was long",
    "to keep a promise to a friend",
    "as part of a small contest",
]
_RESULTS = [
    "Soon everyone in town was talking about it.",
    "The project cost less than expected.",
    "Several families joined in the next month.",
    "A newspaper later wrote a short story about it.",
    "Some people doubted it would last.",
    "It became a yearly tradition.",
    "The work took longer than planned.",
    "Visitors began to arrive from nearby towns.",
]
_TEMPLATES = [
    "In {place}, {person} {action} {time}. They did it {reason}. {result}",
    "{Time}, {person} {action} in {place}. {result}",
    "{Person} {action} in {place} {reason}. {result} The effort started {time}.",
    "{Time}, {person} in {place} {action}, {reason}.",
]


def procedural_paragraph(k: int, seed: int = 0) -> str:
    """Paragraph `k` of the procedural source set; a pure function of (`k`, `seed`)."""
    rng = random.Random(seed * 1_000_003 + k)  # int seeds give the same stream on every Python 3
    slots = {
        "place": rng.choice(_PLACES),
        "person": rng.choice(_PEOPLE),
        "action": rng.choice(_ACTIONS),
        "time": rng.choice(_TIMES),
        "reason": rng.choice(_REASONS),
        "result": rng.choice(_RESULTS),
    }
    slots.update({key.capitalize(): value[0].upper() + value[1:] for key, value in list(slots.items())})
    return rng.choice(_TEMPLATES).format(**slots)
