"""tianshou interop: a tianshou Collector plays textzoo agents in textzoo tasks (strings in its buffer)."""

import re
from types import SimpleNamespace

import numpy as np
import pytest
import torch

torch.set_num_threads(1)

pytest.importorskip("tianshou", reason="the tianshou extra is not installed (pip install 'textzoo[tianshou]')")

from tianshou.data import Collector, VectorReplayBuffer  # noqa: E402
from tianshou.env import DummyVectorEnv  # noqa: E402
from toy import CategoricalPolicy  # noqa: E402

import textzoo.interop.tianshou as ts_interop  # noqa: E402
from textzoo.decoding.generation import GenerationConfig  # noqa: E402
from textzoo.envs import make  # noqa: E402
from textzoo.errors import TextzooError  # noqa: E402
from textzoo.interop.tianshou import TextPettingZooEnv, TextPolicy, team_policy  # noqa: E402
from textzoo.models.joint import JointActor  # noqa: E402
from textzoo.models.policy import Policy  # noqa: E402
from textzoo.models.team import AgentActor  # noqa: E402


class ScriptedPolicy(CategoricalPolicy):
    """Stands in for a `Policy`: answers `reply(prompt, call)` and records every batched call."""

    def __init__(self, reply):
        super().__init__(["-"])
        self.reply = reply
        self.calls: list[list[str]] = []

    def generate(self, prompts, greedy=False, generator=None):
        self.calls.append(list(prompts))
        n = len(self.calls)
        return SimpleNamespace(texts=[self.reply(p, n) for p in prompts])


def collect(policy, env_fn, envs: int, episodes: int):
    venv = DummyVectorEnv([env_fn] * envs)
    collector = Collector(policy, venv, VectorReplayBuffer(64 * envs, envs))
    stats = collector.collect(n_episode=episodes, reset_before_collect=True)
    buffer = collector.buffer
    rows = buffer.sample_indices(0)  # every stored row, grouped by env
    return stats, buffer, sorted(rows)


def test_decentralized_policies_fill_the_buffer_with_prompts_and_their_completions():
    gen = GenerationConfig(max_new_tokens=8)
    team = {"summary": Policy.tiny(seed=0, generation=gen), "elaboration": Policy.tiny(seed=1, generation=gen)}
    env_fn = lambda: TextPettingZooEnv(make("textzoo/Writing-v0", terms={"length_ratio": 1.0}))  # noqa: E731
    stats, buffer, rows = collect(team_policy(team, greedy=True), env_fn, envs=2, episodes=4)

    assert stats.n_collected_episodes == 4
    assert len(rows) == 8  # 4 episodes x 2 agents acting in turn
    for i in rows:
        role, prompt, action = buffer.obs.agent_id[i], buffer.obs.obs[i], buffer.act[i]
        assert isinstance(prompt, str) and isinstance(action, str)
        assert prompt.startswith("Summarize" if role == "summary" else "Elaborate")
        assert action == team[role].generate([prompt], greedy=True).texts[0]  # what the agent itself answers
    # the turn completes on the elaboration's step: its row carries both rewards, as the task scores them
    for i in rows:
        if buffer.obs.agent_id[i] != "elaboration":
            assert buffer.rew[i].tolist() == [0.0, 0.0] and not buffer.done[i]
            continue
        assert buffer.done[i]
        env = make("textzoo/Writing-v0", terms={"length_ratio": 1.0})
        env.reset(options={"index": int(buffer.info.item[i])})
        summary_row = i - 1
        rewards = env.step({"summary": buffer.act[summary_row], "elaboration": buffer.act[i]})[1]
        assert buffer.rew[i].tolist() == pytest.approx([rewards["summary"], rewards["elaboration"]])


def test_multi_turn_inactive_roles_do_not_generate():
    sender = ScriptedPolicy(lambda p, n: "it is " + re.findall(r"\b[A-D]\b", p)[0])
    receiver = ScriptedPolicy(lambda p, n: re.search(r"it is (\w)", p).group(1))
    policy = team_policy([AgentActor("sender", sender), AgentActor("receiver", receiver)])
    env_fn = lambda: TextPettingZooEnv(make("textzoo/Relay-v0"))  # noqa: E731
    stats, buffer, rows = collect(policy, env_fn, envs=3, episodes=3)

    assert stats.n_collected_episodes == 3 and len(rows) == 12  # 2 turns x 2 agents
    assert buffer.act[rows].tolist().count("") == 6  # each inactive role's turn: no completion
    # each agent generated in one batched call per turn over the 3 envs, only where it was active
    assert [len(c) for c in sender.calls] == [3] and [len(c) for c in receiver.calls] == [3]
    done = [i for i in rows if buffer.done[i]]
    assert len(done) == 3 and all(buffer.rew[i].tolist() == [1.0, 1.0] for i in done)  # the message got through


def test_joint_actor_answers_every_role_from_one_completion_per_turn():
    def reply(prompt, call):
        return f"draft {call}</summary>\n<elaboration>long draft {call}</elaboration>"

    scripted = ScriptedPolicy(reply)
    actor = JointActor(["summary", "elaboration"], scripted, joint_format="tags")  # free-form replies
    env_fn = lambda: TextPettingZooEnv(make("textzoo/Writing-v0"))  # noqa: E731
    policy = team_policy(actor)
    stats, buffer, rows = collect(policy, env_fn, envs=2, episodes=2)

    assert stats.n_collected_episodes == 2 and len(rows) == 4
    assert [len(c) for c in scripted.calls] == [2]  # one joint completion per env, generated once
    prompt = scripted.calls[0][0]
    assert prompt.startswith("You answer for every role") and prompt.endswith("<summary>")
    acts = {buffer.obs.agent_id[i]: buffer.act[i] for i in rows}
    assert acts == {"summary": "draft 1", "elaboration": "long draft 1"}
    assert policy.policies["summary"] is policy.policies["elaboration"]
    assert not policy.policies["summary"]._pending  # every handed-out action was dropped


def test_joint_actor_without_the_env_wrapper_says_what_to_do():
    from pettingzoo.utils.conversions import parallel_to_aec
    from tianshou.env import PettingZooEnv

    actor = JointActor(["summary", "elaboration"], ScriptedPolicy(lambda p, n: ""), joint_format="tags")
    policy = TextPolicy(actor)
    env = PettingZooEnv(parallel_to_aec(make("textzoo/Writing-v0")))
    obs, info = env.reset()
    from tianshou.data import Batch

    batch = Batch(
        obs=Batch(obs=np.array([obs["obs"]], dtype=object), agent_id=np.array([obs["agent_id"]])),
        info=Batch(turn=np.array([0])),
    )
    with pytest.raises(TextzooError, match="TextPettingZooEnv"):
        policy(batch)


def test_placeholder_action_space_and_parameters_are_visible_to_tianshou():
    policy = TextPolicy(Policy.tiny(seed=0))
    assert policy.action_space is ts_interop.PLACEHOLDER_ACTION_SPACE
    assert sum(p.numel() for p in policy.parameters()) == sum(p.numel() for p in policy.model.parameters()) > 0


def test_module_docstring_example_runs():
    code = ts_interop.__doc__.split("::\n", 1)[1].split("\n\n`TextPettingZooEnv`", 1)[0]
    scope: dict = {}
    exec(compile("\n".join(line[4:] for line in code.splitlines()), "docstring", "exec"), scope)
    buffer = scope["collector"].buffer
    rows = buffer.sample_indices(0)
    assert len(rows) == 8 and all(isinstance(buffer.act[i], str) for i in rows)
