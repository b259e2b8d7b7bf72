"""Settings at construction: a builder hands an object everything it needs when it constructs it, and never sets
an attribute of an object it built (no `policy.engine = ...`, `joint.task_tokens = ...` after the fact).

Read from the AST of the builder modules: every attribute assignment there is to an object's own attribute
(`self.x = ...` inside its class), nothing else.
"""

import ast
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
BUILDERS = (
    "textzoo/runners/build.py",
    "textzoo/runners/engines.py",
    "textzoo/models/build.py",
    "textzoo/models/lora.py",
    "textzoo/models/critic.py",
    "textzoo/models/team.py",
    "textzoo/decoding/engine.py",
    "textzoo/algorithms/registry.py",
    "textzoo/algorithms/actor_critic/entries.py",
    "textzoo/algorithms/preference/entries.py",
    "textzoo/algorithms/preference/rounds.py",
    "textzoo/algorithms/reinforce/entries.py",
)
"""The modules that build actors, policies, engines, critics, reward models and families from configs."""


def foreign_assignments(source: str) -> list[str]:
    """`line: target` of every assignment (or `setattr`) to an attribute of anything but `self`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        targets = node.targets if isinstance(node, ast.Assign) else []
        if isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        for target in targets:
            for t in target.elts if isinstance(target, ast.Tuple | ast.List) else [target]:
                if isinstance(t, ast.Attribute) and not (isinstance(t.value, ast.Name) and t.value.id == "self"):
                    found.append(f"{node.lineno}: {ast.unparse(t)}")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr":
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_check_finds_what_builders_used_to_do():
    before = """
def build(policy, joint, room, actor):
    joint.task_tokens = 3
    policy.generation = room
    actor.policy.engine = None
    saved, policy.engine = policy.engine, None
    setattr(policy, "engine", None)

class Policy:
    def __init__(self, engine):
        self.engine = engine
"""
    assert [f.split(": ")[1] for f in foreign_assignments(before)] == [
        "joint.task_tokens",
        "policy.generation",
        "actor.policy.engine",
        "policy.engine",
        "setattr(policy, 'engine', None)",
    ]


@pytest.mark.parametrize("module", BUILDERS)
def test_no_builder_sets_an_attribute_of_an_object_it_built(module):
    assert foreign_assignments((ROOT / module).read_text()) == []


@pytest.mark.parametrize("lora_rank", [0, 2])
def test_a_structured_joint_actor_is_built_with_its_budgets(tmp_path, lora_rank):
    """What the builder used to set after construction (the joint's task budget, the policy's prompt budget)
    is there when the objects are made, and fits the model: intro + every task + tags + sections <= positions.
    With LoRA too: the budget is sized on the shared base's model before its first adapter exists."""
    from textzoo.config import AgentConfig, TrainConfig
    from textzoo.models.joint import structured_overhead
    from textzoo.models.settings import LoRAConfig
    from textzoo.runners.build import build_actors

    roles = ["a", "b", "c"]
    cfg = TrainConfig(
        collaboration="centralized",
        agent=AgentConfig(
            n_layer=1, n_embd=16, n_head=1, max_new_tokens=8, max_prompt_tokens=400, lora=LoRAConfig(rank=lora_rank)
        ),
    )
    (joint,) = build_actors(cfg, roles)
    policy = joint.policy
    tags, intro = structured_overhead(roles, policy.tokenizer, joint.prompt_format)
    positions = policy.model.config.n_positions  # a peft model reads through to its base config
    assert policy.generation.max_new_tokens == 24 and joint.section_tokens == {}  # no role has its own budget
    assert [joint.budget(r, 3) for r in roles] == [8, 8, 8] and joint.budget("a", 1) == 24  # alone: all of it
    assert policy.generation.max_prompt_tokens == positions - 24 - tags - 2 * len(roles)  # the model's limit binds
    assert joint.task_tokens == (policy.generation.max_prompt_tokens - intro) // len(roles) > 0
    assert intro + len(roles) * joint.task_tokens + tags + 24 <= positions


def test_a_closed_engine_hands_sampling_back_to_the_policy():
    from textzoo.decoding.engine import EngineClient, LocalEngine
    from textzoo.models.policy import Policy
    from textzoo.models.team import AgentActor
    from textzoo.runners.engines import close_engines

    class Counting(LocalEngine):
        calls = 0
        closed = 0

        def complete(self, prompts, settings, adapter=None):
            Counting.calls += 1
            return super().complete(prompts, settings, adapter)

        def close(self):
            Counting.closed += 1

    base = Policy.tiny("gpt2", n_layer=1, n_embd=16, n_head=1, seed=0)
    policy = Policy(base.model, base.tokenizer, base.generation, engine=EngineClient(Counting(base)))
    policy.generate(["hi"], generator=torch.Generator().manual_seed(0))
    assert Counting.calls == 1
    close_engines([AgentActor("a", policy)])
    assert Counting.closed == 1 and not policy.engine.open
    policy.generate(["hi"], generator=torch.Generator().manual_seed(0))  # its own decoder now
    assert Counting.calls == 1
