"""Runs one program in its confined process and reports each outcome on the result pipe.

`source` runs first, then each test snippet in the same namespace, each with its own timer. Lines on
the result pipe (fd `RESULT_FD`) carry the run's nonce: "S ok" | "S err <type>" for the source,
"T <i> ok" | "T <i> err <type>" per test, "D" at the end. A fork of the program that falls through
into the harness reports nothing.
"""

from __future__ import annotations

import builtins
import io
import os
import random
import signal
import sys
import traceback

RESULT_FD = 3


class TestTimeout(BaseException):
    """A test snippet ran out of its time."""


def _alarm(signum, frame):
    raise TestTimeout()


def prepare_streams() -> None:
    """Before the request: stdin from /dev/null, new text streams on fds 0-2 (over a stand-in pipe
    that the program's own pipes replace later, at the same descriptors) and a fresh random state
    (forks of one zygote must not share its state)."""
    devnull = os.open("/dev/null", os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    r, w = os.pipe()
    for fd in (1, 2):
        os.dup2(w, fd)
    os.close(r)
    os.close(w)
    random.seed()
    sys.stdin = sys.__stdin__ = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8")
    sys.stdout = sys.__stdout__ = io.TextIOWrapper(
        io.BufferedWriter(io.FileIO(1, "w", closefd=False)), encoding="utf-8"
    )
    sys.stderr = sys.__stderr__ = io.TextIOWrapper(
        io.BufferedWriter(io.FileIO(2, "w", closefd=False)),
        encoding="utf-8",
        errors="backslashreplace",
        line_buffering=True,
    )


def run(source: str, tests: list[str], test_timeout: float | None, tag: bytes, drop_uid: bool) -> None:
    """Execute the program and its tests, report, exit; never returns (after `prepare_streams`)."""
    write, getpid, me, exit_, kill = os.write, os.getpid, os.getpid(), os._exit, os.kill

    def emit(*parts: str) -> None:
        if getpid() != me:
            exit_(0)
        try:
            write(RESULT_FD, tag + " ".join(parts).encode() + b"\n")
        except OSError:
            pass

    g = {"__name__": "__main__", "__builtins__": builtins}
    try:
        exec(compile(source, "<program>", "exec"), g)
        emit("S", "ok")
    except BaseException as e:
        traceback.print_exc()
        emit("S", "err", type(e).__name__)
    for i, test in enumerate(tests):
        if test_timeout:
            signal.signal(signal.SIGALRM, _alarm)
            signal.setitimer(signal.ITIMER_REAL, test_timeout)
        try:
            exec(compile(test, f"<test {i}>", "exec"), g)
            ok = "ok"
        except BaseException as e:
            ok = "err " + type(e).__name__
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        emit("T", str(i), ok)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass
    emit("D")
    if drop_uid:
        try:
            kill(-1, signal.SIGKILL)  # every other process of this private uid; never the caller
        except OSError:  # none left
            pass
    exit_(0)
