"""The fast paths are exact: plain-torch forward vs transformers, shared prompts vs one row each."""

import threading

import pytest
import torch
from helpers import tiny_config

from textzoo.decoding.backends.module import ModuleBackend
from textzoo.decoding.backends.plain import PlainBackend
from textzoo.decoding.fastlm import FastDecoder, KVCache
from textzoo.decoding.generation import GenerationConfig
from textzoo.models.policy import Policy

torch.set_num_threads(1)

ARCHS = ["gpt2", "llama", "qwen2", "qwen3"]
PROMPTS = ["hello there", "a", "the quick brown fox jumps", ""]


def _tiny(arch: str = "gpt2", **kw) -> Policy:
    return Policy.tiny(arch, n_layer=2, n_embd=32, n_head=2, generation=GenerationConfig(max_new_tokens=6), **kw)


def _grouped(prompts: list[str], G: int) -> list[str]:
    return [p for p in prompts for _ in range(G)]


@pytest.mark.parametrize("arch", ARCHS)
def test_fast_forward_matches_transformers_with_left_padding_and_cache(arch):
    from textzoo.decoding.fastlm import first_tokens_first

    policy = _tiny(arch)
    model = policy.model.eval()
    fast = FastDecoder.build(model)
    assert fast is not None and fast.usable
    ids, mask = policy.encode(PROMPTS[:3])  # left-padded, different lengths

    def reference(ids, mask):  # transformers' logits at every position ([S, L, V])
        return model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(1) - 1).clamp(min=0)).logits

    with torch.no_grad():
        prefix, last = fast.prefill(*first_tokens_first(ids, mask))
        torch.testing.assert_close(fast.head(last), reference(ids, mask)[:, -1], atol=1e-5, rtol=0)
        # decode two tokens into a preallocated cache, one position at a time
        cache, position, grown, grown_mask = fast.new_cache(capacity=2), prefix.lengths[:, None], ids, mask
        for _ in range(2):
            token = torch.randint(3, 100, (ids.shape[0], 1))
            grown, grown_mask = torch.cat([grown, token], 1), torch.cat([grown_mask, torch.ones_like(token)], 1)
            step = fast.head(fast.extend(token, position, prefix, cache, 1)[:, -1])
            torch.testing.assert_close(step, reference(grown, grown_mask)[:, -1], atol=1e-5, rtol=0)
            position = position + 1
        # several positions at once (scoring): causal within the new tokens
        tokens = torch.randint(3, 100, (ids.shape[0], 3))
        out = fast.head(fast.extend(tokens, prefix.lengths[:, None] + torch.arange(3), prefix, fast.new_cache(), 3))
        full = reference(torch.cat([ids, tokens], 1), torch.cat([mask, torch.ones_like(tokens)], 1))
        torch.testing.assert_close(out, full[:, -3:], atol=1e-5, rtol=0)


def test_unsupported_models_fall_back():
    policy = _tiny("gpt2")
    fast = FastDecoder.build(policy.model)
    assert fast is not None
    # a wrapped layer (what LoRA does) is not read by the plain forward
    layer = policy.model.transformer.h[0].attn.c_attn
    policy.model.transformer.h[0].attn.c_attn = torch.nn.Sequential(layer)
    assert FastDecoder.build(policy.model) is None
    # dropout is only reproduced by the module: train mode with dropout > 0 is not usable
    dropped = FastDecoder.build(_tiny("gpt2", dropout=0.1).model)
    assert dropped is not None
    dropped.model.train()
    assert not dropped.usable
    dropped.model.eval()
    assert dropped.usable
    assert FastDecoder.build(torch.nn.Linear(2, 2)) is None
    # the policy takes the fast forward for training too (dropout 0), and not when told not to
    policy = _tiny("llama")
    policy.model.train()
    assert isinstance(policy.backend(), PlainBackend)
    policy.fast_forward = False
    assert isinstance(policy.backend(), ModuleBackend)


