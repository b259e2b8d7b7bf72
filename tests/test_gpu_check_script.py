"""benchmarks/gpu_check.sh, the GPU checks of one lease, runs every step end to end on CPU (`--cpu`)."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_step_runs_and_the_runs_are_bit_identical_on_cpu(tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path)}
    done = subprocess.run(["bash", "benchmarks/gpu_check.sh", "--cpu", str(out)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)  # fmt: skip
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-4000:]
    for step in ("gpu_qwen", "families", "determinism"):
        assert f"=== {step}: exit 0" in log, log[-4000:]
    agent = json.loads((out / "gpu_qwen.json").read_text())["agents"]["agent0"]
    assert agent["static/greedy_as_first"] == 1.0 and agent["update_logp_4096_268435456/tokens_per_s"] > 0
    # --cpu runs one family (magrpo) in both collaborations; on the GPU all three
    assert "--- magrpo decentralized: exit 0" in log and "--- magrpo centralized: exit 0" in log, log[-4000:]
    assert log.count(": exit 0\n") == 2
    determinism = (out / "determinism.log").read_text()
    assert "stopped by SIGTERM with checkpoints: step-00000002" in determinism
    # CPU: a second run and a resumed one give the same weights bit for bit (two agents each)
    assert determinism.count("bit-identical") == 4 and "differs" not in determinism, determinism
    assert list(tmp_path.glob("textzoo-gpu-check.*")) == []  # its scratch runs are removed
