"""The one place model-written code runs: a Python program in a separate, limited process.

`run(Program(source, tests))` executes `source`, then each test snippet in the same namespace, in a
fresh child interpreter and returns a `SandboxResult` with one pass/fail per test. `run_many` does the
same for a batch in parallel worker threads (each launching its own child) and keeps the order.

How a child is confined
-----------------------
- Process: `python -I -S` (isolated mode: no PYTHON* variables, no user site, no cwd on `sys.path`; no
  site-packages either, so only the standard library imports), started in a new session so its whole
  process group can be killed; stdin is /dev/null; the environment is scrubbed to a minimal PATH, a
  UTF-8 locale and HOME/TMPDIR pointing at the working dir.
- Working dir: a fresh temp dir, removed afterwards.
- Limits (`SandboxLimits`, set with `setrlimit` before any model code runs): CPU seconds, address
  space, file size, open files, processes, no core files; a wall-clock timeout after which the
  process group is killed with SIGKILL; an optional per-test timer (SIGALRM) so one looping test
  does not cost the others; stdout/stderr are read incrementally and only the first
  `output_bytes` of each are kept (decoded with errors="replace").
- Privileges: when the caller is root, the child drops to a dedicated unprivileged uid/gid (one per
  concurrent run, from a pool locked across processes) after loading the interpreter and the
  `preload` modules and before running any model code. Because the uid is private to this run,
  RLIMIT_NPROC bounds a fork bomb, and everything left behind (even processes that escaped the
  process group with `setsid`) is killed with `kill(-1, SIGKILL)` issued as that uid.
- Results: the harness reports per-test outcomes on a private pipe, each line tagged with a random
  nonce, so printing a fake "passed" line does nothing.

What is guaranteed (tested in tests/test_sandbox.py)
----------------------------------------------------
Infinite loops, fork bombs, huge allocations and floods of output end within the limits, the program
counts as failed and no process of it remains. With the uid drop (root caller): the child cannot
kill its parent or any process of the caller, cannot read files that are not world-readable (e.g.
``~/.ssh``), and cannot write anywhere that is not world-writable.

What is not guaranteed
----------------------
- World-readable files (a repo checked out 0644, /etc) can be read; world-writable dirs (/tmp,
  /dev/shm) can be written, bounded by RLIMIT_FSIZE per file. The network is not blocked.
- Without root (no uid drop) the child runs as the caller: it can read and write the caller's files
  and signal the caller's processes (including its parent); only the limits, the process-group kill
  and the temp working dir apply. Processes that leave the process group survive the cleanup.
- Results are reported from inside the child: code that introspects the harness (frames, `gc`) could
  find the nonce and forge outcomes, just as it could monkeypatch `==`. The nonce stops accidental
  and print-based forgery, not a deliberate in-process attack.
- Imports after the uid drop only work for modules the unprivileged uid can read; when the
  interpreter lives in a private dir (e.g. under /root) only `preload`ed modules are importable.
"""

from __future__ import annotations

import fcntl
import json
import os
import resource
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cache

from textzoo.errors import ConfigError

