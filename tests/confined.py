"""Run test code in a child process that is confined: as an unprivileged user, or on a tiny disk.

`run_unprivileged`: as root, the child enters a private mount namespace in which the interpreter's
private folder under /root is reachable (a tmpfs over /root with the interpreter's tree moved back
in), then becomes `nobody`; without root the code simply runs as the caller.
`run_on_tiny_disk`: the child sees a tmpfs of a few MiB at a given folder (a private mount
namespace; without root, inside a user namespace).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from textzoo.sandbox._sandbox import syscalls as sc

NOBODY = 65534
REPO = str(Path(__file__).resolve().parents[1])
_MS_MOVE = 8192


def _private_folder(path: str) -> str | None:
    """The top folder under /root holding `path` (None when it is not under /root)."""
    parts = Path(path).parts
    return str(Path(*parts[:3])) if len(parts) > 2 and parts[:2] == ("/", "root") else None


def _become_nobody(stage: str, folder: str | None) -> None:
    sc.unshare(sc.CLONE_NEWNS)
    sc.mount(None, "/", None, sc.MS_REC | sc.MS_PRIVATE)
    if folder is not None:
        sc.mount(folder, stage, None, sc.MS_BIND | sc.MS_REC)
        sc.mount("tmpfs", "/root", "tmpfs", 0, "mode=0755")
        os.mkdir(folder)
        sc.mount(stage, folder, None, _MS_MOVE)
    os.setgroups([])
    os.setresgid(NOBODY, NOBODY, NOBODY)
    os.setresuid(NOBODY, NOBODY, NOBODY)


def run_unprivileged(code: str, tmp_path: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run `python -c code` as a non-root user (nobody when we are root); skip when impossible."""
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
        stage = tmp_path / "stage"
        stage.mkdir()
        folder = _private_folder(os.path.realpath(sys.executable))
        preexec = lambda: _become_nobody(str(stage), folder)  # noqa: E731
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
    except subprocess.SubprocessError as e:
        pytest.skip(f"cannot run code as an unprivileged user here: {e}")


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
        pytest.skip(f"cannot mount a tmpfs here (needs root or user namespaces): {e}")
    return subprocess.run(
        [sys.executable, *args],
        preexec_fn=lambda: _mount_tmpfs(str(folder), size),
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
