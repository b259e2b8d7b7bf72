"""Run test code in a child process that is confined: as an unprivileged user, or on a tiny disk.

`run_unprivileged`: as root, the child enters a private mount namespace in which everything the
interpreter reads is reachable by others (`open_walls`: each folder on the way that others cannot
enter, such as a 0700 home folder holding the checkout and its venv, is covered by a 0755 tmpfs into
which only the entries that lead on are bound back), then becomes `nobody`; without root the code
simply runs as the caller. Where that is impossible the test is skipped, or fails when the sandbox is
required (tests/features.py).
`run_on_tiny_disk`: the child sees a tmpfs of a few MiB at a given folder (a private mount
namespace; without root, inside a user namespace).
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import features

from textzoo.sandbox._sandbox import layout
from textzoo.sandbox._sandbox import syscalls as sc

NOBODY = 65534
REPO = str(Path(__file__).resolve().parents[1])


def interpreter_reads() -> list[str]:
    """What `python -c` of this interpreter reads as another user: the interpreter's own paths (sys.path,
    its libraries, its executable), the venv's folder with the link to it, and the repository."""
    extra = [os.path.dirname(os.path.abspath(sys.executable)), sys.prefix, sys.base_prefix, REPO]
    return layout.collapse([*layout.interpreter_paths(), *(os.path.realpath(p) for p in extra)])


def walls(paths: list[str]) -> dict[str, set[str]]:
    """The folders on the way to `paths` that others cannot enter (no o+x), each with its entries that
    lead on to a path (a path that is such a folder itself: all its entries)."""
    found: dict[str, set[str]] = {}
    for path in paths:
        parts = Path(path).parts
        for i in range(1, len(parts)):
            folder = str(Path(*parts[:i]))
            if not os.stat(folder).st_mode & stat.S_IXOTH:
                found.setdefault(folder, set()).add(parts[i])
        if os.path.isdir(path) and not os.stat(path).st_mode & stat.S_IXOTH:
            found.setdefault(path, set()).update(os.listdir(path))
    return found


def open_walls(found: dict[str, set[str]]) -> None:
    """In this (private) mount namespace, cover each wall with a 0755 tmpfs and bind its entries back
    from the folder underneath (reached through a descriptor opened before the cover), shallowest first."""
    for folder in sorted(found, key=lambda f: len(Path(f).parts)):
        below = os.open(folder, os.O_PATH | os.O_DIRECTORY)
        sc.mount("tmpfs", folder, "tmpfs", 0, "mode=0755")
        for entry in sorted(found[folder]):
            source, target = f"/proc/self/fd/{below}/{entry}", os.path.join(folder, entry)
            if os.path.isdir(source):
                os.mkdir(target)
            else:
                open(target, "w").close()
            sc.mount(source, target, None, sc.MS_BIND | sc.MS_REC)
        os.close(below)


def _become_nobody(found: dict[str, set[str]]) -> None:
    sc.unshare(sc.CLONE_NEWNS)
    sc.mount(None, "/", None, sc.MS_REC | sc.MS_PRIVATE)
    open_walls(found)
    os.setgroups([])
    os.setresgid(NOBODY, NOBODY, NOBODY)
    os.setresuid(NOBODY, NOBODY, NOBODY)


def run_unprivileged(code: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run `python -c code` as a non-root user (nobody when we are root), from wherever this checkout and
    its interpreter live; skip when impossible (fail when the sandbox is required)."""
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": "/tmp",
        "PYTHONPATH": REPO,
        "PYTHONDONTWRITEBYTECODE": "1",
        "OMP_NUM_THREADS": "1",
        "LANG": "C.UTF-8",
    }
    preexec = None
    if os.geteuid() == 0:
        found = walls(interpreter_reads())
        preexec = lambda: _become_nobody(found)  # noqa: E731
    try:
        return subprocess.run(
            [sys.executable, "-c", code],
            preexec_fn=preexec,
            env=env,
            cwd="/tmp",
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except (subprocess.SubprocessError, OSError) as e:
        features.missing("sandbox", f"cannot run code as an unprivileged user here: {e!r}")


def _mount_tmpfs(folder: str, size: int) -> None:
    if os.geteuid() == 0:
        sc.unshare(sc.CLONE_NEWNS)
    else:
        uid, gid = os.getuid(), os.getgid()
        sc.unshare(sc.CLONE_NEWUSER | sc.CLONE_NEWNS)
        sc.write_id_maps(uid, gid)
    sc.mount(None, "/", None, sc.MS_REC | sc.MS_PRIVATE)
    sc.mount("tmpfs", folder, "tmpfs", 0, f"size={size},mode=0755")


def run_on_tiny_disk(args: list[str], folder: Path, size: int, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run `python *args` with a `size`-byte tmpfs at `folder` (which must exist); skip when impossible."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": REPO}
    try:
        subprocess.run([sys.executable, "-c", "pass"], preexec_fn=lambda: _mount_tmpfs(str(folder), size), check=True)
    except (subprocess.SubprocessError, OSError) as e:
        features.missing("sandbox", f"cannot mount a tmpfs here (needs root or user namespaces): {e!r}")
    return subprocess.run(
        [sys.executable, *args],
        preexec_fn=lambda: _mount_tmpfs(str(folder), size),
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