def test_kv_cache_room():
    cache = KVCache(layers=1, capacity=3)
    k = torch.arange(4.0).view(2, 1, 2, 1)  # [S=2, H, T=2, D]
    keys, _ = cache.update(0, k, k)
    assert keys.shape == (2, 1, 2, 1)
    keys, _ = cache.update(0, torch.full((2, 1, 1, 1), 9.0), torch.zeros(2, 1, 1, 1))
    assert keys[:, 0, :, 0].tolist() == [[0, 1, 9], [2, 3, 9]]
    with pytest.raises(ValueError, match="capacity"):
        cache.update(0, torch.zeros(2, 1, 1, 1), torch.zeros(2, 1, 1, 1))


def _generate(policy: Policy, prompts: list[str], seed: int = 0):
    return policy.generate(prompts, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("fast_forward,share_prompts", [(True, True), (False, True), (True, False)])
def test_generation_is_the_same_with_and_without_the_fast_paths(arch, fast_forward, share_prompts):
    policy = _tiny(arch)
    prompts = _grouped(PROMPTS, 3)
    policy.fast_forward, policy.share_prompts = fast_forward, share_prompts
    fast = _generate(policy, prompts)
    policy.fast_forward, policy.share_prompts = False, False
    plain = _generate(policy, prompts)
    assert torch.equal(fast.completion_ids, plain.completion_ids)
    assert fast.texts == plain.texts
    torch.testing.assert_close(fast.logprobs, plain.logprobs, atol=1e-5, rtol=0)


def _spy_rows(monkeypatch, policy: Policy) -> list[tuple[str, int | tuple[int, int]]]:
    """Record (call, rows) of every model pass: the fast decoder's prefill/extend, its one-pass score
    (prompts, completion rows), or the module's forward."""
    seen: list[tuple[str, int | tuple[int, int]]] = []
    backend = policy.backend()
    if isinstance(backend, ModuleBackend):
        forward = backend._forward
        monkeypatch.setattr(
            backend, "_forward", lambda ids, *a, **k: seen.append(("forward", ids.shape[0])) or forward(ids, *a, **k)
        )
        return seen
    fast = backend.decoder
    prefill, extend, score = fast.prefill, fast.extend, fast.score
    monkeypatch.setattr(
        fast,
        "score",
        lambda prompts, lengths, rows, ids, *a: (
            seen.append(("score", (len(prompts), len(ids)))) or score(prompts, lengths, rows, ids, *a)
        ),
    )
    monkeypatch.setattr(
        fast, "prefill", lambda ids, *a, **k: seen.append(("prefill", ids.shape[0])) or prefill(ids, *a, **k)
    )
    monkeypatch.setattr(
        fast, "extend", lambda ids, *a, **k: seen.append(("extend", ids.shape[0])) or extend(ids, *a, **k)
    )
    return seen


@pytest.mark.parametrize("fast_forward", [True, False])
def test_prefill_runs_each_distinct_prompt_once(monkeypatch, fast_forward):
    policy = _tiny("gpt2")
    policy.fast_forward = fast_forward
    seen = _spy_rows(monkeypatch, policy)
    prompts = ["x" * 20, "y" * 10, "x" * 20, "z" * 5, "x" * 20, "y" * 10]  # 3 distinct, scattered rows
    _generate(policy, prompts)
    assert seen[0][1] == 3 and len(seen) > 1 and all(rows == 6 for _, rows in seen[1:])
    seen.clear()
    gen = _generate(policy, _grouped(["p" * 30, "q" * 12], 4))
    assert seen[0][1] == 2
    seen.clear()
    policy.score(gen.prompt_ids, gen.prompt_mask, gen.completion_ids, gen.completion_mask)
    if fast_forward:  # one pass: the two prompts once, with the eight completions
        assert seen == [("score", (2, 8))]
    else:  # the module: the prompts once, then the completions
        assert seen == [("forward", 2), ("forward", 8)]


def test_grouped_rows_read_one_copy_of_their_prompt(monkeypatch):
    policy = _tiny("gpt2")
    fast = policy.backend().decoder
    shares = []
    share = fast.share
    monkeypatch.setattr(fast, "share", lambda prefix, rows: shares.append(rows.group) or share(prefix, rows))
    gen = _generate(policy, _grouped(["p" * 30, "q" * 12, "r"], 4))
    policy.score(gen.prompt_ids, gen.prompt_mask, gen.completion_ids, gen.completion_mask)
    _generate(policy, ["b" * 9, "a", "b" * 9])  # not contiguous groups: each row gets its prompt's copy
    assert shares == [4, 4, 0]


def _score_and_grads(policy: Policy, gen, weights: torch.Tensor):
    policy.model.zero_grad()
    logp = policy.score(gen.prompt_ids, gen.prompt_mask, gen.completion_ids, gen.completion_mask)  # [S, C]
    (logp.sum(1) * weights).sum().backward()
    grads = {n: p.grad.clone() for n, p in policy.model.named_parameters() if p.grad is not None}
    return logp.detach(), grads


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("layout", ["groups", "scattered"])
@pytest.mark.parametrize("fast_forward", [True, False])
def test_shared_prompt_scoring_gives_the_plain_log_probs_and_gradients(arch, layout, fast_forward):
    policy = _tiny(arch)
    prompts = _grouped(PROMPTS, 3) if layout == "groups" else ["b" * 9, "a", "b" * 9, "c" * 4, "b" * 9, "a"]
    gen = _generate(policy, prompts)
    weights = torch.linspace(-1.0, 2.0, len(prompts))  # distinct per-sample weights, like advantages
    policy.model.train()  # no dropout in the tiny model: train mode is still exact
    policy.fast_forward, policy.share_prompts = fast_forward, True
    shared_logp, shared_grads = _score_and_grads(policy, gen, weights)
    policy.fast_forward, policy.share_prompts = False, False
    plain_logp, plain_grads = _score_and_grads(policy, gen, weights)
    torch.testing.assert_close(shared_logp, plain_logp, atol=1e-5, rtol=0)
    torch.testing.assert_close(shared_logp, gen.logprobs, atol=1e-5, rtol=0)  # sampled == scored
    assert shared_grads.keys() == plain_grads.keys()
    for name, grad in plain_grads.items():
        torch.testing.assert_close(shared_grads[name], grad, atol=1e-5, rtol=1e-4, msg=name)
    assert any(bool(g.abs().sum() > 0) for g in plain_grads.values())


def test_single_token_completions_share_prompts():
    policy = _tiny("gpt2")
    gen = _generate(policy, _grouped(["one", "two"], 3))
    ids, mask = gen.completion_ids[:, :1], torch.ones_like(gen.completion_ids[:, :1])
    shared = policy.score(gen.prompt_ids, gen.prompt_mask, ids, mask)
    policy.share_prompts = False
    torch.testing.assert_close(shared, policy.score(gen.prompt_ids, gen.prompt_mask, ids, mask), atol=1e-6, rtol=0)


def _train_two_steps(parallel_jobs: int = 1, agent=None, run_dir="/tmp/textzoo-test-fast-paths", **overrides):
    from textzoo.config import AgentConfig
    from textzoo.runners.trainer import Trainer
    from textzoo.runners.update import UpdateConfig

    cfg = tiny_config(
        agent=agent or AgentConfig(),
        eval_prompts=16,
        threads=1,
        update=UpdateConfig(micro_batch_size=4, parallel_jobs=parallel_jobs, compile_regions=False),
        **overrides,
    )
    trainer = Trainer(cfg, run_dir=run_dir)
    for _ in range(2):
        trainer.train_step()
    return [{n: p.detach().clone() for n, p in a.policy.model.named_parameters()} for a in trainer.actors]


def test_parallel_update_jobs_give_the_sequential_weights():
    from textzoo.runners import update

    calls = []
    independent = update._independent
    update._independent = lambda jobs, learners: calls.append(independent(jobs, learners)) or calls[-1]
    try:
        parallel = _train_two_steps(parallel_jobs=2)
    finally:
        update._independent = independent
    assert calls and all(calls)  # two agents with their own models did run at once
    sequential = _train_two_steps(parallel_jobs=1)
    for par, seq in zip(parallel, sequential):
        for name, weight in seq.items():
            assert torch.equal(par[name], weight), name


def test_parallel_bf16_update_jobs_give_the_sequential_weights(tmp_path, monkeypatch):
    """tiny-llama in bf16-mixed with its weight gradients through the cast copies' nodes (GPUs, CPUs without
    AMX): two jobs in two threads land on the sequential weights bit for bit. The tied head and embedding
    add into one ``.grad``; with a cast node cached from the rollout, a worker thread's backward added the
    head's part at another point (autograd orders ready nodes by a per-thread sequence number) and the
    embedding came out ~2e-9 off."""
    from textzoo.config import AgentConfig
    from textzoo.decoding import fastlm

    monkeypatch.setattr(fastlm, "GRAD_INTO_WEIGHTS", False)
    agent = AgentConfig(model="tiny-llama", precision="bf16-mixed", max_new_tokens=8)
    parallel = _train_two_steps(2, agent, run_dir=tmp_path / "parallel")
    sequential = _train_two_steps(1, agent, run_dir=tmp_path / "sequential")
    assert len(parallel) == 2
    for par, seq in zip(parallel, sequential):
        for name, weight in seq.items():
            assert torch.equal(par[name], weight), name


def test_jobs_that_share_modules_or_draw_random_numbers_stay_sequential():
    from textzoo.algorithms.batch import Job
    from textzoo.runners.update import Learner, _independent

    def learner(model):
        return Learner(model, torch.optim.SGD(model.parameters(), lr=0.1))

    trunk = torch.nn.Linear(2, 2)
    own = {"a": learner(torch.nn.Linear(2, 2)), "b": learner(torch.nn.Linear(2, 2))}
    jobs = [Job("a", None, None), Job("b", None, None)]
    assert _independent(jobs, own)
    assert not _independent(jobs, {"a": learner(torch.nn.Sequential(trunk)), "b": learner(torch.nn.Sequential(trunk))})
    assert not _independent([Job("a", None, None, epochs=2), Job("b", None, None)], own)
    dropout = {"a": learner(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.1))), "b": own["b"]}
    assert not _independent(jobs, dropout)


