"""The zygote: a warm interpreter that keeps confined process trees ready and hands each a program.

Started by the parent as `python -I -S -c BOOT <textzoo/sandbox dir> <config json>` with one end of a
SOCK_SEQPACKET socket pair. It imports the preload modules, enters its own namespaces, probes what
else works, says hello (the plan, as JSON) and serves:

    parent -> zygote  RUN  (id, timeout_s) + fds [payload memfd, stdout, stderr, result pipe]
                      KILL (id)
    zygote -> parent  HELLO json | EXIT (id, returncode, timed_out) | ERROR (id) + text

It keeps `pool` trees (see `confine`) waiting; a request goes to a ready tree at once and a new tree
starts in its place, so forking and entering namespaces happen while the previous program runs. It
kills a tree when its program's time is up, and every tree when the parent closes the socket or dies.
"""

from __future__ import annotations

import array
import collections
import gc
import importlib
import json
import os
import selectors
import signal
import socket
import struct
import sys
import time

from . import confine, layout
from . import syscalls as sc

HELLO, RUN, KILL, EXIT, ERROR = b"H", b"R", b"K", b"X", b"E"
RUN_MSG = struct.Struct("=Qd")
KILL_MSG = struct.Struct("=Q")
EXIT_MSG = struct.Struct("=Qi?")
BOOT = "import sys; sys.path.insert(0, sys.argv[1]); import _sandbox.zygote as z; del sys.path[0]; z.main()"
_MAX_SETUP_FAILURES = 3  # trees in a row that fail before a request: the sandbox is broken


