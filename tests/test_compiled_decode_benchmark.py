"""benchmarks/compiled_decode.py: its static-cache decode step is the transformers model's forward, step by
step, eager and compiled, and the script runs end to end on a tiny model."""

import pytest
import torch
from helpers import load_benchmark

from textzoo.decoding import compiled


def _script():
    return load_benchmark("compiled_decode")


def test_the_static_step_decodes_as_the_transformers_forward():
    bench = _script()
    policy = bench.load("tiny-llama", torch.float32)
    model = bench.in_dtype(policy, torch.float32)
    prompt = bench.prompt_tokens(policy.tokenizer, 3)  # [3, n]
    step = bench.StaticStep(model)
    keys, values = step.new_cache(3, prompt.shape[1] + 2)
    with torch.no_grad():
        full = model(prompt).logits  # [3, n, V]
        for t in range(prompt.shape[1]):  # each step's logits are the forward's at that position
            logits = step(prompt[:, t].contiguous(), torch.tensor(t), keys, values)
            torch.testing.assert_close(logits, full[:, t], rtol=1e-4, atol=1e-4)
    assert keys[0][:, :, prompt.shape[1] :].abs().sum() == 0  # positions not reached yet stay empty


@pytest.mark.skipif(not compiled.compiler_available(), reason="inductor needs a C++ compiler")
def test_the_script_times_each_variant_and_their_agreement(capsys):
    bench = _script()
    figures = bench.main(bench.Args(model="tiny-llama", rows=4, steps=2, rounds=1, dtype="float32"))
    out = capsys.readouterr().out
    # float32: each compiled step and textzoo's decoder are the eager step up to summation order, and the eager
    # step is the transformers forward
    agree = figures["agreement"]
    variants = (*bench.VARIANTS, bench.TEXTZOO)  # textzoo's own decoder too, over the same prompt rows
    assert set(agree) == {"eager vs transformers"} | {f"{name} vs eager" for name in variants[1:]}
    assert all(a["argmax"] == 1.0 and a["max_diff"] < 1e-3 for a in agree.values()), agree
    assert "first call (compiling)" in out and "x eager" in out
    assert set(figures["times"]) == set(variants)
    assert all(len(seconds) == 1 and seconds[0] > 0 for seconds in figures["times"].values())
