"""benchmarks/reward_model.py end to end on a tiny model: both sides run and the table reports them."""

from helpers import load_benchmark

bench = load_benchmark("reward_model")


def test_both_sides_time_scoring_and_an_epoch(capsys):
    args = bench.Args(model="tiny-llama", rounds=1, texts=4, pairs=4, minibatches=2, max_tokens=16)
    bench.main(args)
    out = capsys.readouterr().out
    for figure in ("score 4 texts (s)", "one epoch of 4 pairs (s)", "float32 / now"):
        assert figure in out
    assert "16 tokens a text; 2 optimizer steps an epoch" in out
