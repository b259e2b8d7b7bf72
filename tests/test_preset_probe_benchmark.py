"""benchmarks/preset_probe.py without a model: the markdown table of its JSON-lines rows."""

from helpers import load_benchmark

probe = load_benchmark("preset_probe")


def _row(temps: dict, greedy: float = 0.3) -> dict:
    return {
        "preset": "debate:sums-30", "mode": "decentralized", "items": 100, "samples": 8, "greedy": greedy,
        "format": {"valid": 1.0}, **{f"T={t}": {"sampled": s, "pass@8": p} for t, (s, p) in temps.items()},
    }  # fmt: skip


def test_rows_run_apart_share_one_line_with_the_best_gap():
    rows = [_row({0.5: (0.2, 0.55)}), _row({0.7: (0.1, 0.37)}), {**_row({1.0: (0.05, 0.2)}), "mode": "centralized"}]
    table = probe.markdown(rows).splitlines()
    assert table[0] == (
        "| preset | mode | items | greedy | T=0.5 sampled / pass@8 | T=0.7 sampled / pass@8 | "
        "T=1.0 sampled / pass@8 | best gap | format |"
    )
    assert len(table) == 4  # header, rule, one line per preset and mode
    assert table[2] == (
        "| debate:sums-30 | decentralized | 100 | 0.300 | 0.200 / 0.550 | 0.100 / 0.370 |  | +0.250 | valid 1.00 |"
    )
    assert table[3] == "| debate:sums-30 | centralized | 100 | 0.300 |  |  | 0.050 / 0.200 | -0.100 | valid 1.00 |"
