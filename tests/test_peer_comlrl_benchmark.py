"""benchmarks/peer_comlrl.py: each side's process gets the run's settings and its thread count, the sides
alternate round by round in fresh processes, and (with CoMLRL installed) the whole comparison prints its
median ratio and range."""

import dataclasses
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import tyro
from helpers import load_benchmark

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--steps", "1", "--warmup", "1", "--batch-prompts", "2", "--group-size", "2", "--max-new-tokens", "8"]


def test_each_side_gets_the_settings_and_its_threads():
    bench = load_benchmark("peer_comlrl")
    a = bench.Args(model="smollm2", lr=1e-5, batch_prompts=8, workers=2, comlrl_threads=2, source_words=5)
    for side, threads in (("comlrl", 2), ("textzoo", 1), ("textzoo_batched", 1)):
        command, n = bench.side_command(a, side)
        assert command[:2] == [sys.executable, bench.__file__]
        assert tyro.cli(bench.Args, args=command[2:]) == dataclasses.replace(a, side=side)
        assert n == threads
    command, n = bench.side_command(bench.Args(threads=2), "comlrl")
    assert n == 1 and tyro.cli(bench.Args, args=command[2:]).comlrl_threads == 1
    assert bench.side_command(bench.Args(threads=2), "textzoo")[1] == 2


def test_the_textzoo_sides_alternate_in_fresh_processes():
    bench = load_benchmark("peer_comlrl")
    a = tyro.cli(bench.Args, args=[*TINY, "--rounds", "2"])
    alt = bench.measure(a, ("textzoo", "textzoo_batched"))
    b1, b2 = "textzoo magrpo B=1", "textzoo magrpo B=2"
    assert alt.order == [b1, b2, b1, b2]
    for side in (b1, b2):
        assert all(v > 0 for v in alt.values(side, "joint_actions_per_s"))
        assert all(100 < v < 4000 for v in alt.values(side, "peak_rss_mb"))  # each its own process's peak
    per_round = [x / y for x, y in zip(alt.values(b2, "tokens_per_s"), alt.values(b1, "tokens_per_s"))]
    ratio = alt.ratio("tokens_per_s", b2, b1)
    assert (ratio.low, ratio.high) == (min(per_round), max(per_round))


@pytest.mark.skipif(importlib.util.find_spec("comlrl") is None, reason="CoMLRL 1.4.3 is not installed")
def test_the_comparison_prints_the_median_ratio_and_its_range(tmp_path):
    command = [sys.executable, "benchmarks/peer_comlrl.py", *TINY, "--rounds", "3", "--results", str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=1200)
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stderr.count("round 3/3:") == 3  # the three sides, in the third round
    assert "joint actions/s, textzoo B=2 / CoMLRL: " in done.stdout and "x [" in done.stdout
    assert "over 3 alternating round(s)" in done.stdout
    (entry,) = tmp_path.glob("*-peer_comlrl-magrpo.md")
    assert "| joint actions/s |" in entry.read_text()
