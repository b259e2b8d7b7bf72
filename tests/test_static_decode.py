"""Static-cache decoding (the CUDA-graph path, run eagerly on CPU) and finished rows letting go:
the same samples and log-probs as the dynamic path, with the same seed."""

import pytest
import torch

from textzoo.decoding.backends import static
from textzoo.decoding.backends.module import ModuleDecoding
from textzoo.decoding.backends.plain import PlainDecoding
from textzoo.decoding.generation import GenerationConfig
from textzoo.errors import ConfigError
from textzoo.models.policy import Policy

torch.set_num_threads(1)

PROMPTS = ["hello there", "a", "the quick brown fox jumps", ""]
# ten allowed bytes + EOS: about one step in eleven ends a row, so rows finish at many different steps
SHORT = GenerationConfig(max_new_tokens=24, allowed_tokens=tuple(range(60, 70)), temperature=0.9)


def _grouped(prompts, G):
    return [p for p in prompts for _ in range(G)]


def _policy(arch: str, generation=SHORT, **kw) -> Policy:
    if arch == "gqa":
        from transformers import AutoModelForCausalLM, LlamaConfig

        from textzoo.models.tokenizer import byte_tokenizer

        tokenizer = byte_tokenizer()
        config = LlamaConfig(
            vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, pad_token_id=tokenizer.pad_token_id,
            bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        )  # fmt: skip
        torch.manual_seed(0)
        return Policy(AutoModelForCausalLM.from_config(config), tokenizer, generation)
    return Policy.tiny(arch, n_layer=2, n_embd=32, generation=generation, **kw)


def _generate(policy, prompts, seed=0, greedy=False):
    return policy.generate(prompts, greedy=greedy, generator=torch.Generator().manual_seed(seed))


def _same(a, b):
    assert torch.equal(a.completion_ids, b.completion_ids)
    assert torch.equal(a.completion_mask, b.completion_mask)
    assert a.texts == b.texts
    torch.testing.assert_close(a.logprobs, b.logprobs, atol=1e-5, rtol=0)


def test_buckets_are_powers_of_two():
    assert [static.bucket(n) for n in (1, 2, 3, 4, 5, 63, 64, 65)] == [1, 2, 4, 4, 8, 64, 64, 128]


@pytest.mark.parametrize("arch", ["gpt2", "llama", "qwen2", "qwen3", "gqa"])
@pytest.mark.parametrize("layout", ["groups", "scattered"])
def test_static_cache_decoding_gives_the_dynamic_samples(arch, layout):
    policy = _policy(arch)
    prompts = _grouped(PROMPTS, 3) if layout == "groups" else ["b" * 9, "a", "b" * 9, "c" * 4, "b" * 9]
    policy.decode_mode = "dynamic"
    dynamic = _generate(policy, prompts)
    lengths = dynamic.completion_mask.sum(1)
    assert len(set(lengths.tolist())) > 2  # rows end at different steps
    policy.decode_mode = "static"
    _same(_generate(policy, prompts), dynamic)
    policy.fast_forward = False  # and the transformers module, for good measure
    _same(_generate(policy, prompts), dynamic)
    policy.fast_forward = True
    _same(_generate(policy, prompts, greedy=True), _generate(policy, prompts, greedy=True))


def test_static_decoding_with_stop_strings_and_top_p():
    abc = tuple(range(ord("A") + 3, ord("A") + 6))  # the byte ids of A, B, C
    cfg = GenerationConfig(max_new_tokens=20, stop_strings=("AB",), top_p=0.9, allowed_tokens=abc)
    policy = _policy("llama", generation=cfg)
    prompts = _grouped(["x", "yy"], 4)
    dynamic = _generate(policy, prompts, seed=3)
    assert any("AB" in t for t in dynamic.texts)
    policy.decode_mode = "static"
    _same(_generate(policy, prompts, seed=3), dynamic)


