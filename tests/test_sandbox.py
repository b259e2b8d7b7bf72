"""The sandbox: outcomes, limits, one test per attack (the test process must survive them all), each
isolation mechanism alone and missing, the zygote's lifetime, and non-root callers."""

import dataclasses
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import features
import pytest
from confined import run_unprivileged
from conftest import wait_until

from textzoo.errors import ConfigError, SandboxError
from textzoo.sandbox import (
    ISOLATION,
    Program,
    SandboxLimits,
    close_zygotes,
    isolation_report,
    run,
    run_many,
)
from textzoo.sandbox import host as sandbox

FAST = SandboxLimits(timeout_s=3.0, cpu_s=2, test_timeout_s=1.0)
HERE = isolation_report(FAST)
ACTIVE = set(HERE.mechanisms)


def needs(*mechanisms):
    missing = sorted(set(mechanisms) - ACTIVE)
    return features.requires("sandbox", not missing, f"this machine lacks {missing}: {HERE.missing}")


def need(*mechanisms) -> None:
    """`needs` inside a test."""
    missing = sorted(set(mechanisms) - ACTIVE)
    features.need("sandbox", not missing, f"this machine lacks {missing}: {HERE.missing}")


def only(*mechanisms: str) -> SandboxLimits:
    return dataclasses.replace(FAST, isolation=mechanisms)


def _sandbox_pids() -> list[int]:
    """Pids of live processes that run as one of the sandbox's dedicated uids."""
    lo, hi = FAST.uid_base, FAST.uid_base + FAST.uid_pool_size
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status") as f:
                status = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:
            continue
        uid = int(status["Uid"].split()[0])
        if lo <= uid < hi and not status["State"].strip().startswith("Z"):
            pids.append(int(name))
    return pids


def _descendants(pid: int) -> list[int]:
    """Live processes below `pid` (by parent links in /proc)."""
    parents = _parents()
    found, frontier = [], [pid]
    while frontier:
        kids = [p for p, pp in parents.items() if pp in frontier]
        found += kids
        frontier = kids
    return found


def _trees(zygote: int) -> int:
    """The zygote's live process trees (its children): `pool` ready ones, plus one per running program."""
    return sum(pp == zygote for pp in _parents().values())


def _parents() -> dict[int, int]:
    """Parent pid of every live (not zombie) process."""
    parents = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                if fields[0] != "Z":
                    parents[int(name)] = int(fields[1])
            except OSError:
                continue
    return parents


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return "?"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _wait_gone(pids, seconds: float = 60.0) -> list[int]:
    """The pids still alive once all are gone or `seconds` have passed (generous: a loaded machine reaps late)."""
    wait_until(lambda: not any(_alive(p) for p in pids), seconds)
    return [p for p in pids if _alive(p)]


def _assert_clean(result) -> None:
    assert not result.passed
    # a program's leftover processes are found by its private uid
    need("uid")
    assert _wait_gone(_sandbox_pids()) == []


def _named(name: str) -> list[int]:
    """Live processes whose name (comm) is `name`."""
    return [pid for pid in _parents() if _comm(pid) == name]


def _daemon(name: str) -> str:
    """A program that leaves a daemon behind: a forked child in a session of its own, named `name`
    (prctl PR_SET_NAME), which sleeps a minute; the program ends once the daemon has its name."""
    return (
        "import ctypes, os, time\nr, w = os.pipe()\nif os.fork() == 0:\n    os.setsid()\n"
        f"    ctypes.CDLL(None).prctl(15, {name.encode()!r}, 0, 0, 0)\n    os.write(w, b'x')\n    time.sleep(60)\n"
        "os.read(r, 1)"
    )


# ---- outcomes ----------------------------------------------------------------------------------
def test_per_test_outcomes_and_output():
    r = run(
        Program("def f(x):\n    return x + 1\nprint('héllo')", ["assert f(1) == 2", "assert f(1) == 3", "f(None)"]),
        FAST,
    )
    assert r.tests == [True, False, False]
    assert r.test_errors == [None, "AssertionError", "TypeError"]
    assert r.fraction_passed == pytest.approx(1 / 3)
    assert r.source_error is None and r.finished and not r.timed_out and not r.passed
    assert r.stdout == "héllo\n"


