"""Placement: the pure resolver on fake device lists, concurrent generation, bf16 and checkpointing."""

import threading
from types import SimpleNamespace

import pytest
import torch
from toy import CategoricalPolicy

from textzoo.config import AgentConfig
from textzoo.errors import ConfigError
from textzoo.models.build import build_policy
from textzoo.models.team import AgentActor
from textzoo.runners.placement import DeviceSpec, ModelSpec, model_bytes, resolve_placement, team_models
from textzoo.runners.rollout import Collector

torch.set_num_threads(1)

GB = 2**30


def _gpus(*free_gb):
    return [DeviceSpec(f"cuda:{i}", int(gb * GB)) for i, gb in enumerate(free_gb)]


def test_no_gpu_puts_everything_on_cpu():
    models = [ModelSpec("a", "actor", GB), ModelSpec("a-ref", "reference", GB)]
    assert resolve_placement(models, []) == {"a": "cpu", "a-ref": "cpu"}
    assert resolve_placement(models, [], {"a-ref": "cuda:3"}) == {"a": "cpu", "a-ref": "cuda:3"}


def test_equal_models_go_round_robin():
    models = [ModelSpec(n, "actor", 2 * GB) for n in ("a", "b", "c", "d")]
    assert resolve_placement(models, _gpus(80, 80)) == {"a": "cuda:0", "b": "cuda:1", "c": "cuda:0", "d": "cuda:1"}


def test_largest_first_balances_memory():
    # trained actors (weights + grad + 2 moments) and frozen references of a 4 GB and a 1 GB model
    models = [
        ModelSpec("small", "actor", 4 * GB),
        ModelSpec("big", "actor", 16 * GB),
        ModelSpec("small-ref", "reference", GB),
        ModelSpec("big-ref", "reference", 4 * GB),
    ]
    placed = resolve_placement(models, _gpus(40, 40))
    # big -> 0 (16), small -> 1 (4), big-ref -> 1 (8), small-ref -> 1 (9): loads 16 vs 9
    assert placed == {"small": "cuda:1", "big": "cuda:0", "small-ref": "cuda:1", "big-ref": "cuda:1"}


def test_capacity_is_relative():
    models = [ModelSpec("a", "actor", 10 * GB), ModelSpec("b", "actor", 10 * GB)]
    # a GPU with 4x the free memory takes both before the small one is as full
    assert resolve_placement(models, _gpus(100, 25)) == {"a": "cuda:0", "b": "cuda:0"}
    assert resolve_placement(models, _gpus(40, 25)) == {"a": "cuda:0", "b": "cuda:1"}


def test_explicit_map_overrides_and_counts_as_load():
    models = [ModelSpec("a", "actor", 8 * GB), ModelSpec("b", "actor", 8 * GB), ModelSpec("c", "critic", GB)]
    placed = resolve_placement(models, _gpus(80, 80), {"a": "cuda:1"})
    assert placed == {"a": "cuda:1", "b": "cuda:0", "c": "cuda:0"}
    with pytest.raises(ConfigError, match="device_map names \\['nope'\\]"):
        resolve_placement(models, _gpus(80), {"nope": "cuda:0"})


def test_team_models_lists_actors_family_models_and_references():
    def policy(n):
        return SimpleNamespace(model=torch.nn.Linear(n, n, bias=False))

    actors = [
        SimpleNamespace(id="a", policy=policy(2), trainable=True),
        SimpleNamespace(id="b", policy=policy(3), trainable=False),
    ]
    critic = torch.nn.Linear(4, 1, bias=False)
    family = SimpleNamespace(
        trainable_models=lambda: {"critic": (critic, None)}, frozen_models=lambda: {"a-ref": policy(2).model}
    )
    models = team_models(actors, family)
    assert {k: (v[1], v[2]) for k, v in models.items()} == {
        "a": ("actor", True),
        "b": ("actor", False),
        "critic": ("critic", True),
        "a-ref": ("reference", False),
    }
    assert model_bytes(models["a"][0], True) == 4 * 4 * 4  # 4 fp32 weights x (weights, grad, 2 moments)
    assert model_bytes(models["b"][0], False) == 9 * 4


class _FakePolicy(CategoricalPolicy):
    """Answers after every other device's thread has arrived: only concurrent calls can finish."""

    def __init__(self, device, barrier):
        super().__init__(["x"])
        self._device, self.barrier = torch.device(device), barrier

    @property
    def device(self) -> torch.device:
        return self._device

    def generate(self, prompts, greedy=False, generator=None):
        self.barrier.wait(timeout=10)
        return [f"{self.device}:{p}" for p in prompts]


