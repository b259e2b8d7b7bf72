"""MADPO: the joint DPO loss against hand-computed values, pair selection, the family, learning, resume."""

import dataclasses
import json
import math
import shutil

import pytest
import torch

torch.set_num_threads(1)

from helpers import tiny_config  # noqa: E402
from toy import CategoricalPolicy, TargetWordEnv  # noqa: E402

from textzoo.algorithms.preference.madpo import (  # noqa: E402
    MADPOFamily,
    PairBatch,
    PairStore,
    PreferenceConfig,
    merge_groups,
    select_pairs,
)
from textzoo.algorithms.registry import configure  # noqa: E402
from textzoo.algorithms.rlmath import BatchNorm  # noqa: E402
from textzoo.config import AgentConfig, TrainConfig  # noqa: E402
from textzoo.errors import ConfigError  # noqa: E402
from textzoo.models.joint import JointActor  # noqa: E402
from textzoo.models.team import AgentActor  # noqa: E402
from textzoo.models.tokenizer import byte_tokenizer  # noqa: E402
from textzoo.runners.checkpoint import list_checkpoints, read_checkpoint  # noqa: E402
from textzoo.runners.rollout import Collector  # noqa: E402
from textzoo.runners.trainer import Trainer  # noqa: E402
from textzoo.runners.update import Learner, UpdateConfig, run_job  # noqa: E402

WORDS = ["alpha", "beta", "gamma"]


# ---- pairs -------------------------------------------------------------------------------------
REWARDS = torch.tensor([[1.0, 0.0, 0.5, 0.5], [2.0, 2.0, 2.0, 2.0]])
STRICT = [(0, 1), (0, 2), (0, 3), (2, 1), (3, 1)]  # r_w > r_l in (w, l) order; (2, 3) ties, prompt 1 all tie


def as_list(pairs):
    return [tuple(p) for p in pairs.tolist()]


def test_all_pairs_drop_ties():
    assert as_list(select_pairs(REWARDS, "all")) == [(0, w, l) for w, l in STRICT]
    assert as_list(select_pairs(REWARDS, "all", cap=2)) == [(0, 0, 1), (0, 0, 2)]


def test_gap_selection_takes_largest_gaps_first():
    assert as_list(select_pairs(REWARDS, "gap", cap=3)) == [(0, 0, 1), (0, 0, 2), (0, 0, 3)]
    ranked = as_list(select_pairs(torch.tensor([[0.0, 3.0, 1.0]]), "gap"))
    assert ranked == [(0, 1, 0), (0, 1, 2), (0, 2, 0)]  # gaps 3, 2, 1


def test_random_selection_is_a_capped_subset_and_seeded():
    picks = as_list(select_pairs(REWARDS, "random", cap=3, generator=torch.Generator().manual_seed(1)))
    again = as_list(select_pairs(REWARDS, "random", cap=3, generator=torch.Generator().manual_seed(1)))
    assert picks == again and len(picks) == 3 and len(set(picks)) == 3
    assert {(w, l) for _, w, l in picks} <= set(STRICT)
    full = as_list(select_pairs(REWARDS, "random", generator=torch.Generator().manual_seed(2)))
    assert sorted((w, l) for _, w, l in full) == sorted(STRICT)


def test_config_validation_names_the_field():
    with pytest.raises(ConfigError, match="preference.pair_selection"):
        PreferenceConfig(pair_selection="best")
    with pytest.raises(ConfigError, match="comparator_model"):
        PreferenceConfig(comparator="model")
    with pytest.raises(ConfigError, match="iterations"):
        configure(TrainConfig(algo="madpo", steps=5, preference=PreferenceConfig(iterations=2)))
    with pytest.raises(ConfigError, match="rl_algo"):
        configure(TrainConfig(algo="marlhf", preference=PreferenceConfig(rl_algo="madpo")))


# ---- the family on toy agents --------------------------------------------------------------------
def toy_team(n, logits, targets=("alpha", "beta", "gamma")):
    roles = [f"p{i}" for i in range(n)]
    actors = []
    for role, values in zip(roles, logits):
        policy = CategoricalPolicy(WORDS)
        policy.tokenizer = byte_tokenizer()  # the collector measures action lengths in tokens
        with torch.no_grad():
            policy.model.logits.copy_(torch.tensor(values))
        actors.append(AgentActor(role, policy))
    env = lambda: TargetWordEnv(dict(zip(roles, targets)))  # noqa: E731
    return actors, Collector(env, actors)


