"""Where a run came from: `RUN_DIR/provenance.jsonl`, one row each time `train` starts or resumes a run.

A row holds the step the process started at, its command line, the textzoo version and the source
commit of the code that ran (`source_commit`), so an export of step N can name the code and the
commands that trained it (`rows_until`).
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import textzoo

logger = logging.getLogger(__name__)

FILE = "provenance.jsonl"
"""The provenance file of a run dir."""


def source_commit() -> str | None:
    """The git commit of the textzoo source that runs ("<sha>-dirty" when its tracked files have
    uncommitted changes), from its git checkout or, for a pip install from git, its install record;
    None when neither says."""
    root = Path(textzoo.__file__).resolve().parent.parent
    if (root / ".git").exists():
        try:
            sha = _git(root, "rev-parse", "HEAD")
            dirty = _git(root, "status", "--porcelain", "--untracked-files=no", "--", "textzoo")
            return f"{sha}-dirty" if dirty else sha
        except (OSError, subprocess.SubprocessError):
            logger.debug("git could not name the commit of %s", root)
    try:
        record = importlib.metadata.distribution("textzoo").read_text("direct_url.json")
    except importlib.metadata.PackageNotFoundError:
        return None
    if not record:
        return None
    return json.loads(record).get("vcs_info", {}).get("commit_id")


def _git(root: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10, check=True)
    return done.stdout.strip()


def command_line(argv: list[str] | None = None) -> str:
    """The command that runs this process, as a shell line: `textzoo ...` for the command line tool."""
    argv = list(sys.argv if argv is None else argv)
    if argv and Path(argv[0]).name in ("textzoo", "cli.py"):
        return shlex.join(["textzoo", *argv[1:]])
    return shlex.join([Path(sys.executable).name, *argv])


def record_start(run_dir: str | Path, step: int) -> None:
    """Append this process's row (the step it starts at) to the run's provenance file."""
    row = {
        "step": step,
        "command": command_line(),
        "textzoo_version": textzoo.__version__,
        "source_commit": source_commit(),
    }
    with open(Path(run_dir) / FILE, "a") as f:
        f.write(json.dumps(row, sort_keys=True) + "\n")


def rows_until(run_dir: str | Path, step: int) -> list[dict[str, Any]]:
    """The provenance rows of the processes that trained a run up to `step`: those that started before it
    (a row that started at `step` or later trained nothing up to it); [] for a run that recorded none."""
    path = Path(run_dir) / FILE
    if not path.is_file():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    before = [r for r in rows if int(r.get("step", 0)) < step]
    return before or rows[:1]
