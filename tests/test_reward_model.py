"""MARLHF's joint reward model: Bradley–Terry loss, learning a separable preference, relabelling, the pipeline."""

import random

import pytest
import torch

torch.set_num_threads(1)

from toy import CategoricalPolicy, TargetWordEnv  # noqa: E402

from textzoo.agents.batch import Job  # noqa: E402
from textzoo.agents.critic import Critic  # noqa: E402
from textzoo.agents.policy import Policy  # noqa: E402
from textzoo.agents.preference import PairBatch  # noqa: E402
from textzoo.agents.reward_model import (  # noqa: E402
    RewardModel,
    encode_texts,
    joint_texts,
    pair_accuracy,
    relabel,
    reward_model_loss,
)
from textzoo.agents.rlmath import credited_rewards  # noqa: E402
from textzoo.agents.team import AgentActor  # noqa: E402
from textzoo.agents.tokenizer import byte_tokenizer  # noqa: E402
from textzoo.runners.config import AgentConfig, TrainConfig  # noqa: E402
from textzoo.runners.rollout import Collector  # noqa: E402
from textzoo.runners.trainer import Trainer  # noqa: E402
from textzoo.runners.update import Learner, UpdateConfig, run_job  # noqa: E402


def separable_pairs(model: Critic, n: int, seed: int) -> PairBatch:
    """Chosen texts praise, rejected texts complain; the filler words are shared at random."""
    rng = random.Random(seed)
    filler = ["the", "team", "wrote", "a", "text", "about", "rivers", "and", "cities", "today"]

    def text(mood: str) -> str:
        words = rng.sample(filler, 5)
        words.insert(rng.randrange(6), mood)
        return " ".join(words)

    chosen = [text(rng.choice(["great", "superb", "lovely"])) for _ in range(n)]
    rejected = [text(rng.choice(["awful", "broken", "wrong"])) for _ in range(n)]
    return PairBatch(encode_texts(model, chosen), encode_texts(model, rejected))


def test_reward_model_learns_a_separable_preference():
    model = RewardModel([Critic.from_policy(Policy.tiny(n_layer=1, n_embd=32, seed=0), max_tokens=64, seed=0)], "last")
    train, held = separable_pairs(model, 48, seed=0), separable_pairs(model, 32, seed=1)
    assert pair_accuracy(model, held) == 0.5  # a zero-initialised head ties every pair
    learner = Learner(model, torch.optim.AdamW(model.parameters(), lr=3e-3))
    job = Job(
        "reward_model", train, lambda batch, norm: reward_model_loss(model, batch, norm), epochs=15, minibatches=3
    )
    run_job(job, learner, UpdateConfig(micro_batch_size=16), generator=torch.Generator().manual_seed(0))
    assert pair_accuracy(model, held) >= 0.9


def toy_rollout():
    roles = ["p0", "p1"]
    actors = []
    for role in roles:
        policy = CategoricalPolicy(["alpha", "beta"])
        policy.tokenizer = byte_tokenizer()  # the collector measures action lengths in tokens
        actors.append(AgentActor(role, policy))
    torch.manual_seed(0)
    return Collector(lambda: TargetWordEnv({"p0": "alpha", "p1": "beta"}), actors).collect([0, 1], [0, 1], 3)


def test_joint_text_holds_every_prompt_and_action():
    rollout = toy_rollout()
    texts = joint_texts(rollout)
    for s in rollout.steps:
        for e, action in zip(s.env_ids.tolist(), s.gen.texts):
            assert f"<{s.actor} prompt>" in texts[e]
            assert f"[turn 0] <{s.actor} action>\n{action}" in texts[e]


def test_relabel_moves_task_rewards_to_terms():
    rollout = toy_rollout()
    scores = torch.arange(rollout.num_envs, dtype=torch.float32)
    out = relabel(rollout, lambda texts: scores[: len(texts)])
    assert torch.equal(out.team_rewards.sum(-1), scores)
    assert torch.equal(credited_rewards(out.rewards, out.actor_roles, "per_agent")[:, 1, 0], scores)
    assert torch.equal(out.reward_terms["task/mean"], rollout.rewards.sum(-1))
    assert torch.equal(out.reward_terms["task/own_hit"], rollout.reward_terms["own_hit"])
    assert torch.equal(out.reward_terms["rm"][:, 0], scores)
    assert rollout.rewards is not out.rewards  # the task rollout is left as it was


def test_marlhf_trains_the_reward_model_then_the_online_family(tmp_path):
    cfg = TrainConfig(
        algo="marlhf",
        rl_algo="marloo",
        steps=2,
        iterations=2,
        batch_prompts=2,
        group_size=3,
        progress=False,
        plot=False,
        env_kwargs={"terms": {"length_ratio": 1.0}, "max_prompt_chars": 128},
        agent=AgentConfig(max_new_tokens=6, n_layer=1, n_embd=32),
        eval_prompts=1,
    )
    cfg.preference.rm_batches = 1
    history = Trainer(cfg, run_dir=tmp_path).train()
    first, second = history[1], history[2]
    for row in (first, second):
        assert {"reward/rm", "reward/task/mean", "reward/task/length_ratio", "rm/heldout_accuracy"} <= set(row)
        assert row["reward/mean"] == pytest.approx(row["reward/rm"], abs=1e-6)
        # the reward model's scores differ between samples, so the online family took its step on them
        # (constant rewards would give zero advantages and a skipped step)
        assert row["agent/summary/optimizer_steps"] == 1 and row["agent/summary/skipped_zero_grad"] == 0
    assert second["round"] == 1 and first["round"] == 0
