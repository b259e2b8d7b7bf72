"""Shared base + one LoRA adapter per agent: one base in memory, adapters switched per agent,
gradients and checkpoints per adapter, and a LoRA team that trains and resumes exactly."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

torch.set_num_threads(1)

from helpers import tiny_config  # noqa: E402

from textzoo.config import AgentConfig, LoRAConfig, TrainConfig  # noqa: E402
from textzoo.decoding.generation import GenerationConfig  # noqa: E402
from textzoo.errors import ConfigError, ModelError  # noqa: E402
from textzoo.models.lora import SharedBase, adapter_state_dict, load_adapter_state_dict  # noqa: E402
from textzoo.models.policy import Policy  # noqa: E402
from textzoo.runners.checkpoint import apply_weights, check_weights, model_weights  # noqa: E402
from textzoo.runners.trainer import Trainer  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")


def team(n: int = 2, rank: int = 4):
    shared = SharedBase(Policy.tiny("gpt2", seed=3, generation=GenerationConfig(max_new_tokens=5)))
    return shared, [shared.add(f"agent{i}", rank, seed=10 + i) for i in range(n)]


def scored(policy: Policy, gen) -> torch.Tensor:
    with torch.no_grad():
        return policy.score(gen.prompt_ids, gen.prompt_mask, gen.completion_ids, gen.completion_mask)


def perturb(policy: Policy, value: float) -> None:
    with torch.no_grad():
        for name, p in policy.model.named_parameters():
            if "lora_B" in name:
                p.fill_(value)


def test_one_base_in_memory_and_views_hold_only_their_adapter():
    shared, (a, b) = team()
    base = dict(shared.base_parameters())
    assert a.model.shared is b.model.shared
    total = sum(p.numel() for p in shared.model.parameters())
    adapter = sum(p.numel() for p in a.model.parameters())
    assert total == sum(p.numel() for p in base.values()) + 2 * adapter  # the base once, plus two adapters
    assert all(".lora_" in n and ".agent_agent0." in n for n, _ in a.model.named_parameters())
    assert not set(map(id, a.model.parameters())) & set(map(id, b.model.parameters()))
    assert all(not p.requires_grad for p in base.values())
    assert not hasattr(a.model, "peft_config")  # checkpoints treat a view as a plain module: adapter only


def test_each_agent_generates_and_scores_with_its_own_adapter():
    shared, (a, b) = team()
    gen = a.generate(["hello there", "x"])
    assert torch.allclose(scored(a, gen), gen.logprobs, atol=1e-5)  # sampled and scored with adapter a
    before = scored(a, gen)
    assert torch.equal(scored(b, gen), before)  # lora_B starts at 0: both adapters are the identity
    perturb(b, 0.05)
    assert not torch.allclose(scored(b, gen), before)  # b's adapter now changes b's outputs ...
    assert torch.equal(scored(a, gen), before)  # ... and never a's, whichever ran last


def test_gradients_reach_only_the_agents_own_adapter():
    shared, (a, b) = team()
    perturb(a, 0.01)
    gen = a.generate(["abc"])
    a.score(gen.prompt_ids, gen.prompt_mask, gen.completion_ids, gen.completion_mask).sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in a.model.parameters())
    assert all(p.grad is None for p in b.model.parameters())
    assert all(p.grad is None for _, p in shared.base_parameters())
    assert all(p.requires_grad for p in b.model.parameters())  # b stays trainable for its own learner


def test_adapter_state_dict_round_trip_and_checkpoint_helpers():
    shared, (a, b) = team()
    perturb(a, 0.03)
    state = adapter_state_dict(a.model)
    assert state and all("lora_" in k and "agent_" not in k for k in state)  # peft's saved-adapter names
    assert model_weights(a.model).keys() == state.keys()  # runners/checkpoint stores exactly the adapter
    check_weights(b.model, state, "agent1")
    apply_weights(b.model, state)
    gen = a.generate(["round trip"])
    assert torch.equal(scored(a, gen), scored(b, gen))
    with pytest.raises(ModelError, match="do not match"):
        load_adapter_state_dict(b.model, {"nope": torch.zeros(1)})


def test_frozen_lora_agent_keeps_requires_grad_off_and_names_must_map_uniquely():
    shared = SharedBase(Policy.tiny("gpt2", seed=0))
    frozen = shared.add("frozen", 2, trainable=False)
    live = shared.add("live", 2)
    live.generate(["a"])
    frozen.generate(["a"])  # activating the frozen adapter must not make it trainable
    assert not any(p.requires_grad for p in frozen.model.parameters())
    assert all(p.requires_grad for p in live.model.parameters())
    with pytest.raises(ConfigError, match="already has"):
        shared.add("live", 2)


# ---- a LoRA team through the trainer ---------------------------------------------------------
def lora_config(run_dir, **kwargs) -> TrainConfig:
    """Refine-v0 with two LoRA refiners on one tiny GPT-2 base and a LoRA generator on a tiny Llama base."""
    overrides = {"generator": {"model": "tiny-llama", "allowed_outputs": ["a b "], "max_new_tokens": 6}}
    base = dict(
        env="textzoo/Refine-v0",
        env_kwargs={"num_refiners": 2, "keywords": [["a"], ["b"]]},
        agent=AgentConfig(max_new_tokens=4, lr=1e-2, lora=LoRAConfig(rank=4)),
        agent_overrides=overrides,
        steps=4,
        group_size=4,
        eval_prompts=1,
        run_dir=run_dir,
        credit="per_agent",
        save_every=2,
        keep_last=0,
    )
    return tiny_config(**{**base, **kwargs})


def test_lora_team_trains_adapters_only_and_resumes_exactly(tmp_path):
    cfg = lora_config(tmp_path / "a")
    trainer = Trainer(cfg)
    r0, r1, gen = trainer.actors
    assert r0.policy.model.shared is r1.policy.model.shared is not gen.policy.model.shared  # one base per model
    gpt2_base = {n: p.detach().clone() for n, p in r0.policy.model.shared.base_parameters()}
    fresh = dict(Policy.tiny("gpt2", seed=cfg.seed * 1000).model.named_parameters())  # the first agent's seed
    plain = {n.replace("base_model.model.", "", 1).replace(".base_layer", ""): p for n, p in gpt2_base.items()}
    assert plain.keys() == fresh.keys() and all(torch.equal(plain[n], p) for n, p in fresh.items())
    trainer.train()
    for name, p in r0.policy.model.shared.base_parameters():
        assert torch.equal(p, gpt2_base[name]), name  # the base never changes
    adapters = {a.id: adapter_state_dict(a.policy.model) for a in trainer.actors}
    assert any(not torch.equal(adapters["refiner_0"][k], adapters["refiner_1"][k]) for k in adapters["refiner_0"])
    for a in trainer.actors:
        assert trainer.history[-1][f"agent/{a.id}/weights_version"] > 0
    step4 = tmp_path / "a" / "checkpoints" / "step-00000004"
    for a in trainer.actors:  # checkpoints hold adapters only
        saved = load_file(step4 / f"weights-{a.id}.safetensors")
        assert saved.keys() == adapters[a.id].keys()
        assert all(torch.equal(saved[k], v) for k, v in adapters[a.id].items())

    # resume from step 2 in a copy of the run: steps 3-4 must replay bit for bit
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    shutil.rmtree(tmp_path / "b" / "checkpoints" / "step-00000004")
    resumed = Trainer(lora_config(tmp_path / "b"), resume=tmp_path / "b")
    assert resumed.step == 2
    resumed.train()
    for a in resumed.actors:
        again = adapter_state_dict(a.policy.model)
        assert all(torch.equal(again[k], v) for k, v in adapters[a.id].items()), a.id
    rows_a = [json.loads(line) for line in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    rows_b = [json.loads(line) for line in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows_a) == len(rows_b) == 5

    def learning(row):
        return {k: v for k, v in row.items() if not k.startswith("time/")}

    assert [learning(r) for r in rows_a] == [learning(r) for r in rows_b]


def test_a_lora_agents_reference_is_a_frozen_adapter_on_the_same_base():
    from textzoo.models.team import AgentActor, frozen_references

    shared, (a, b) = team()
    perturb(a, 0.02)  # the agent as it starts RL (e.g. after a warm-up): not the bare base
    base_ids = {id(p) for _, p in shared.base_parameters()}
    gen = a.generate(["hello there", "x"], generator=torch.Generator().manual_seed(0))
    start = scored(a, gen)
    refs = frozen_references([AgentActor("a", a), AgentActor("b", b, trainable=False)])
    assert list(refs) == ["a"]
    ref = refs["a"]
    assert ref.model.shared is shared and {id(p) for _, p in shared.base_parameters()} == base_ids  # no base copy
    assert all(not p.requires_grad for p in ref.model.parameters())
    assert sum(p.numel() for p in ref.model.parameters()) == sum(p.numel() for p in a.model.parameters())
    torch.testing.assert_close(scored(ref, gen), start, atol=0, rtol=0)
    perturb(a, -0.03)  # training moves the agent; its reference stays where it started
    assert not torch.allclose(scored(a, gen), start)
    torch.testing.assert_close(scored(ref, gen), start, atol=0, rtol=0)
    # the agent's learner sees only its own adapter; the reference's adapter stays frozen after switches
    a.score(gen.prompt_ids, gen.prompt_mask, gen.completion_ids, gen.completion_mask).sum().backward()
    assert all(p.grad is None for p in ref.model.parameters())
    assert all(p.requires_grad for p in a.model.parameters())


def test_lora_dropout_is_off_in_a_frozen_reference():
    shared = SharedBase(Policy.tiny("gpt2", seed=3, generation=GenerationConfig(max_new_tokens=5)))
    agent = shared.add("agent", 4, dropout=0.5, seed=1)
    perturb(agent, 0.05)
    ref = shared.frozen_copy(agent, "agent-reference")
    gen = agent.generate(["abc", "de"], generator=torch.Generator().manual_seed(0))
    agent.model.train()  # the base is in train mode during updates
    first, second = scored(ref, gen), scored(ref, gen)
    assert torch.equal(first, second)  # no dropout draws
    assert shared.model.training  # and the base's mode is restored


def test_iac_value_heads_on_lora_agents_read_each_agents_adapter(tmp_path):
    from textzoo.algorithms.actor_critic.family import critic_name

    cfg = tiny_config(eval_prompts=16, algo="iac", run_dir=tmp_path / "run", agent=AgentConfig(lora=LoRAConfig(rank=4)))
    cfg.actor_critic.critic_model = "actor"
    trainer = Trainer(cfg)
    trainer.train_step()
    units = {r["model"]: set(r.get("shares_weights_with", [])) for r in trainer.placement}
    assert units["summary.critic"] == {"summary", "elaboration", "elaboration.critic"}  # one base, one device
    for actor in trainer.actors:
        critic = trainer.family.critics[critic_name(actor.id)]
        assert all(n.startswith("head.") for n, _ in critic.named_parameters())  # only the head is the critic's
        perturb(actor.policy, 0.01 if actor.id == "summary" else -0.02)  # adapters that differ
        gen = actor.policy.generate(["hello there", "x"], generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            position = (gen.prompt_mask.cumsum(1) - 1).clamp(min=0)  # left padding
            hidden = actor.policy.model(
                input_ids=gen.prompt_ids,
                attention_mask=gen.prompt_mask,
                position_ids=position,
                output_hidden_states=True,
            ).hidden_states[-1][:, -1]  # [S, d]
        torch.testing.assert_close(critic.features(gen.prompt_ids, gen.prompt_mask), hidden, atol=1e-5, rtol=0)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_lora_agents_run_the_plain_decoder_with_their_own_adapter(arch):
    """The plain-torch decoder reads a view's adapter on the shared base (peft's wrapped layers): the
    module's samples, log-probs and adapter gradients, and nothing from the other agent's adapter."""
    from textzoo.decoding.backends.plain import PlainBackend

    base = Policy.tiny(arch, seed=3, generation=GenerationConfig(max_new_tokens=6))
    shared = SharedBase(base)
    a, b = shared.add("a", 4, seed=1), shared.add("b", 4, seed=2)
    perturb(a, 0.05)
    perturb(b, -0.07)
    for policy in (a, b):
        backend = policy.backend()
        assert isinstance(backend, PlainBackend) and backend.decoder.adapter == policy.model.adapter
    prompts = ["hello there", "a", "hello there", "the quick brown fox"]
    results = {}
    for fast in (True, False):
        a.fast_forward = b.fast_forward = fast
        gen = a.generate(prompts, generator=torch.Generator().manual_seed(0))
        b.generate(prompts[:1])  # the other agent runs in between: it must not leak into a's next call
        a.model.train()
        a.model.zero_grad()
        logp = a.score(gen.prompt_ids, gen.prompt_mask, gen.completion_ids, gen.completion_mask)
        (logp.sum(1) * torch.linspace(-1.0, 1.0, len(prompts))).sum().backward()
        grads = {n: p.grad.clone() for n, p in a.model.named_parameters() if p.grad is not None}
        assert grads and all(p.grad is None or not p.grad.any() for p in b.model.parameters())
        results[fast] = gen, logp.detach(), grads
        a.model.eval()
    (gen_fast, logp_fast, grads_fast), (gen_module, logp_module, grads_module) = results[True], results[False]
    assert torch.equal(gen_fast.completion_ids, gen_module.completion_ids)
    torch.testing.assert_close(gen_fast.logprobs, gen_module.logprobs, atol=1e-5, rtol=0)
    torch.testing.assert_close(logp_fast, logp_module, atol=1e-5, rtol=0)
    assert grads_fast.keys() == grads_module.keys()
    for name, grad in grads_module.items():
        torch.testing.assert_close(grads_fast[name], grad, atol=1e-5, rtol=1e-4, msg=name)


def test_lora_dropout_in_train_mode_runs_the_module():
    shared = SharedBase(Policy.tiny("llama", seed=3, generation=GenerationConfig(max_new_tokens=4)))
    policy = shared.add("a", 4, dropout=0.1, seed=1)
    from textzoo.decoding.backends.plain import PlainBackend

    policy.model.eval()
    assert isinstance(policy.backend(), PlainBackend)  # eval mode: dropout is off, the plain forward is exact
    policy.model.train()
    assert not isinstance(policy.backend(), PlainBackend)
