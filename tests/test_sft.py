"""Allowed-token restriction (sampling == scoring) and the supervised warm-up (`sft`, `textzoo sft`)."""

import json

import pytest
import torch

from textzoo.config import AgentConfig, TrainConfig
from textzoo.decoding.generation import GenerationConfig
from textzoo.errors import ConfigError
from textzoo.models.build import allowed_token_ids, build_policy
from textzoo.models.policy import Policy
from textzoo.runners.build import build_actors
from textzoo.runners.cli import main
from textzoo.runners.sft import completion_ids, load_pairs, save_pairs, sft, sft_loss

torch.set_num_threads(1)

PAIRS = [
    ("Secret: A\nMessage:", "xq"),
    ("Secret: B\nMessage:", "mv"),
    ("The secret symbol is C.\nMessage:", "kd"),
    ("D", "zo"),
]


def byte_id(ch: str) -> int:
    return ord(ch) + 3  # byte tokenizer: <pad>, <bos>, <eos>, then bytes


def restricted(outputs: tuple[str, ...], temperature: float = 1.0, seed: int = 0) -> Policy:
    agent = AgentConfig(allowed_outputs=outputs, temperature=temperature, max_new_tokens=6)
    return build_policy(agent, seed, torch.device("cpu"))


# ---- allowed tokens ------------------------------------------------------------------------------
def test_allowed_outputs_become_their_token_ids():
    policy = restricted(("A", "B", "CD"))
    assert policy.generation.allowed_tokens == tuple(sorted(byte_id(c) for c in "ABCD"))
    assert allowed_token_ids(policy, ("AB", "BA")) == (byte_id("A"), byte_id("B"))
    with pytest.raises(ConfigError, match="no tokens"):
        allowed_token_ids(policy, ("",))


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_restricted_sampling_logprobs_equal_scored_logprobs(temperature):
    policy = restricted(("A", "B", "C"), temperature)
    prompts = ["Which? Answer:", "x", "A longer prompt that pads the others on the left:"] * 4
    gen = policy.generate(prompts, generator=torch.Generator().manual_seed(0))
    allowed = {byte_id(c) for c in "ABC"} | {policy.eos_id}
    sampled = gen.completion_ids[gen.completion_mask.bool()]
    assert set(sampled.tolist()) <= allowed and len(set(sampled.tolist())) > 2
    with torch.no_grad():
        scored = policy.score(gen.prompt_ids, gen.prompt_mask, gen.completion_ids, gen.completion_mask)
    torch.testing.assert_close(scored, gen.logprobs, atol=1e-5, rtol=0)


def test_restricted_distribution_sums_to_one_over_allowed_set():
    policy = restricted(("A", "B", "C"))
    ids, mask = policy.encode(["Which symbol? Answer:"])
    candidates = [byte_id(c) for c in "ABC"] + [policy.eos_id]
    completions = torch.tensor(candidates)[:, None]  # [4, 1]
    with torch.no_grad():
        logp = policy.score(ids.expand(4, -1), mask.expand(4, -1), completions, torch.ones_like(completions))
        outside = policy.score(ids, mask, torch.tensor([[byte_id("D")]]), torch.ones(1, 1, dtype=torch.long))
    assert float(logp.exp().sum()) == pytest.approx(1.0, abs=1e-5)
    assert outside.item() == float("-inf")
    # The restricted distribution is the full one renormalised over the allowed ids.
    full = Policy(policy.model, policy.tokenizer, GenerationConfig())
    with torch.no_grad():
        full_logp = full.score(ids.expand(4, -1), mask.expand(4, -1), completions, torch.ones_like(completions))
    torch.testing.assert_close(logp, full_logp - full_logp.logsumexp(0), atol=1e-5, rtol=0)


# ---- the warm-up loss ----------------------------------------------------------------------------
def manual_nll(policy: Policy, pairs, targets) -> torch.Tensor:
    """Mean NLL of completion tokens from one unpadded forward per pair (no Policy.score)."""
    total, count = torch.zeros(()), 0
    for (prompt, _), target in zip(pairs, targets):
        p = policy.tokenizer.encode(prompt, add_special_tokens=True)
        ids = torch.tensor([p + target])
        logits = policy.model(input_ids=ids).logits[0, len(p) - 1 : -1]  # [C, V]
        logp = torch.log_softmax(logits.float() / policy.generation.temperature, -1)
        total = total - logp.gather(1, torch.tensor(target)[:, None]).sum()
        count += len(target)
    return total / count


def batch(policy: Policy, pairs, targets):
    prompt_ids, prompt_mask = policy.encode([p for p, _ in pairs])
    C = max(map(len, targets))
    comp = torch.tensor([t + [policy.pad_id] * (C - len(t)) for t in targets])
    mask = torch.tensor([[1] * len(t) + [0] * (C - len(t)) for t in targets])
    return prompt_ids, prompt_mask, comp, mask


def test_sft_loss_is_completion_token_nll_under_left_padding():
    policy = Policy.tiny(seed=3)
    policy.model.eval()
    targets = completion_ids(policy, PAIRS)
    assert targets[0] == [byte_id("x"), byte_id("q"), policy.eos_id]
    loss = sft_loss(policy, *batch(policy, PAIRS, targets))
    torch.testing.assert_close(loss, manual_nll(policy, PAIRS, targets), atol=1e-5, rtol=0)