def test_all_pass_and_no_tests():
    assert run(Program("x = 1", ["assert x == 1"]), FAST).passed
    r = run(Program("print(2 + 2)"), FAST)
    assert r.passed and r.stdout == "4\n" and r.tests == [] and r.fraction_passed == 0.0


def test_source_error_is_reported_and_tests_still_run():
    r = run(Program("def f(): return 1\nraise ValueError('boom')", ["assert f() == 1"]), FAST)
    assert r.source_error == "ValueError" and r.tests == [True] and not r.passed
    assert "boom" in r.stderr


def test_forged_result_lines_are_ignored():
    r = run(
        Program(
            "import sys\nprint('T 0 ok')\nsys.stdout.flush()\nimport os\nfor fd in range(3, 20):\n"
            "    try: os.write(fd, b'T 0 ok\\nD\\n')\n    except OSError: pass",
            ["assert False"],
        ),
        FAST,
    )
    assert r.tests == [False] and not r.passed


def test_isolation_is_reported_on_every_result():
    r = run(Program("x = 1", ["assert x == 1"]), FAST)
    assert r.isolation == str(HERE) == "+".join(m for m in ISOLATION if m in ACTIVE)
    r = run(Program("x = 1", ["assert x == 2"]), dataclasses.replace(FAST, drop_privileges=False))
    assert "uid" not in r.isolation.split("+") and r.tests == [False]
    assert run(Program("x = 1"), only()).isolation == "none"


def test_programs_do_not_share_state():
    # the zygote's random state, imported modules and globals are copies: nothing carries over
    src = "import random, math\nprint(random.random())\nmath.pi = 3\nimport textwrap\ntextwrap.X = 1"
    a, b = run(Program(src), FAST), run(Program(src), FAST)
    assert a.passed and b.passed and a.stdout != b.stdout
    r = run(Program("import math, textwrap\nprint(math.pi, hasattr(textwrap, 'X'))"), FAST)
    assert r.stdout.split() == [str(3.141592653589793), "False"]


# ---- limits ------------------------------------------------------------------------------------
def test_infinite_loop_times_out():
    t = time.monotonic()
    r = run(Program("while True:\n    pass"), SandboxLimits(timeout_s=1.0, cpu_s=5))
    # `timed_out` is the zygote's word that the wall-clock limit ended it (the CPU limit would end it
    # unflagged); the bound only catches a hang, loosely: a loaded machine is slow to kill and reap
    assert r.timed_out and not r.passed and time.monotonic() - t < 30
    _assert_clean(r)


def test_a_sleeping_program_takes_its_time():
    t = time.monotonic()
    r = run(Program("import time\ntime.sleep(0.5)", ["assert True"]), FAST)
    assert r.passed and r.wall_s >= 0.5 and time.monotonic() - t >= 0.5


def test_looping_test_costs_only_itself():
    r = run(
        Program("def f(x):\n    while x: pass\n    return 0", ["assert f(0) == 0", "f(1)", "assert f(0) == 0"]),
        SandboxLimits(timeout_s=3.0, test_timeout_s=0.5),
    )
    assert r.tests == [True, False, True] and r.test_errors[1] == "TestTimeout"


def test_cpu_limit_kills_busy_program():
    # a wall-clock limit far above the CPU limit: the CPU limit, not the timeout, must end it
    # (no wall-time bound here: on a loaded machine 1 CPU-second can take several seconds)
    r = run(Program("while True:\n    pass"), SandboxLimits(timeout_s=60.0, cpu_s=1))
    assert not r.passed and r.returncode != 0 and not r.timed_out
    _assert_clean(r)


@features.requires("sandbox", bool(ACTIVE & {"uid", "userns"}), "RLIMIT_NPROC needs a private uid or user namespace")
def test_fork_bomb_is_bounded_and_cleaned_up():
    t = time.monotonic()
    r = run(Program("import os\nwhile True:\n    os.fork()"), SandboxLimits(timeout_s=2.0, cpu_s=2, max_processes=16))
    assert not r.passed and time.monotonic() - t < 60  # a hang, not a speed, fails (timeout_s=2 ends it)
    _assert_clean(r)


