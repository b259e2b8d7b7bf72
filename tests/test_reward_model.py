"""MARLHF's joint reward model: Bradley–Terry loss, learning a separable preference, relabelling, the pipeline."""

import logging
import random
from functools import partial

import pytest
import torch

torch.set_num_threads(1)

from helpers import tiny_config  # noqa: E402
from toy import CategoricalPolicy, TargetWordEnv  # noqa: E402

from textzoo.algorithms.batch import Job  # noqa: E402
from textzoo.algorithms.preference.config import PreferenceConfig  # noqa: E402
from textzoo.algorithms.preference.madpo import PairBatch  # noqa: E402
from textzoo.algorithms.preference.reward_model import (  # noqa: E402
    HackingMonitor,
    RewardModel,
    agreement,
    encode_texts,
    joint_texts,
    member_scores,
    pair_accuracy,
    relabel,
    reward_model_loss,
    scores,
)
from textzoo.algorithms.preference.rounds import build_reward_model, fit_reward_model  # noqa: E402
from textzoo.algorithms.reinforce.family import ReinforceConfig, ReinforceFamily  # noqa: E402
from textzoo.algorithms.rlmath import credited_rewards  # noqa: E402
from textzoo.config import AgentConfig, TrainConfig  # noqa: E402
from textzoo.models.critic import Critic  # noqa: E402
from textzoo.models.policy import Policy  # noqa: E402
from textzoo.models.team import AgentActor  # noqa: E402
from textzoo.models.tokenizer import byte_tokenizer  # noqa: E402
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
    cfg = tiny_config(
        algo="marlhf",
        preference=PreferenceConfig(rl_algo="marloo", iterations=2),
        group_size=3,
        env_kwargs={"terms": {"length_ratio": 1.0}, "max_prompt_chars": 128},
        agent=AgentConfig(max_new_tokens=6, n_layer=1, n_embd=32),
        eval_prompts=1,
    )
    cfg.preference.rm_batches = 1
    history = Trainer(cfg, run_dir=tmp_path).train()
    first, second = history[1], history[2]
    for row in (first, second):
        assert {"reward/rm", "reward/task/mean", "reward/task/length_ratio", "rm/heldout_accuracy"} <= set(row)
        # agreement with the task on the step's fresh episodes, and the episodes spent on reward-model pairs
        assert {"rm/pearson", "rm/spearman", "rm/group_accuracy", "rm/epochs"} <= set(row)
        assert row["rm/episodes"] == 2 * 3 * (row["round"] + 1)  # rm_batches x batch_prompts x group_size a round
        assert row["reward/mean"] == pytest.approx(row["reward/rm"], abs=1e-6)
        # the reward model's scores differ between samples, so the online family took its step on them
        # (constant rewards would give zero advantages and a skipped step)
        assert row["agent/summary/optimizer_steps"] == 1 and row["agent/summary/skipped_zero_grad"] == 0
    assert second["round"] == 1 and first["round"] == 0


# ---- reward-model options: each does what it claims ------------------------------------------
def tiny_member(seed: int = 0, frozen_trunk=None) -> Critic:
    policy = frozen_trunk or Policy.tiny(n_layer=1, n_embd=32, seed=seed)
    if frozen_trunk is not None:
        policy.model.eval().requires_grad_(False)
    return Critic.from_policy(policy, max_tokens=64, seed=seed, shared_trunk=frozen_trunk is not None)


def test_pooling_reads_the_mean_or_the_last_token():
    member = tiny_member()
    torch.nn.init.normal_(member.head[-1].weight, generator=torch.Generator().manual_seed(0))
    texts = ["a short one", "a much longer text with many more words in it"]
    ids, mask = member.encode(texts)  # left-padded [2, L]
    with torch.no_grad():
        mean = RewardModel([member], "mean")(ids, mask)[0]
        last = RewardModel([member], "last")(ids, mask)[0]
        for i, text in enumerate(texts):  # each text alone, unpadded: per-token values by hand
            one, one_mask = member.encode([text])
            hidden = member.trunk(input_ids=one, attention_mask=one_mask, use_cache=False).last_hidden_state
            values = member.value(hidden)[0]  # [L_i]
            assert mean[i] == pytest.approx(float(values.mean()), abs=1e-5)
            assert last[i] == pytest.approx(float(values[-1]), abs=1e-5)


def test_the_reward_model_reads_its_trunk_at_the_actors_precision():
    member = Critic.from_policy(Policy.tiny("llama", n_layer=1, n_embd=32, seed=0), max_tokens=64, seed=0)
    member.autocast = torch.bfloat16  # what an actor's bf16-mixed precision hands its critics
    dtypes = []
    linear = next(m for m in member.trunk.modules() if isinstance(m, torch.nn.Linear))
    linear.register_forward_hook(lambda module, inputs, out: dtypes.append(out.dtype))
    ids, mask = member.encode(["a joint text"])
    RewardModel([member], "mean")(ids, mask)
    assert dtypes == [torch.bfloat16]


