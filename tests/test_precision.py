"""Per-agent precision: fp32, bf16-mixed (fp32 master weights under bf16 autocast), bf16/fp16 weights."""

import json

import pytest
import torch

from textzoo.errors import ConfigError
from textzoo.runners.build import build_learner, build_policy
from textzoo.runners.config import AgentConfig, TrainConfig, load_config
from textzoo.runners.update import UpdateConfig

torch.set_num_threads(1)


def _trainer(tmp_path, precision: str, algo: str = "magrpo"):
    from textzoo.runners.trainer import Trainer

    cfg = TrainConfig(
        algo=algo,
        steps=2,
        batch_prompts=2,
        group_size=2,
        progress=False,
        plot=False,
        agent=AgentConfig(n_layer=1, n_embd=32, precision=precision, max_new_tokens=8, lr=1e-2),
        update=UpdateConfig(micro_batch_size=4),
    )
    return Trainer(cfg, run_dir=str(tmp_path / precision))


@pytest.mark.parametrize("model", ["tiny", "tiny-llama"])
def test_bf16_mixed_computes_in_bf16_on_fp32_weights(model):
    fp32 = build_policy(AgentConfig(model=model, n_layer=1, n_embd=32), seed=0, device=torch.device("cpu"))
    mixed = build_policy(
        AgentConfig(model=model, n_layer=1, n_embd=32, precision="bf16-mixed"), seed=0, device=torch.device("cpu")
    )
    assert mixed.autocast is torch.bfloat16 and fp32.autocast is None
    assert {p.dtype for p in mixed.model.parameters()} == {torch.float32}
    gen = mixed.generate(["hello", "hello", "abc"], generator=torch.Generator().manual_seed(0))
    mixed.model.eval()
    scored = mixed.score(gen.prompt_ids, gen.prompt_mask, gen.completion_ids, gen.completion_mask)
    torch.testing.assert_close(scored, gen.logprobs, atol=1e-5, rtol=0)  # sampled == scored under autocast
    reference = fp32.score(gen.prompt_ids, gen.prompt_mask, gen.completion_ids, gen.completion_mask).detach()
    gap = float((scored.detach() - reference).abs().max())
    assert 1e-4 < gap < 0.2  # the same weights, computed in bf16: close, not equal


def test_bf16_mixed_trains_fp32_master_weights_and_adam_state(tmp_path):
    trainer = _trainer(tmp_path, "bf16-mixed")
    before = {a.id: {n: p.detach().clone() for n, p in a.policy.model.named_parameters()} for a in trainer.actors}
    for _ in range(2):
        row = trainer.train_step()
    assert all(v == v for k, v in row.items() if isinstance(v, float))  # no NaN metric
    for actor in trainer.actors:
        moved = 0
        for name, p in actor.policy.model.named_parameters():
            assert p.dtype == torch.float32, name
            moved += int(not torch.equal(p, before[actor.id][name]))
        assert moved > 0, f"{actor.id}'s fp32 weights did not move"
        state = trainer.learners[actor.id].optimizer.state
        moments = [s["exp_avg"] for s in state.values()] + [s["exp_avg_sq"] for s in state.values()]
        assert moments and {m.dtype for m in moments} == {torch.float32}


def test_bf16_weights_keeps_weights_and_adam_state_in_bf16():
    agent = AgentConfig(n_layer=1, n_embd=32, precision="bf16-weights")
    policy = build_policy(agent, seed=0, device=torch.device("cpu"))
    assert policy.autocast is None and {p.dtype for p in policy.model.parameters()} == {torch.bfloat16}
    learner = build_learner(policy.model, agent, total_steps=1)
    gen = policy.generate(["abc", "de"], generator=torch.Generator().manual_seed(0))
    policy.score(gen.prompt_ids, gen.prompt_mask, gen.completion_ids, gen.completion_mask).sum().backward()
    learner.optimizer.step()
    assert {s["exp_avg"].dtype for s in learner.optimizer.state.values()} == {torch.bfloat16}


def test_critics_of_a_bf16_mixed_agent_compute_in_bf16(tmp_path):
    trainer = _trainer(tmp_path, "bf16-mixed", algo="iac")
    critics = trainer.family.critics
    assert critics and all(c.autocast is torch.bfloat16 for c in critics.values())
    trainer.train_step()
    for critic in critics.values():
        assert {p.dtype for p in critic.parameters()} == {torch.float32}


def test_old_dtype_field_maps_to_a_precision(tmp_path):
    assert AgentConfig(dtype="bfloat16").precision == "bf16-weights"
    assert AgentConfig(dtype="float16").precision == "fp16-weights"
    migrated = AgentConfig(dtype="float32")
    assert (migrated.precision, migrated.dtype) == ("fp32", None)
    assert AgentConfig(dtype="bfloat16", precision="bf16-weights").precision == "bf16-weights"
    with pytest.raises(ConfigError, match="contradicts agent.precision"):
        AgentConfig(dtype="float32", precision="bf16-mixed")
    with pytest.raises(ConfigError, match="agent.dtype"):
        AgentConfig(dtype="int8")
    with pytest.raises(ConfigError, match="agent.precision"):
        AgentConfig(precision="bf16")
    # a config.json written before `precision` existed (every field, dtype among them) still loads
    old = {"steps": 3, "agent": {"model": "tiny", "dtype": "bfloat16", "lr": 0.01}}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(old))
    cfg = load_config(path)
    assert cfg.agent.precision == "bf16-weights" and cfg.agent.dtype is None
    assert cfg.agent_config("any").precision == "bf16-weights"