@pytest.mark.parametrize(
    "iso, ender",
    [(ISOLATION, "pidns"), (("uid",), "uid"), (("pidns",), "pidns")],
    ids=["all", "uid-only", "pidns-only"],
)
def test_escaped_daemon_is_killed(iso, ender):
    need(ender)
    name = f"tzd{os.urandom(5).hex()}"
    r = run(Program(_daemon(name), ["assert True"]), only(*iso))
    assert r.passed
    # ended at once by its pid namespace's end, a moment later by the kill of the program's uid
    assert wait_until(lambda: not _named(name)), _named(name)


def test_escaped_daemon_outlives_a_run_without_isolation():
    # the positive control of the test above: the daemon is there, under its name, when nothing ends it
    name = f"tzd{os.urandom(5).hex()}"
    r = run(Program(_daemon(name), ["assert True"]), only())
    alive = _named(name)
    for pid in alive:
        os.kill(pid, signal.SIGKILL)
    assert r.passed and len(alive) == 1


def test_huge_allocation_fails():
    r = run(Program("x = bytearray(50 * 2**30)"), FAST)
    assert r.source_error == "MemoryError" and not r.passed


def test_output_flood_is_truncated():
    r = run(Program("while True:\n    print('x' * 10000)"), SandboxLimits(timeout_s=1.0, output_bytes=1000))
    assert r.timed_out and not r.passed
    assert len(r.stdout) < 1200 and "more bytes dropped" in r.stdout


def test_stdin_is_empty_and_env_is_scrubbed():
    r = run(
        Program(
            "import os, sys\n"
            "print(sys.stdin.read() == '', 'PYTHONPATH' in os.environ, os.getcwd() == os.environ['HOME'])"
        ),
        FAST,
    )
    assert r.stdout.split() == ["True", "False", "True"]


def test_workdir_is_fresh_every_time():
    src = "import os\nprint(os.listdir('.'))\nopen('f.txt', 'w').write('x')\nos.mkdir('d')"
    first, second = run(Program(src), FAST), run(Program(src), FAST)
    assert first.passed and first.stdout == second.stdout == "[]\n"


@needs("mountns")
def test_private_tmpfs_is_bounded_by_disk_bytes():
    src = "chunk = b'x' * (1 << 20)\nwith open('/tmp/big', 'wb') as f:\n    for _ in range(64):\n        f.write(chunk)"
    r = run(Program(src), dataclasses.replace(FAST, disk_bytes=8 << 20, file_size_bytes=1 << 30))
    assert r.source_error == "OSError" and "No space left" in r.stderr


@needs("uid")
def test_cannot_write_outside_workdir(tmp_path):
    target = tmp_path / "pwned.txt"
    r = run(Program(f"open({str(target)!r}, 'w').write('x')"), FAST)
    assert r.source_error in ("PermissionError", "FileNotFoundError", "OSError") and not target.exists()


@needs("uid")
def test_cannot_read_user_files(tmp_path):
    secret = tmp_path / "id_rsa"
    secret.write_text("SECRET")
    secret.chmod(0o600)
    r = run(Program(f"print(open({str(secret)!r}).read())"), FAST)
    assert r.source_error in ("PermissionError", "FileNotFoundError") and "SECRET" not in r.stdout


@features.requires(
    "sandbox",
    bool(ACTIVE & {"pidns", "uid"}) or ("landlock" in ACTIVE and HERE.landlock_abi >= 6),
    "needs a pid namespace, a private uid or Landlock's signal scope (ABI >= 6)",
)
def test_cannot_kill_parent():
    # in a pid namespace the parent is the keeper (root, pid 1): a signal from inside is refused or dropped
    r = run(Program("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nprint('alive')"), FAST)
    assert r.source_error == "PermissionError" or r.stdout == "alive\n"


def test_killing_own_process_group_spares_caller():
    r = run(Program("import os, signal\nos.killpg(0, signal.SIGKILL)", ["assert True"]), FAST)
    assert not r.passed and not r.finished and r.returncode == -9
    _assert_clean(r)


def test_run_many_keeps_order():
    progs = [
        Program(f"import time\ntime.sleep({0.2 if i % 2 else 0})\nv = {i}", [f"assert v == {i}", "assert v % 2 == 0"])
        for i in range(6)
    ]
    results = run_many(progs, FAST, workers=3)
    assert [r.tests for r in results] == [[True, i % 2 == 0] for i in range(6)]
    assert run_many([], FAST) == []


