"""GracefulStop and the launcher's signal forwarding (the training runs are in tests/test_resume.py)."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from textzoo.runners.preemption import DUPLICATE_S, GracefulStop, agree, resume_hint


def test_the_first_signal_is_a_request_and_a_copy_of_it_changes_nothing():
    with GracefulStop() as stop:
        assert not stop.requested and stop.name == ""
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGINT)  # within DUPLICATE_S: the same request, delivered twice
        assert stop.requested and stop.name == "SIGTERM"
        assert agree(stop.requested)  # one process: its own request
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # restored


SECOND = """
import logging, os, signal, sys, time
from textzoo.runners.preemption import GracefulStop
logging.basicConfig()
with GracefulStop() as stop:
    os.kill(os.getpid(), signal.{sig})
    time.sleep({wait})
    os.kill(os.getpid(), signal.{sig})
    time.sleep(0.5)
    print("still here", stop.requested, flush=True)
"""


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_a_second_signal_ends_the_process_the_way_the_signal_would(sig):
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}
    late = subprocess.run(
        [sys.executable, "-c", SECOND.format(sig=sig, wait=DUPLICATE_S + 0.2)], env=env, capture_output=True, text=True
    )
    assert late.returncode == -getattr(signal, sig) and "still here" not in late.stdout
    assert "stopping at once" in late.stderr
    early = subprocess.run(
        [sys.executable, "-c", SECOND.format(sig=sig, wait=0)], env=env, capture_output=True, text=True
    )
    assert early.returncode == 0 and "still here True" in early.stdout


LAUNCH = """
import sys, time
from pathlib import Path
from textzoo.runners.distributed import launch
from textzoo.runners.preemption import GracefulStop, agree

def replica(ctx, out):
    with GracefulStop() as stop:
        Path(out, f"ready-{ctx.rank}").touch()
        steps = 0
        while not agree(stop.requested):
            time.sleep(0.05)
            steps += 1
        Path(out, f"stopped-{ctx.rank}").write_text(f"{steps} {stop.name}")

if __name__ == "__main__":
    launch(replica, 2, sys.argv[1])
    print("launcher done", flush=True)
"""


@pytest.mark.parametrize("target", ["launcher", "process group"])
def test_the_launcher_forwards_a_stop_to_every_replica(target, tmp_path):
    script = tmp_path / "launch.py"
    script.write_text(textwrap.dedent(LAUNCH))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    deadline = time.time() + 120
    while not all((tmp_path / f"ready-{r}").exists() for r in (0, 1)):
        assert proc.poll() is None and time.time() < deadline, proc.stdout.read()
        time.sleep(0.05)
    if target == "launcher":
        proc.send_signal(signal.SIGTERM)
    else:  # Ctrl-C in a terminal: every process of the group, and the launcher forwards it as well
        os.killpg(proc.pid, signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    assert "launcher done" in out
    expected = "SIGTERM" if target == "launcher" else "SIGINT"
    for rank in (0, 1):
        assert (tmp_path / f"stopped-{rank}").read_text().split()[1] == expected


def test_resume_hint():
    text = resume_hint("runs/x", 3, 10, "SIGTERM", checkpointed=True)
    assert "after step 3 of 10" in text and "textzoo train --resume runs/x" in text
    assert "nothing to resume" in resume_hint("runs/x", 0, 10, "SIGINT", checkpointed=False)