def test_parallel_generation_is_reproducible_and_concurrent():
    from textzoo.runners.rollout import Collector

    threads = []
    generate = Policy.generate

    def spy(self, *args, **kwargs):
        threads.append(threading.get_ident())
        return generate(self, *args, **kwargs)

    Policy.generate = spy
    try:
        torch.manual_seed(0)
        first = _train_two_steps(generate_workers=2)
        torch.manual_seed(0)
        second = _train_two_steps(generate_workers=2)
    finally:
        Policy.generate = generate
    assert threads and threading.main_thread().ident not in threads  # the agents generated in worker threads
    for a, b in zip(first, second):
        assert all(torch.equal(a[n], b[n]) for n in a)
    assert Collector.__init__.__defaults__[-1] == 1  # one at a time unless asked


def test_scoring_with_active_dropout_gives_each_sample_its_own_prompt_pass(monkeypatch):
    policy = _tiny("gpt2", dropout=0.1)
    gen = _generate(policy, _grouped(["p" * 30, "q" * 12], 4))
    policy.model.train()
    assert isinstance(policy.backend(), ModuleBackend)  # only the module reproduces dropout
    seen = _spy_rows(monkeypatch, policy)
    policy.score(gen.prompt_ids, gen.prompt_mask, gen.completion_ids, gen.completion_mask)
    assert [rows for _, rows in seen] == [8]  # one pass over all rows: independent dropout masks
    policy.model.eval()
    seen = _spy_rows(monkeypatch, policy)
    policy.score(gen.prompt_ids, gen.prompt_mask, gen.completion_ids, gen.completion_mask)
    assert seen == [("score", (2, 8))]