def test_limits_validate():
    with pytest.raises(ConfigError, match="timeout_s"):
        SandboxLimits(timeout_s=0)
    with pytest.raises(ConfigError, match="test_timeout_s"):
        SandboxLimits(test_timeout_s=-1)
    with pytest.raises(ConfigError, match="unknown mechanisms"):
        SandboxLimits(isolation=("netns", "chroot"))
    with pytest.raises(ConfigError, match="require"):
        SandboxLimits(isolation=("netns",), require=("mountns",))


# ---- isolation, mechanism by mechanism ---------------------------------------------------------


def _connect(port: int) -> str:
    return f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=1)\ns.sendall(b'leak')"


NETWORK = [("netns",), ("landlock",), ("seccomp",)]


@pytest.mark.parametrize("mechanism", NETWORK, ids=lambda m: m[0])
def test_each_network_layer_alone_blocks_a_local_connection(mechanism, listener):
    port, received = listener
    need(*mechanism)
    landlock_net = mechanism != ("landlock",) or HERE.landlock_abi >= 4
    features.need("sandbox", landlock_net, "Landlock's network rules need ABI 4")
    r = run(Program(_connect(port)), only(*mechanism))
    time.sleep(0.3)  # grace for a late connection to show up: an absence cannot be waited for
    assert r.source_error in ("PermissionError", "OSError", "ConnectionRefusedError") and received == []


def test_without_any_network_layer_the_connection_works(listener):
    # the positive control: the same program does connect when nothing blocks it
    port, received = listener
    r = run(Program(_connect(port)), only())
    wait_until(lambda: received)  # the listener thread records it a moment later
    assert r.source_error is None and received == [b"leak"]


@pytest.mark.parametrize("mechanism", [("mountns",), ("landlock",)], ids=lambda m: m[0])
def test_each_file_layer_alone_keeps_tmp_and_shm_private(mechanism, tmp_path):
    need(*mechanism)
    name = f"textzoo-test-{os.getpid()}-{mechanism[0]}"
    paths = [f"/tmp/{name}", f"/dev/shm/{name}"]
    # each write is tried; the program itself never fails
    write = f"for p in {paths!r}:\n    try:\n        open(p, 'w').write('x')\n    except OSError:\n        pass"
    look = f"import os\nprint([os.path.exists(p) for p in {paths!r}])"
    assert run(Program(write), only(*mechanism)).passed
    assert [os.path.exists(p) for p in paths] == [False, False]
    seen = run(Program(look), only(*mechanism))
    assert seen.passed and seen.stdout == "[False, False]\n", seen
    # the positive control: with no layer the same writes land on the host and a later program sees them
    try:
        assert run(Program(write), only()).passed
        assert [os.path.exists(p) for p in paths] == [True, True]
        assert run(Program(look), only()).stdout == "[True, True]\n"
    finally:
        for p in paths:
            if os.path.exists(p):
                os.remove(p)


@pytest.mark.parametrize("mechanism", [("mountns",), ("landlock",)], ids=lambda m: m[0])
def test_each_file_layer_alone_hides_world_readable_files(mechanism, world_readable):
    need(*mechanism)
    r = run(Program(f"print(open({str(world_readable)!r}).read())"), only(*mechanism))
    assert r.source_error in ("FileNotFoundError", "PermissionError") and "SECRET" not in r.stdout
    control = run(Program(f"print(open({str(world_readable)!r}).read())"), only())
    assert "WORLD-READABLE-SECRET" in control.stdout


@needs("seccomp")
def test_seccomp_blocks_new_namespaces_and_inet_sockets():
    unshare_user = "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nprint(libc.unshare(0x10000000))"
    assert run(Program(unshare_user), only()).stdout.strip() == "0"  # unprivileged user namespaces work here
    assert run(Program(unshare_user), only("seccomp")).stdout.strip() == "-1"
    r = run(Program("import socket\nsocket.socket(socket.AF_INET6, socket.SOCK_DGRAM)"), only("seccomp"))
    assert r.source_error == "PermissionError"
    pair = "import socket\na, b = socket.socketpair()\na.send(b'x')\nassert b.recv(1) == b'x'"
    assert run(Program(pair), FAST).passed  # unix sockets still work


