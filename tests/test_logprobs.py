"""Selected-token log-probs in chunks of positions: the full-logits values and gradients, less memory."""

import math

import pytest
import torch

from textzoo.decoding.backends import HeadInput
from textzoo.decoding.backends.module import ModuleBackend
from textzoo.decoding.generation import GenerationConfig
from textzoo.decoding.sampling import log_probs, selected_log_probs
from textzoo.models.policy import Policy

torch.set_num_threads(1)


def _inputs(S=3, C=5, d=8, V=11, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(S, C, d, generator=g, dtype=torch.float32).requires_grad_()
    head = torch.nn.Linear(d, V, dtype=torch.float32)
    with torch.no_grad():
        head.weight.copy_(torch.randn(V, d, generator=g, dtype=torch.float32))
        head.bias.copy_(torch.randn(V, generator=g, dtype=torch.float32))
    tokens = torch.randint(0, V, (S, C), generator=g)
    return hidden, head, tokens


def test_log_probs_by_hand():
    logits = torch.tensor([[1.0, 2.0, 3.0]])
    bias = torch.tensor([0.0, float("-inf"), 0.0])
    # T = 2, token 1 not allowed: p(0) = e^0.5 / (e^0.5 + e^1.5), p(2) = e^1.5 / (...)
    out = log_probs(logits, 2.0, bias)
    z = math.log(math.exp(0.5) + math.exp(1.5))
    assert out[0, 0].item() == pytest.approx(0.5 - z)
    assert out[0, 2].item() == pytest.approx(1.5 - z)
    assert out[0, 1].item() == float("-inf")
    inputs = HeadInput(logits[:, None], lambda x: x)
    logp, entropy = selected_log_probs(inputs, torch.tensor([[2]]), 2.0, bias, return_entropy=True)
    p0, p2 = math.exp(0.5 - z), math.exp(1.5 - z)
    assert logp.item() == pytest.approx(1.5 - z)
    assert entropy.item() == pytest.approx(-(p0 * math.log(p0) + p2 * math.log(p2)))


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("restricted", [False, True])
@pytest.mark.parametrize("rows_per_chunk", [1, 4, 7])
def test_chunks_give_the_full_logits_values_and_gradients(temperature, restricted, rows_per_chunk):
    hidden, head, tokens = _inputs()
    V = head.out_features
    bias = None
    if restricted:
        bias = torch.full((V,), float("-inf"), dtype=torch.float32)
        bias[[0, 2, 3, 7]] = 0.0
        tokens = torch.tensor([0, 2, 3, 7])[torch.arange(tokens.numel()) % 4].view_as(tokens)
    weights = torch.linspace(-1, 2, tokens.numel(), dtype=torch.float32).view_as(tokens)

    def run(chunk):
        hidden.grad, head.weight.grad, head.bias.grad = None, None, None
        logp, entropy = selected_log_probs(
            HeadInput(hidden, head), tokens, temperature, bias, return_entropy=True, chunk=chunk
        )
        ((logp * weights).sum() + entropy.sum()).backward()
        return logp.detach(), entropy.detach(), hidden.grad.clone(), head.weight.grad.clone(), head.bias.grad.clone()

    full = run(0)
    chunked = run(rows_per_chunk * V)
    for a, b in zip(full, chunked):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)
    # and against the definition: gather of log_softmax over the whole [S, C, V]
    logits = head(hidden).detach() / temperature + (0 if bias is None else bias)
    expected = torch.log_softmax(logits, -1).gather(2, tokens[..., None]).squeeze(2)
    torch.testing.assert_close(full[0], expected, atol=1e-6, rtol=0)


def _saved_numels(fn, weights) -> list[int]:
    """Sizes of the tensors autograd saves for backward while ``fn`` runs (``weights`` not counted)."""
    sizes: list[int] = []
    skip = {w.data_ptr() for w in weights}

    def pack(t):
        if t.data_ptr() not in skip:
            sizes.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sizes


def test_chunked_scoring_keeps_no_full_logits_for_backward():
    hidden, head, tokens = _inputs(S=4, C=6, V=50)
    S, C, V = 4, 6, 50
    weights = list(head.parameters())
    full = _saved_numels(lambda: selected_log_probs(HeadInput(hidden, head), tokens, 1.0, None, chunk=0), weights)
    chunked = _saved_numels(
        lambda: selected_log_probs(HeadInput(hidden, head), tokens, 1.0, None, chunk=2 * V), weights
    )
    assert max(full) >= S * C * V  # the naive pass saves the [S*C, V] log-probs
    assert max(chunked) < S * C * V / 4  # the chunked pass saves its inputs only