DEFAULT_PRELOAD: tuple[str, ...] = (
    "bisect",
    "collections",
    "copy",
    "datetime",
    "decimal",
    "fractions",
    "functools",
    "hashlib",
    "heapq",
    "itertools",
    "json",
    "math",
    "operator",
    "random",
    "re",
    "statistics",
    "string",
    "typing",
)


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits for one sandboxed program."""

    timeout_s: float = 5.0
    """Wall-clock seconds for the whole program (interpreter start included); then SIGKILL."""
    cpu_s: int = 5
    """CPU seconds (RLIMIT_CPU) for the child."""
    memory_bytes: int = 1 << 30
    """Address space (RLIMIT_AS) per process; a bigger allocation raises MemoryError."""
    file_size_bytes: int = 16 << 20
    """Largest file the program may write (RLIMIT_FSIZE)."""
    max_processes: int = 32
    """Processes/threads (RLIMIT_NPROC); enforced only when the child runs as a dedicated uid."""
    max_open_files: int = 64
    """Open file descriptors (RLIMIT_NOFILE)."""
    output_bytes: int = 64 << 10
    """Bytes of stdout and of stderr kept; the rest is read and dropped."""
    test_timeout_s: float | None = 2.0
    """Wall-clock seconds per test snippet (None: only `timeout_s` applies)."""
    drop_privileges: bool = True
    """When the caller is root, run model code as a dedicated unprivileged uid."""
    uid_base: int = 2_100_000_000
    """First uid of the pool of dedicated uids (one per concurrent run)."""
    uid_pool_size: int = 1024
    """Number of dedicated uids, i.e. the most concurrent runs across processes."""
    preload: tuple[str, ...] = DEFAULT_PRELOAD
    """Standard modules imported before the uid drop (the only ones importable when the
    interpreter is not readable by the unprivileged uid)."""
    python: str = sys.executable
    """Interpreter that runs the program."""

    def __post_init__(self) -> None:
        for name in (
            "timeout_s",
            "cpu_s",
            "memory_bytes",
            "file_size_bytes",
            "max_processes",
            "max_open_files",
            "output_bytes",
            "uid_pool_size",
        ):
            if getattr(self, name) <= 0:
                raise ConfigError(f"SandboxLimits.{name} must be > 0, got {getattr(self, name)!r}")
        if self.test_timeout_s is not None and self.test_timeout_s <= 0:
            raise ConfigError(f"SandboxLimits.test_timeout_s must be > 0 or None, got {self.test_timeout_s!r}")
        if not 0 < self.uid_base < 2**31 - self.uid_pool_size:
            raise ConfigError(f"SandboxLimits.uid_base must be in (0, 2**31 - uid_pool_size), got {self.uid_base}")


@dataclass(frozen=True)
class Program:
    """Code to run: `source` first, then each of `tests` in the same namespace (one outcome each)."""

    source: str
    tests: Sequence[str] = ()


@dataclass
class SandboxResult:
    """What happened to one program."""

    passed: bool
    """The source ran without error, every test passed and the harness reached its end."""
    returncode: int | None
    timed_out: bool
    stdout: str
    stderr: str
    wall_s: float
    tests: list[bool] = field(default_factory=list)
    """Per test: True when the snippet ran without raising (missing outcome = False)."""
    test_errors: list[str | None] = field(default_factory=list)
    """Per test: the exception type name when it failed ("missing" when it never reported)."""
    source_error: str | None = None
    """Exception type name raised by `source`, "missing" when it never reported, else None."""
    finished: bool = False
    """The harness ran every test and reported the end."""
    isolation: str = "none"
    """"uid" when model code ran as a dedicated unprivileged uid, else "none"."""

    @property
    def fraction_passed(self) -> float:
        """Share of tests passed (0.0 with no tests)."""
        return sum(self.tests) / len(self.tests) if self.tests else 0.0


# The child harness, run as `python -I -S -c _HARNESS payload_path`. It reads (and deletes) its
# payload while still privileged, preloads modules, sets limits, drops to the dedicated uid, then
# runs the program. Outcomes go to a private pipe, tagged with the nonce.
_HARNESS = r"""
import json, os, resource, signal, sys, traceback
def _run():
    path = sys.argv[1]
    with open(path, encoding="utf-8") as f:
        cfg = json.load(f)
    os.unlink(path)
    for name in cfg["preload"]:
        try:
            __import__(name)
        except Exception:
            pass
    for res, val in cfg["rlimits"]:
        try:
            resource.setrlimit(res, (val, val))
        except (ValueError, OSError):
            pass
    uid = cfg["uid"]
    if uid is not None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    fd, tag, write, getpid, me = cfg["fd"], (cfg["nonce"] + " ").encode(), os.write, os.getpid, os.getpid()
    exit_, kill = os._exit, os.kill
    source, tests, test_timeout = cfg["source"], cfg["tests"], cfg["test_timeout"]
    del cfg
    def emit(*parts):
        if getpid() != me:  # a fork of the program fell through into the harness: it reports nothing
            exit_(0)
        try:
            write(fd, tag + " ".join(parts).encode() + b"\n")
        except OSError:
            pass
    class _TestTimeout(BaseException):
        pass
    def _alarm(signum, frame):
        raise _TestTimeout()
    g = {"__name__": "__main__", "__builtins__": __builtins__}
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
            exec(compile(test, "<test %d>" % i, "exec"), g)
            ok = "ok"
        except BaseException as e:
            ok = "err " + ("TestTimeout" if isinstance(e, _TestTimeout) else type(e).__name__)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        emit("T", str(i), ok)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass
    emit("D")
    if uid is not None:
        kill(-1, signal.SIGKILL)  # everything else of this private uid; never the caller itself
    exit_(0)
_run()
"""

_SCRUBBED_PATH = "/usr/local/bin:/usr/bin:/bin"


class _UidPool:
    """Dedicated uids, one per concurrent run, locked with `flock` so other processes skip them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[int, int] = {}  # uid -> lock file fd

    def acquire(self, base: int, size: int) -> int:
        lock_dir = os.path.join(tempfile.gettempdir(), "textzoo-sandbox-uids")
        os.makedirs(lock_dir, mode=0o700, exist_ok=True)
        with self._lock:
            for uid in range(base, base + size):
                if uid in self._held:
                    continue
                fd = os.open(os.path.join(lock_dir, str(uid)), os.O_RDWR | os.O_CREAT, 0o600)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)
                    continue
                self._held[uid] = fd
                return uid
        raise ConfigError(f"all {size} sandbox uids from {base} are busy; raise SandboxLimits.uid_pool_size")

    def release(self, uid: int) -> None:
        with self._lock:
            fd = self._held.pop(uid)
        os.close(fd)  # closing drops the flock


