"""The one JSONL reader: datasets, (prompt, completion) pairs and run logs, one JSON object per line."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path
from typing import Any

from textzoo.errors import TextzooError


def read_jsonl(
    path: str | os.PathLike,
    what: str,
    error: type[TextzooError] = TextzooError,
    *,
    torn_tail: bool = False,
) -> list[tuple[int, dict[str, Any]]]:
    """(line number, object) of every non-blank line of `path` (gzip when it ends in .gz).

    `what` names the file in messages ("pairs file", "dataset"); problems raise `error` with the path
    and line. `torn_tail=True` drops a last line that is not JSON (a log whose writer was killed
    mid-line) instead of raising.
    """
    path = Path(path)
    if not path.is_file():
        raise error(f"{what} {str(path)!r} does not exist; pass an existing JSONL file (one JSON object per line)")
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            lines = [(n, line) for n, line in enumerate(f, start=1) if line.strip()]
    except (OSError, UnicodeDecodeError) as e:
        raise error(f"cannot read {what} {str(path)!r}: {e}") from None
    rows = []
    for i, (n, line) in enumerate(lines):
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            if torn_tail and i == len(lines) - 1:
                break
            raise error(f"{what} {str(path)!r}, line {n}: not JSON ({e})") from None
        if not isinstance(row, dict):
            raise error(f"{what} {str(path)!r}, line {n}: must be a JSON object, got {type(row).__name__}")
        rows.append((n, row))
    return rows