def test_actors_on_distinct_devices_generate_concurrently():
    barrier = threading.Barrier(2)
    actors = [AgentActor("a", _FakePolicy("cpu", barrier)), AgentActor("b", _FakePolicy("meta", barrier))]
    collector = Collector.__new__(Collector)  # only _generate is under test
    collector.generate_workers = 1  # no threads for actors that share a device
    out = collector._generate([(actors[0], ["x"]), (actors[1], ["y", "z"])], greedy=False)
    assert out == [["cpu:x"], ["meta:y", "meta:z"]]  # results stay in actor order


def test_actors_on_one_device_generate_in_turn():
    calls = []

    class Recorder(CategoricalPolicy):
        def __init__(self, name):
            super().__init__([name])
            self.name = name

        def generate(self, prompts, greedy=False, generator=None):
            calls.append((self.name, threading.current_thread() is threading.main_thread()))
            return self.name

    collector = Collector.__new__(Collector)  # only _generate is under test
    collector.generate_workers = 1  # no threads for actors that share a device
    out = collector._generate(
        [(AgentActor("a", Recorder("a")), ["p"]), (AgentActor("b", Recorder("b")), ["q"])], greedy=False
    )
    assert out == ["a", "b"] and calls == [("a", True), ("b", True)]


def test_bf16_and_gradient_checkpointing_are_per_agent_options():
    plain = build_policy(AgentConfig(n_layer=2, n_embd=32), seed=0, device=torch.device("cpu"))
    ckpt = build_policy(
        AgentConfig(n_layer=2, n_embd=32, gradient_checkpointing=True), seed=0, device=torch.device("cpu")
    )

    def checkpointing(model):
        if hasattr(type(model), "is_activation_checkpointing"):
            return model.is_activation_checkpointing
        return model.is_gradient_checkpointing

    assert checkpointing(ckpt.model) and not checkpointing(plain.model)
    ids = torch.randint(3, 200, (2, 6))
    mask = torch.ones_like(ids)
    grads = []
    for policy in (plain, ckpt):
        policy.model.train()
        policy.model.zero_grad()
        policy.score(ids[:, :3], mask[:, :3], ids[:, 3:], mask[:, 3:]).sum().backward()
        grads.append([p.grad.clone() for p in policy.model.parameters()])
    for g_plain, g_ckpt in zip(*grads):
        torch.testing.assert_close(g_ckpt, g_plain, rtol=1e-5, atol=1e-6)
    bf16 = build_policy(AgentConfig(n_layer=1, n_embd=32, precision="bf16-weights"), seed=0, device=torch.device("cpu"))
    assert {p.dtype for p in bf16.model.parameters()} == {torch.bfloat16}


def test_models_that_share_weights_are_placed_as_one_unit():
    from textzoo.models.critic import Critic
    from textzoo.models.lora import SharedBase
    from textzoo.models.policy import Policy
    from textzoo.models.team import AgentActor, frozen_references
    from textzoo.runners.placement import place_models, shared_units

    shared = SharedBase(Policy.tiny("gpt2", seed=1))
    a, b = shared.add("a", 4, seed=1), shared.add("b", 4, seed=2)
    refs = frozen_references([AgentActor("a", a), AgentActor("b", b)])
    own = Policy.tiny("gpt2", seed=2)
    head = Critic.from_policy(own, shared_trunk=True)  # a value head on `own`'s trunk
    alone = Policy.tiny("gpt2", seed=3)
    models = {
        "a": (a.model, "actor", True),
        "own": (own.model, "actor", True),
        "b": (b.model, "actor", True),
        "alone": (alone.model, "actor", True),
        "own.critic": (head, "critic", True),
        "a-ref": (refs["a"].model, "reference", False),
        "b-ref": (refs["b"].model, "reference", False),
    }
    assert shared_units({n: m for n, (m, _, _) in models.items()}) == [
        ["a", "b", "a-ref", "b-ref"],
        ["own", "own.critic"],
        ["alone"],
    ]
    # two (fake) devices: every member of a unit lands where its unit goes, and the unit's bytes count
    # the shared base once (a view's own parameters are only its adapter)
    devices = [DeviceSpec("cpu", 100 * GB), DeviceSpec("cpu:0", 100 * GB)]
    rows = {r["model"]: r for r in place_models(models, devices, {})}
    assert len({rows[n]["device"] for n in ("a", "b", "a-ref", "b-ref")}) == 1
    assert rows["own"]["device"] == rows["own.critic"]["device"]
    assert rows["a"]["shares_weights_with"] == ["b", "a-ref", "b-ref"] and "shares_weights_with" not in rows["alone"]
    assert rows["a"]["device"] != rows["own"]["device"]  # the two largest units spread over both devices
    rows = {r["model"]: r for r in place_models(models, devices, {"a-ref": "cpu:0"})}
    assert {rows[n]["device"] for n in ("a", "b", "a-ref", "b-ref")} == {"cpu:0"}  # one member placed: all go
    with pytest.raises(ConfigError, match="share weights"):
        place_models(models, devices, {"a": "cpu", "b-ref": "cpu:0"})
