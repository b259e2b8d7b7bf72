"""benchmarks/bf16_fidelity.py runs end to end on a tiny model: bf16-mixed measured against float32, a
fastlm switch A/B'd and put back, a bad switch named before any model is built."""

import pytest
import torch
from helpers import load_benchmark

from textzoo.decoding import fastlm

torch.set_num_threads(1)


def _script():
    return load_benchmark("bf16_fidelity")


TINY = {"model": "tiny-llama", "prompts": 2, "group": 2, "max_new_tokens": 8, "seeds": [0], "repeats": 1}


def _tiny(script, **fields):
    return script.Args(**{**TINY, **fields})


def test_the_script_measures_bf16_against_fp32_on_a_tiny_model(capsys):
    script = _script()
    figures = script.main(_tiny(script, seeds=[0, 1]))
    out = capsys.readouterr().out
    assert list(figures) == [0, 1] and all(list(by_setting) == [None] for by_setting in figures.values())
    assert out.count("bf16-mixed: log-prob gap mean") == 2 and "tokens in the pass" in out
    for f in (figures[0][None], figures[1][None]):
        # two precisions really ran: bf16 rounding separates them, and only by bf16 rounding
        assert 0 < f["gap_mean"] <= f["gap_max"] < 0.5
        assert 0 < f["median"] <= f["worst"] and 0 < f["error"] < 0.1
        assert f["ms"] > 0


def test_a_switch_is_measured_both_ways_and_put_back(capsys):
    script = _script()
    figures = script.main(_tiny(script, switch="FUSE_PROJECTIONS"))
    out = capsys.readouterr().out
    assert set(figures[0]) == {True, False}
    assert "FUSE_PROJECTIONS=True" in out and "FUSE_PROJECTIONS=False" in out
    assert fastlm.FUSE_PROJECTIONS  # the default is back on
    on, off = figures[0][True], figures[0][False]
    assert abs(on["error"] - off["error"]) < 0.05  # the same math either way, to bf16 rounding
    from textzoo.decoding import compiled

    assert set(script.main(_tiny(script, switch="COMPILE_UPDATE"))[0]) == {True, False}  # compiled's switch too
    assert compiled.COMPILE_UPDATE
    # a switch whose default is None (decided per CPU) is forced both ways and put back to None
    assert set(script.main(_tiny(script, switch="GRAD_INTO_WEIGHTS"))[0]) == {True, False}
    assert fastlm.GRAD_INTO_WEIGHTS is None


def test_a_bad_switch_is_named_before_any_model_is_built(monkeypatch):
    script = _script()
    monkeypatch.setattr("textzoo.models.build.build_policy", lambda *a, **k: pytest.fail("a model was built"))
    for name in ("NOPE", "GROUPED_SCORES_LIMIT"):  # missing; not a boolean
        with pytest.raises(SystemExit, match=f"--switch {name}: not a boolean switch"):
            script.main(_tiny(script, switch=name))
