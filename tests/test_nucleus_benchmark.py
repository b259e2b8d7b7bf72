"""benchmarks/nucleus.py: its full-sort floor is the ranked one's reference, and the script times every
variant, each truncating as it says."""

import torch
from helpers import load_benchmark

from textzoo.decoding import sampling


def _script():
    return load_benchmark("nucleus")


def test_the_sorted_floor_is_the_ranked_floor():
    bench = _script()
    g = torch.Generator().manual_seed(0)
    logp = torch.log_softmax(torch.tensor([[6.0], [2.0], [0.5]]) * torch.randn(3, 3000, generator=g), -1)
    for top_p in (0.5, 0.9):
        torch.testing.assert_close(bench.sorted_floor(logp, top_p), sampling.nucleus_floor(logp, top_p))
    top2 = logp.masked_fill(logp < logp.topk(2, -1).values[:, -1:], float("-inf"))  # mass < 1: renormalised
    torch.testing.assert_close(bench.sorted_floor(top2, 0.6), sampling.nucleus_floor(top2, 0.6, renormalise=True))


def test_the_script_times_each_variant_with_its_own_truncation(monkeypatch):
    bench = _script()
    calls = {"ranked": 0, "sorted": 0}
    ranked, by_sort = sampling.nucleus_floor, bench.sorted_floor

    def count(name, floor):
        def counted(*a, **k):
            calls[name] += 1
            return floor(*a, **k)

        return counted

    monkeypatch.setattr(sampling, "nucleus_floor", count("ranked", ranked))
    monkeypatch.setattr(bench, "sorted_floor", count("sorted", by_sort))
    args = bench.Args(model="tiny-llama", batch_prompts=2, group_size=2, max_new_tokens=4, rounds=2)
    f = bench.main(args)
    assert sampling.nucleus_floor.__name__ == "counted"  # restored after the sorted variant's calls
    assert set(f["seconds"]) == {"ranked", "sorted", "no top-p"} and all(len(s) == 2 for s in f["seconds"].values())
    assert all(s > 0 for s in f["best"].values())
    # one truncation per decode step: the warm-up and two rounds ranked, two rounds sorted, none at top-p 1
    assert calls["sorted"] == 2 * f["steps"]["sorted"] and calls["ranked"] == 3 * f["steps"]["ranked"]
    assert 0 < f["nucleus_median"] <= f["nucleus_max"] <= f["vocab"]
    assert 0.0 <= f["equal_tokens"] <= 1.0
