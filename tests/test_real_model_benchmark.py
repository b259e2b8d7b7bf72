"""benchmarks/real_model.py: its peak RSS leaves out the stretches it runs under a dispatch mode or the profiler."""

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "real_model.py"


def _script():
    spec = importlib.util.spec_from_file_location("real_model_bench", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses resolve annotations through it
    spec.loader.exec_module(module)
    return module


def _touch(mib: int) -> bytearray:
    block = bytearray(mib << 20)
    for i in range(0, len(block), 4096):  # resident, page by page
        block[i] = 1
    return block


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux's /proc/self/clear_refs")
def test_the_peak_leaves_out_what_ran_inside_left_out_and_keeps_the_rest():
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")  # this worker's peak from earlier tests := its RSS now
    rss = _script().PeakRSS()
    kept = _touch(64)  # before: counted
    start = rss.mib()
    with rss.left_out():
        spike = _touch(256)
        assert rss.mib() >= start + 200  # inside, the peak sees it
        del spike
    assert rss.mib() < start + 100  # afterwards it is gone from the peak ...
    assert rss.mib() >= start  # ... and what came before is kept
    after = _touch(128)  # a later rise counts again
    assert rss.mib() >= start + 100
    del kept, after
