"""The processes behind each program, and the probe of what this machine allows.

    as root:          zygote -fork-> keeper -fork-> program
    user namespaces:  zygote -fork-> launcher -fork-> keeper -fork-> program

The zygote keeps a few such trees ready before any program arrives (pre-forked); each serves one
program and ends; the zygote kills a tree's top process when its program's time is up.
- launcher (user namespaces only): enters a new user namespace with the others and forks the keeper.
  As root the zygote forks the keeper straight into a new pid namespace and returns to its own.
- keeper: pid 1 of the program's pid namespace; enters the other namespaces (net, mount, ipc + uts:
  those of the plan), forks the program process, reaps it and any orphan, reports its returncode to
  the zygote and exits, which kills whatever is left in the namespace.
- program: mounts its private tmpfs and /proc and builds its Landlock ruleset, says "ready" and waits
  for its request (a payload and three pipes); then takes its own session, the rlimits, the dedicated
  uid (or no capabilities at all), its working dir, Landlock and seccomp; `harness.run` runs the model
  code.
Each dies with its parent (a parent-death signal), so killing the top of a tree ends all of it.
Before model code runs, the program reports "R" on the result pipe; a setup step that fails reports
"F <why>" there (or, before a request came, to the zygote) and model code never runs: the sandbox
fails closed.
"""

from __future__ import annotations

import array
import gc
import json
import os
import resource
import select
import signal
import socket
import struct

from . import harness, layout
from . import syscalls as sc

MECHANISMS = ("uid", "userns", "netns", "mountns", "pidns", "ipcns", "landlock", "seccomp")
SCRUBBED_PATH = "/usr/local/bin:/usr/bin:/bin"
READY, FAILED, STATUS = b"ready", b"F ", b"S"  # tree -> zygote: ready, setup failed, returncode
STATUS_MSG = struct.Struct("=i")
NUM_FDS = 4  # a request's payload memfd and the write ends of stdout, stderr and the result pipe


class SetupError(Exception):
    """A confinement step failed: the program must not run."""


def _step(name: str, fn, *args) -> None:
    try:
        fn(*args)
    except OSError as e:
        raise SetupError(f"{name}: {e}") from None


def _fail_tree(link: socket.socket, why: str) -> None:
    """A setup step failed before any request: tell the zygote, end this tree."""
    try:
        link.send(FAILED + why.encode("utf-8", "replace")[:2000])
    finally:
        os._exit(125)


def _fail_program(res_fd: int, tag: bytes, why: str) -> None:
    try:
        os.write(res_fd, tag + FAILED + why.replace("\n", " ").encode("utf-8", "replace") + b"\n")
    finally:
        os._exit(125)


def recv_fds(sock: socket.socket, size: int = 4096) -> tuple[bytes, list[int]]:
    """One message and the file descriptors that came with it."""
    msg, ancdata, _flags, _addr = sock.recvmsg(size, socket.CMSG_SPACE(NUM_FDS * 4))
    fds = array.array("i")
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
    return msg, list(fds)


def namespace_flags(use: frozenset[str]) -> int:
    """The unshare flags of one program's launcher."""
    flags = 0
    for name, flag in (
        ("userns", sc.CLONE_NEWUSER),
        ("netns", sc.CLONE_NEWNET),
        ("mountns", sc.CLONE_NEWNS),
        ("pidns", sc.CLONE_NEWPID),
        ("ipcns", sc.CLONE_NEWIPC | sc.CLONE_NEWUTS),
    ):
        if name in use:
            flags |= flag
    return flags


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    return b"".join(chunks)


def _only_fds(keep: list[int]) -> None:
    """Close every descriptor above stderr but `keep` (the zygote's sockets, other trees' ends)."""
    low = 3
    for fd in sorted(keep):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, resource.getrlimit(resource.RLIMIT_NOFILE)[0])