@pytest.mark.parametrize("mode", ["dynamic", "static", "module"])
def test_finished_rows_are_let_go_with_the_same_results(mode, monkeypatch):
    policy = _policy("gpt2")
    if mode == "module":
        policy.fast_forward = False
    else:
        policy.decode_mode = mode
    kind = {"dynamic": PlainDecoding, "static": static.StaticDecoding, "module": ModuleDecoding}[mode]
    kept, decoded = [], []
    retain, decode = kind.retain, kind.decode
    monkeypatch.setattr(kind, "retain", lambda self, rows: kept.append(len(r := retain(self, rows))) or r)
    monkeypatch.setattr(kind, "decode", lambda self, tokens: decoded.append(len(tokens)) or decode(self, tokens))
    prompts = ["p" * 5, "q" * 3, "r", "s" * 7] if mode != "dynamic" else _grouped(["p" * 5, "q" * 3, "r", "s"], 2)
    prompts = prompts * 3
    compacted = _generate(policy, prompts, seed=1)
    assert kept and min(decoded) < len(prompts)  # later steps ran fewer rows
    policy.compact_finished = False
    decoded.clear()
    full = _generate(policy, prompts, seed=1)
    assert set(decoded) == {len(prompts)}
    _same(compacted, full)


def test_the_static_cache_is_reused_across_calls_and_released():
    policy = _policy("llama")
    policy.decode_mode = "static"
    prompts = _grouped(PROMPTS, 2)
    first = _generate(policy, prompts)
    plain = policy.backends().plain
    cache = plain._static
    assert cache is not None and cache.rows == 8 and cache.length % static.LENGTH_STEP == 0
    _same(_generate(policy, prompts), first)
    assert plain._static is cache  # same shapes: the same buffers (and, on CUDA, the same graphs)
    _generate(policy, prompts[:3])
    assert plain._static is cache  # fewer rows fit too
    plain.release()
    assert plain._static is None
    _same(_generate(policy, prompts), first)


def test_graph_mode_replays_the_captured_step(monkeypatch):
    """The CUDA-graph plumbing on CPU: a stand-in capture runs the step at capture time (as the real
    warm-up does) and again at every replay into the same output buffer; samples stay the dynamic ones."""
    captured = []

    def fake_capture(step, warmup=2):
        for _ in range(warmup):
            step()
        output = step()
        captured.append(output.shape[0])
        return (lambda: output.copy_(step())), output

    monkeypatch.setattr(static, "graphs_available", lambda device: True)
    monkeypatch.setattr(static, "capture_graph", fake_capture)
    policy = _policy("gqa")
    prompts = _grouped(PROMPTS, 3)
    policy.decode_mode = "dynamic"
    dynamic = _generate(policy, prompts)
    policy.decode_mode = "auto"  # graphs are "available": auto picks them
    graphed = _generate(policy, prompts)
    _same(graphed, dynamic)
    assert captured[0] == 16 and len(captured) == len(set(captured))  # one capture per bucket
    n = len(captured)
    _same(_generate(policy, prompts), dynamic)
    assert len(captured) == n  # the next call replays the same graphs
    for p in policy.model.parameters():  # weights moved to new storage: graphs are captured again
        p.data = p.data.clone()
    _same(_generate(policy, prompts), dynamic)
    assert len(captured) > n


def test_decode_mode_is_checked():
    policy = _policy("gpt2")
    policy.decode_mode = "graph"
    with pytest.raises(ConfigError, match="CUDA"):
        _generate(policy, ["x"])
    policy.decode_mode = "fast"
    with pytest.raises(ConfigError, match="decode_mode"):
        _generate(policy, ["x"])


def test_static_decoding_under_bf16_autocast_matches_dynamic():
    policy = _policy("llama")
    policy.autocast = torch.bfloat16
    prompts = _grouped(PROMPTS, 2)
    dynamic = _generate(policy, prompts)
    policy.decode_mode = "static"
    static_gen = _generate(policy, prompts)
    assert torch.equal(static_gen.completion_ids, dynamic.completion_ids)
    torch.testing.assert_close(static_gen.logprobs, dynamic.logprobs, atol=2e-2, rtol=0)
