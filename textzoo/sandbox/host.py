"""The host side of the sandbox: limits, the zygotes seen from the parent, `run` and `run_many`.

`run(Program(source, tests))` executes `source`, then each test snippet in the same namespace, and
returns a `SandboxResult` with one pass/fail per test. `run_many` does the same for a batch in
parallel and keeps the order.

How a program runs
------------------
A zygote (one warm `python -I -S` per interpreter and isolation setting, started on first use)
has imported the standard modules of `SandboxLimits.preload` and keeps a few process trees ready
(pre-forked): a keeper, pid 1 of a fresh pid namespace in fresh network, mount and IPC namespaces
(under a launcher that enters a user namespace first when the caller is not root), and below it
the program process, which has already mounted its private tmpfs and /proc and built its Landlock
ruleset. A program goes to a ready tree and a new tree starts in its place, so no interpreter
starts and no namespace is built while a program waits. The program process then takes the
rlimits, the dedicated uid (or, without one, no capabilities), its working dir, a scrubbed
environment (PATH, a UTF-8 locale, HOME and TMPDIR), stdin from /dev/null, Landlock and seccomp;
then model code runs. Outcomes come back on a private pipe, each line tagged with a random nonce.
Each tree serves one program. The zygote kills a program's tree when `timeout_s` is up; closing
the zygote (atexit, `close_zygotes`, or the parent dying) kills everything it started. A
confinement step that fails stops the program before any model code runs and `run` raises
`SandboxError` (the sandbox fails closed, never open).

Isolation mechanisms (`SandboxLimits.isolation`; the strongest this machine allows are used, the
zygote logs once which ones, and `require` turns a missing one into a `SandboxError`):

- uid: as root, model code runs as a dedicated uid (one per concurrent run, locked across processes).
- userns: without root, a user namespace per zygote and per program stands in for root.
- netns: a fresh network namespace per program: no interfaces but a loopback that is down.
- mountns: a private root: read-only binds of the interpreter's own folders (every `sys.path` entry,
  its libraries, its executable: the whole standard library imports, wherever the interpreter
  lives), the system library folders and time-zone data; /dev with null, zero, full, random,
  urandom; /etc with hosts only; and one tmpfs per program, `disk_bytes` large, behind
  /sandbox (the working dir), /tmp and /dev/shm, gone with the program.
- pidns: a pid namespace per program with its own /proc; its end kills every process in it.
- ipcns: private System V IPC, POSIX message queues and hostname.
- landlock: reads only of the exposed paths, writes only in the working dir (and /tmp, /dev/shm of
  the private root); no TCP bind/connect (ABI >= 4); no signals or abstract unix sockets beyond the
  program's own processes (ABI >= 6).
- seccomp: sockets of any family but AF_UNIX, new namespaces, mount, ptrace, process_vm_*, bpf,
  perf_event_open, io_uring, keyctl, kexec, modules and other host-wide calls fail with EPERM
  (x86_64 and aarch64).

What it guarantees, what it allows and which test proves each: the package docstring (`textzoo.sandbox`).
"""

from __future__ import annotations

import array
import atexit
import fcntl
import functools
import itertools
import json
import logging
import os
import resource
import secrets
import selectors
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from textzoo.errors import ConfigError, SandboxError
from textzoo.sandbox._sandbox import confine, zygote

logger = logging.getLogger(__name__)

