"""The sandbox: outcomes, limits, and one test per attack (the test process must survive them all)."""

import dataclasses
import os
import time

import pytest

from textzoo.envs.sandbox import Program, SandboxLimits, can_drop_privileges, run, run_many
from textzoo.errors import ConfigError

FAST = SandboxLimits(timeout_s=3.0, cpu_s=2, test_timeout_s=1.0)
DROPS = can_drop_privileges(FAST.python, FAST.uid_base)
needs_drop = pytest.mark.skipif(not DROPS, reason="needs root: the uid drop is what enforces this")


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


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            return not any(line.startswith("State:") and "Z" in line.split()[1] for line in f)
    except OSError:
        return False


def _assert_clean(result) -> None:
    assert not result.passed
    if DROPS:
        assert _sandbox_pids() == []


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


def test_isolation_modes():
    assert run(Program("x = 1", ["assert x == 1"]), FAST).isolation == ("uid" if DROPS else "none")
    r = run(Program("x = 1", ["assert x == 1", "assert x == 2"]), dataclasses.replace(FAST, drop_privileges=False))
    assert r.isolation == "none" and r.tests == [True, False]


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


def test_infinite_loop_times_out():
    t = time.monotonic()
    r = run(Program("while True:\n    pass"), SandboxLimits(timeout_s=1.0, cpu_s=5))
    assert r.timed_out and not r.passed and time.monotonic() - t < 3
    _assert_clean(r)


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


@needs_drop  # without a private uid RLIMIT_NPROC is not set: only the timeout would bound the bomb
def test_fork_bomb_is_bounded_and_cleaned_up():
    t = time.monotonic()
    r = run(Program("import os\nwhile True:\n    os.fork()"), SandboxLimits(timeout_s=2.0, cpu_s=2, max_processes=16))
    assert not r.passed and time.monotonic() - t < 6
    _assert_clean(r)


@needs_drop
def test_escaped_daemon_is_killed():
    src = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\nprint(os.getpid())"
    r = run(Program(src, ["assert True"]), FAST)
    assert r.finished and _sandbox_pids() == []


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


def test_workdir_is_fresh_and_removed():
    r = run(Program("import os\nprint(os.getcwd())\nprint(os.listdir('.'))\nopen('f.txt', 'w').write('x')"), FAST)
    cwd, listing = r.stdout.splitlines()
    assert listing == "[]" and not os.path.exists(cwd)


@needs_drop
def test_cannot_write_outside_workdir(tmp_path):
    target = tmp_path / "pwned.txt"
    r = run(Program(f"open({str(target)!r}, 'w').write('x')"), FAST)
    assert r.source_error == "PermissionError" and not target.exists()


@needs_drop
def test_cannot_read_user_files(tmp_path):
    secret = tmp_path / "id_rsa"
    secret.write_text("SECRET")
    secret.chmod(0o600)
    r = run(Program(f"print(open({str(secret)!r}).read())"), FAST)
    assert r.source_error == "PermissionError" and "SECRET" not in r.stdout


@needs_drop
def test_cannot_kill_parent():
    r = run(Program("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)"), FAST)
    assert r.source_error == "PermissionError"  # and we are still here


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