@needs("pidns", "mountns")
def test_pid_namespace_shows_only_the_program():
    r = run(Program("import os\nprint(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()), os.getpid())"), FAST)
    pids, me = r.stdout.rsplit(" ", 1)
    assert json.loads(pids) == [1, 2] and me.strip() == "2"


@needs("mountns")
def test_the_whole_standard_library_imports():
    # every public module this interpreter can import outside the sandbox imports inside it too
    names = sorted(m for m in sys.stdlib_module_names if not m.startswith("_") and m not in ("antigravity", "this"))
    probe = textwrap.dedent(
        """
        import importlib, json
        ok = []
        for m in NAMES:
            try:
                importlib.import_module(m)
                ok.append(m)
            except Exception:
                pass
        print(json.dumps(ok))
        """
    )
    outside = subprocess.run(
        [sys.executable, "-I", "-S", "-c", probe.replace("NAMES", repr(names))], capture_output=True, text=True
    )
    r = run(Program(probe.replace("NAMES", repr(names))), dataclasses.replace(FAST, timeout_s=30, cpu_s=30))
    assert r.source_error is None, r.stderr
    assert set(json.loads(r.stdout)) == set(json.loads(outside.stdout))
    assert len(json.loads(r.stdout)) > 150


REQUIRE_UID = """
from textzoo.errors import SandboxError
from textzoo.sandbox import Program, SandboxLimits, run
try:
    print(run(Program("x = 1"), SandboxLimits(timeout_s=10, cpu_s=10, require=("uid",))).passed)
except SandboxError as e:
    print(e)
"""


def test_require_refuses_a_missing_mechanism():
    present = tuple(m for m in ISOLATION if m in ACTIVE)
    assert run(Program("x = 1"), dataclasses.replace(FAST, require=present)).passed
    absent = [m for m in ISOLATION if m not in ACTIVE]
    if absent:
        with pytest.raises(SandboxError, match=absent[0]):
            run(Program("x = 1"), dataclasses.replace(FAST, require=(absent[0],)))
    else:  # nothing is missing here; a caller that is not root has no private uids
        proc = run_unprivileged(REQUIRE_UID)
        assert "SandboxLimits.require asks for ['uid'], not available here" in proc.stdout, proc


def test_isolation_is_logged_once(caplog):
    close_zygotes()
    sandbox._announce.cache_clear()
    with caplog.at_level("INFO", logger="textzoo.sandbox.host"):
        run(Program("x = 1"), FAST)
        close_zygotes()
        run(Program("x = 1"), FAST)
    infos = [r for r in caplog.records if "programs run confined by" in r.getMessage()]
    assert len(infos) == 1 and str(HERE) in infos[0].getMessage()
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == (1 if HERE.missing else 0)


# ---- the zygote's lifetime ---------------------------------------------------------------------
def _zygote_pid(limits: SandboxLimits) -> int:
    run(Program("x = 1"), limits)
    return sandbox._zygote_for(limits).proc.pid


def test_close_kills_running_programs_and_the_zygote():
    pid = _zygote_pid(FAST)
    pool = sandbox._zygote_for(FAST).pool
    errors = []

    def sleeper():
        try:
            run(Program("import time\ntime.sleep(60)"), dataclasses.replace(FAST, timeout_s=120))
        except SandboxError as e:
            errors.append(e)

    thread = threading.Thread(target=sleeper)
    thread.start()
    # the sleeping program took a ready tree and a new one started in its place: one tree more
    assert wait_until(lambda: _trees(pid) > pool), _descendants(pid)
    tree = _descendants(pid)
    close_zygotes()
    thread.join(10)
    assert not thread.is_alive() and errors and "zygote" in str(errors[0])
    assert _wait_gone([pid, *tree]) == []
    assert run(Program("x = 1"), FAST).passed  # a fresh zygote starts on demand


PARENT = """
import sys, threading, time
sys.path.insert(0, {repo!r})
from textzoo.sandbox import host as sandbox
limits = sandbox.SandboxLimits(timeout_s=300, cpu_s=300)
sandbox.run(sandbox.Program("x = 1"), limits)
sleeper = sandbox.Program("import time; time.sleep(300)")
threading.Thread(target=sandbox.run, args=(sleeper, limits), daemon=True).start()
zygote = sandbox._zygote_for(limits)
print(zygote.proc.pid, zygote.pool, flush=True)
sys.stdin.readline()  # the test has seen the sleeping program's tree
{end}
"""


