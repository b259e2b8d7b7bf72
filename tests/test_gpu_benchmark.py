"""benchmarks/gpu.py: its shapes are the real models' and the script runs end to end on CPU (`--tiny`), with
its decode modes in agreement."""

import json

from helpers import load_benchmark


def _script():
    return load_benchmark("gpu")


def test_the_smollm2_shape_is_the_real_models(smollm2):
    real = json.loads((smollm2 / "config.json").read_text())
    config_class, shape = _script().SHAPES["smollm2-135m"]
    built = config_class(**shape).to_dict()
    assert built["model_type"] == real["model_type"] == "llama"
    for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "vocab_size", "tie_word_embeddings", "rope_parameters", "max_position_embeddings"):  # fmt: skip
        assert built[key] == real[key], key
    assert abs(built["rms_norm_eps"] - real["rms_norm_eps"]) < 1e-12


def test_the_script_runs_on_cpu_with_its_decode_modes_in_agreement(tmp_path, capsys):
    bench = _script()
    out = tmp_path / "gpu.json"
    args = bench.Args(tiny=True, agents=1, precision="fp32", batch_prompts=2, new_tokens=8, profile=True, out=str(out))
    figures = bench.main(args)
    assert json.loads(out.read_text()) == figures
    agent = figures["agents"]["agent0"]
    # float32: the static cache decodes what the growing one does, token for token, its log-probs equal to
    # rounding (a position off by one in the static cache gives a gap of 1.3e-4 here; ~5e-7 without it)
    assert agent["dynamic/greedy_as_first"] == agent["static/greedy_as_first"] == 1.0
    assert agent["dynamic/greedy_logp_gap"] == 0 and agent["static/greedy_logp_gap"] < 1e-5
    for mode in ("dynamic", "static"):
        assert agent[f"{mode}/decode_tokens_per_s"] > 0 and 0 < agent[f"{mode}/of_hbm_bound"] < 1
        assert agent[f"{mode}/ms_per_step"] > 0
    assert 0 < agent["update_mfu"] < 1 and agent["update_tokens_per_s"] > 0
    printed = capsys.readouterr().out
    for title in ("decode, dynamic, 16 steps", "decode, static, 16 steps", "update"):
        assert f"--- profile: {title}:" in printed
    assert "| dynamic/greedy_as_first | 1 |" in printed
