"""AT-GRPO: (state, agent, turn) grouping, the tree rollout, and learning (its math: test_rlmath.py)."""

import pytest
import torch

torch.set_num_threads(1)

from helpers import tiny_config  # noqa: E402
from toy import CategoricalPolicy, TargetWordEnv  # noqa: E402

from textzoo.algorithms.registry import configure  # noqa: E402
from textzoo.algorithms.reinforce.atgrpo import ATGRPOFamily  # noqa: E402
from textzoo.algorithms.reinforce.family import ReinforceConfig, ReinforceFamily  # noqa: E402
from textzoo.config import AgentConfig, TrainConfig  # noqa: E402
from textzoo.decoding.generation import Generation  # noqa: E402
from textzoo.envs.base import StepResult, TextParallelEnv  # noqa: E402
from textzoo.errors import ConfigError  # noqa: E402
from textzoo.models.team import AgentActor  # noqa: E402
from textzoo.runners.rollout import Collector  # noqa: E402
from textzoo.runners.trainer import Trainer  # noqa: E402
from textzoo.runners.update import Learner, UpdateConfig, run_job  # noqa: E402

WORDS = ["red", "green", "blue", "gold", "pink"]


class PromptCategorical(CategoricalPolicy):
    """The toy softmax policy, with the prompt's characters as its prompt ids (what AT-GRPO groups by)."""

    def generate(self, prompts, *, greedy=False, generator=None) -> Generation:
        gen = super().generate(prompts, greedy=greedy, generator=generator)
        width = max(len(p) for p in prompts)
        ids = torch.zeros(len(prompts), width, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, p in enumerate(prompts):
            ids[i, width - len(p) :] = torch.tensor([ord(c) for c in p])
            mask[i, width - len(p) :] = 1
        gen.prompt_ids, gen.prompt_mask = ids, mask
        return gen


class TwoTurnWordEnv(TextParallelEnv):
    """Two turns; each agent earns 1 per turn for saying its target; turn 1's prompt shows turn 0's answers."""

    metadata = {"name": "two_turn_word", "render_modes": ["ansi"], "is_parallelizable": True}

    def __init__(self, targets: dict[str, str]):
        super().__init__(list(targets), num_turns=2, max_prompt_chars=256, max_action_chars=64)
        self.targets = targets

    def num_items(self) -> int:
        return 8

    def _reset_task(self, index: int) -> dict[str, str]:
        self.index = index
        return {a: f"item {index}: say your word" for a in self.possible_agents}

    def _step_task(self, actions, notes) -> StepResult:
        hit = {a: float(actions[a].strip() == self.targets[a]) for a in self.possible_agents}
        said = ", ".join(f"{a} said {actions[a]}" for a in self.possible_agents)
        return StepResult(
            rewards=hit,
            reward_terms={a: {"hit": hit[a]} for a in hit},
            observations={a: f"item {self.index}: {said}; say your word again" for a in self.possible_agents},
        )


def _team(targets, seed=0):
    torch.manual_seed(seed)
    actors = [AgentActor(a, PromptCategorical(WORDS)) for a in targets]
    return actors, Collector(lambda: TwoTurnWordEnv(targets), actors)


def test_config_rules():
    with pytest.raises(ConfigError, match="tree_rollout"):
        configure(TrainConfig(algo="magrpo", reinforce=ReinforceConfig(tree_rollout=True)))
    with pytest.raises(ConfigError, match="group_size"):
        configure(TrainConfig(algo="atgrpo", group_size=1))
    with pytest.raises(ConfigError, match="joint_mode"):
        configure(TrainConfig(algo="atgrpo", reinforce=ReinforceConfig(joint_mode="cross")))
    configure(TrainConfig(algo="atgrpo", reinforce=ReinforceConfig(tree_rollout=True)))


def test_single_turn_advantages_are_magrpos():
    """One turn: every sample of a prompt has the same state, so AT-GRPO's groups are MAGRPO's."""
    torch.manual_seed(0)
    targets = {"a": "gold", "b": "red"}
    actors = [AgentActor(a, PromptCategorical(WORDS)) for a in targets]
    rollout = Collector(lambda: TargetWordEnv(targets), actors).collect([0, 1, 2], [5, 6, 7], 4)
    at = ATGRPOFamily(ReinforceConfig(), actors).jobs(rollout)[0]
    ma = ReinforceFamily(ReinforceConfig(), actors, "grpo", group_size=4).jobs(rollout)[0]
    assert any(j.batch.advantages.abs().sum() > 0 for j in ma)
    for x, y in zip(at, ma):
        assert torch.equal(x.batch.advantages, y.batch.advantages)


def test_tree_rollout_continues_the_best_branch_in_every_copy():
    targets = {"a": "gold", "b": "red"}
    actors, collector = _team(targets)
    B, G = 3, 4
    rollout = collector.collect([0, 1, 2], [1, 2, 3], G, tree=True)
    prompts = rollout.infos["actions"]  # per turn: env -> role -> action
    team0 = rollout.team_rewards[:, 0].view(B, G)
    for b in range(B):
        best = b * G + int(team0[b].argmax())  # argmax returns the first of ties
        # turn 1 of every copy continues the best branch: its observation names that branch's answers
        assert len({rollout.states[1][b * G + g] for g in range(G)}) == 1
        for role in targets:
            assert f"{role} said {prompts[0][best][role]}" in rollout.states[1][b * G]
    # so AT-GRPO finds one group per prompt at each turn
    stats = ATGRPOFamily(ReinforceConfig(tree_rollout=True), actors).jobs(rollout)[1]
    assert stats["agent/a/state_groups"] == 2 * B
    # without the tree, turn 1's histories differ between copies: more (smaller) groups
    free = collector.collect([0, 1, 2], [1, 2, 3], G)
    assert ATGRPOFamily(ReinforceConfig(), actors).jobs(free)[1]["agent/a/state_groups"] > 2 * B


@pytest.mark.parametrize("tree", [False, True])
def test_atgrpo_team_learns_both_turns_over_seeds(tree):
    """Two agents, two turns, 40 steps of 4 prompts x 4: each agent's target probability from 0.2 to > 0.8."""
    targets = {"a": "gold", "b": "blue"}
    final = []
    for seed in range(3):
        actors, collector = _team(targets, seed)
        family = ATGRPOFamily(ReinforceConfig(tree_rollout=tree), actors, credit="per_agent")
        learners = {
            a.id: Learner(a.policy.model, torch.optim.AdamW(a.policy.model.parameters(), lr=0.1), None) for a in actors
        }
        for step in range(40):
            rollout = collector.collect(list(range(4)), [seed * 1000 + step * 10 + b for b in range(4)], 4, tree=tree)
            for job in family.jobs(rollout)[0]:
                run_job(job, learners[job.learner], UpdateConfig())
        final += [float(a.policy.probs()[WORDS.index(targets[a.id])]) for a in actors]
    assert min(final) > 0.8, final


@pytest.mark.parametrize("collaboration", ["decentralized", "centralized"])
def test_trainer_runs_atgrpo_with_the_tree_on_a_multi_turn_task(tmp_path, collaboration):
    cfg = tiny_config(
        env="textzoo/Debate-v0",
        env_kwargs={"turns": 2},
        algo="atgrpo",
        collaboration=collaboration,
        reinforce=ReinforceConfig(tree_rollout=True),
        steps=1,
        eval_prompts=1,
        eval_modes=("greedy",),
        agent=AgentConfig(max_new_tokens=6),
    )
    row = Trainer(cfg, run_dir=tmp_path).train()[-1]
    actor = "debater_0" if collaboration == "decentralized" else "joint"
    assert row[f"agent/{actor}/state_groups"] == 2 * 2  # 2 prompts x 2 turns: the tree keeps one state each
    assert row[f"agent/{actor}/weights_version"] == 1
    assert f"agent/{actor}/turn1/frac_reward_zero_std" in row
