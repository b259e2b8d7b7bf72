"""benchmarks/gpu.py: its shapes are the real models' and the script runs end to end on CPU (`--tiny`), with
its decode modes in agreement."""

import json

import pytest
import torch
from helpers import load_benchmark

from textzoo.decoding import sampling
from textzoo.decoding.generation import Generation


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


def test_the_script_runs_on_cpu_with_its_decode_modes_in_agreement(tmp_path, capsys, monkeypatch):
    bench = _script()
    out = tmp_path / "gpu.json"
    args = bench.Args(tiny=True, agents=1, precision="fp32", batch_prompts=2, max_new_tokens=8, profile=True,
                      out=str(out), logp_blocks=("4:1024",))  # fmt: skip
    scored, score = [], sampling.selected_log_probs

    def spy(*args, chunk, **kwargs):  # the blocking each scoring call ran with
        scored.append((sampling.TOKEN_LOGP_ROWS, chunk))
        return score(*args, chunk=chunk, **kwargs)

    monkeypatch.setattr(sampling, "selected_log_probs", spy)
    figures = bench.main(args)
    assert set(scored) == {(16, sampling.LOGITS_CHUNK), (4, 1024)}  # the default's calls and the variant's
    assert sampling.TOKEN_LOGP_ROWS == 16  # left as it was
    assert json.loads(out.read_text()) == figures
    agent = figures["agents"]["agent0"]
    # float32: the static cache decodes what the growing one does, token for token, its log-probs equal to
    # rounding (a position off by one in the static cache gives a gap of 1.3e-4 here; ~5e-7 without it)
    assert agent["dynamic/greedy_as_first"] == agent["static/greedy_as_first"] == 1.0
    assert agent["dynamic/greedy_logp_gap"] == 0 and agent["static/greedy_logp_gap"] < 1e-5
    for mode in ("dynamic", "static"):
        assert agent[f"{mode}/decode_tokens_per_s"] > 0 and 0 < agent[f"{mode}/of_hbm_bound"] < 1
        assert agent[f"{mode}/ms_per_step"] > 0
        # the median of three alternating rounds, between their slowest and fastest
        low, high = agent[f"{mode}/decode_tokens_per_s_min"], agent[f"{mode}/decode_tokens_per_s_max"]
        assert low <= agent[f"{mode}/decode_tokens_per_s"] <= high
    assert agent["dynamic/vs_dynamic"] == 1.0 and agent["static/vs_dynamic_min"] <= agent["static/vs_dynamic"]
    assert 0 < agent["update_mfu"] < 1 and agent["update_tokens_per_s"] > 0
    assert agent["update_logp_4_1024/tokens_per_s"] > 0  # 2 positions of the 512-token vocabulary per chunk
    printed = capsys.readouterr().out
    for title in ("decode, dynamic, 16 steps", "decode, static, 16 steps", "update"):
        assert f"--- profile: {title}:" in printed
    assert "| dynamic/greedy_as_first | 1 |" in printed


def test_the_update_counts_each_prompt_once_per_micro_batch():
    bench = _script()
    # rows: prompt a (3 tokens, left-padded) twice, then prompt b (4 tokens) twice; completions of 2, 1, 2, 0
    ids = torch.tensor([[0, 5, 6, 7], [0, 5, 6, 7], [8, 9, 5, 6], [8, 9, 5, 6]])
    mask = torch.tensor([[0, 1, 1, 1], [0, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1]])
    done = torch.tensor([[1, 1], [1, 0], [1, 1], [0, 0]])
    gen = Generation(ids, mask, torch.ones(4, 2, dtype=torch.long), done, torch.zeros(4, 2))
    assert bench.forwarded_tokens(gen, 4) == (3 + 4) + 5  # one micro-batch: a and b once each
    assert bench.forwarded_tokens(gen, 3) == (3 + 4) + 4 + 5  # rows 0-2 (a, b), row 3 (b again)
    assert bench.forwarded_tokens(gen, 1) == (3 + 3 + 4 + 4) + 5  # each row its own prompt pass


def test_a_bad_logp_blocking_fails_before_any_model_is_built(monkeypatch):
    bench = _script()
    monkeypatch.setattr(bench, "build_policy", lambda *a, **k: pytest.fail("a model was built"))
    for spec in ("16", "0:1024", "a:b"):
        with pytest.raises(SystemExit, match="ROWS:CHUNK"):
            bench.main(bench.Args(tiny=True, agents=1, logp_blocks=(spec,)))
