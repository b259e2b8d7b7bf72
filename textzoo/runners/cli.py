"""`textzoo train | eval | export | plot | sft | bench | serve-engine`: the command line over the Python API's
dataclass configs.

`textzoo train --config run.toml --steps 200` loads the file, then applies the flags on top.
`textzoo train` with no arguments trains the embedded default (two tiny GPT-2 agents on
`textzoo/WritingRatio-v0`, Writing-v0 with its length-ratio reward alone) in a few minutes on a CPU.
`textzoo export RUN_DIR --out DIR` writes a run's trained models as transformers folders or PEFT adapters.
`textzoo COMMAND --help` lists a command's flags.
"""

from __future__ import annotations

import importlib
import sys

COMMANDS = ("train", "eval", "export", "plot", "sft", "bench", "serve-engine")


def main(argv: list[str] | None = None) -> int:
    """Run one command; 0 on success, 2 on a usage or `TextzooError` (one line on stderr)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        argv = ["train"]
    from textzoo.runners.console import console, show_logs  # rich only: torch and transformers wait for a command

    if argv[0] in ("-h", "--help"):
        console().print(f"usage: textzoo {{{','.join(COMMANDS)}}} [--help] ...\n\n{__doc__}")
        return 0
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        console(stderr=True).print(f"error: unknown command {command!r}; choose one of {', '.join(COMMANDS)}")
        return 2
    from textzoo.errors import TextzooError

    show_logs()
    try:
        importlib.import_module("textzoo.runners.commands").HANDLERS[command](rest)
    except TextzooError as e:
        console(stderr=True).print(f"error: {e}")
        return 2
    except SystemExit as e:  # tyro's parse errors and --help
        return int(e.code or 0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
