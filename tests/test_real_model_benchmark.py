"""benchmarks/real_model.py: its peak RSS leaves out the stretches it runs under a dispatch mode or the profiler."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "real_model.py"

# In a fresh process: a test worker's own heap (freed pages it keeps, its peak from earlier tests) would
# decide whether an allocation raises the RSS.
PROBE = textwrap.dedent(
    """
    import importlib.util, sys
    spec = importlib.util.spec_from_file_location("real_model_bench", {script!r})
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)

    def touch(mib):
        block = bytearray(mib << 20)
        for i in range(0, len(block), 4096):  # resident, page by page
            block[i] = 1
        return block

    pins = []

    def heap(mib):  # blocks under glibc's mmap threshold, on the heap: freeing them leaves holes that stay resident
        blocks = []
        for _ in range(mib * 10):
            blocks.append(bytearray(100_000))
            pins.append(bytearray(1000))  # outlives the blocks: between them, so the heap cannot shrink
            for i in range(0, 100_000, 4096):
                blocks[-1][i] = 1
        return blocks

    def cycle(mib):  # heap blocks that only a reference cycle keeps, as the profiler's records are kept
        blocks = heap(mib)
        blocks.append(blocks)
        return blocks

    rss = module.PeakRSS()
    kept = touch(64)  # before the stretch left out: counted
    start = rss.mib()
    with rss.left_out():
        spike = {spike}
        inside = rss.mib()
        del spike
    after_stretch = rss.mib()
    later = touch(128)  # a later rise counts again
    print(start, inside, after_stretch, rss.mib())
    """
)
SPIKES = {"mapped": "touch(256)", "heap": "heap(256)", "cycle": "cycle(256)"}


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux's /proc/self/clear_refs")
@pytest.mark.parametrize("spike", sorted(SPIKES))
def test_the_peak_leaves_out_what_ran_inside_left_out_and_keeps_the_rest(spike):
    probe = PROBE.format(script=str(SCRIPT), spike=SPIKES[spike])
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
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


def test_a_profiled_run_times_the_steps_before_the_profiled_last_one(tmp_path):
    figures = tmp_path / "full.json"
    flags = ["--model", "tiny-llama", "--steps", "5", "--batch-prompts", "2", "--group-size", "2"]
    flags += ["--max-new-tokens", "4", "--eval-prompts", "1", "--eval-every", "100", "--micro-batch-size", "2"]
    flags += ["--no-compile-update", "--profile", "--out", str(tmp_path), "--only", "full", "--only-precision", "fp32"]
    subprocess.run([sys.executable, str(SCRIPT), *flags, f"--json-out={figures}"], check=True, capture_output=True)
    result = json.loads(figures.read_text())
    assert result["timed_steps"] == [3, 4]  # not the warm-up, the FLOP-counted step 2 or the profiled step 5
    for phase in ("generate", "update"):
        assert "Self CPU" in (tmp_path / f"full-fp32-{phase}-profile.txt").read_text()
