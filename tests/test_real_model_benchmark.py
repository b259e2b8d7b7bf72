"""benchmarks/real_model.py: its peak RSS leaves out the stretches it runs under a dispatch mode or the profiler."""

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "real_model.py"

# In a fresh process: a test worker's own heap (freed pages it keeps, its peak from earlier tests) would
# decide whether an allocation raises the RSS.
PROBE = textwrap.dedent(
    f"""
    import importlib.util, sys
    spec = importlib.util.spec_from_file_location("real_model_bench", {str(SCRIPT)!r})
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)

    def touch(mib):
        block = bytearray(mib << 20)
        for i in range(0, len(block), 4096):  # resident, page by page
            block[i] = 1
        return block

    rss = module.PeakRSS()
    kept = touch(64)  # before the stretch left out: counted
    start = rss.mib()
    with rss.left_out():
        spike = touch(256)
        inside = rss.mib()
        del spike
    after_stretch = rss.mib()
    later = touch(128)  # a later rise counts again
    print(start, inside, after_stretch, rss.mib())
    """
)


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux's /proc/self/clear_refs")
def test_the_peak_leaves_out_what_ran_inside_left_out_and_keeps_the_rest():
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True).stdout
    start, inside, after_stretch, final = map(float, out.split())
    assert inside >= start + 200  # inside, the peak sees the spike
    assert start <= after_stretch < start + 100  # afterwards it is gone, and what came before is kept
    assert final >= start + 100


@pytest.mark.parametrize(("flags", "needed"), [(["--steps", "2"], 3), (["--steps", "3", "--profile"], 4)])
def test_a_run_with_no_step_to_time_stops_before_building_a_model(tmp_path, flags, needed):
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--modes", "full", "--out", str(out), *flags], capture_output=True, text=True
    )
    assert done.returncode != 0 and f"use --steps {needed} or more" in done.stderr, done.stderr
    assert not out.exists()  # nothing was written, no model was built