def _gqa_policy() -> Policy:
    from transformers import AutoModelForCausalLM, LlamaConfig

    from textzoo.models.tokenizer import byte_tokenizer

    tokenizer = byte_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )  # fmt: skip
    torch.manual_seed(0)
    return Policy(AutoModelForCausalLM.from_config(config), tokenizer, GenerationConfig(max_new_tokens=6))


@pytest.mark.parametrize("layout", ["groups", "scattered"])
def test_grouped_query_attention_models_take_the_grouped_path_exactly(layout):
    policy = _gqa_policy()
    fast = policy.backend().decoder
    assert (fast.kv_heads, fast.heads) == (2, 4)
    prompts = _grouped(PROMPTS, 3) if layout == "groups" else ["b" * 9, "a", "b" * 9, "c" * 4]
    fast = _generate(policy, prompts)
    weights = torch.linspace(-1.0, 2.0, len(prompts))
    policy.model.train()
    fast_logp, fast_grads = _score_and_grads(policy, fast, weights)
    policy.fast_forward, policy.share_prompts = False, False
    plain = _generate(policy, prompts)
    assert torch.equal(fast.completion_ids, plain.completion_ids)
    torch.testing.assert_close(fast.logprobs, plain.logprobs, atol=1e-5, rtol=0)
    plain_logp, plain_grads = _score_and_grads(policy, fast, weights)
    torch.testing.assert_close(fast_logp, plain_logp, atol=1e-5, rtol=0)
    for name, grad in plain_grads.items():
        torch.testing.assert_close(fast_grads[name], grad, atol=1e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_long_scoring_passes_take_fused_attention_with_the_same_results(arch, monkeypatch):
    from textzoo.decoding import fastlm

    policy = _gqa_policy() if arch == "llama" else _tiny(arch)
    prompts = _grouped(PROMPTS, 3)
    gen = _generate(policy, prompts)
    weights = torch.linspace(-1.0, 2.0, len(prompts))
    policy.model.train()
    grouped_logp, grouped_grads = _score_and_grads(policy, gen, weights)
    calls = []
    rows = fastlm.FastDecoder._attend_rows
    monkeypatch.setattr(fastlm.FastDecoder, "_attend_rows", lambda self, *a: calls.append(1) or rows(self, *a))
    monkeypatch.setattr(fastlm, "GROUPED_SCORES_LIMIT", 0)
    fused_logp, fused_grads = _score_and_grads(policy, gen, weights)
    assert len(calls) == 2  # both layers of the one scoring pass
    torch.testing.assert_close(fused_logp, grouped_logp, atol=1e-5, rtol=0)
    torch.testing.assert_close(fused_logp, gen.logprobs, atol=1e-5, rtol=0)
    for name, grad in grouped_grads.items():
        torch.testing.assert_close(fused_grads[name], grad, atol=1e-5, rtol=1e-4, msg=name)
    calls.clear()
    _generate(policy, prompts)  # decoding (one token per step) keeps the grouped path
    assert calls == []


@pytest.mark.parametrize("arch", ["gpt2", "llama", "qwen3"])
def test_scoring_skips_the_positions_after_each_rows_last_scored_token(arch, monkeypatch):
    """Completions of different lengths: the layers run on the needed positions only (`Packed`), with
    the log-probs and gradients of running every position, and the masked-out positions cost no head."""
    from textzoo.decoding import fastlm

    policy = _gqa_policy() if arch == "llama" else _tiny(arch)
    gen = _generate(policy, _grouped(PROMPTS, 3))
    gen.completion_mask[::2, 3:] = 0  # shorten every other row further: lots of padding
    gen.logprobs = gen.logprobs * gen.completion_mask
    assert gen.completion_mask.float().mean() < fastlm.Packed.PACK_BELOW
    weights = torch.linspace(-1.0, 2.0, len(gen))
    policy.model.train()
    packed = []
    of = fastlm.Packed.of
    monkeypatch.setattr(fastlm.Packed, "of", classmethod(lambda cls, needed: packed.append(of(needed)) or packed[-1]))
    packed_logp, packed_grads = _score_and_grads(policy, gen, weights)
    _, rows = packed  # the prompts (each distinct one once, in the same pass), then the completions
    last = gen.completion_mask.shape[1] - 1 - gen.completion_mask.flip(1).int().argmax(1)
    assert rows.index is not None and len(rows.index) == int(last.sum())  # inputs before each last scored token
    monkeypatch.setattr(fastlm.Packed, "PACK_BELOW", 0.0)  # compute every position
    full_logp, full_grads = _score_and_grads(policy, gen, weights)
    torch.testing.assert_close(packed_logp, full_logp, atol=1e-5, rtol=0)
    torch.testing.assert_close(packed_logp, gen.logprobs, atol=1e-5, rtol=0)
    for name, grad in full_grads.items():
        torch.testing.assert_close(packed_grads[name], grad, atol=1e-5, rtol=1e-4, msg=name)