def fit_once(model: RewardModel, pairs: PairBatch, epochs: int = 1) -> None:
    learner = Learner(model, torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2))
    job = Job("rm", pairs, lambda b, n: reward_model_loss(model, b, n), epochs=epochs, minibatches=2)
    run_job(job, learner, UpdateConfig(), generator=torch.Generator().manual_seed(0))


def snapshot(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


@pytest.mark.parametrize("train_trunk", [False, True])
def test_frozen_trunk_trains_only_the_head(train_trunk):
    cfg = TrainConfig(algo="marlhf", agent=AgentConfig(n_layer=1, n_embd=32))
    cfg.preference.rm_train_trunk = train_trunk
    cfg.preference.rm_max_tokens = 64
    rm, _ = build_reward_model(cfg, [], torch.device("cpu"))
    member = rm.members[0]
    trunk, head = snapshot(member.trunk), snapshot(member.head)
    assert any(k.startswith("members.0.trunk") for k in rm.state_dict()) == train_trunk
    fit_once(rm, separable_pairs(member, 16, seed=0))
    moved = [not torch.equal(v, member.trunk.state_dict()[k]) for k, v in trunk.items()]
    assert any(moved) == train_trunk
    assert any(not torch.equal(v, member.head.state_dict()[k]) for k, v in head.items())


def test_actor_trunk_starts_as_the_first_actor_and_stays_its_own():
    actor = AgentActor("summary", Policy.tiny(n_layer=1, n_embd=32, seed=3))
    cfg = TrainConfig(algo="marlhf", agent=AgentConfig(n_layer=1, n_embd=32))
    cfg.preference.reward_model, cfg.preference.rm_ensemble, cfg.preference.rm_train_trunk = "actor", 2, False
    rm, _ = build_reward_model(cfg, [actor], torch.device("cpu"))
    a, b = rm.members
    assert a.trunk is b.trunk  # two heads on one frozen copy: the trunk runs once per text
    weights = actor.policy.model.base_model.state_dict()
    for k, v in a.trunk.state_dict().items():
        assert torch.equal(v, weights[k]) and v.data_ptr() != weights[k].data_ptr()


def test_ensemble_members_fit_their_own_bootstrap_weights_and_disagreement_is_penalised():
    trunk = Policy.tiny(n_layer=1, n_embd=32, seed=0)
    rm = RewardModel([tiny_member(0, trunk), tiny_member(1, trunk)], "mean", disagreement_penalty=0.5)
    pairs = separable_pairs(rm.members[0], 16, seed=0)
    pairs.extra["bootstrap"] = torch.tensor([[2.0, 0.0]]).repeat(len(pairs), 1)  # member 1 sees no pair
    heads = [snapshot(m.head) for m in rm.members]
    fit_once(rm, pairs)
    assert not torch.equal(heads[0]["0.weight"], rm.members[0].head.state_dict()["0.weight"])
    assert torch.equal(heads[1]["0.weight"], rm.members[1].head.state_dict()["0.weight"])
    members = member_scores(rm, pairs.chosen)  # [2, S]; member 1 is still all zeros
    assert torch.equal(members[1], torch.zeros(len(pairs)))
    # reward = mean − λ·std = s/2 − 0.5·|s|/2 over members (s, 0)
    s = members[0]
    assert torch.allclose(scores(rm, pairs.chosen), s / 2 - 0.5 * s.abs() / 2, atol=1e-6)


def test_early_stopping_keeps_the_epoch_with_the_best_heldout_accuracy():
    def model():
        return RewardModel([tiny_member(0)], "last")

    stopped, plain = model(), model()
    train = separable_pairs(stopped.members[0], 24, seed=0)
    held = PairBatch(train.rejected, train.chosen)  # held-out raters reverse every training pair
    start = snapshot(stopped)
    for rm, early in ((stopped, True), (plain, False)):
        learner = Learner(rm, torch.optim.AdamW(rm.parameters(), lr=3e-3))
        epoch, losses = fit_reward_model(rm, learner, train, held, 4, 2, early, partial(run_job, cfg=UpdateConfig()))
        assert len(losses) == 4
        assert epoch == (0 if early else 4)
    assert all(torch.equal(v, stopped.state_dict()[k]) for k, v in start.items())  # epoch 0: as it came
    assert pair_accuracy(stopped, held) == 0.5 and pair_accuracy(plain, held) < 0.5


def test_agreement_of_a_faithful_and_a_reversed_reward_model():
    task = torch.tensor([0.0, 1.0, 0.5, 0.2, 0.9, 0.4])  # two prompts x three samples
    faithful, reversed_ = agreement(2 * task + 1, task, 3), agreement(-task, task, 3)
    assert faithful == pytest.approx({"pearson": 1.0, "spearman": 1.0, "group_accuracy": 1.0})
    assert reversed_ == pytest.approx({"pearson": -1.0, "spearman": -1.0, "group_accuracy": 0.0})


# ---- the hacking warning: an RM that prefers what the task punishes, and a faithful one -------
WORDS = ["red", "green", "blue", "gold", "pink"]


def train_on_reward_model(score, caplog, steps: int = 40) -> HackingMonitor:
    """Toy agents trained by GRPO on `score(joint texts)` in place of the task reward."""
    torch.manual_seed(0)
    targets = {"a": "gold", "b": "red"}
    actors = [AgentActor(r, CategoricalPolicy(WORDS)) for r in targets]
    collector = Collector(lambda: TargetWordEnv(targets), actors)
    family = ReinforceFamily(ReinforceConfig(), actors, "grpo", credit="per_agent", group_size=8)
    learners = {a.id: Learner(a.policy.model, torch.optim.AdamW(a.policy.model.parameters(), lr=0.1)) for a in actors}
    monitor = HackingMonitor(window=10, threshold=0.5)
    with caplog.at_level(logging.WARNING, logger="textzoo.algorithms.preference.reward_model"):
        for step in range(steps):
            rollout = collector.collect(list(range(4)), [step * 10 + b for b in range(4)], 8)
            task = rollout.team_rewards.sum(-1)
            rollout = relabel(rollout, score)
            monitor.update(step + 1, float(rollout.team_rewards.sum(-1).mean()), float(task.mean()))
            for job in family.jobs(rollout)[0]:
                run_job(job, learners[job.learner], UpdateConfig())
    return monitor


def test_hacking_warning_fires_when_the_reward_model_prefers_what_the_task_punishes(caplog):
    # the model rewards agent a for "pink"; the task rewards a for "gold" only
    train_on_reward_model(lambda texts: torch.tensor([float("<a action>\npink" in t) for t in texts]), caplog)
    warnings = [r for r in caplog.records if "reward hacking" in r.getMessage()]
    assert len(warnings) >= 1
    assert len(warnings) <= 3  # once per episode of hacking, not once per step


def test_hacking_warning_stays_quiet_on_a_faithful_reward_model(caplog):
    def task_reward(texts):
        return torch.tensor([("<a action>\ngold" in t) + ("<b action>\nred" in t) / 1.0 for t in texts])

    monitor = train_on_reward_model(task_reward, caplog)
    assert not [r for r in caplog.records if "reward hacking" in r.getMessage()]
    assert not monitor.firing and len(monitor.rm) == monitor.window


def test_hacking_monitor_state_round_trips():
    monitor = HackingMonitor(window=3, threshold=0.5)
    for step, (rm, task) in enumerate([(0.0, 1.0), (1.0, 0.5), (2.0, 0.0)]):
        out = monitor.update(step, rm, task)
    assert out["rm/hacking"] == 1.0 and monitor.firing
    other = HackingMonitor(window=3, threshold=0.5)
    other.load_state_dict(monitor.state_dict())
    assert other.update(3, 3.0, -0.5) == monitor.update(3, 3.0, -0.5)


def test_held_out_pairs_come_from_prompts_the_model_never_trains_on(monkeypatch):
    import re
    from types import SimpleNamespace

    import textzoo.algorithms.preference.rounds as pipeline

    cfg = TrainConfig(algo="marlhf", batch_prompts=5, group_size=4, steps=2)
    cfg.preference.rm_batches, cfg.preference.rm_holdout = 2, 0.3
    # the rounds are built as a run builds them, on a stand-in run: a tiny reward model, no learner (the fit
    # is captured below), no comparator
    monkeypatch.setattr(pipeline, "build_reward_model", lambda *a: (RewardModel([tiny_member(0)], "mean"), None))
    device = SimpleNamespace(policy=SimpleNamespace(device=torch.device("cpu")))
    built = SimpleNamespace(actors=[device], build_learner=lambda *a: None, run_job=None)
    rounds = pipeline.RewardModelRounds(cfg, built)
    assert rounds.comparator is None and rounds.rm_learner is None
    targets = {"p0": "alpha", "p1": "beta"}
    actors = [AgentActor(r, CategoricalPolicy(["alpha", "beta"])) for r in targets]
    collector = Collector(lambda: TargetWordEnv(targets, items=10), actors)
    monkeypatch.setattr(rounds, "candidates", lambda run, items, seeds: collector.collect(items, seeds, 4))
    items = iter(range(10))
    run = SimpleNamespace(sampler=SimpleNamespace(next=lambda n: [next(items) for _ in range(n)]))
    seen = {}
    monkeypatch.setattr(
        pipeline,
        "fit_reward_model",
        lambda rm, learner, train, holdout, *a: seen.update(train=train, holdout=holdout) or (0, []),
    )
    torch.manual_seed(0)
    rounds.train_reward_model(run, 0)

    def prompts(pairs):
        return {int(re.search(r"\((\d+)\)", t).group(1)) for t in pairs.chosen.texts + pairs.rejected.texts}

    held, train = prompts(seen["holdout"]), prompts(seen["train"])
    assert len(held) == 3 and held.isdisjoint(train)  # round(10 prompts x 0.3), every pair of each
    assert rounds.round_stats["rm/heldout_pairs"] == len(seen["holdout"]) > 0