# ---- launcher (with a user namespace) ----------------------------------------------------------
def launch(link: socket.socket, plan: dict, zygote: int) -> None:
    """Run in the launcher, a fork of the zygote that enters the namespaces; never returns.

    Only with user namespaces (non-root): a pid namespace owned by a new user namespace cannot be
    left again, so this process exists to enter them. As root the zygote forks the keeper itself.
    """
    gc.disable()
    sc.set_parent_death_signal(signal.SIGKILL)
    sc.set_name("textzoo-launch")
    if os.getppid() != zygote:
        os._exit(125)
    _only_fds([link.fileno()])
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    use = frozenset(plan["use"])
    uid, gid = os.getuid(), os.getgid()
    try:
        _step("entering namespaces", sc.unshare, namespace_flags(use))
        if "userns" in use:
            _step("mapping ids", sc.write_id_maps, uid, gid)
    except SetupError as e:
        _fail_tree(link, str(e))
    pid = os.fork()
    if pid == 0:
        try:
            keep(plan, link, 0)
        finally:
            os._exit(125)
    link.close()
    os.waitpid(pid, 0)
    os._exit(0)


# ---- keeper ------------------------------------------------------------------------------------
def _peer_gone(link: socket.socket) -> bool:
    """Whether the zygote's end of `link` is closed (it sends nothing before the request)."""
    if not select.select([link], [], [], 0)[0]:
        return False
    try:
        return link.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False


def keep(plan: dict, link: socket.socket, flags: int) -> None:
    """Run in the keeper (pid 1 of the program's pid namespace when there is one); never returns.

    Enters the namespaces in `flags` (those its parent did not), forks the program, reaps it and
    every orphan, and sends the program's returncode to the zygote before it exits.
    """
    gc.disable()
    sc.set_parent_death_signal(signal.SIGKILL)
    sc.set_name("textzoo-keeper")
    if _peer_gone(link):  # the zygote died before the signal was armed
        os._exit(125)
    _only_fds([link.fileno()])
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    try:
        if flags:
            _step("entering namespaces", sc.unshare, flags)
    except SetupError as e:
        _fail_tree(link, str(e))
    use = frozenset(plan["use"])
    me = os.getpid()
    pid = os.fork()
    if pid == 0:
        try:
            serve_one(plan, link, me)
        finally:
            os._exit(125)
    while True:  # as pid 1, orphans of the program are ours to reap
        done, code = os.waitpid(-1 if "pidns" in use else pid, 0)
        if done == pid:
            break
    if "pidns" not in use:
        try:
            os.killpg(pid, signal.SIGKILL)  # what the program left in its session
        except OSError:
            pass
    link.send(STATUS + STATUS_MSG.pack(os.waitstatus_to_exitcode(code)))
    os._exit(0)


# ---- program -----------------------------------------------------------------------------------
def _prepare(plan: dict) -> int | None:
    """What needs no request, done before it comes: a session of its own, the text streams, the
    private tmpfs and /proc mounted, the Landlock ruleset of the private root built. Returns the
    ruleset's fd (None: built per program, or none)."""
    os.setsid()
    harness.prepare_streams()
    use = frozenset(plan["use"])
    if "mountns" not in use:
        return None
    _step("mounting the private tmpfs", layout.program_mounts, plan["disk_bytes"], "pidns" in use)
    if "landlock" not in use:
        return None
    try:
        return sc.landlock_ruleset(layout.landlock_rules(plan["paths"], layout.WORKDIR, True), plan["landlock_abi"])
    except OSError as e:
        raise SetupError(f"Landlock: {e}") from None


def serve_one(plan: dict, link: socket.socket, keeper: int) -> None:
    """Run in the program process: prepare, wait for the request, confine, run the harness; never returns."""
    gc.enable()
    sc.set_name("textzoo-program")
    try:
        ruleset = _prepare(plan)
    except SetupError as e:
        _fail_tree(link, str(e))
    link.send(READY)
    try:
        msg, fds = recv_fds(link)
    except OSError:
        os._exit(125)
    link.close()
    if len(fds) != NUM_FDS:  # the zygote closed (no request will come)
        os._exit(0)
    payload_fd, out_fd, err_fd, res_fd = fds
    os.lseek(payload_fd, 0, os.SEEK_SET)
    cfg = json.loads(_read_all(payload_fd))
    os.close(payload_fd)
    confine_and_run(cfg, plan, [out_fd, err_fd, res_fd], cfg["nonce"].encode() + b" ", keeper, ruleset)