_UIDS = _UidPool()


@cache
def can_drop_privileges(python: str = sys.executable, uid: int = 2_100_000_000) -> bool:
    """True when we are root and a child of `python` can switch to `uid` (probed once)."""
    if os.geteuid() != 0:
        return False
    probe = "import os,sys; u=int(sys.argv[1]); os.setgroups([]); os.setresgid(u,u,u); os.setresuid(u,u,u)"
    try:
        r = subprocess.run([python, "-I", "-S", "-c", probe, str(uid)], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0


def _kill_uid(uid: int) -> None:
    """Kill every process running as `uid` (kill(-1) as that uid spares only the killer itself)."""
    kill = shutil.which("kill", path=_SCRUBBED_PATH)
    if kill is None:
        return
    subprocess.run(
        [kill, "-s", "KILL", "-1"],
        user=uid,
        group=uid,
        extra_groups=[],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={"PATH": _SCRUBBED_PATH},
        timeout=10,
        check=False,
    )


@cache
def _warn_root() -> None:
    warnings.warn(
        "textzoo sandbox: running as root but cannot switch to a dedicated uid (restricted uid map?); "
        "model code runs as root with only resource limits. Run as an unprivileged user or allow the "
        "uids from SandboxLimits.uid_base.",
        RuntimeWarning,
        stacklevel=3,
    )


def _rmtree(path: str) -> None:
    def retry(func, p, _exc):
        # the program may have made a dir unwritable; we own it, so make it writable and retry
        try:
            os.chmod(os.path.dirname(p), 0o700)
            func(p)
        except OSError:
            pass

    shutil.rmtree(path, onerror=retry)


def _decode(buf: bytearray, dropped: int) -> str:
    text = bytes(buf).decode("utf-8", errors="replace")
    return text + (f"\n[... {dropped} more bytes dropped]" if dropped else "")


def run(program: Program, limits: SandboxLimits | None = None) -> SandboxResult:
    """Run one program in a fresh, limited child process; never raises for anything the code does."""
    limits = limits or SandboxLimits()
    drop = limits.drop_privileges and can_drop_privileges(limits.python, limits.uid_base)
    if limits.drop_privileges and not drop and os.geteuid() == 0:
        _warn_root()
    uid: int | None = None
    workdir = tempfile.mkdtemp(prefix="textzoo-sbx-")
    read_fd, write_fd = os.pipe()
    nonce = secrets.token_hex(16)
    start = time.monotonic()
    try:
        if drop:
            uid = _UIDS.acquire(limits.uid_base, limits.uid_pool_size)
            os.chown(workdir, uid, uid)
        rlimits = [
            (resource.RLIMIT_CPU, limits.cpu_s),
            (resource.RLIMIT_AS, limits.memory_bytes),
            (resource.RLIMIT_FSIZE, limits.file_size_bytes),
            (resource.RLIMIT_NOFILE, limits.max_open_files),
            (resource.RLIMIT_CORE, 0),
        ]
        if uid is not None:  # NPROC counts every process of the uid: only meaningful for a private one
            rlimits.append((resource.RLIMIT_NPROC, limits.max_processes))
        payload = {
            "source": program.source,
            "tests": list(program.tests),
            "nonce": nonce,
            "fd": write_fd,
            "uid": uid,
            "rlimits": rlimits,
            "preload": list(limits.preload),
            "test_timeout": limits.test_timeout_s,
        }
        payload_path = os.path.join(workdir, ".payload.json")
        # 0600 and owned by the caller: the dropped child could not read it, and it is gone anyway
        with os.fdopen(os.open(payload_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w", encoding="utf-8") as f:
            json.dump(payload, f)
        env = {"PATH": _SCRUBBED_PATH, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "HOME": workdir, "TMPDIR": workdir}
        try:
            proc = subprocess.Popen(
                [limits.python, "-I", "-S", "-c", _HARNESS, payload_path],
                cwd=workdir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=(write_fd,),
                start_new_session=True,
            )
        except OSError as e:
            return SandboxResult(
                False,
                None,
                False,
                "",
                f"could not start {limits.python}: {e}",
                time.monotonic() - start,
                [False] * len(program.tests),
                ["missing"] * len(program.tests),
                "missing",
            )
        os.close(write_fd)
        write_fd = -1
        outs, timed_out = _collect(proc, read_fd, start + limits.timeout_s, limits.output_bytes)
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # leftovers in the group, even after a clean exit
        except (ProcessLookupError, PermissionError):
            pass
        returncode = proc.wait()
        wall = time.monotonic() - start
    finally:
        for fd in (read_fd, write_fd):
            if fd >= 0:
                os.close(fd)
        if uid is not None:
            try:
                _kill_uid(uid)
            finally:
                _UIDS.release(uid)
        _rmtree(workdir)

    (out, out_drop), (err, err_drop), (res, _) = outs
    tests: list[bool | None] = [None] * len(program.tests)
    errors: list[str | None] = ["missing"] * len(program.tests)
    source_error: str | None = "missing"
    finished = False
    tag = nonce + " "
    for line in bytes(res).decode("utf-8", errors="replace").splitlines():
        if not line.startswith(tag) or finished:
            continue
        parts = line[len(tag) :].split()
        if parts[:1] == ["S"] and source_error == "missing":
            source_error = None if parts[1:2] == ["ok"] else (parts[2] if len(parts) > 2 else "error")
        elif parts[:1] == ["T"] and len(parts) >= 3 and parts[1].isdigit():
            i = int(parts[1])
            if i < len(tests) and tests[i] is None:  # first report wins
                tests[i] = parts[2] == "ok"
                errors[i] = None if tests[i] else (parts[3] if len(parts) > 3 else "error")
        elif parts == ["D"]:
            finished = True
    outcome = [bool(t) for t in tests]
    passed = finished and not timed_out and source_error is None and all(outcome)
    return SandboxResult(
        passed=passed,
        returncode=returncode,
        timed_out=timed_out,
        stdout=_decode(out, out_drop),
        stderr=_decode(err, err_drop),
        wall_s=wall,
        tests=outcome,
        test_errors=errors,
        source_error=source_error,
        finished=finished,
        isolation="uid" if uid is not None else "none",
    )


def _collect(proc: subprocess.Popen, result_fd: int, deadline: float, cap: int):
    """Read stdout, stderr and the result pipe until EOF, the harness exits, or the deadline.

    Returns ([(stdout, dropped), (stderr, dropped), (results, dropped)], timed_out). Reading goes
    on past `cap` (the bytes are dropped) so a chatty program cannot block on a full pipe.
    """
    caps = [cap, cap, 1 << 20]
    bufs = [bytearray(), bytearray(), bytearray()]
    dropped = [0, 0, 0]
    sel = selectors.DefaultSelector()
    for i, f in enumerate((proc.stdout.fileno(), proc.stderr.fileno(), result_fd)):
        os.set_blocking(f, False)
        sel.register(f, selectors.EVENT_READ, i)
    timed_out = False
    exited_at: float | None = None
    try:
        while sel.get_map():
            now = time.monotonic()
            if now >= deadline:
                timed_out = proc.poll() is None
                break
            if exited_at is None and proc.poll() is not None:
                exited_at = now
            # once the harness is gone, pipes held open by stray children must not keep us waiting
            if exited_at is not None and now - exited_at > 0.2:
                break
            for key, _ in sel.select(timeout=min(deadline - now, 0.05 if exited_at else 0.5)):
                i = key.data
                try:
                    chunk = os.read(key.fd, 65536)
                except BlockingIOError:
                    continue
                if not chunk:
                    sel.unregister(key.fd)
                    continue
                room = caps[i] - len(bufs[i])
                bufs[i] += chunk[: max(room, 0)]
                dropped[i] += max(len(chunk) - max(room, 0), 0)
    finally:
        sel.close()
        proc.stdout.close()
        proc.stderr.close()
    if not timed_out and proc.poll() is None:
        # all pipes closed but the harness still runs (it closed its fds): wait out the deadline
        try:
            proc.wait(timeout=max(deadline - time.monotonic(), 0))
        except subprocess.TimeoutExpired:
            timed_out = True
    return list(zip(bufs, dropped)), timed_out


def run_many(
    programs: Sequence[Program], limits: SandboxLimits | None = None, workers: int | None = None
) -> list[SandboxResult]:
    """Run `programs` in parallel (`workers` children at a time, default: CPU count); keep order."""
    programs = list(programs)
    if not programs:
        return []
    workers = workers or os.cpu_count() or 1
    if workers < 1:
        raise ConfigError(f"workers must be >= 1, got {workers}")
    if workers == 1 or len(programs) == 1:
        return [run(p, limits) for p in programs]
    with ThreadPoolExecutor(max_workers=min(workers, len(programs))) as pool:
        return list(pool.map(lambda p: run(p, limits), programs))
