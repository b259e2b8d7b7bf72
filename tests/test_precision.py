"""Per-agent precision: fp32, bf16-mixed (fp32 master weights under bf16 autocast), bf16/fp16 weights."""

import json
import os
import subprocess
import sys

import pytest
import torch
from helpers import tiny_llama_grads

from textzoo.config import AgentConfig, TrainConfig, migrate_agent
from textzoo.config_files import load_config
from textzoo.errors import ConfigError
from textzoo.models.build import build_policy
from textzoo.runners.build import build_learner
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
    """`dtype` left AgentConfig; the migration (`textzoo.config.migrate_agent`) reads it in files and overrides."""
    assert migrate_agent({"dtype": "bfloat16"}) == {"precision": "bf16-weights"}
    assert migrate_agent({"dtype": "float16"}) == {"precision": "fp16-weights"}
    assert migrate_agent({"dtype": "float32", "lr": 0.5}) == {"precision": "fp32", "lr": 0.5}
    assert migrate_agent({"dtype": None, "precision": "auto"}) == {"precision": "auto"}  # every old config.json
    assert migrate_agent({"dtype": "bfloat16", "precision": "bf16-weights"}) == {"precision": "bf16-weights"}
    with pytest.raises(ConfigError, match="contradicts agent.precision"):
        migrate_agent({"dtype": "float32", "precision": "bf16-mixed"})
    with pytest.raises(ConfigError, match="agent.dtype"):
        migrate_agent({"dtype": "int8"})
    with pytest.raises(ConfigError, match="agent.precision"):
        AgentConfig(precision="bf16")
    with pytest.raises(TypeError):
        AgentConfig(dtype="bfloat16")  # the Python API has only `precision`
    assert TrainConfig(agent_overrides={"a": {"dtype": "float16"}}).agent_config("a").precision == "fp16-weights"
    # a config.json written before `precision` existed (every field, dtype among them) still loads
    old = {"steps": 3, "agent": {"model": "tiny", "dtype": "bfloat16", "lr": 0.01}}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(old))
    cfg = load_config(path)
    assert cfg.agent.precision == "bf16-weights" and not hasattr(cfg.agent, "dtype")
    assert cfg.agent_config("any").precision == "bf16-weights"


def test_auto_resolves_the_tiny_default_to_fp32_and_records_it(tmp_path):
    trainer = _trainer(tmp_path, "auto")
    assert all(a.policy.precision == "fp32" and a.policy.autocast is None for a in trainer.actors)
    assert trainer.cfg.agent.precision == "fp32"
    trainer.train()
    saved = json.loads((tmp_path / "auto" / "config.json").read_text())
    assert saved["agent"]["precision"] == "fp32"
    assert AgentConfig().precision == "auto"


def test_auto_is_bf16_mixed_for_a_large_model_on_a_native_bf16_cpu(monkeypatch):
    from textzoo.decoding import precision

    big = torch.nn.Linear(5000, 4000)  # 20,004,000 parameters: just over the threshold
    small = torch.nn.Linear(4000, 4000)
    cpu = torch.device("cpu")
    monkeypatch.setattr(precision, "cpu_flags", lambda: frozenset({"avx512f", "avx512_bf16"}))
    assert precision.native_bf16(cpu) is torch.backends.mkldnn.is_available()
    expected = "bf16-mixed" if torch.backends.mkldnn.is_available() else "fp32"
    assert precision.resolve("auto", big, cpu) == expected
    assert precision.resolve("auto", small, cpu) == "fp32"
    assert precision.resolve("fp32", big, cpu) == "fp32"
    monkeypatch.setattr(precision, "cpu_flags", lambda: frozenset({"avx512f", "avx2"}))  # AVX512 without bf16
    assert precision.resolve("auto", big, cpu) == "fp32"
    assert precision.resolve("bf16-weights", small, cpu) == "bf16-weights"


