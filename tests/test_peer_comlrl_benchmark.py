"""benchmarks/peer_comlrl.py without CoMLRL: each side's process gets the run's settings and its thread count."""

import dataclasses

import tyro
from helpers import load_benchmark


def test_each_side_gets_the_settings_and_its_threads():
    bench = load_benchmark("peer_comlrl")
    a = bench.Args(model="smollm2", lr=1e-5, batch_prompts=8, workers=2, comlrl_threads=2, source_words=5)
    for side, threads in (("comlrl", "2"), ("textzoo", "1"), ("textzoo_batched", "1")):
        flags, env = bench.side_command(a, side)
        assert tyro.cli(bench.Args, args=flags) == dataclasses.replace(a, side=side)
        assert env["OMP_NUM_THREADS"] == threads
    flags, env = bench.side_command(bench.Args(), "comlrl")
    assert env["OMP_NUM_THREADS"] == "1" and tyro.cli(bench.Args, args=flags).comlrl_threads == 1