ISOLATION: tuple[str, ...] = confine.MECHANISMS
"""Every isolation mechanism, strongest first."""
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
    """Resource limits and isolation for one sandboxed program."""

    timeout_s: float = 5.0
    """Wall-clock seconds for the whole program (its setup included); then SIGKILL."""
    cpu_s: int = 5
    """CPU seconds (RLIMIT_CPU) for the program."""
    memory_bytes: int = 1 << 30
    """Address space (RLIMIT_AS) per process; a bigger allocation raises MemoryError."""
    file_size_bytes: int = 16 << 20
    """Largest file the program may write (RLIMIT_FSIZE)."""
    disk_bytes: int = 64 << 20
    """Size of the program's private tmpfs (its working dir, /tmp and /dev/shm together)."""
    max_processes: int = 32
    """Processes/threads (RLIMIT_NPROC); enforced with a dedicated uid or a user namespace."""
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
    isolation: tuple[str, ...] = ISOLATION
    """Mechanisms to use where this machine allows them (see the module docstring)."""
    require: tuple[str, ...] = ()
    """Mechanisms that must be in effect: without one, `run` raises `SandboxError` before running."""
    preload: tuple[str, ...] = DEFAULT_PRELOAD
    """Standard modules the zygote imports once, so programs start with them warm."""
    python: str = sys.executable
    """Interpreter that runs the programs."""

    def __post_init__(self) -> None:
        for name in (
            "timeout_s",
            "cpu_s",
            "memory_bytes",
            "file_size_bytes",
            "disk_bytes",
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
        for name in ("isolation", "require"):
            unknown = sorted(set(getattr(self, name)) - set(ISOLATION))
            if unknown:
                raise ConfigError(f"SandboxLimits.{name} has unknown mechanisms {unknown}; choose from {ISOLATION}")
        if set(self.require) - set(self.mechanisms):
            raise ConfigError(
                f"SandboxLimits.require names {sorted(set(self.require) - set(self.mechanisms))}, which "
                "isolation (or drop_privileges=False) turns off"
            )

    @property
    def mechanisms(self) -> tuple[str, ...]:
        """The mechanisms asked for: `isolation`, without "uid" when `drop_privileges` is off."""
        return tuple(m for m in self.isolation if self.drop_privileges or m != "uid")


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
    """The mechanisms the program ran under, joined by "+" (e.g. "uid+netns+mountns"), or "none"."""

    @property
    def fraction_passed(self) -> float:
        """Share of tests passed (0.0 with no tests)."""
        return sum(self.tests) / len(self.tests) if self.tests else 0.0


@dataclass(frozen=True)
class IsolationReport:
    """What a zygote confines programs with on this machine."""

    mechanisms: tuple[str, ...]
    """In effect, in `ISOLATION` order."""
    missing: dict[str, str]
    """Asked for but unavailable: mechanism -> why."""
    landlock_abi: int
    """The kernel's Landlock ABI version (0: none)."""

    def __str__(self) -> str:
        return "+".join(self.mechanisms) or "none"


_SCRUBBED_PATH = confine.SCRUBBED_PATH
_GRACE_S = 0.2  # after the program's tree is gone, how long stray pipe holders may keep us reading
_STUCK_S = 30.0  # beyond timeout_s: the zygote must have reported by then


# ---- dedicated uids ----------------------------------------------------------------------------
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


# ---- the zygote, seen from the parent ----------------------------------------------------------
class _Job:
    """One program submitted to a zygote: the read ends of its pipes and, later, its exit."""

    def __init__(self, rid: int, fds: list[int], on_exit: Callable[[], None] | None = None):
        self.id, self.fds, self.on_exit = rid, fds, on_exit
        self.done = threading.Event()
        self.returncode: int | None = None
        self.timed_out = False
        self.error: str | None = None

    def finish(self, returncode: int | None, timed_out: bool, error: str | None = None) -> None:
        self.returncode, self.timed_out, self.error = returncode, timed_out, error
        self.done.set()
        if self.on_exit is not None:
            self.on_exit()


class _Zygote:
    """A running zygote: its process, its control socket, what it isolates with and the jobs in flight."""

    def __init__(self, limits: SandboxLimits):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        config = {
            "fd": theirs.fileno(),
            "parent": os.getpid(),
            "preload": list(limits.preload),
            "isolation": list(limits.mechanisms),
            "uid": limits.uid_base,
            "disk_bytes": limits.disk_bytes,
            "pool": max(3, min(os.cpu_count() or 1, 8)),
        }
        self.pool = config["pool"]  # process trees kept ready; one more while each program runs
        package_dir = str(Path(__file__).resolve().parent)  # holds _sandbox, imported by the zygote
        try:
            self.proc = subprocess.Popen(
                [limits.python, "-I", "-S", "-c", zygote.BOOT, package_dir, json.dumps(config)],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                env={"PATH": _SCRUBBED_PATH, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"},
                start_new_session=True,  # a Ctrl-C in the terminal must not reach it
            )
        except OSError as e:
            raise SandboxError(f"cannot start the sandbox interpreter {limits.python!r}: {e}") from e
        finally:
            theirs.close()
        self.sock, self.pid = ours, os.getpid()
        self._ids = itertools.count(1)
        self._jobs: dict[int, _Job] = {}
        self._lock = threading.Lock()
        self.alive = True
        hello = self._hello()
        order = {m: i for i, m in enumerate(ISOLATION)}
        self.report = IsolationReport(
            tuple(sorted(hello["use"], key=order.__getitem__)), dict(hello["missing"]), int(hello["landlock_abi"])
        )
        self._reader = threading.Thread(target=self._read, name="textzoo-sandbox-zygote", daemon=True)
        self._reader.start()

    def _hello(self) -> dict:
        self.sock.settimeout(120)
        try:
            msg = self.sock.recv(1 << 20)
        except OSError:
            msg = b""
        self.sock.settimeout(None)
        if msg[:1] != zygote.HELLO:
            self.close()
            raise SandboxError(
                f"the sandbox zygote did not start (exit status {self.proc.poll()}); its error is printed above"
            )
        return json.loads(msg[1:])

    def _read(self) -> None:
        while True:
            try:
                msg = self.sock.recv(4096)
            except OSError:
                msg = b""
            if not msg:
                break
            kind, body = msg[:1], msg[1:]
            if kind == zygote.EXIT:
                rid, returncode, timed_out = zygote.EXIT_MSG.unpack(body)
                job = self._jobs.pop(rid, None)
                if job is not None:
                    job.finish(returncode, timed_out)
            elif kind == zygote.ERROR:
                (rid,) = zygote.KILL_MSG.unpack(body[: zygote.KILL_MSG.size])
                job = self._jobs.pop(rid, None)
                if job is not None:
                    job.finish(None, False, body[zygote.KILL_MSG.size :].decode("utf-8", "replace"))
        self.alive = False
        for job in list(self._jobs.values()):
            job.finish(None, False, "the sandbox zygote exited")
        self._jobs.clear()

    def submit(self, payload: bytes, timeout_s: float, on_exit: Callable[[], None] | None = None) -> _Job:
        """Start one program; the caller reads `job.fds` and waits for `job.done` (then `on_exit` runs)."""
        memfd = os.memfd_create("textzoo-sandbox-payload", os.MFD_CLOEXEC)
        pipes = [os.pipe() for _ in range(3)]
        job = _Job(next(self._ids), [r for r, _ in pipes], on_exit)
        try:
            view = memoryview(payload)
            while view:
                view = view[os.write(memfd, view) :]
            fds = array.array("i", [memfd, *(w for _, w in pipes)])
            with self._lock:
                if not self.alive:
                    raise SandboxError("the sandbox zygote has exited")
                self._jobs[job.id] = job
                try:
                    self.sock.sendmsg(
                        [zygote.RUN + zygote.RUN_MSG.pack(job.id, timeout_s)],
                        [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)],
                    )
                except OSError as e:
                    self._jobs.pop(job.id, None)
                    raise SandboxError(f"the sandbox zygote does not answer: {e}") from e
        except BaseException:
            for fd in job.fds:
                os.close(fd)
            raise
        finally:
            for fd in (memfd, *(w for _, w in pipes)):
                os.close(fd)
        return job

    def kill(self, job: _Job) -> None:
        with self._lock:
            try:
                self.sock.send(zygote.KILL + zygote.KILL_MSG.pack(job.id))
            except OSError:
                pass

    def close(self) -> None:
        """Stop the zygote; it kills every program it runs before it exits."""
        self.alive = False
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


_ZYGOTES: dict[tuple, _Zygote] = {}
_ZYGOTES_LOCK = threading.Lock()


def _zygote_for(limits: SandboxLimits) -> _Zygote:
    key = (limits.python, limits.preload, limits.mechanisms, limits.uid_base)
    with _ZYGOTES_LOCK:
        z = _ZYGOTES.get(key)
        if z is not None and z.alive and z.pid == os.getpid():
            return z
        if z is not None and z.pid == os.getpid():
            z.close()
        z = _ZYGOTES[key] = _Zygote(limits)
    _announce(str(z.report), tuple(z.report.missing.items()), z.report.landlock_abi)
    try:
        _self_test(z, limits)
    except BaseException:
        with _ZYGOTES_LOCK:
            _ZYGOTES.pop(key, None)
        z.close()
        raise
    return z


def _self_test(z: _Zygote, limits: SandboxLimits) -> None:
    """A first program through the whole path: setup, the standard library, outcomes."""
    r = _run_on(z, Program("import json, socket, textwrap", ["assert json.loads('1') == 1"]), limits)
    if not r.passed:
        raise SandboxError(
            f"the sandbox ({z.report}) cannot run a trivial program: returncode {r.returncode}, "
            f"stderr: {r.stderr.strip()[-500:]!r}"
        )


@functools.cache
def _announce(mechanisms: str, missing: tuple[tuple[str, str], ...], landlock_abi: int) -> None:
    """Say once per process and isolation outcome what programs run under."""
    abi = f", Landlock ABI {landlock_abi}" if "landlock" in mechanisms.split("+") else ""
    logger.info("textzoo sandbox: programs run confined by %s%s", mechanisms, abi)
    if missing:
        logger.warning(
            "textzoo sandbox: not available here: %s. See the guarantees table of textzoo.sandbox for "
            "what each one's absence leaves open.",
            "; ".join(f"{m} ({why})" for m, why in missing),
        )


def close_zygotes() -> None:
    """Stop this process's zygotes, killing any program still running (they restart on next use)."""
    with _ZYGOTES_LOCK:
        zygotes = [z for z in _ZYGOTES.values() if z.pid == os.getpid()]
        _ZYGOTES.clear()
    for z in zygotes:
        z.close()


def _forget_zygotes_after_fork() -> None:
    # a forked child must not talk over its parent's sockets; it starts its own zygotes
    _ZYGOTES.clear()


atexit.register(close_zygotes)
os.register_at_fork(after_in_child=_forget_zygotes_after_fork)


def isolation_report(limits: SandboxLimits | None = None) -> IsolationReport:
    """The isolation programs run under with `limits` on this machine (starts the zygote)."""
    return _zygote_for(limits or SandboxLimits()).report


def can_drop_privileges(python: str = sys.executable, uid: int = 2_100_000_000) -> bool:
    """True when programs run by `python` run as a dedicated uid (`uid` is the pool's first)."""
    return "uid" in isolation_report(SandboxLimits(python=python, uid_base=uid)).mechanisms


# ---- one program -------------------------------------------------------------------------------
def run(program: Program, limits: SandboxLimits | None = None) -> SandboxResult:
    """Run one program confined and limited; never raises for anything the code does.

    Raises `SandboxError` when the sandbox itself cannot run it (a `require`d mechanism is missing,
    a confinement step failed, the zygote died).
    """
    limits = limits or SandboxLimits()
    z = _zygote_for(limits)
    missing = sorted(set(limits.require) - set(z.report.mechanisms))
    if missing:
        raise SandboxError(
            f"SandboxLimits.require asks for {missing}, not available here: "
            + "; ".join(f"{m}: {z.report.missing.get(m, 'not set up')}" for m in missing)
        )
    return _run_on(z, program, limits)


def _payload(program: Program, limits: SandboxLimits, nonce: str, uid: int | None, workdir: str | None) -> bytes:
    rlimits = [
        (resource.RLIMIT_CPU, limits.cpu_s),
        (resource.RLIMIT_AS, limits.memory_bytes),
        (resource.RLIMIT_FSIZE, limits.file_size_bytes),
        (resource.RLIMIT_NOFILE, limits.max_open_files),
        (resource.RLIMIT_CORE, 0),
    ]
    return json.dumps(
        {
            "source": program.source,
            "tests": list(program.tests),
            "nonce": nonce,
            "uid": uid,
            "workdir": workdir,
            "rlimits": rlimits,
            "nproc": limits.max_processes,
            "disk_bytes": limits.disk_bytes,
            "test_timeout": limits.test_timeout_s,
        }
    ).encode()


def _host_workdir(uid: int | None) -> str:
    """Without a private root: a fresh temp dir on the host (owned by the dedicated uid)."""
    workdir = tempfile.mkdtemp(prefix="textzoo-sbx-")
    if uid is not None:
        os.chown(workdir, uid, uid)
    return workdir


def _rmtree(path: str) -> None:
    def retry(func, p, _exc):
        # the program may have made a dir unwritable; we own it, so make it writable and retry
        try:
            os.chmod(os.path.dirname(p), 0o700)
            func(p)
        except OSError:
            pass

    shutil.rmtree(path, onerror=retry)


def _run_on(z: _Zygote, program: Program, limits: SandboxLimits) -> SandboxResult:
    use = z.report.mechanisms
    # a pid namespace and a private root clean up after themselves: the result is known when the
    # harness reports its end, and the uid goes back to the pool once the zygote saw the tree exit
    detached = "pidns" in use and "mountns" in use
    uid = _UIDS.acquire(limits.uid_base, limits.uid_pool_size) if "uid" in use else None
    release = functools.partial(_UIDS.release, uid) if uid is not None else None
    workdir = None
    nonce = secrets.token_hex(16)
    start = time.monotonic()
    try:
        workdir = None if "mountns" in use else _host_workdir(uid)
        job = z.submit(_payload(program, limits, nonce, uid, workdir), limits.timeout_s, release if detached else None)
    except BaseException:
        if release is not None:
            release()
        raise
    try:
        end = (nonce + " D\n").encode() if detached else None
        outs, ended = _collect(job, limits.output_bytes, start + limits.timeout_s + _STUCK_S, end)
        if not ended:
            _wait(z, job, start + limits.timeout_s + _STUCK_S)
    except BaseException:
        z.kill(job)
        raise
    finally:
        if not detached:
            _clean_up(uid, workdir, "pidns" in use)
    returncode, timed_out = (0, False) if ended else (job.returncode, job.timed_out)
    return _result(program, outs, returncode, timed_out, nonce, time.monotonic() - start, z.report)


def _wait(z: _Zygote, job: _Job, deadline: float) -> None:
    """Until the zygote reports the program's exit; `SandboxError` when it cannot run it."""
    job.done.wait(max(deadline - time.monotonic(), 0))
    if not job.done.is_set():
        z.kill(job)
        raise SandboxError(f"the sandbox zygote did not report a program {_STUCK_S:.0f} s after its timeout")
    if job.error is not None:
        raise SandboxError(f"the sandbox could not run a program: {job.error}")


def _clean_up(uid: int | None, workdir: str | None, pid_namespace: bool) -> None:
    """Without a pid namespace and a private root: kill what the uid left running, remove the workdir."""
    if uid is not None:
        try:
            if not pid_namespace:
                _kill_uid(uid)
        finally:
            _UIDS.release(uid)
    if workdir is not None:
        _rmtree(workdir)


def _drain(fd: int) -> bytes:
    chunks = []
    try:
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    except BlockingIOError:
        pass
    return b"".join(chunks)


def _collect(job: _Job, cap: int, deadline: float, end: bytes | None = None) -> tuple[list, bool]:
    """Read stdout, stderr and the result pipe until EOF (or `_GRACE_S` after the program's exit),
    or, given `end`, until the result pipe ends with it (the harness's last line; what the program
    wrote before it is in the other pipes by then).

    Returns ([(stdout, dropped), (stderr, dropped), (results, dropped)], whether `end` was seen).
    Reading goes on past `cap` (the bytes are dropped) so a chatty program cannot block on a full pipe.
    """
    caps = [cap, cap, 1 << 20]
    bufs = [bytearray(), bytearray(), bytearray()]
    dropped = [0, 0, 0]
    sel = selectors.DefaultSelector()
    for i, fd in enumerate(job.fds):
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_READ, i)

    def keep(i: int, chunk: bytes) -> None:
        room = max(caps[i] - len(bufs[i]), 0)
        bufs[i] += chunk[:room]
        dropped[i] += len(chunk) - len(chunk[:room])

    exited_at: float | None = None
    ended = False
    try:
        while sel.get_map() and not ended:
            now = time.monotonic()
            if exited_at is None and job.done.is_set():
                exited_at = now
            if now >= deadline or (exited_at is not None and now - exited_at > _GRACE_S):
                break
            for key, _ in sel.select(timeout=0.05 if exited_at else 0.5):
                try:
                    chunk = os.read(key.fd, 65536)
                except BlockingIOError:
                    continue
                if not chunk:
                    sel.unregister(key.fd)
                    continue
                keep(key.data, chunk)
                ended = end is not None and key.data == 2 and bufs[2].endswith(end)
                if ended:
                    for i in (0, 1):
                        keep(i, _drain(job.fds[i]))
                    break
    finally:
        sel.close()
        for fd in job.fds:
            os.close(fd)
    return list(zip(bufs, dropped)), ended