def test_bf16_on_a_cpu_without_bf16_instructions_is_named_slow_and_logged(monkeypatch, tmp_path, caplog):
    from textzoo.decoding import precision

    cpu = torch.device("cpu")
    monkeypatch.setattr(precision, "cpu_flags", lambda: frozenset({"avx", "avx2"}))
    for name in ("bf16-mixed", "bf16-weights"):
        message = precision.slow_bf16(name, cpu)
        assert message is not None and "no bf16 matrix instructions" in message and "'fp32'" in message
    assert precision.slow_bf16("fp32", cpu) is None and precision.slow_bf16("fp16-weights", cpu) is None
    assert precision.slow_bf16("bf16-mixed", torch.device("meta")) is None  # only CPUs emulate here
    with caplog.at_level("WARNING", logger="textzoo.runners.trainer"):
        _trainer(tmp_path, "bf16-mixed")
    assert [r for r in caplog.records if "no bf16 matrix instructions" in r.getMessage()]
    caplog.clear()
    monkeypatch.setattr(precision, "cpu_flags", lambda: frozenset({"avx512f", "avx512_bf16"}))
    if torch.backends.mkldnn.is_available():
        assert precision.slow_bf16("bf16-mixed", cpu) is None
        with caplog.at_level("WARNING", logger="textzoo.runners.trainer"):
            _trainer(tmp_path / "native", "bf16-mixed")
        assert not [r for r in caplog.records if "no bf16 matrix instructions" in r.getMessage()]


def test_cpu_flags_reads_the_flags_line(tmp_path):
    from textzoo.decoding.precision import cpu_flags

    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: X\nflags\t\t: fpu avx512f avx512_bf16 amx_tile\n\nprocessor\t: 1\n")
    assert cpu_flags(str(info)) == {"fpu", "avx512f", "avx512_bf16", "amx_tile"}
    assert cpu_flags(str(tmp_path / "missing")) == frozenset()


def test_resolved_config_writes_each_roles_precision():
    from types import SimpleNamespace

    from textzoo.runners.build import resolved_config

    cfg = TrainConfig(agent_overrides={"b": {"model": "other"}, "c": {"precision": "auto"}})

    def actor(role, precision):
        return SimpleNamespace(id=role, policy=SimpleNamespace(precision=precision))

    out = resolved_config(cfg, [actor("a", "bf16-mixed"), actor("b", "fp32"), actor("c", "fp32")])
    assert out.agent.precision == "bf16-mixed"
    assert out.agent_overrides == {"b": {"model": "other", "precision": "fp32"}, "c": {"precision": "fp32"}}
    assert cfg.agent.precision == "auto" and cfg.agent_overrides["c"] == {"precision": "auto"}  # input unchanged
    fixed = TrainConfig(agent=AgentConfig(precision="fp32"))
    assert resolved_config(fixed, [actor("a", "fp32")]) is fixed


def test_bf16_mixed_gradients_match_fp32_within_bf16_tolerance():
    """The same weights and samples: bf16-mixed gradients on the fp32 weights agree with fp32's to bf16
    accuracy (a relative error of a few 1e-3 per matmul; a wrong or missing gradient is O(1) off)."""
    agent = AgentConfig(model="tiny-llama", n_layer=2, n_embd=64, n_head=2)
    fp32 = build_policy(agent, seed=0, device=torch.device("cpu"))
    mixed = build_policy(agent, seed=0, device=torch.device("cpu"))
    mixed.autocast = torch.bfloat16
    gen = fp32.generate(["hello there", "hello there", "abc"], generator=torch.Generator().manual_seed(0))
    grads = []
    for policy in (fp32, mixed):
        policy.model.train()
        logp = policy.score(gen.prompt_ids, gen.prompt_mask, gen.completion_ids, gen.completion_mask)
        (logp * torch.linspace(-1, 1, logp.shape[1])).sum().backward()
        grads.append(torch.cat([p.grad.flatten() for p in policy.model.parameters()]))
        assert {p.grad.dtype for p in policy.model.parameters()} == {torch.float32}
    error = float((grads[1] - grads[0]).norm() / grads[0].norm())
    assert error < 0.03, error
    for a, b in zip(fp32.model.parameters(), mixed.model.parameters()):
        if a.grad.norm() > 1e-3 * grads[0].norm():  # every tensor that gets a real gradient gets it in both
            assert float((b.grad - a.grad).norm() / a.grad.norm()) < 0.1