def _stdio(fds: list[int]) -> None:
    """The program's pipes as fds 1, 2 and the result fd; every other descriptor above them closed."""
    for fd, target in ((fds[0], 1), (fds[1], 2), (fds[2], harness.RESULT_FD)):
        os.dup2(fd, target)
    os.closerange(harness.RESULT_FD + 1, resource.getrlimit(resource.RLIMIT_NOFILE)[0])


def _identity(uid: int | None) -> None:
    if uid is not None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    else:
        sc.drop_capabilities()


def program_environment(workdir: str, private: bool) -> dict[str, str]:
    """The whole environment a program sees."""
    return {
        "PATH": SCRUBBED_PATH,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "HOME": workdir,
        "TMPDIR": "/tmp" if private else workdir,
        "USER": "sandbox",
        "LOGNAME": "sandbox",
    }


def confine_and_run(cfg: dict, plan: dict, fds: list[int], tag: bytes, keeper: int, ruleset: int | None) -> None:
    """Confine this process for `cfg`'s program, report "R", run the harness; never returns."""
    use = frozenset(plan["use"])
    private = "mountns" in use
    workdir = layout.WORKDIR if private else cfg["workdir"]
    res_fd = fds[2]
    try:
        if private:
            _step("sizing the private tmpfs", layout.adopt_private, cfg["disk_bytes"], plan["disk_bytes"], cfg["uid"])
        if "landlock" in use:  # after the mounts (Landlock forbids mounting), before stdio closes the ruleset
            if ruleset is not None:
                _step("Landlock", sc.landlock_enforce, ruleset)
            else:
                rules = layout.landlock_rules(plan["paths"], workdir, private)
                _step("Landlock", sc.landlock_restrict, rules, plan["landlock_abi"])
        _step("redirecting stdio", _stdio, fds)
        res_fd = harness.RESULT_FD
        rlimits = list(cfg["rlimits"])
        if cfg["uid"] is not None or "userns" in use:  # NPROC counts per uid (per user namespace)
            rlimits.append((resource.RLIMIT_NPROC, cfg["nproc"]))
        for res, value in rlimits:
            _step(f"setrlimit({res})", resource.setrlimit, res, (value, value))
        _step("dropping privileges", _identity, cfg["uid"])
        sc.set_parent_death_signal(signal.SIGKILL)  # a change of uid cleared it
        if os.getppid() != (1 if "pidns" in use else keeper):
            os._exit(125)
        _step("entering the working dir", os.chdir, workdir)
        env = program_environment(workdir, private)
        if os.environ != env:  # the zygote of a private root already has it
            os.environ.clear()
            os.environ.update(env)
        if "seccomp" in use:
            _step("seccomp", sc.seccomp_install)
        else:
            _step("no_new_privs", sc.no_new_privs)
    except SetupError as e:
        _fail_program(res_fd, tag, str(e))
    os.write(harness.RESULT_FD, tag + b"R\n")
    harness.run(cfg["source"], cfg["tests"], cfg["test_timeout"], tag, drop_uid=cfg["uid"] is not None)


# ---- probing -----------------------------------------------------------------------------------
def in_child(fn, *args) -> str | None:
    """Run `fn(*args)` in a forked child: None when it returned, else the error it raised."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            fn(*args)
            code = 0
        except BaseException as e:  # every failure is a finding
            os.write(w, f"{type(e).__name__}: {e}".encode()[:500])
            code = 1
        os._exit(code)
    os.close(w)
    message = _read_all(r).decode("utf-8", "replace")
    os.close(r)
    _, status = os.waitpid(pid, 0)
    if status == 0:
        return None
    return message or f"the probe died ({os.waitstatus_to_exitcode(status)})"


def _try_uid(uid: int) -> None:
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)


def _try_namespace(flags: int, userns: bool) -> None:
    uid, gid = os.getuid(), os.getgid()
    sc.unshare(flags | (sc.CLONE_NEWUSER if userns else 0))
    if userns:
        sc.write_id_maps(uid, gid)
    if flags & sc.CLONE_NEWPID:
        pid = os.fork()
        if pid == 0:
            os._exit(0 if os.getpid() == 1 else 1)
        _, status = os.waitpid(pid, 0)
        if status:
            raise OSError("the first child of a new pid namespace is not pid 1")


def _try_pid_namespaces(own: int) -> None:
    """The zygote's way (as root): a new pid namespace per child, then back to its own."""
    for _ in range(2):
        sc.unshare(sc.CLONE_NEWPID)
        pid = os.fork()
        if pid == 0:
            os._exit(0 if os.getpid() == 1 else 1)
        sc.setns(own, sc.CLONE_NEWPID)
        _, status = os.waitpid(pid, 0)
        if status:
            raise OSError("the first child of a new pid namespace is not pid 1")


