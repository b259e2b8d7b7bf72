"""The REINFORCE family's math against hand-computed values, and learning to known optima."""

import math

import pytest
import torch

torch.set_num_threads(1)

from toy import CategoricalPolicy, TargetWordEnv  # noqa: E402

from textzoo.agents.batch import SampleBatch  # noqa: E402
from textzoo.agents.losses import BatchNorm, k3_kl, policy_gradient_loss  # noqa: E402
from textzoo.agents.reinforce import (  # noqa: E402
    ReinforceConfig,
    ReinforceFamily,
    advantages,
    cross_returns,
    discounted_returns,
    normalize_over_batch,
)
from textzoo.agents.team import AgentActor  # noqa: E402
from textzoo.errors import ConfigError  # noqa: E402
from textzoo.runners.rollout import Collector  # noqa: E402
from textzoo.runners.update import Learner, UpdateConfig, run_job  # noqa: E402


def group(values):
    """[G] rewards of one prompt, one agent, one turn -> [B=1, G, A=1, T=1]."""
    return torch.tensor(values, dtype=torch.float32).view(1, -1, 1, 1)


R = [1.0, 0.0, 0.5, 0.5]
ONES = torch.ones(1, 4, 1, 1)


def test_discounted_returns_by_hand():
    r = torch.tensor([[1.0, 0.0, 2.0]])
    assert torch.allclose(discounted_returns(r, 0.5), torch.tensor([[1.5, 1.0, 2.0]]))
    assert torch.allclose(discounted_returns(r, 1.0), torch.tensor([[3.0, 2.0, 2.0]]))
    assert torch.allclose(discounted_returns(r, 0.0), r)


def test_grpo_by_hand():
    adv = advantages(group(R), ONES, "grpo", scale="none").flatten()
    assert torch.allclose(adv, torch.tensor([0.5, -0.5, 0.0, 0.0]))
    std = math.sqrt((0.25 + 0.25) / 3)  # unbiased std of the group
    adv = advantages(group(R), ONES, "grpo", scale="std").flatten()
    assert torch.allclose(adv, torch.tensor([0.5, -0.5, 0.0, 0.0]) / (std + 1e-6), atol=1e-6)


def test_rloo_by_hand():
    adv = advantages(group(R), ONES, "rloo", scale="none").flatten()
    # baseline of sample g is the mean of the other three
    assert torch.allclose(adv, torch.tensor([1 - 1 / 3, 0 - 2 / 3, 0.5 - 0.5, 0.5 - 0.5]))


def test_remax_and_reinforce_by_hand():
    greedy = torch.tensor([0.25]).view(1, 1, 1)
    adv = advantages(group(R), ONES, "remax", scale="none", greedy_returns=greedy).flatten()
    assert torch.allclose(adv, torch.tensor([0.75, -0.25, 0.25, 0.25]))
    assert torch.allclose(advantages(group(R), ONES, "reinforce", scale="none").flatten(), torch.tensor(R))
    running = torch.tensor([[0.4]])
    adv = advantages(group(R), ONES, "reinforce", scale="none", running_mean=running).flatten()
    assert torch.allclose(adv, torch.tensor(R) - 0.4)


def test_four_estimators_differ_on_same_rewards():
    greedy = torch.tensor([0.25]).view(1, 1, 1)
    out = {
        e: advantages(group(R), ONES, e, scale="std", greedy_returns=greedy).flatten()
        for e in ("grpo", "rloo", "remax", "reinforce")
    }
    names = list(out)
    for i in range(4):
        for j in range(i + 1, 4):
            assert not torch.allclose(out[names[i]], out[names[j]]), (names[i], names[j])


def test_zero_variance_group_has_zero_advantage():
    for est in ("grpo", "rloo"):
        adv = advantages(group([0.7] * 4), ONES, est, scale="std")
        assert torch.count_nonzero(adv) == 0


def test_std_floor_bounds_the_scale():
    adv = advantages(group([1.0, 0.0, 0.0, 0.0]), ONES, "grpo", scale="std", std_floor=10.0).flatten()
    assert torch.allclose(adv, torch.tensor([0.75, -0.25, -0.25, -0.25]) / (10.0 + 1e-6))