def test_bf16_weight_copies_follow_the_weights():
    """The plain decoder reads one bf16 copy per weight version: shared by forwards, renewed after an
    optimizer step (fused AdamW, which leaves version counters alone) and after an in-place load."""
    agent = AgentConfig(model="tiny-llama", n_layer=1, n_embd=32, precision="bf16-mixed")
    policy = build_policy(agent, seed=0, device=torch.device("cpu"))
    learner = build_learner(policy.model, agent, total_steps=2)
    prompts = ["hello", "abc"]
    gen = policy.generate(prompts, greedy=True)

    def scored():
        return policy.score(gen.prompt_ids, gen.prompt_mask, gen.completion_ids, gen.completion_mask)

    reference = build_policy(agent, seed=0, device=torch.device("cpu"))  # autocast's own casts, fresh
    reference.fast_forward = False
    first = scored()
    first.sum().backward()
    learner.optimizer.step()
    learner.optimizer.zero_grad()
    reference.model.load_state_dict(policy.model.state_dict())
    after_step = scored().detach()
    expected = reference.score(gen.prompt_ids, gen.prompt_mask, gen.completion_ids, gen.completion_mask).detach()
    assert not torch.equal(after_step, first.detach())  # the step moved the weights: new copies are read
    torch.testing.assert_close(after_step, expected, atol=2e-2, rtol=0)
    with torch.no_grad():
        for p, q in zip(policy.model.parameters(), build_policy(agent, 0, torch.device("cpu")).model.parameters()):
            p.copy_(q)  # back to the initial weights, in place
    torch.testing.assert_close(scored().detach(), first.detach(), atol=0, rtol=0)


def test_embedding_rows_gradient_under_autocast_matches_the_module():
    from textzoo.decoding.fastlm import embed

    table = torch.nn.Embedding(10, 4, padding_idx=0)
    ids = torch.tensor([[3, 3, 0, 7], [1, 0, 3, 9]])
    out_grad = torch.randn(2, 4, 4)
    table(ids).backward(out_grad)
    expected = table.weight.grad.clone()
    table.weight.grad = torch.ones_like(expected)  # accumulates onto an existing gradient, like the module
    with torch.autocast("cpu", dtype=torch.bfloat16):
        looked_up = embed(table, ids)
    assert looked_up.dtype == torch.float32 and torch.equal(looked_up, table(ids))
    looked_up.backward(out_grad)
    torch.testing.assert_close(table.weight.grad, expected + 1, atol=1e-6, rtol=0)
    assert torch.equal(table.weight.grad[0], torch.ones(4))  # the padding row gets nothing


def _llama_grads(fuse: bool, monkeypatch, precision_autocast=torch.bfloat16):
    from textzoo.decoding import fastlm

    monkeypatch.setattr(fastlm, "FUSE_PROJECTIONS", fuse)
    gen, logp, grads, policy = tiny_llama_grads(precision_autocast)  # the fp32 samples, scored in each precision
    fused = [k for k in fastlm._CASTS if len(k) > 1]  # keys: the ids of the weights a copy holds
    return gen.completion_ids, logp, grads, policy, fused


def test_fused_projections_match_separate_ones(monkeypatch):
    """Under bf16 autocast q/k/v and gate/up run as one matmul each over one fused bf16 copy: the same
    log-probs as one matmul per projection, each weight's gradient on its own ``.grad``
    (within bf16 rounding of the separate path, and as close to fp32's), parameter names unchanged."""
    ids, logp, grads, policy, fused = _llama_grads(True, monkeypatch)
    ids_sep, logp_sep, grads_sep, separate, _ = _llama_grads(False, monkeypatch)
    assert torch.equal(ids, ids_sep)
    _, _, grads_fp32, _, _ = _llama_grads(False, monkeypatch, None)
    assert len(fused) >= 4  # q/k/v and gate/up of both layers went through the fused copies
    assert torch.equal(ids, ids_sep)
    torch.testing.assert_close(logp, logp_sep, atol=1e-6, rtol=0)
    assert list(grads) == list(grads_sep) and all(".qkv" not in n and "gate_up" not in n for n in grads)
    assert list(policy.model.state_dict()) == list(separate.model.state_dict())  # the HF names, nothing added
    for name in grads:
        scale = float(grads_fp32[name].norm())
        assert float((grads[name] - grads_sep[name]).norm()) < 0.02 * scale, name
        assert float((grads[name] - grads_fp32[name]).norm()) < 0.05 * scale, name