class Server:
    """The zygote's loop: keep trees ready, hand out requests, enforce time limits, report exits."""

    def __init__(self, sock: socket.socket, plan: dict, parent: int, pool: int, own_pidns: int):
        self.sock, self.plan, self.parent, self.pool = sock, plan, parent, pool
        self.me, self.own_pidns = os.getpid(), own_pidns
        use = frozenset(plan["use"])
        # as root the zygote forks each keeper straight into a new pid namespace and returns to its
        # own; a user namespace's pid namespace needs a launcher in between (see confine.launch)
        self.direct = "userns" not in use
        self.new_pid = self.direct and "pidns" in use
        self.keeper_flags = confine.namespace_flags(use - {"pidns"}) if self.direct else 0
        self.sel = selectors.DefaultSelector()
        self.idle: dict[int, socket.socket] = {}  # launcher pid -> link, tree not ready yet
        self.ready: collections.deque[tuple[int, socket.socket]] = collections.deque()
        self.running: dict[int, list] = {}  # tree pid -> [request id, deadline, timed out, link]
        self.queue: collections.deque[tuple[int, float, list[int]]] = collections.deque()
        self.failures, self.broken, self.parent_gone = 0, "", False
        self.wake_r, self.wake_w = os.pipe()
        for fd in (self.wake_r, self.wake_w):
            os.set_blocking(fd, False)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.set_wakeup_fd(self.wake_w)

    def serve(self) -> None:
        self.sel.register(self.sock, selectors.EVENT_READ, "parent")
        self.sel.register(self.wake_r, selectors.EVENT_READ, "child")
        try:
            self._fill()
            while os.getppid() == self.parent and not self.parent_gone:
                deadlines = [c[1] for c in self.running.values() if not c[2]]
                timeout = min([0.5, *(d - time.monotonic() for d in deadlines)])
                for key, _ in self.sel.select(max(timeout, 0)):
                    if key.data == "parent":
                        if not self._on_request():
                            return
                    elif key.data == "child":
                        self._drain()
                    else:
                        self._on_tree(key.data, key.fileobj)
                self._reap()
                self._expire()
                self._dispatch()
                self._fill()
        finally:
            self._shutdown()

    # ---- trees -------------------------------------------------------------------------------
    def _fill(self) -> None:
        while not self.broken and len(self.idle) + len(self.ready) < self.pool:
            if not self._spawn():
                return

    def _spawn(self) -> bool:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        pid = -1
        try:
            if self.new_pid:
                sc.unshare(sc.CLONE_NEWPID)  # for the next child only
            try:
                pid = os.fork()
            finally:
                if self.new_pid and pid != 0:
                    sc.setns(self.own_pidns, sc.CLONE_NEWPID)  # back to our own for the rest
        except OSError as e:
            ours.close()
            theirs.close()
            if pid > 0:  # forked, but stuck in the child's pid namespace: nothing more can start
                self._kill(pid)
                self.broken = f"cannot return to the zygote's pid namespace: {e}"
            if not self.idle and not self.ready:  # a fork that fails (process limits): tell who waits
                self._fail_requests(f"cannot start a process tree: {e}")
            return False
        if pid == 0:
            try:
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                if self.direct:
                    confine.keep(self.plan, theirs, self.keeper_flags)
                else:
                    confine.launch(theirs, self.plan, self.me)
            finally:
                os._exit(125)
        theirs.close()
        self.idle[pid] = ours
        self.sel.register(ours, selectors.EVENT_READ, pid)
        return True

    def _on_tree(self, pid: int, link: socket.socket) -> None:
        try:
            msg = link.recv(4096)
        except OSError:
            msg = b""
        self.sel.unregister(link)
        self.idle.pop(pid, None)
        if msg == confine.READY:
            self.ready.append((pid, link))
            self.failures = 0
            return
        link.close()
        self._kill(pid)
        self.failures += 1
        if self.failures >= _MAX_SETUP_FAILURES:
            why = msg[len(confine.FAILED) :].decode("utf-8", "replace") if msg.startswith(confine.FAILED) else ""
            self.broken = why or "process trees die before they are ready"
            self._fail_requests(self.broken)

    # ---- requests ----------------------------------------------------------------------------
    def _on_request(self) -> bool:
        try:
            msg, fds = confine.recv_fds(self.sock)
        except OSError:
            return False
        if not msg:
            return False
        kind, body = msg[:1], msg[1:]
        if kind == RUN and len(body) == RUN_MSG.size and len(fds) == confine.NUM_FDS:
            rid, timeout_s = RUN_MSG.unpack(body)
            self.queue.append((rid, timeout_s, fds))
            self._dispatch()
            if self.broken:
                self._fail_requests(self.broken)
        elif kind == KILL and len(body) == KILL_MSG.size:
            (rid,) = KILL_MSG.unpack(body)
            self._cancel(rid)
        else:
            for fd in fds:
                os.close(fd)
        return True

    def _dispatch(self) -> None:
        while self.queue and self.ready:
            rid, timeout_s, fds = self.queue.popleft()
            pid, link = self.ready.popleft()
            try:
                link.sendmsg([RUN], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
            except OSError:  # the tree died while ready: try the next one
                self._kill(pid)
                self.queue.appendleft((rid, timeout_s, fds))
                link.close()
                continue
            for fd in fds:
                os.close(fd)
            self.running[pid] = [rid, time.monotonic() + timeout_s, False, link]
            self._fill()

    def _cancel(self, rid: int) -> None:
        for i, (queued, _, fds) in enumerate(self.queue):
            if queued == rid:
                del self.queue[i]
                for fd in fds:
                    os.close(fd)
                self._tell(EXIT + EXIT_MSG.pack(rid, -signal.SIGKILL, False))
                return
        for pid, child in self.running.items():
            if child[0] == rid:
                self._kill(pid)

    def _fail_requests(self, why: str) -> None:
        while self.queue:
            rid, _, fds = self.queue.popleft()
            for fd in fds:
                os.close(fd)
            self._tell(ERROR + KILL_MSG.pack(rid) + why.encode("utf-8", "replace")[:4000])

    def _tell(self, msg: bytes) -> None:
        """A message to the parent; when it is gone, the loop ends (and with it every tree)."""
        try:
            self.sock.send(msg)
        except OSError:
            self.parent_gone = True

    # ---- processes ---------------------------------------------------------------------------
    def _drain(self) -> None:
        try:
            while os.read(self.wake_r, 4096):
                pass
        except BlockingIOError:
            pass

    def _kill(self, pid: int) -> None:
        try:
            os.kill(pid, signal.SIGKILL)  # the keeper and the program follow (parent-death signals)
        except ProcessLookupError:
            pass

    def _expire(self) -> None:
        now = time.monotonic()
        for pid, child in self.running.items():
            if not child[2] and now >= child[1]:
                child[2] = True
                self._kill(pid)

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            child = self.running.pop(pid, None)
            if child is not None:
                rid, _deadline, timed_out, link = child
                self._tell(EXIT + EXIT_MSG.pack(rid, _returncode(link, status), timed_out))
                link.close()
                continue
            link = self.idle.pop(pid, None)  # a tree that died before it was ready
            if link is not None:
                self.sel.unregister(link)
                link.close()
            self.ready = collections.deque((p, s) for p, s in self.ready if p != pid)

    def _shutdown(self) -> None:
        for pid in [*self.running, *self.idle, *(p for p, _ in self.ready)]:
            self._kill(pid)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                os.waitpid(-1, 0)
            except ChildProcessError:
                break


def _returncode(link: socket.socket, status: int) -> int:
    """The program's returncode as its keeper reported it, else how the tree itself ended."""
    try:
        msg = link.recv(64, socket.MSG_DONTWAIT)
    except OSError:
        msg = b""
    if msg[:1] == confine.STATUS and len(msg) == 1 + confine.STATUS_MSG.size:
        return confine.STATUS_MSG.unpack(msg[1:])[0]
    return os.waitstatus_to_exitcode(status)


def _preload(names: list[str]) -> None:
    for name in names:
        try:
            importlib.import_module(name)
        except Exception:  # a module this interpreter lacks: the program will see the same error
            pass


def main() -> None:
    cfg = json.loads(sys.argv[2])
    sock = socket.socket(fileno=cfg["fd"])
    if os.getppid() != cfg["parent"]:
        return
    _preload(cfg["preload"])
    sys.executable = sys._base_executable = os.path.realpath(sys.executable)
    requested = frozenset(cfg["isolation"])
    missing: dict[str, str] = {}
    paths, links = layout.exposed_paths()
    own_pidns = os.open("/proc/self/ns/pid", os.O_RDONLY)  # before the private root hides /proc
    have = confine.enter_zygote_namespaces(requested, paths, links, missing)
    plan = confine.probe(requested, have, cfg["uid"], paths, own_pidns, missing)
    plan["disk_bytes"] = cfg["disk_bytes"]
    if "mountns" in plan["use"]:
        os.environ.clear()
        os.environ.update(confine.program_environment(layout.WORKDIR, private=True))
    sock.send(HELLO + json.dumps({**plan, "missing": missing, "pid": os.getpid()}).encode())
    sc.set_name("textzoo-zygote")
    sc.seccomp_prepare()
    gc.freeze()  # what every fork shares stays untouched by their collections (fewer page copies)
    Server(sock, plan, cfg["parent"], cfg["pool"], own_pidns).serve()