@pytest.mark.parametrize("n", [1, 2, 3])
@pytest.mark.parametrize("reference", ["initial", "none"])
def test_family_loss_matches_hand_computation(n, reference):
    """Pairs from a real rollout; every job's loss equals the joint DPO loss computed from the logits."""
    torch.manual_seed(n)
    beta = 0.3
    ref_logits = [[0.0, 0.5, -0.5], [0.2, -0.1, 0.3], [-0.4, 0.0, 0.1]][:n]
    actors, collector = toy_team(n, ref_logits)
    family = MADPOFamily(
        PreferenceConfig(beta=beta, reference=reference, pairs_per_prompt=0, pair_selection="all"), actors
    )
    new_logits = [[1.0, -0.5, 0.0], [-0.3, 0.6, 0.2], [0.5, 0.5, -1.0]][:n]
    for a, values in zip(actors, new_logits):
        with torch.no_grad():
            a.policy.model.logits.copy_(torch.tensor(values))
    rollout = collector.collect([0, 1, 2], [0, 1, 2], 5)
    jobs, stats = family.jobs(rollout)
    episode = rollout.team_rewards.sum(-1).view(3, 5)
    expected_pairs = select_pairs(episode, "all")
    assert stats["pairs/new"] == len(expected_pairs) > 0
    assert [j.learner for j in jobs] == [a.id for a in actors]

    def lp(values, k):
        return torch.log_softmax(torch.tensor(values), -1)[k]

    words = [(j.batch.chosen.completion_ids[:, 0], j.batch.rejected.completion_ids[:, 0]) for j in jobs]
    margin = torch.zeros(len(expected_pairs))
    for i in range(n):
        w, l = words[i]
        delta = lp(new_logits[i], w) - lp(new_logits[i], l)
        if reference == "initial":
            delta = delta - (lp(ref_logits[i], w) - lp(ref_logits[i], l))
        margin += beta * delta
    expected = -torch.nn.functional.logsigmoid(margin).mean()
    for job in jobs:
        contrib, _ = job.loss(job.batch, BatchNorm(len(job.batch), 1, 1))
        assert contrib.sum().item() == pytest.approx(expected.item(), abs=1e-5)
    # the chosen episode's team reward beats the rejected one's, pair by pair
    flat = episode.view(-1)
    e_w = expected_pairs[:, 0] * 5 + expected_pairs[:, 1]
    e_l = expected_pairs[:, 0] * 5 + expected_pairs[:, 2]
    assert bool((flat[e_w] > flat[e_l]).all())
    chosen_words = torch.stack([words[i][0] for i in range(n)], 1)
    assert [[WORDS[k] for k in row] for row in chosen_words.tolist()] == [
        [t for t in texts] for texts in zip(*[[rollout.steps[i].gen.texts[e] for e in e_w.tolist()] for i in range(n)])
    ]