@pytest.mark.parametrize("end", ["time.sleep(300)", "raise SystemExit(0)"], ids=["killed", "exits"])
def test_zygote_and_programs_die_with_their_parent(end):
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = textwrap.dedent(PARENT).format(repo=repo, end=end)
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    zygote, pool = map(int, proc.stdout.readline().split())
    # the sleeping program took a ready tree and a new one started in its place: one tree more
    assert wait_until(lambda: _trees(zygote) > pool), _descendants(zygote)
    tree = [zygote, *_descendants(zygote)]
    assert len(tree) > 3, tree  # the zygote, its ready trees and the sleeping program's
    proc.stdin.write("go\n")
    proc.stdin.close()
    if end.startswith("time"):
        proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    left = _wait_gone(tree)
    assert left == [], [(pid, _comm(pid)) for pid in left]


# ---- non-root callers --------------------------------------------------------------------------
NONROOT = """
import json, logging, os, socket
logging.basicConfig(level=logging.INFO)
from textzoo.sandbox import Program, SandboxLimits, isolation_report, run
srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen(); srv.settimeout(0.5)
port = srv.getsockname()[1]
limits = SandboxLimits(timeout_s=10, cpu_s=10)
out = {"uid": os.getuid(), "isolation": str(isolation_report(limits))}
connect = f"import socket\\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)"
out["connect"] = run(Program(connect), limits).source_error
try:
    srv.accept(); out["accepted"] = True
except OSError:
    out["accepted"] = False
out["tmp"] = run(Program("open('/tmp/textzoo-nonroot', 'w').write('x')"), limits).passed
out["tmp_left"] = os.path.exists("/tmp/textzoo-nonroot")
out["imports"] = run(Program("import textwrap, unicodedata, socket, importlib, ssl, sqlite3"), limits).passed
kill = "import os, signal\\nos.kill(os.getppid(), signal.SIGKILL)\\nprint('alive')"
out["kill_parent"] = run(Program(kill), limits).stdout
bomb = "import os\\nwhile True:\\n    os.fork()"
out["bomb"] = run(Program(bomb), SandboxLimits(timeout_s=3, max_processes=16)).passed
print(json.dumps(out))
"""


def test_non_root_callers_get_user_namespaces_and_are_told():
    proc = run_unprivileged(textwrap.dedent(NONROOT))
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["uid"] != 0
    assert "not available here: uid" in proc.stderr  # the fallback says so
    mechanisms = out["isolation"].split("+")
    features.need(
        "sandbox", "userns" in mechanisms, f"user namespaces are not allowed for non-root users: {proc.stderr[-500:]}"
    )
    assert {"userns", "netns", "mountns", "pidns"} <= set(mechanisms) and "uid" not in mechanisms
    assert out["connect"] and not out["accepted"]
    assert out["tmp"] and not out["tmp_left"]
    assert out["imports"] and out["bomb"] is False
    assert out["kill_parent"] in ("", "alive\n")


def test_a_failed_setup_step_raises_and_runs_no_model_code(monkeypatch, tmp_path):
    # without a private root each program gets a host working dir; make entering it fail
    marker = tmp_path / "ran"
    monkeypatch.setattr(sandbox, "_host_workdir", lambda uid: str(tmp_path / "missing"))
    with pytest.raises(SandboxError, match="could not confine a program.*entering the working dir"):
        run(Program(f"open({str(marker)!r}, 'w').write('x')"), only("landlock"))
    assert not marker.exists()


def test_the_sandbox_imports_nothing_of_textzoo_but_errors():
    """Tasks import the sandbox, never the other way round (textzoo.sandbox's docstring)."""
    code = "import json, sys, textzoo.sandbox; print(json.dumps([m for m in sys.modules if m.startswith('textzoo')]))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    loaded = json.loads(out)
    assert "textzoo.sandbox.host" in loaded
    assert [m for m in loaded if m not in ("textzoo", "textzoo.errors") and not m.startswith("textzoo.sandbox")] == []