def test_fused_copies_are_renewed_after_an_optimizer_step(monkeypatch):
    from textzoo.decoding import fastlm

    monkeypatch.setattr(fastlm, "FUSE_PROJECTIONS", True)
    agent = AgentConfig(model="tiny-llama", n_layer=1, n_embd=32, precision="bf16-mixed")
    policy = build_policy(agent, seed=0, device=torch.device("cpu"))
    learner = build_learner(policy.model, agent, total_steps=2)
    attn = policy.model.model.layers[0].self_attn
    weights = (attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        before = fastlm.autocast_fused(weights)
        again = fastlm.autocast_fused(weights)  # one copy per weight version (a new cast node per call)
        assert again.data_ptr() == before.data_ptr() and again.grad_fn is not before.grad_fn
        (before.float() ** 2).sum().backward()
    for w in weights:  # each weight's own gradient: d/dw sum(w^2) = 2w, at bf16 resolution
        torch.testing.assert_close(w.grad, 2 * w.detach().bfloat16().float(), atol=1e-6, rtol=1e-2)
    learner.optimizer.step()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        after = fastlm.autocast_fused(weights)
    assert after.data_ptr() != before.data_ptr()
    torch.testing.assert_close(after.float(), torch.cat(weights).detach().bfloat16().float(), atol=0, rtol=0)


def test_accumulate_in_chunks_equals_one_add(monkeypatch):
    from textzoo.decoding import fastlm

    monkeypatch.setattr(fastlm, "ACCUMULATE_CHUNK", 7)
    total, grad = torch.randn(5, 9), torch.randn(5, 9).bfloat16()
    expected = total + grad.float()
    fastlm.accumulate(total, grad)
    assert torch.equal(total, expected)


def test_bf16_per_sample_backward_with_fused_projections_matches_the_batched_gradient():
    """bf16-mixed, fused q/k/v and gate/up copies: per-sample backward (each prompt once, shared by its
    samples) accumulates the batched gradient, to bf16 accuracy."""
    from textzoo.algorithms.batch import Job, SampleBatch
    from textzoo.algorithms.reinforce.config import ReinforceConfig
    from textzoo.algorithms.reinforce.family import reinforce_loss
    from textzoo.decoding import fastlm
    from textzoo.decoding.generation import GenerationConfig
    from textzoo.models.policy import Policy
    from textzoo.runners.update import Learner, run_job

    fastlm._CASTS.clear()
    policy = Policy.tiny("llama", seed=1, generation=GenerationConfig(max_new_tokens=6))
    prompts = [p for p in ("first prompt", "a second, longer prompt", "x") for _ in range(4)]  # B=3, G=4
    gen = policy.generate(prompts, generator=torch.Generator().manual_seed(0))
    policy.autocast = torch.bfloat16
    batch = SampleBatch(gen, torch.linspace(-1, 1, len(prompts)))
    cfg = ReinforceConfig(loss_aggregation="seq_mean")
    grads = {}
    for name, per_sample, cache in (("batched", False, None), ("per-sample", True, policy.prompt_cache)):
        learner = Learner(policy.model, torch.optim.AdamW(list(policy.model.parameters())))
        learner.optimizer.step = lambda: None  # keep weights: compare the gradients only
        job = Job("a", batch, lambda b, n: reinforce_loss(policy, cfg, b, n), max_new_tokens=6, prompt_cache=cache)
        run_job(job, learner, UpdateConfig(micro_batch_size=64, per_sample_backward=per_sample))
        grads[name] = torch.cat([p.grad.flatten() for p in learner.params])
    assert any(len(k) > 1 for k in fastlm._CASTS)  # the fused copies were used
    error = float((grads["per-sample"] - grads["batched"]).norm() / grads["batched"].norm())
    assert grads["batched"].abs().sum() > 0 and error < 0.02, error


_KERNEL_CACHE_PROBE = """
import torch, textzoo.decoding.precision as p
x = torch.randn(64, 256, dtype=torch.bfloat16)  # large enough for oneDNN (small ones take another kernel)
for n in range(p.ONEDNN_KERNEL_CACHE + 8):  # more distinct shapes than the cache holds
    torch.mm(x, torch.randn(256, 64 + n, dtype=torch.bfloat16))
print("again", flush=True)
torch.mm(x, torch.randn(256, 64, dtype=torch.bfloat16))  # the first shape
"""


@pytest.mark.parametrize("preset", [None, "1024"])
def test_onednn_kernel_cache_is_capped_unless_the_user_set_it(preset):
    env = {k: v for k, v in os.environ.items() if k != "ONEDNN_PRIMITIVE_CACHE_CAPACITY"}
    env["ONEDNN_VERBOSE"] = "profile_create"
    if preset:
        env["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] = preset
    probe = [sys.executable, "-c", _KERNEL_CACHE_PROBE]
    out = subprocess.run(probe, env=env, capture_output=True, text=True, check=True)
    last = [line for line in out.stdout.split("again")[1].splitlines() if ",create:" in line]
    if not last:
        pytest.skip("torch's bf16 matmul does not run on oneDNN on this CPU")
    # capped: the first shape was evicted and is compiled again; the user's 1024 keeps it
    assert ("create:cache_miss" in last[-1]) == (preset is None), last