def test_sft_loss_ignores_prompt_tokens_and_padding():
    policy = Policy.tiny(seed=3)
    policy.model.eval()
    targets = completion_ids(policy, PAIRS)
    prompt_ids, prompt_mask, comp, mask = batch(policy, PAIRS, targets)
    loss = sft_loss(policy, prompt_ids, prompt_mask, comp, mask)
    # Different token ids under the padding (prompt and completion) change nothing.
    junk = comp.masked_fill(mask == 0, byte_id("!"))
    prompt_junk = prompt_ids.masked_fill(prompt_mask == 0, byte_id("?"))
    torch.testing.assert_close(sft_loss(policy, prompt_junk, prompt_mask, junk, mask), loss, atol=1e-6, rtol=0)


def test_restricted_sft_loss_is_cross_entropy_over_allowed_set():
    policy = restricted(tuple("xqmvkdzo"), seed=1)
    policy.model.eval()
    targets = completion_ids(policy, PAIRS)
    loss = sft_loss(policy, *batch(policy, PAIRS, targets))
    allowed = torch.tensor(sorted({*policy.generation.allowed_tokens, policy.eos_id}))
    total, count = 0.0, 0
    for (prompt, _), target in zip(PAIRS, targets):
        p = policy.tokenizer.encode(prompt)
        with torch.no_grad():
            logits = policy.model(input_ids=torch.tensor([p + target])).logits[0, len(p) - 1 : -1]  # [C, V]
        logp = torch.log_softmax(logits[:, allowed], -1)  # [C, |allowed|]
        total -= sum(float(logp[k, (allowed == t).nonzero().item()]) for k, t in enumerate(target))
        count += len(target)
    assert loss.item() == pytest.approx(total / count, abs=1e-5)
    with pytest.raises(ConfigError, match="outside the policy's allowed tokens"):
        completion_ids(policy, [("p", "xy")])


# ---- training ------------------------------------------------------------------------------------
def test_sft_teaches_the_completions_and_the_stop():
    policy = Policy.tiny(seed=0, generation=GenerationConfig(max_new_tokens=6))
    policy.model.eval()
    losses = sft(policy, PAIRS, steps=60, lr=3e-3, batch_size=4, seed=0)
    assert len(losses) == 60 and losses[0] > 4.0 and losses[-1] < 0.1
    assert not policy.model.training  # the mode is restored
    gen = policy.generate([p for p, _ in PAIRS], greedy=True)
    assert gen.texts == [c for _, c in PAIRS]
    assert gen.completion_mask.sum(1).tolist() == [3, 3, 3, 3]  # two letters, then EOS


def test_sft_is_seeded_and_batches_over_passes():
    a, b = Policy.tiny(seed=0), Policy.tiny(seed=0)
    la = sft(a, PAIRS, steps=5, batch_size=3, seed=7)
    lb = sft(b, PAIRS, steps=5, batch_size=3, seed=7)
    assert la == lb
    assert len(sft(Policy.tiny(seed=0), PAIRS, steps=2, batch_size=100)) == 2  # batch larger than the data


def test_sft_rejects_bad_arguments():
    policy = Policy.tiny()
    with pytest.raises(ConfigError, match="steps"):
        sft(policy, PAIRS, steps=0)
    with pytest.raises(ConfigError, match="lr"):
        sft(policy, PAIRS, lr=0.0)
    with pytest.raises(ConfigError, match="at least one"):
        sft(policy, [])
    with pytest.raises(ConfigError, match="empty completion"):
        sft(policy, [("p", "")], add_eos=False)


def test_pairs_file_errors_name_the_line(tmp_path):
    path = tmp_path / "pairs.jsonl"
    save_pairs(PAIRS, path)
    assert load_pairs(path) == PAIRS
    with pytest.raises(ConfigError, match="does not exist"):
        load_pairs(tmp_path / "missing.jsonl")
    path.write_text('{"prompt": "a", "completion": "b"}\nnot json\n')
    with pytest.raises(ConfigError, match="line 2: not JSON"):
        load_pairs(path)
    path.write_text('{"prompt": "a"}\n')
    with pytest.raises(ConfigError, match="line 1: needs string fields"):
        load_pairs(path)


# ---- the command line ----------------------------------------------------------------------------
def test_cli_sft_saves_a_model_that_train_loads(tmp_path, capsys):
    pairs = tmp_path / "pairs.jsonl"
    out = tmp_path / "sender"
    save_pairs(PAIRS, pairs)
    rc = main(["sft", "--pairs", str(pairs), "--out", str(out), "--steps", "60", "--lr", "3e-3", "--batch-size", "4"])
    assert rc == 0 and "sft loss" in capsys.readouterr().out
    summary = json.loads((out / "sft.json").read_text())
    assert summary["pairs"] == 4 and summary["loss_last"] < 0.1

    cfg = TrainConfig(env="textzoo/Relay-v0", env_kwargs={}, agent_overrides={"sender": {"model": str(out)}})
    sender, receiver = build_actors(cfg, ["sender", "receiver"])
    assert sender.policy.generate([p for p, _ in PAIRS], greedy=True).texts == [c for _, c in PAIRS]
    trained = dict(sender.policy.model.named_parameters())
    fresh = dict(receiver.policy.model.named_parameters())
    assert not torch.equal(trained["transformer.wte.weight"], fresh["transformer.wte.weight"])

    assert main(["sft", "--pairs", str(tmp_path / "none.jsonl"), "--out", str(out)]) == 2
    assert "does not exist" in capsys.readouterr().err
