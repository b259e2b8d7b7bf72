"""The command line's output: rich consoles for what a command prints, and library log records shown on stderr.

Library modules log through `logging.getLogger(__name__)` and print nothing; `textzoo` commands print
their results with `console()` and show the library's INFO records (placement, grid progress,
skipped checkpoints) through `show_logs()`.
"""

from __future__ import annotations

import logging

from rich.console import Console
from rich.logging import RichHandler


def console(stderr: bool = False) -> Console:
    """A console that prints text as given (no markup, highlighting or emoji; long lines are not wrapped)."""
    return Console(stderr=stderr, soft_wrap=True, markup=False, highlight=False, emoji=False)


def show_logs(level: int = logging.INFO) -> None:
    """Show `textzoo` log records of `level` and above on stderr (once per process)."""
    logger = logging.getLogger("textzoo")
    if not any(isinstance(h, RichHandler) for h in logger.handlers):
        handler = RichHandler(console=console(stderr=True), show_time=False, show_path=False, markup=False)
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
    logger.setLevel(level)