@pytest.mark.parametrize("fast_forward", [True, False])
@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_policy_scores_the_same_in_chunks(arch, fast_forward):
    cfg = GenerationConfig(max_new_tokens=6, temperature=0.8, allowed_tokens=tuple(range(40, 120)))
    policy = Policy.tiny(arch, n_layer=2, n_embd=32, generation=cfg)
    policy.fast_forward = fast_forward
    gen = policy.generate(["ab", "hello", "ab", "xyz"], generator=torch.Generator().manual_seed(0))
    weights = torch.linspace(-1, 1, 4)

    def run(chunk):
        policy.logits_chunk = chunk
        policy.model.zero_grad()
        logp, entropy = policy.score(
            gen.prompt_ids, gen.prompt_mask, gen.completion_ids, gen.completion_mask, return_entropy=True
        )
        ((logp.sum(1) * weights).sum() + entropy.sum()).backward()
        return logp.detach(), entropy.detach(), {n: p.grad.clone() for n, p in policy.model.named_parameters()}

    naive, chunked = run(0), run(3 * 259)  # 3 positions of the byte vocabulary per chunk
    torch.testing.assert_close(chunked[0], naive[0], atol=1e-6, rtol=0)
    torch.testing.assert_close(chunked[0], gen.logprobs, atol=1e-5, rtol=0)
    torch.testing.assert_close(chunked[1], naive[1], atol=1e-6, rtol=0)
    for name, grad in naive[2].items():
        torch.testing.assert_close(chunked[2][name], grad, atol=1e-6, rtol=1e-5, msg=name)


def test_the_module_backend_scores_from_hidden_states_when_the_head_is_plain():
    policy = Policy.tiny("llama", n_layer=1, n_embd=32)
    backend = ModuleBackend(policy.model)
    assert backend.head is policy.model.lm_head
    ids, mask = policy.encode(["abc", "de"])
    completion = torch.randint(3, 200, (2, 4))
    inputs = backend.score(ids, mask, completion)
    assert inputs.hidden.shape == (2, 4, 32)  # [S, C, d], not [S, C, V]
    P = ids.shape[1]
    full = policy.model(
        torch.cat([ids, completion], 1),
        attention_mask=torch.cat([mask, torch.ones_like(completion)], 1),
        position_ids=(torch.cat([mask, torch.ones_like(completion)], 1).cumsum(1) - 1).clamp(min=0),
    ).logits[:, P - 1 : -1]
    torch.testing.assert_close(inputs.logits(), full, atol=1e-5, rtol=0)


def test_models_with_logit_postprocessing_score_from_the_module_logits():
    from transformers import AutoModelForCausalLM, Gemma2Config

    from textzoo.models.tokenizer import byte_tokenizer

    tokenizer = byte_tokenizer()
    config = Gemma2Config(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, final_logit_softcapping=5.0, pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
    )  # fmt: skip
    torch.manual_seed(0)
    policy = Policy(AutoModelForCausalLM.from_config(config), tokenizer, GenerationConfig(max_new_tokens=5))
    assert policy.backends().module.head is None and policy.backends().plain is None
    gen = policy.generate(["abc", "de"], generator=torch.Generator().manual_seed(0))
    policy.logits_chunk = 2 * len(tokenizer)
    scored = policy.score(gen.prompt_ids, gen.prompt_mask, gen.completion_ids, gen.completion_mask)
    torch.testing.assert_close(scored, gen.logprobs, atol=1e-5, rtol=0)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("restricted", [False, True])
def test_half_precision_token_log_probs_match_the_autograd_path(temperature, restricted, monkeypatch):
    """bf16 logits: the blocked token log-prob (`_TokenLogProb`, blocks of 3 rows here) gives autograd's
    log_softmax-then-gather values and logits gradient (to float32 rounding, then the gradient's bf16)."""
    from textzoo.decoding import sampling

    monkeypatch.setattr(sampling, "TOKEN_LOGP_ROWS", 3)
    torch.manual_seed(0)
    logits = (3 * torch.randn(8, 50)).bfloat16().requires_grad_()
    tokens = torch.randint(0, 40, (8,))
    bias = None
    if restricted:
        bias = torch.zeros(50)
        bias[40:] = float("-inf")
    weights = torch.randn(8)
    expected = sampling.log_probs(logits, temperature, bias).gather(1, tokens[:, None]).squeeze(1)
    (expected * weights).sum().backward()
    expected_grad, logits.grad = logits.grad.clone(), None
    got = sampling._TokenLogProb.apply(logits, tokens, temperature, bias)
    (got * weights).sum().backward()
    assert got.dtype == torch.float32 and logits.grad.dtype == torch.bfloat16
    torch.testing.assert_close(got, expected.detach(), atol=1e-5, rtol=0)
    torch.testing.assert_close(logits.grad.float(), expected_grad.float(), atol=1e-3, rtol=1e-2)
    if restricted:
        assert torch.equal(logits.grad[:, 40:], torch.zeros(8, 10, dtype=torch.bfloat16))