def _try_landlock(abi: int) -> None:
    if abi < 1:
        raise OSError("Landlock is not available (kernel < 5.13, or not enabled in the LSM list)")
    sc.landlock_restrict([], abi)
    try:
        os.listdir("/")
    except PermissionError:
        return
    raise OSError("Landlock did not restrict reading /")


def _try_seccomp() -> None:
    if not sc.seccomp_supported():
        raise OSError(f"no syscall table for {sc.ARCH} here (x86_64 and aarch64 have one)")
    sc.seccomp_install()
    try:
        socket.socket(socket.AF_INET, socket.SOCK_STREAM).close()
    except PermissionError:
        return
    raise OSError("the filter did not block an AF_INET socket")


def enter_zygote_namespaces(
    requested: frozenset[str], paths: list[str], links: list[tuple[str, str]], missing: dict[str, str]
) -> frozenset[str]:
    """In the zygote: its own user namespace (non-root) and mount namespace with the read-only root
    of `paths` (see `layout.exposed_paths`).

    Returns the mechanisms set up; `missing` gets the reason for each requested one that failed.
    """
    got: set[str] = set()
    root = os.geteuid() == 0
    if "userns" in requested and not root:
        uid, gid = os.getuid(), os.getgid()
        try:
            sc.unshare(sc.CLONE_NEWUSER | sc.CLONE_NEWNS)
            sc.write_id_maps(uid, gid)
            got.add("userns")
        except OSError as e:
            missing["userns"] = f"user namespaces are not allowed here ({e})"
    if "mountns" in requested:
        if root or "userns" in got:
            try:
                if root:
                    sc.unshare(sc.CLONE_NEWNS)
                hidden = [p for p in paths if layout.hidden(p)]
                if hidden:
                    raise OSError(f"the interpreter's {hidden[0]} would be hidden by the sandbox's own mounts")
                layout.build_root(layout.STAGE, paths, links, host_proc=not root)
                got.add("mountns")
            except OSError as e:
                missing["mountns"] = f"cannot build the private root ({e})"
        else:
            missing["mountns"] = "needs root or a user namespace"
    return frozenset(got)


def probe(
    requested: frozenset[str], have: frozenset[str], uid: int, paths: list[str], own_pidns: int, missing: dict[str, str]
) -> dict:
    """Which per-program mechanisms work from this zygote; returns the plan (JSON-able).

    `own_pidns`: a descriptor of the zygote's pid namespace (it returns there after each tree).
    """
    use = set(have)
    root = os.geteuid() == 0
    userns = "userns" in have
    if "uid" in requested:
        problem = "needs root" if not root else in_child(_try_uid, uid)
        (missing.__setitem__("uid", problem) if problem else use.add("uid"))
    for name, flags in (
        ("netns", sc.CLONE_NEWNET),
        ("pidns", sc.CLONE_NEWPID),
        ("ipcns", sc.CLONE_NEWIPC | sc.CLONE_NEWUTS),
    ):
        if name not in requested:
            continue
        problem = None if root or userns else "needs root or a user namespace"
        if problem is None and name == "pidns" and not userns:
            problem = in_child(_try_pid_namespaces, own_pidns)
        problem = problem or in_child(_try_namespace, flags, userns)
        (missing.__setitem__(name, problem) if problem else use.add(name))
    abi = sc.landlock_abi()
    if "landlock" in requested:
        problem = in_child(_try_landlock, abi)
        (missing.__setitem__("landlock", problem) if problem else use.add("landlock"))
    if "seccomp" in requested:
        problem = in_child(_try_seccomp)
        (missing.__setitem__("seccomp", problem) if problem else use.add("seccomp"))
    return {"use": sorted(use), "landlock_abi": abi, "paths": paths}