def test_inactive_samples_are_left_out_of_the_group():
    mask = torch.tensor([1.0, 1.0, 0.0, 0.0]).view(1, 4, 1, 1)
    adv = advantages(group([1.0, 0.0, 5.0, 5.0]), mask, "grpo", scale="none").flatten()
    assert torch.allclose(adv, torch.tensor([0.5, -0.5, 0.0, 0.0]))


def test_cross_mode_means_over_partners():
    # G=2, A=2; combination (g1, g2) row-major: (0,0), (0,1), (1,0), (1,1)
    credited = torch.tensor([[[1.0, 1.0], [0.0, 0.0], [0.5, 0.5], [0.25, 0.25]]])  # [B=1, 4, A=2]
    out = cross_returns(credited, 2)  # [1, G, A]
    # agent 0 sample 0: mean of (0,0),(0,1) = 0.5; sample 1: mean of (1,0),(1,1) = 0.375
    # agent 1 sample 0: mean of (0,0),(1,0) = 0.75; sample 1: mean of (0,1),(1,1) = 0.125
    assert torch.allclose(out[0], torch.tensor([[0.5, 0.75], [0.375, 0.125]]))


def test_normalize_over_batch():
    adv = torch.tensor([1.0, 2.0, 3.0, 4.0]).view(1, 4, 1, 1)
    out = normalize_over_batch(adv, ONES).flatten()
    assert abs(float(out.mean())) < 1e-6
    assert torch.allclose(out.pow(2).mean(), torch.tensor(1.0), atol=1e-4)


def test_config_errors_name_the_field():
    with pytest.raises(ConfigError, match="clip_range"):
        ReinforceConfig(epochs=2)
    with pytest.raises(ConfigError, match="loss_aggregation"):
        ReinforceConfig(loss_aggregation="sum")
    with pytest.raises(ConfigError, match="group_size"):
        ReinforceFamily(ReinforceConfig(), [], "grpo", group_size=1)


# ---- losses ---------------------------------------------------------------------------------------
def test_aggregations_by_hand():
    token_loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    norm = BatchNorm(2, 4, 8)
    from textzoo.agents.losses import AGGREGATIONS

    assert torch.allclose(AGGREGATIONS["seq_sum"](token_loss, mask, norm), torch.tensor([3.0, 2.0]))
    assert torch.allclose(AGGREGATIONS["seq_mean"](token_loss, mask, norm), torch.tensor([1.0, 2.0]))
    assert torch.allclose(AGGREGATIONS["token_mean"](token_loss, mask, norm), torch.tensor([1.5, 1.0]))
    assert torch.allclose(AGGREGATIONS["constant"](token_loss, mask, norm), torch.tensor([6 / 16, 4 / 16]))


def test_policy_gradient_matches_analytic_reinforce_gradient():
    theta = torch.tensor([0.2, -0.4, 1.0], requires_grad=True)
    tokens = torch.tensor([0, 2, 2, 1])
    adv = torch.tensor([1.5, -0.5, 0.25, 2.0])
    logp = torch.log_softmax(theta, -1)[tokens].view(4, 1)
    mask = torch.ones(4, 1)
    contrib, _ = policy_gradient_loss(logp, logp.detach(), adv, mask, BatchNorm(4, 4, 1))
    contrib.sum().backward()
    pi = torch.softmax(theta.detach(), -1)
    # d/dθ of −(1/S) Σ A_s log π(y_s) = −(1/S) Σ A_s (onehot(y_s) − π)
    expected = -sum(a * (torch.nn.functional.one_hot(t, 3).float() - pi) for a, t in zip(adv, tokens)) / 4
    assert torch.allclose(theta.grad, expected, atol=1e-6)


