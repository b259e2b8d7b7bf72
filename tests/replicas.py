"""Helpers of the multi-process tests (data parallel, FSDP): run a script's mode, compare saved states."""

from __future__ import annotations

import os
import subprocess
import sys

import torch


def run_script(script, mode, out, run_dir) -> None:
    """Run ``script mode out run_dir`` in a fresh interpreter (one thread, offline, `tests/helpers.py`
    importable); it must exit 0."""
    path = os.pathsep.join(p for p in (os.path.dirname(os.path.abspath(__file__)), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": path}
    argv = [sys.executable, str(script), mode, str(out), str(run_dir)]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def assert_states_equal(a: dict, b: dict) -> None:
    """Nested dicts of tensors with the same keys and bit-identical tensors."""
    assert sorted(a) == sorted(b)
    for k in a:
        if isinstance(a[k], dict):
            assert_states_equal(a[k], b[k])
        else:
            assert torch.equal(a[k], b[k]), k
