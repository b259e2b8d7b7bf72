"""The joint actor starts where the team starts: on the real model (SmolLM2-135M-Instruct, the `smollm2`
fixture of tests/conftest.py), the untrained joint actor (centralized) answers as well as the untrained
team (decentralized) from the same base model.

With a chat model the structured joint answer is one conversation (textzoo.models.joint): the first role's
prompt is its decentralized agent's prompt, token for token, so its greedy answer is the agent's; each
later role's observation comes as the next user turn of the chat template. The last test measures the
step-0 gap on held-out items of a real preset (`textzoo.envs.debate_v0` `one-digit-sums`).
"""

import pytest
import torch

from textzoo.config import AgentConfig, TrainConfig
from textzoo.decoding.generation import GenerationConfig
from textzoo.envs import make
from textzoo.envs.debate_v0 import PRESETS
from textzoo.models.joint import JointActor
from textzoo.models.policy import Policy
from textzoo.models.team import AgentActor
from textzoo.runners.build import build_actors, env_factory
from textzoo.runners.rollout import Collector, prompt_seed

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def policy(smollm2) -> Policy:
    return Policy.from_pretrained(smollm2, generation=GenerationConfig(max_new_tokens=24))


def _debate_observations(n: int) -> list[dict[str, str]]:
    env = make("textzoo/Debate-v0", split="eval", **PRESETS["one-digit-sums"].env_kwargs)
    return [env.reset(seed=0, options={"index": k})[0] for k in range(n)]


def test_the_first_role_answers_exactly_as_its_decentralized_agent(policy):
    roles = ["debater_0", "debater_1"]
    joint = JointActor(roles, policy, section_tokens=24)
    agent = AgentActor("debater_0", policy)
    observations = _debate_observations(3)
    prompts = [joint.build_prompt(o) for o in observations]
    alone = [agent.build_prompt({"debater_0": o["debater_0"]}) for o in observations]
    joint_ids, joint_mask = joint.prompt_format.encode(policy, prompts)
    agent_ids, agent_mask = agent.prompt_format.encode(policy, alone)
    assert torch.equal(joint_ids, agent_ids) and torch.equal(joint_mask, agent_mask)  # the same prompt
    gen = joint.generate(prompts, greedy=True)
    plain = agent.generate(alone, greedy=True)
    for row, text in enumerate(gen.texts):
        actions, failed = joint.parse(text, tuple(roles))
        assert not failed and actions["debater_0"] == plain.texts[row]  # the same greedy answer
        assert actions["debater_1"]
    # between the sections: the chat template's next user turn, the end of the first turn written once
    eos, tokenizer = policy.eos_ids, policy.tokenizer
    endings = set()
    for row, prompt in enumerate(prompts):
        n = int(plain.completion_mask[row].sum())  # the first section: the agent's completion
        ids = gen.completion_ids[row].tolist()
        assert ids[:n] == plain.completion_ids[row, :n].tolist() and gen.completion_mask[row, :n].all()
        ended = ids[n - 1] in eos  # the section ended its own turn
        forced = list(joint.script(prompt.observations)[1].tokens(after_stop=ended))
        assert ids[n : n + len(forced)] == forced and not gen.completion_mask[row, n : n + len(forced)].any()
        turn = joint.prompt_format.next_turn(tokenizer, observations[row]["debater_1"])
        assert tokenizer.decode(ids[n - ended : n + len(forced)]) == turn  # one end marker, then the user turn
        assert turn.startswith(tokenizer.decode(eos[:1]))  # ChatML ends a turn with the EOS token
        endings.add(ended)
    assert endings == {True, False}  # a section that ended its turn, and one cut by its budget


def test_a_lone_role_gets_its_own_section_budget(policy):
    joint = JointActor(["sender", "receiver"], policy, section_tokens={"sender": 3, "receiver": 24})
    gen = joint.generate([joint.build_prompt({"sender": "Write a long story about a cat."})], greedy=True)
    assert gen.completion_mask.sum() <= 3


def _greedy_solved(smollm2, mode: str, n: int) -> torch.Tensor:
    preset = PRESETS["one-digit-sums"]
    cfg = TrainConfig(
        env="textzoo/Debate-v0", **preset.train_fields(mode), collaboration=mode,
        agent=AgentConfig(model=str(smollm2), max_prompt_tokens=512), progress=False, plot=False,
    )  # fmt: skip
    env_fn = env_factory(cfg, eval=True)
    collector = Collector(env_fn, build_actors(cfg, list(env_fn().possible_agents)))
    items = list(range(n))
    rollout = collector.collect(items, [prompt_seed(0, -1, b) for b in items], 1, greedy=True)
    return rollout.reward_terms["solved"].mean(-1)  # [n] each item's share of debaters whose final answer solves it


def test_the_untrained_joint_actor_starts_where_the_untrained_team_starts(smollm2):
    # The first 6 of the 20 held-out items of one-digit-sums, greedy, 2 turns of 2 debaters (6, not 20, to
    # keep the test near a minute of CPU: at 10 it was the suite's slowest, 92 s). Measured: team 0.583, joint
    # actor 0.667 (they differ on one debater's answer on item 5; 64 s on one core of the Intel Xeon without
    # AMX, 2026-12-07); on the first 10: 0.65 and 0.60; on all 20: 0.625 and 0.600. Before the joint actor
    # answered as one conversation (tagged sections in one assistant turn) it was 0.325 on the 20. The bound
    # is the issue's, 0.10: on 6 items one debater's answer on one item is 0.083, two are 0.167.
    team, joint = _greedy_solved(smollm2, "decentralized", 6), _greedy_solved(smollm2, "centralized", 6)
    assert team.mean() > 0.4  # the real model answers (a broken team would make the gap trivially small)
    assert abs(float(joint.mean() - team.mean())) <= 0.10, (team.tolist(), joint.tolist())