def test_frozen_agent_is_its_own_reference_and_gets_no_job():
    actors, collector = toy_team(2, [[0.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    actors[1].trainable = False
    family = MADPOFamily(PreferenceConfig(), actors)
    assert list(family.references) == ["p0"]
    rollout = collector.collect([0, 1], [0, 1], 4)
    jobs, _ = family.jobs(rollout)
    assert [j.learner for j in jobs] == ["p0"]
    assert torch.equal(jobs[0].batch.extra["others"], torch.zeros(len(jobs[0].batch)))


def test_all_ties_give_no_jobs():
    actors, collector = toy_team(1, [[0.0, -30.0, -30.0]])  # always "alpha": every sample ties
    family = MADPOFamily(PreferenceConfig(), actors)
    jobs, stats = family.jobs(collector.collect([0], [0], 4))
    assert jobs == [] and stats["pairs/new"] == 0


def test_madpo_learns_each_agents_target_word():
    """Known optimum: each agent's chosen word is its target, so DPO raises p(target) for both."""
    torch.manual_seed(0)
    actors, collector = toy_team(2, [[0.0] * 3, [0.0] * 3])
    family = MADPOFamily(PreferenceConfig(beta=1.0, reference="none", epochs=2), actors)
    learners = {a.id: Learner(a.policy.model, torch.optim.Adam(a.policy.model.parameters(), lr=0.1)) for a in actors}
    for _ in range(30):
        jobs, _ = family.jobs(collector.collect(list(range(4)), list(range(4)), 4))
        for job in jobs:
            run_job(job, learners[job.learner], UpdateConfig())
    assert actors[0].policy.probs()[0] > 0.9 and actors[1].policy.probs()[1] > 0.9


def test_replay_store_keeps_newest_token_ids_and_round_trips():
    actors, collector = toy_team(1, [[0.0] * 3])
    family = MADPOFamily(PreferenceConfig(replay_pairs=2, replay_capacity=3), actors)
    pairs, _ = family.pairs(collector.collect([0, 1], [0, 1], 4))
    store = PairStore(3)
    store.add(pairs, {"p0": 0})
    store.add(pairs, {"p0": 0})
    assert len(store) == 3
    newest = pairs["p0"].chosen.completion_ids[-3:]
    assert torch.equal(store.sides["p0"]["chosen"].completion_ids, newest)
    restored = PairStore(3)
    restored.load_state_dict(store.state_dict())
    for side in ("chosen", "rejected"):
        for key in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask"):
            assert torch.equal(getattr(restored.sides["p0"][side], key), getattr(store.sides["p0"][side], key))
    torch.manual_seed(3)
    a = store.sample(2)
    torch.manual_seed(3)
    b = restored.sample(2)
    assert torch.equal(a["p0"].chosen.completion_ids, b["p0"].chosen.completion_ids)
    assert isinstance(a["p0"], PairBatch) and len(a["p0"]) == 2


def test_merge_groups_interleaves_prompts():
    actors, collector = toy_team(1, [[0.0] * 3])
    a = collector.collect([0, 1], [0, 1], 2)
    b = collector.collect([0, 1], [0, 1], 3)
    merged = merge_groups(a, b)
    assert merged.group_size == 5 and merged.num_envs == 10
    team_a, team_b = a.team_rewards.view(2, 2, -1), b.team_rewards.view(2, 3, -1)
    assert torch.equal(merged.team_rewards.view(2, 5, -1), torch.cat([team_a, team_b], 1))
    texts = {}
    for s in merged.steps:
        for e, t in zip(s.env_ids.tolist(), s.gen.texts):
            texts[e] = t
    assert [texts[e] for e in (5, 6, 7, 8, 9)] == a.steps[0].gen.texts[2:] + b.steps[0].gen.texts[3:]


def test_centralized_team_is_one_actor_with_joint_pairs():
    """With a joint actor, N = 1: one job over pairs of joint completions, reference = its initial copy."""
    from textzoo.decoding.generation import GenerationConfig
    from textzoo.envs import make
    from textzoo.models.policy import Policy

    policy = Policy.tiny(n_layer=1, n_embd=32, generation=GenerationConfig(max_new_tokens=6))
    env = lambda: make("textzoo/Writing-v0", terms={"length_ratio": 1.0}, max_prompt_chars=128)  # noqa: E731
    joint = JointActor(["summary", "elaboration"], policy)
    family = MADPOFamily(PreferenceConfig(), [joint])
    torch.manual_seed(0)
    rollout = Collector(env, [joint]).collect([0, 1], [0, 1], 4)
    jobs, stats = family.jobs(rollout)
    assert len(jobs) <= 1 and list(family.references) == [joint.id]
    if jobs:
        contrib, _ = jobs[0].loss(jobs[0].batch, BatchNorm(len(jobs[0].batch), 1, 1))
        # the policy still equals its reference: Δ = 0, loss log 2 per pair
        assert contrib.sum().item() == pytest.approx(math.log(2), abs=1e-4)


# ---- the runner ----------------------------------------------------------------------------------
WRITING = {"terms": {"length_ratio": 1.0}, "max_prompt_chars": 128}


def test_madpo_raises_the_writing_reward(tmp_path):
    """Two tiny GPT-2s trained with MADPO raise Writing-v0's length-ratio reward (3 seeds, CI-sized)."""
    gains = []
    for seed in (0, 1, 2):
        cfg = tiny_config(
            algo="madpo",
            steps=30,
            batch_prompts=4,
            group_size=4,
            seed=seed,
            env_kwargs=WRITING,
            agent=AgentConfig(max_new_tokens=24, lr=5e-3),
            eval_prompts=1,
            preference=PreferenceConfig(beta=0.5, epochs=2),
        )
        history = Trainer(cfg, run_dir=tmp_path / f"seed-{seed}").train()
        rewards = [r["reward/mean"] for r in history if r["step"] > 0]
        gains.append(sum(rewards[15:]) / 15 - sum(rewards[:5]) / 5)  # steps 16-30 against steps 1-5
    # One seed is too noisy to test (the last 5 steps against the first 5 gave +0.054 to +0.195 over seeds
    # 0-11, 2 of 12 under +0.1). Measured gain per seed, seeds 0-11, transformers 5.24: +0.117 mean,
    # 0.034 sd, lowest +0.031 (seed 1); the mean of 3 seeds: sd 0.017, lowest of all 220 triples +0.074.
    # Seeds 0-5 under transformers 5.14 (its GPT-2 init differs): +0.136 mean, 0.048 sd. Seeds 0, 1, 2
    # give +0.100 (5.24) and +0.099 (5.14). A team that does not learn (lr 1e-9, seeds 0-5): +0.013 mean,
    # 0.028 sd, the mean of 3 seeds at most +0.030 (seeds 0, 1, 2: +0.000). The bar sits between the two.
    assert sum(gains) / len(gains) > 0.05, gains


def small(tmp_path, **kw) -> TrainConfig:
    base = dict(
        steps=4,
        group_size=3,
        seed=1,
        env_kwargs=WRITING,
        agent=AgentConfig(max_new_tokens=6, n_layer=1, n_embd=32),
        eval_prompts=1,
        save_every=1,
        keep_last=0,
        run_dir=str(tmp_path),
    )
    base.update(kw)
    base["preference"] = dataclasses.replace(base.get("preference", PreferenceConfig()), iterations=2)
    return tiny_config(**base)


@pytest.mark.parametrize(
    "algo,pref",
    [
        ("madpo", PreferenceConfig(comparator="copy", replay_pairs=2)),
        ("madpo", PreferenceConfig(comparator="history", history_k=1, replay_pairs=2, pair_selection="random")),
        ("marlhf", PreferenceConfig(comparator="copy", replay_pairs=3, rm_batches=1, rm_epochs=1)),
        # an ensemble with bootstrap weights, early stopping over 3 epochs and a running hacking monitor
        (
            "marlhf",
            PreferenceConfig(rm_batches=1, rm_epochs=3, rm_ensemble=2, rm_disagreement_penalty=0.5, hacking_window=2),
        ),
    ],
)
def test_resume_mid_round_is_exact(tmp_path, algo, pref):
    """Stop after step 3 (inside round 2 of 2), resume: weights, pair store and metrics match a straight run."""
    full = Trainer(small(tmp_path / "full", algo=algo, preference=pref))
    full.train()
    cut = tmp_path / "cut"
    shutil.copytree(tmp_path / "full", cut)
    shutil.rmtree(list_checkpoints(cut)[-1])  # drop step 4: the newest is step 3, mid-round
    resumed = Trainer(small(cut, algo=algo, preference=pref), resume=cut)
    assert resumed.step == 3 and resumed.hooks[0].round == 1
    resumed.train()
    a, b = read_checkpoint(list_checkpoints(tmp_path / "full")[-1]), read_checkpoint(list_checkpoints(cut)[-1])
    for name in a.weights:
        for key in a.weights[name]:
            assert torch.equal(a.weights[name][key], b.weights[name][key]), (name, key)
    hook_a, hook_b = a.state["replicas"][0]["hooks"][0], b.state["replicas"][0]["hooks"][0]
    assert len(hook_a["store"]) == len(hook_b["store"])
    if algo == "marlhf":
        for key, value in hook_a["reward_model"].items():
            assert torch.equal(value, hook_b["reward_model"][key])
        assert hook_a["monitor"] == hook_b["monitor"] and hook_a["rm_episodes"] == hook_b["rm_episodes"]
    else:
        store_a, store_b = a.state["replicas"][0]["family"]["store"], b.state["replicas"][0]["family"]["store"]
        assert store_a and torch.equal(
            store_a["summary"]["chosen"]["completion_ids"], store_b["summary"]["chosen"]["completion_ids"]
        )
    rows_a = (tmp_path / "full" / "metrics.jsonl").read_text().splitlines()
    rows_b = (cut / "metrics.jsonl").read_text().splitlines()
    strip = lambda row: {k: v for k, v in json.loads(row).items() if not k.startswith("time/")}  # noqa: E731
    assert [strip(r) for r in rows_a] == [strip(r) for r in rows_b]
