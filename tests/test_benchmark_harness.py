"""benchmarks/harness.py: alternating rounds run A B A B A B and their medians, ranges and round-by-round
ratios are the ones computed by hand; settings reach a fresh process as flags; the report writes a dated
entry with the host and the command."""

import json
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import tyro
from helpers import load_benchmark

harness = load_benchmark("harness")


def _scripted(name: str, values: list[float], order: list[str]):
    """A side that returns ``values`` one per call, recording the call order."""
    queue = iter(values)

    def run():
        order.append(name)
        return {"s": next(queue), "rate": 1 / values[0]}

    return run


def test_sides_alternate_and_the_ratio_is_taken_round_by_round():
    order: list[str] = []
    a_times, b_times = [2.0, 4.0, 3.0], [1.0, 1.0, 2.0]  # per round: ratios b / a = 0.5, 0.25, 0.667
    alt = harness.alternate({"a": _scripted("a", a_times, order), "b": _scripted("b", b_times, order)})
    assert order == ["a", "b", "a", "b", "a", "b"] == alt.order  # the default: 3 rounds, A B A B A B
    assert alt.values("a", "s") == a_times and alt.values("b", "s") == b_times
    assert alt.spread("a", "s") == harness.Spread(3.0, 2.0, 4.0)  # median, min, max
    assert alt.spread("b", "s") == harness.Spread(1.0, 1.0, 2.0)
    ratio = alt.ratio("s", "b", "a")
    # round by round, not median(b) / median(a) (1 / 3) nor a ratio of sums (4 / 9)
    assert ratio.median == pytest.approx(0.5) and ratio.low == pytest.approx(0.25)
    assert ratio.high == pytest.approx(2 / 3)
    assert ratio.format("x") == "0.500x [0.250, 0.667]"
    assert alt.to_json()["rounds"][1] == {"a": {"s": 4.0, "rate": 0.5}, "b": {"s": 1.0, "rate": 1.0}}
    assert "over 3 alternating round(s), each running a, b in this order" in alt.note()


def test_three_sides_and_a_table_with_ratios_to_the_reference():
    order: list[str] = []
    sides = {name: _scripted(name, [t, t, t, t], order) for name, t in (("ref", 4.0), ("x", 2.0), ("y", 1.0))}
    alt = harness.alternate(sides, rounds=4)
    assert order == ["ref", "x", "y"] * 4
    header, rows = harness.compare(alt, {"s": "seconds", "rate": "rate"}, reference="ref", ratios=("s",))
    assert header == ["figure", "ref", "x", "y", "x / ref", "y / ref"]
    assert rows[0] == ["seconds", "4.00 [4.00, 4.00]", "2.00 [2.00, 2.00]", "1.00 [1.00, 1.00]",
                       "0.500x [0.500, 0.500]", "0.250x [0.250, 0.250]"]  # fmt: skip
    assert rows[1][-2:] == ["", ""]  # no ratio asked for this figure


def test_alternate_refuses_no_rounds_and_common_settings_refuse_them_on_the_command_line():
    with pytest.raises(ValueError, match="1 or more rounds"):
        harness.alternate({"a": dict}, rounds=0)
    with pytest.raises(SystemExit, match="--rounds and --threads take 1 or more"):
        tyro.cli(harness.Common, args=["--rounds", "0"])


def test_numbers_keep_the_digits_that_matter():
    assert [harness.number(x) for x in (268.8, 19.74, 1.594, 0.2031, 0.00412, 2.6e-6, 0.0)] == [
        "269", "19.7", "1.59", "0.203", "0.0041", "2.6e-06", "0.00",
    ]  # fmt: skip


@dataclass
class _Settings(harness.Common):
    name: str = "x"
    sizes: tuple[int, ...] = (1, 2)
    fast: bool = True


def test_settings_reach_a_fresh_process_as_flags(tmp_path):
    settings = _Settings(threads=2, rounds=5, name="-odd value", sizes=(3, 4, 5), fast=False)
    flags = harness.cli_flags(settings)
    assert "--seed" not in " ".join(flags)  # defaults are left out
    assert tyro.cli(_Settings, args=flags) == settings
    assert tyro.cli(_Settings, args=harness.cli_flags(_Settings())) == _Settings()
    # a fresh process at 2 threads prints its JSON last; a failing one raises with its error output
    code = "import os, json; print('noise'); print(json.dumps({'omp': os.environ['OMP_NUM_THREADS']}))"
    assert harness.run_json([sys.executable, "-c", code], threads=2) == {"omp": "2"}
    with pytest.raises(SystemExit, match="boom"):
        harness.run_json([sys.executable, "-c", "raise SystemExit('boom')"])


def test_the_report_prints_the_host_and_writes_a_dated_entry(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", [str(harness.ROOT / "benchmarks" / "x.py"), "--rounds", "3"])
    info = harness.host()
    assert info["cores"] >= 1 and info["torch"] and len(info["date"]) == 10
    text = harness.report(
        str(tmp_path), "x", "a [title]", ["figure", "a"], [["s", "1.00 [1.00, 2.00]"]], {"k": 1}, ["n"]
    )
    out = capsys.readouterr().out
    assert out.startswith("host: ") and "a [title]" in out and "1.00 [1.00, 2.00]" in out
    assert "| figure | a |\n| --- | --- |\n| s | 1.00 [1.00, 2.00] |" in text
    entry = (tmp_path / f"{info['date']}-x.md").read_text()
    assert f"- commit: {info['commit']}" in entry and "- command: `python benchmarks/x.py --rounds 3`" in entry
    assert entry.endswith(text)
    saved = json.loads((tmp_path / f"{info['date']}-x.json").read_text())
    assert saved["figures"] == {"k": 1} and saved["host"]["cpu"] == info["cpu"]


def test_a_script_gives_inherited_settings_its_own_defaults_and_keeps_their_help(capsys):
    @dataclass
    @harness.defaults(batch_prompts=4, n_layer=1)
    class Script(harness.Common, harness.Rollouts, harness.TinyGPT2):
        extra: int = 0

    assert (Script().batch_prompts, Script().n_layer, Script().group_size) == (4, 1, 4)
    assert harness.Rollouts().batch_prompts == 32  # the parent keeps its own
    assert Script(n_embd=8).tiny() == {"n_layer": 1, "n_embd": 8, "n_head": 2}
    with pytest.raises(SystemExit):
        tyro.cli(Script, args=["--help"])
    assert "Prompts per training step (B). (default: 4)" in " ".join(capsys.readouterr().out.split())
    with pytest.raises(TypeError, match="inherits no setting 'nope'"):
        harness.defaults(nope=1)(type("Bad", (harness.Rollouts,), {}))


def test_a_fresh_process_reports_its_own_peak_memory_not_its_parents():
    # a parent holding ~600 MiB starts a small process: getrusage's ru_maxrss would report the parent's peak
    # (it survives fork and exec); peak_rss_mib reports the child's own, well under 200 MiB
    import subprocess

    held = bytearray(600 * 2**20)
    held[::4096] = b"\1" * len(held[::4096])  # touch every page: resident, not only reserved
    child = (
        "import sys; sys.path.insert(0, sys.argv[1]); import harness, resource; "
        "print(harness.peak_rss_mib(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)"
    )
    out = subprocess.run([sys.executable, "-c", child, str(Path(harness.__file__).parent)],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    own, inherited = map(float, out.split())
    assert own < 200 < 600 <= inherited, (own, inherited)  # the child's own peak; the parent's peak it inherits
    assert harness.peak_rss_mib() >= 600  # this process's own peak counts what it holds
    del held