def test_clipped_ratio_gives_no_gradient_outside_the_trust_region():
    theta = torch.tensor([0.0, 0.0], requires_grad=True)
    logp = torch.log_softmax(theta, -1)[0].view(1, 1)
    old = logp.detach() - 1.0  # ratio e ≈ 2.7 > 1 + ε
    contrib, stats = policy_gradient_loss(
        logp, old, torch.tensor([1.0]), torch.ones(1, 1), BatchNorm(1, 1, 1), clip_range=0.2
    )
    contrib.sum().backward()
    assert torch.count_nonzero(theta.grad) == 0
    assert float(stats["clipfrac"]) == 1.0
    assert torch.allclose(contrib, torch.tensor([-1.2]))


def test_masked_tokens_contribute_nothing():
    logp = torch.tensor([[-1.0, -2.0, -3.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    contrib, _ = policy_gradient_loss(logp, logp.detach(), torch.tensor([1.0]), mask, BatchNorm(1, 2, 3))
    contrib.sum().backward()
    assert torch.allclose(contrib, torch.tensor([3.0]))
    assert logp.grad[0, 2] == 0


def test_k3_kl_by_hand():
    lp = torch.tensor([[-1.0, -2.0]])
    ref = torch.tensor([[-1.5, -1.0]])
    d = ref - lp
    expected = (torch.exp(d) - d - 1).sum()
    assert torch.allclose(k3_kl(lp, ref, torch.ones(1, 2)), expected.view(1))
    assert float(k3_kl(lp, lp, torch.ones(1, 2))) == 0.0


# ---- update mechanics -----------------------------------------------------------------------------
def _tiny_batch(policy, n=6):
    torch.manual_seed(0)
    gen = policy.generate([f"prompt {i} " * (i + 1) for i in range(n)])
    return SampleBatch(gen, torch.linspace(-1, 1, n))


def _learner(model, lr=1e-2):
    return Learner(model, torch.optim.AdamW(model.parameters(), lr=lr), max_grad_norm=None)


def test_per_sample_backward_equals_batched_gradient():
    from textzoo.agents.batch import Job
    from textzoo.agents.policy import Policy
    from textzoo.agents.reinforce import reinforce_loss

    policy = Policy.tiny(seed=1)
    batch = _tiny_batch(policy)
    cfg = ReinforceConfig(loss_aggregation="token_mean")
    grads = []
    for per_sample in (False, True):
        learner = _learner(policy.model)
        job = Job("a", batch, lambda b, n: reinforce_loss(policy, cfg, b, n), max_new_tokens=32)
        learner.optimizer.step = lambda: None  # keep weights: compare the gradients only
        run_job(job, learner, UpdateConfig(micro_batch_size=64, per_sample_backward=per_sample))
        grads.append(torch.cat([p.grad.flatten() for p in learner.params]))
    assert torch.allclose(grads[0], grads[1], atol=1e-6, rtol=1e-4)
    assert grads[0].abs().sum() > 0


def test_zero_signal_batch_leaves_weights_and_optimizer_untouched():
    from textzoo.agents.batch import Job
    from textzoo.agents.policy import Policy
    from textzoo.agents.reinforce import reinforce_loss

    policy = Policy.tiny(seed=2)
    batch = _tiny_batch(policy)
    batch.advantages = torch.zeros(len(batch))
    learner = Learner(policy.model, torch.optim.AdamW(policy.model.parameters(), lr=1e-2, weight_decay=0.1))
    before = {k: v.clone() for k, v in policy.model.state_dict().items()}
    job = Job("a", batch, lambda b, n: reinforce_loss(policy, ReinforceConfig(), b, n), max_new_tokens=32)
    stats = run_job(job, learner, UpdateConfig(skip_zero_grad_steps=True))
    assert stats["skipped_zero_grad"] == 1 and stats["optimizer_steps"] == 0
    assert all(torch.equal(before[k], v) for k, v in policy.model.state_dict().items())
    assert learner.optimizer.state_dict()["state"] == {}
    assert learner.version == 0


def test_nonfinite_sample_is_skipped_and_counted():
    from textzoo.agents.batch import Job

    policy = CategoricalPolicy(["a", "b"])
    gen = policy.generate(["x", "y", "z"])
    batch = SampleBatch(gen, torch.tensor([1.0, float("nan"), -1.0]))

    def loss(b, n):
        lp = policy.score(b.gen.prompt_ids, b.gen.prompt_mask, b.gen.completion_ids, b.gen.completion_mask)
        return policy_gradient_loss(lp, b.gen.logprobs, b.advantages, b.gen.completion_mask, n)

    learner = _learner(policy.model)
    stats = run_job(Job("a", batch, loss, max_new_tokens=1), learner, UpdateConfig(per_sample_backward=True))
    assert stats["nonfinite_skipped"] == 1
    assert stats["optimizer_steps"] == 1
    assert torch.isfinite(policy.model.logits).all()


# ---- learning known optima through the real collector -----------------------------------------
WORDS = ["red", "green", "blue", "gold", "pink"]


@pytest.mark.parametrize("n_agents", [1, 2, 4])
@pytest.mark.parametrize("credit", ["per_agent", "shared"])
def test_agents_learn_their_own_targets(n_agents, credit):
    torch.manual_seed(0)
    targets = {f"agent{i}": WORDS[i] for i in range(n_agents)}
    actors = [AgentActor(a, CategoricalPolicy(WORDS)) for a in targets]
    collector = Collector(lambda: TargetWordEnv(targets), actors)
    family = ReinforceFamily(ReinforceConfig(), actors, "grpo", credit=credit, group_size=8)
    learners = {a.id: _learner(a.policy.model, lr=0.1) for a in actors}
    for step in range(60):
        rollout = collector.collect(list(range(4)), [step * 10 + b for b in range(4)], 8)
        jobs, _ = family.jobs(rollout)
        for job in jobs:
            run_job(job, learners[job.learner], UpdateConfig())
    for a in actors:
        p = a.policy.probs()[WORDS.index(targets[a.id])]
        assert p > 0.9, (a.id, credit, a.policy.probs())


@pytest.mark.parametrize("estimator", ["rloo", "remax", "reinforce"])
def test_every_estimator_learns(estimator):
    torch.manual_seed(0)
    targets = {"a": "gold", "b": "red"}
    actors = [AgentActor(a, CategoricalPolicy(WORDS)) for a in targets]
    collector = Collector(lambda: TargetWordEnv(targets), actors)
    cfg = ReinforceConfig(advantage_scale="none")
    family = ReinforceFamily(cfg, actors, estimator, credit="per_agent", group_size=4)
    learners = {a.id: _learner(a.policy.model, lr=0.1) for a in actors}
    for step in range(80):
        items, seeds = list(range(4)), [step * 10 + b for b in range(4)]
        rollout = collector.collect(items, seeds, 4)
        if family.needs_greedy_baseline:
            rollout.greedy = collector.collect(items, seeds, 1, greedy=True)
        for job in family.jobs(rollout)[0]:
            run_job(job, learners[job.learner], UpdateConfig())
    for a in actors:
        assert a.policy.probs()[WORDS.index(targets[a.id])] > 0.8, (estimator, a.id, a.policy.probs())


def test_cross_mode_learns_through_the_collector():
    torch.manual_seed(0)
    targets = {"a": "blue", "b": "pink"}
    actors = [AgentActor(a, CategoricalPolicy(WORDS)) for a in targets]
    collector = Collector(lambda: TargetWordEnv(targets), actors)
    family = ReinforceFamily(ReinforceConfig(joint_mode="cross"), actors, "grpo", credit="shared", group_size=4)
    learners = {a.id: _learner(a.policy.model, lr=0.1) for a in actors}
    for step in range(50):
        rollout = collector.collect(list(range(2)), [step, step + 1000], 4, cross=True)
        assert rollout.cross_rewards.shape == (2, 16, 2)
        for job in family.jobs(rollout)[0]:
            run_job(job, learners[job.learner], UpdateConfig())
    for a in actors:
        assert a.policy.probs()[WORDS.index(targets[a.id])] > 0.8


def test_kl_shaping_pulls_towards_the_reference():
    torch.manual_seed(0)
    targets = {"a": "none of the words"}  # the task reward is always 0: the KL is the only signal
    actor = AgentActor("a", CategoricalPolicy(WORDS))
    family = ReinforceFamily(ReinforceConfig(kl_coef=0.5, advantage_scale="none"), [actor], "grpo", group_size=8)
    collector = Collector(lambda: TargetWordEnv(targets), [actor])
    rollout = collector.collect([0, 1], [1, 2], 8)
    assert family.jobs(rollout)[1]["agent/a/kl"] == pytest.approx(0.0, abs=1e-7)  # same weights as the reference

    with torch.no_grad():
        actor.policy.model.logits[0] = 3.0  # drift away from the (uniform) reference
    rollout = collector.collect([0, 1], [3, 4], 8)
    jobs, stats = family.jobs(rollout)
    # k3 by hand for each sampled word: d = log π_ref(w) − log π(w); KL = e^d − d − 1
    logp = torch.log_softmax(actor.policy.model.logits.detach(), -1)
    words = jobs[0].batch.gen.completion_ids[:, 0]
    d = torch.log(torch.tensor(1 / len(WORDS))) - logp[words]
    kl = torch.exp(d) - d - 1
    assert stats["agent/a/kl"] == pytest.approx(float(kl.mean()), rel=1e-5)  # logged: k3
    # shaped returns are −β·log(π/π_ref) (k1); GRPO advantages are their deviations from the group mean
    shaped = (-0.5 * -d).view(2, 8)
    expected = (shaped - shaped.mean(1, keepdim=True)).flatten()
    assert torch.allclose(jobs[0].batch.advantages, expected, atol=1e-6)

    learner = _learner(actor.policy.model, lr=0.1)
    start = float(actor.policy.probs()[0])
    for step in range(60):
        rollout = collector.collect([0, 1], [10 * step, 10 * step + 1], 8)
        for job in family.jobs(rollout)[0]:
            run_job(job, learner, UpdateConfig())
    assert start > 0.8 and float(actor.policy.probs()[0]) < 0.5  # back towards the reference's 0.2


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_per_sample_backward_runs_each_prompt_once_with_the_batched_gradient(arch, monkeypatch):
    from textzoo.agents.batch import Job
    from textzoo.agents.policy import GenerationConfig, Policy
    from textzoo.agents.reinforce import reinforce_loss

    policy = Policy.tiny(arch, seed=1, generation=GenerationConfig(max_new_tokens=6))
    prompts = [p for p in ("first prompt", "a second, longer prompt", "x") for _ in range(4)]  # B=3, G=4
    gen = policy.generate(prompts, generator=torch.Generator().manual_seed(0))
    batch = SampleBatch(gen, torch.linspace(-1, 1, len(prompts)))
    cfg = ReinforceConfig(loss_aggregation="seq_mean")
    fast = policy.backend().decoder
    calls = []
    prefill = fast.prefill
    monkeypatch.setattr(fast, "prefill", lambda ids, *a: calls.append(ids.shape[0]) or prefill(ids, *a))
    grads = {}
    for name, per_sample, cache in (
        ("batched", False, None),
        ("per-sample", True, None),
        ("per-sample, shared prompts", True, policy.prompt_cache),
    ):
        learner = _learner(policy.model)
        learner.optimizer.step = lambda: None  # keep weights: compare the gradients only
        calls.clear()
        job = Job("a", batch, lambda b, n: reinforce_loss(policy, cfg, b, n), max_new_tokens=6, prompt_cache=cache)
        run_job(job, learner, UpdateConfig(micro_batch_size=64, per_sample_backward=per_sample))
        grads[name] = torch.cat([p.grad.flatten() for p in learner.params])
        if name == "per-sample":
            assert calls == [1] * 12  # every sample ran its prompt
        if name == "per-sample, shared prompts":
            assert calls == [1, 1, 1]  # each prompt once for its 4 samples
    for name in ("per-sample", "per-sample, shared prompts"):
        torch.testing.assert_close(grads[name], grads["batched"], atol=1e-6, rtol=1e-4, msg=name)
    assert grads["batched"].abs().sum() > 0
    assert policy.backends().plain._prompt_cache is None  # the context closed