def _decode(buf: bytearray, dropped: int) -> str:
    text = bytes(buf).decode("utf-8", errors="replace")
    return text + (f"\n[... {dropped} more bytes dropped]" if dropped else "")


def _outcomes(lines: list[str], n_tests: int) -> tuple[list[bool], list[str | None], str | None, bool]:
    """(per-test outcomes, per-test errors, source error, finished) from the tagged result lines."""
    tests: list[bool | None] = [None] * n_tests
    errors: list[str | None] = ["missing"] * n_tests
    source_error: str | None = "missing"
    finished = False
    for parts in (line.split() for line in lines):
        if finished:
            break
        if parts[:1] == ["S"] and source_error == "missing":
            source_error = None if parts[1:2] == ["ok"] else (parts[2] if len(parts) > 2 else "error")
        elif parts[:1] == ["T"] and len(parts) >= 3 and parts[1].isdigit():
            i = int(parts[1])
            if i < n_tests and tests[i] is None:  # first report wins
                tests[i] = parts[2] == "ok"
                errors[i] = None if tests[i] else (parts[3] if len(parts) > 3 else "error")
        elif parts == ["D"]:
            finished = True
    return [bool(t) for t in tests], errors, source_error, finished


def _result(
    program: Program, outs, returncode: int | None, timed_out: bool, nonce: str, wall: float, report: IsolationReport
) -> SandboxResult:
    (out, out_drop), (err, err_drop), (res, _) = outs
    tag = nonce + " "
    lines = [line[len(tag) :] for line in bytes(res).decode("utf-8", "replace").splitlines() if line.startswith(tag)]
    # the first line comes from the sandbox itself, written before any model code ran
    if lines[:1] and lines[0].startswith("F "):
        raise SandboxError(f"the sandbox could not confine a program ({report}): {lines[0][2:]}")
    if lines[:1] != ["R"] and not timed_out:
        raise SandboxError(
            f"a sandboxed program died during its setup (returncode {returncode}): {_decode(err, err_drop)[-500:]}"
        )
    tests, errors, source_error, finished = _outcomes(lines[1:], len(program.tests))
    return SandboxResult(
        passed=finished and not timed_out and source_error is None and all(tests),
        returncode=returncode,
        timed_out=timed_out,
        stdout=_decode(out, out_drop),
        stderr=_decode(err, err_drop),
        wall_s=wall,
        tests=tests,
        test_errors=errors,
        source_error=source_error,
        finished=finished,
        isolation=str(report),
    )


def run_many(
    programs: Sequence[Program], limits: SandboxLimits | None = None, workers: int | None = None
) -> list[SandboxResult]:
    """Run `programs` in parallel (`workers` at a time, default: CPU count); keep the order."""
    programs = list(programs)
    if not programs:
        return []
    workers = workers or os.cpu_count() or 1
    if workers < 1:
        raise ConfigError(f"workers must be >= 1, got {workers}")
    limits = limits or SandboxLimits()
    if workers == 1 or len(programs) == 1:
        return [run(p, limits) for p in programs]
    with ThreadPoolExecutor(max_workers=min(workers, len(programs))) as pool:
        return list(pool.map(lambda p: run(p, limits), programs))
