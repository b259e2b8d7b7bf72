"""Heterogeneous N-agent teams on Refine-v0: per-agent credit, shared credit, N = 1..4, frozen and
alternating agents, weight versions, clip targets, and a GPT-2 + Llama team with two tokenizers.

Learning checks use tiny categorical refiners (tests/toy.py) and a categorical "copy or not"
generator, whose optimum is known: refiner i should say its own keyword (of five words, so p starts
at 0.2), the generator should copy the refined prompt. Runner checks use real tiny LLMs through the `Trainer`.
"""

import json

import pytest
import torch
import tyro

torch.set_num_threads(1)

from helpers import tiny_config  # noqa: E402
from toy import CategoricalPolicy  # noqa: E402

from textzoo.algorithms.reinforce.family import ReinforceConfig, ReinforceFamily  # noqa: E402
from textzoo.algorithms.rlmath import credited_rewards  # noqa: E402
from textzoo.config import AgentConfig, LoRAConfig, TrainConfig  # noqa: E402
from textzoo.envs import make  # noqa: E402
from textzoo.errors import ConfigError  # noqa: E402
from textzoo.models.team import AgentActor  # noqa: E402
from textzoo.models.tokenizer import byte_tokenizer  # noqa: E402
from textzoo.runners.build import build_learner  # noqa: E402
from textzoo.runners.rollout import Collector  # noqa: E402
from textzoo.runners.schedule import build_schedule  # noqa: E402
from textzoo.runners.trainer import Trainer  # noqa: E402
from textzoo.runners.update import UpdateConfig, run_job  # noqa: E402

KEYWORDS = ["apple", "river", "green", "tiger"]
FILLERS = ["none", "maybe", "hello", "thanks"]
COPY = "<copy>"


class CopyPolicy(CategoricalPolicy):
    """A generator over {copy the prompt, answer "nothing"}: copying passes the refiners' words on."""

    def __init__(self, copy_logit: float = 0.0):
        super().__init__([COPY, "nothing"])
        with torch.no_grad():
            self.model.logits[0] = copy_logit

    def generate(self, prompts, *, greedy=False, generator=None):
        gen = super().generate(prompts, greedy=greedy, generator=generator)
        gen.texts = [p if t == COPY else t for p, t in zip(prompts, gen.texts)]
        return gen


def toy_team(n: int, generator_trainable: bool = True, copy_logit: float = 0.0):
    # refiner i says its keyword or a filler: like the env's refiners, it alone knows keyword i
    policies = [CategoricalPolicy([KEYWORDS[i], *FILLERS]) for i in range(n)] + [CopyPolicy(copy_logit)]
    for policy in policies:
        policy.tokenizer = byte_tokenizer()  # the collector measures action lengths in tokens
    actors = [AgentActor(f"refiner_{i}", p) for i, p in enumerate(policies[:n])]
    return [*actors, AgentActor("generator", policies[-1], trainable=generator_trainable)]


def target_prob(actor: AgentActor, i: int) -> float:
    return float(actor.policy.probs()[actor.policy.words.index(KEYWORDS[i])])


def train_toy(actors, credit: str, steps: int, trainable_agents=(), every: int = 0, seed: int = 0):
    """Collect -> jobs -> (schedule) -> run_job, as the trainer does; return learners and per-step stats."""
    torch.manual_seed(seed)
    n = len(actors) - 1
    env_fn = lambda: make("textzoo/Refine-v0", num_refiners=n, keywords=[[k] for k in KEYWORDS[:n]])  # noqa: E731
    collector = Collector(env_fn, actors)
    family = ReinforceFamily(ReinforceConfig(), actors, "grpo", credit=credit, group_size=8)
    # each agent its own clip target, as agent_overrides would give
    learners = {
        a.id: build_learner(a.policy.model, AgentConfig(lr=0.1, max_grad_norm=1.0 + i), steps)
        for i, a in enumerate(actors)
        if a.trainable
    }
    schedule = build_schedule(trainable_agents, every, [a.id for a in actors], learners)
    history = []
    for step in range(steps):
        rollout = collector.collect(list(range(4)), [step * 10 + b for b in range(4)], 8)
        jobs, _ = family.jobs(rollout)
        stats = {
            job.learner: run_job(job, learners[job.learner], UpdateConfig()) for job in schedule.filter(jobs, step)
        }
        history.append(
            {
                "team": float(rollout.team_rewards.sum(-1).mean()),
                "stats": stats,
                "versions": {k: v.version for k, v in learners.items()},
            }
        )
    return learners, history


# ---- learning: the N-expert scenario with known optima ---------------------------------------
@pytest.mark.parametrize("n", [1, 3, 4])
def test_per_agent_credit_every_refiner_learns_its_own_keyword(n):
    actors = toy_team(n)
    before = [target_prob(a, i) for i, a in enumerate(actors[:n])]
    copy_before = float(actors[-1].policy.probs()[0])
    learners, history = train_toy(actors, "per_agent", steps=40)
    after = [target_prob(a, i) for i, a in enumerate(actors[:n])]
    copy_after = float(actors[-1].policy.probs()[0])
    print(
        f"\nper_agent N={n}: target p {[round(p, 3) for p in before]} -> {[round(p, 3) for p in after]}, "
        f"generator p(copy) {copy_before:.3f} -> {copy_after:.3f}, team reward "
        f"{history[0]['team']:.3f} -> {history[-1]['team']:.3f}, versions {history[-1]['versions']}"
    )
    for i in range(n):
        assert after[i] > 0.5 and after[i] - before[i] > 0.2, (i, before[i], after[i])
    assert copy_after > copy_before + 0.2  # the generator learns to pass the refiners' words on
    # every expert has its own version: its own optimizer steps, counted by its own learner
    assert set(learners) == {a.id for a in actors}
    for agent_id, learner in learners.items():
        steps = sum(h["stats"][agent_id]["optimizer_steps"] for h in history if agent_id in h["stats"])
        assert learner.version == steps > 0
    assert [learners[a.id].max_grad_norm for a in actors] == [1.0 + i for i in range(n + 1)]


def test_shared_credit_runs_with_independent_versions_and_an_expert_learns():
    n = 3
    actors = toy_team(n)
    before = [target_prob(a, i) for i, a in enumerate(actors[:n])]
    learners, history = train_toy(actors, "shared", steps=40)
    after = [target_prob(a, i) for i, a in enumerate(actors[:n])]
    print(
        f"\nshared N={n}: target p {[round(p, 3) for p in before]} -> {[round(p, 3) for p in after]}, "
        f"team reward {history[0]['team']:.3f} -> {history[-1]['team']:.3f}, versions {history[-1]['versions']}"
    )
    assert any(a > 0.5 and a - b > 0.2 for a, b in zip(after, before))
    for agent_id, learner in learners.items():
        steps = sum(h["stats"][agent_id]["optimizer_steps"] for h in history if agent_id in h["stats"])
        assert learner.version == steps
    assert len({id(learner) for learner in learners.values()}) == n + 1


def test_frozen_generator_is_bit_identical_and_refiners_still_learn():
    n = 2
    actors = toy_team(n, generator_trainable=False, copy_logit=2.0)
    generator = actors[-1].policy.model.logits.detach().clone()
    before = [target_prob(a, i) for i, a in enumerate(actors[:n])]
    learners, history = train_toy(actors, "per_agent", steps=30)
    after = [target_prob(a, i) for i, a in enumerate(actors[:n])]
    print(f"\nprompt-only N={n}: target p {[round(p, 3) for p in before]} -> {[round(p, 3) for p in after]}")
    assert "generator" not in learners and all("generator" not in h["stats"] for h in history)
    assert torch.equal(actors[-1].policy.model.logits, generator)
    for i in range(n):
        assert after[i] > 0.5 and after[i] - before[i] > 0.2


def test_schedule_freezes_an_agent_without_loss_step_or_version_bump():
    actors = toy_team(2)
    generator = actors[-1].policy.model.logits.detach().clone()
    learners, history = train_toy(actors, "per_agent", steps=30, trainable_agents=("refiner_0", "refiner_1"))
    assert learners["generator"].version == 0 and all("generator" not in h["stats"] for h in history)
    assert torch.equal(actors[-1].policy.model.logits, generator)
    assert not learners["generator"].optimizer.state  # no step ever touched its optimizer
    assert all(target_prob(a, i) > 0.5 for i, a in enumerate(actors[:2]))


def test_alternation_trains_one_group_at_a_time():
    actors = toy_team(2)
    _, history = train_toy(actors, "per_agent", steps=6, trainable_agents=("refiner_0+refiner_1", "generator"), every=2)
    trained = [sorted(h["stats"]) for h in history]
    assert trained == [["refiner_0", "refiner_1"]] * 2 + [["generator"]] * 2 + [["refiner_0", "refiner_1"]] * 2
    versions = [h["versions"] for h in history]
    assert [v["generator"] for v in versions] == [0, 0, 1, 2, 2, 2]  # bumped only while it trains


# ---- schedule parsing ------------------------------------------------------------------------
def test_schedule_parsing():
    agents = ["a", "b", "c"]
    s = build_schedule((), 0, agents, agents)
    assert s.at(0) == s.at(7) == {"a", "b", "c"}
    s = build_schedule((), 3, agents, ["a", "c"])  # empty list + alternation: each trainable agent in turn
    assert [sorted(s.at(t)) for t in (0, 2, 3, 6)] == [["a"], ["a"], ["c"], ["a"]]
    s = build_schedule(("a+b", "c"), 1, agents, agents)
    assert s.at(0) == {"a", "b"} and s.at(1) == {"c"}
    s = build_schedule(("b",), 0, agents, agents)
    assert s.at(5) == {"b"}
    for entries, every, trainable, message in [
        (("x",), 0, agents, "not agents"),
        (("a",), 0, ["b"], "trainable=False"),
        (("a", "a+b"), 1, agents, "more than once"),
        ((), 2, [], "no agent is trainable"),
        ((), -1, agents, "alternate_every"),
    ]:
        with pytest.raises(ConfigError, match=message):
            build_schedule(entries, every, agents, trainable)


def test_config_fields_validate_and_parse_on_the_cli():
    with pytest.raises(ConfigError, match="alternate_every"):
        TrainConfig(alternate_every=-1)
    with pytest.raises(ConfigError, match="trainable_agents"):
        TrainConfig(trainable_agents="refiner_0")
    with pytest.raises(ConfigError, match="agent.lora.rank"):
        LoRAConfig(rank=-1)
    overrides = {"generator": {"model": "tiny-llama", "lr": 0.01, "max_grad_norm": 0.5, "trainable": False}}
    cfg = tyro.cli(
        TrainConfig,
        args=[
            "--env",
            "textzoo/Refine-v0",
            "--agent-overrides",
            json.dumps(overrides),
            "--trainable-agents",
            "refiner_0+refiner_1",
            "generator",
            "--alternate-every",
            "3",
        ],
    )
    assert cfg.trainable_agents == ("refiner_0+refiner_1", "generator") and cfg.alternate_every == 3
    gen = cfg.agent_config("generator")
    assert (gen.model, gen.lr, gen.max_grad_norm, gen.trainable) == ("tiny-llama", 0.01, 0.5, False)
    assert cfg.agent_config("refiner_0") == cfg.agent


# ---- the runner, on real tiny LLMs -----------------------------------------------------------
def refine_config(tmp_path, n: int, **kwargs) -> TrainConfig:
    """Refine-v0 with one-letter keywords and a generator restricted to those letters, so rewards vary
    (every agent gets a learning signal) even from random tiny models."""
    letters = "abcd"[:n]
    overrides = {"generator": {"allowed_outputs": [" ".join(letters) + " "], "max_new_tokens": 6}}
    for i in range(n):
        overrides[f"refiner_{i}"] = {"max_grad_norm": 0.25 * (i + 1)}
    for agent, extra in kwargs.pop("agent_overrides", {}).items():
        overrides.setdefault(agent, {}).update(extra)
    base = dict(
        env="textzoo/Refine-v0",
        env_kwargs={"num_refiners": n, "keywords": [[c] for c in letters]},
        agent=AgentConfig(max_new_tokens=4, lr=1e-2),
        agent_overrides=overrides,
        steps=4,
        batch_prompts=4,
        group_size=8,
        eval_prompts=1,
        run_dir=tmp_path,
        credit="per_agent",
    )
    return tiny_config(**{**base, **kwargs})


def weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("n", [1, 4])
def test_runner_is_n_ary(tmp_path, n):
    trainer = Trainer(refine_config(tmp_path, n))
    start = {a.id: weights(a.policy.model) for a in trainer.actors}
    trainer.train()
    last = trainer.history[-1]
    agents = [f"refiner_{i}" for i in range(n)] + ["generator"]
    assert sorted(trainer.learners) == sorted(agents)
    for i, agent in enumerate(agents):
        clip = 0.25 * (i + 1) if agent != "generator" else 1.0
        assert last[f"agent/{agent}/max_grad_norm"] == clip
        own_steps = sum(row.get(f"agent/{agent}/optimizer_steps", 0) for row in trainer.history)
        assert last[f"agent/{agent}/weights_version"] == trainer.learners[agent].version == own_steps > 0
        assert last[f"agent/{agent}/training"] == 1.0
        changed = any(
            not torch.equal(v, start[agent][k]) for k, v in trainer.learners[agent].model.state_dict().items()
        )
        assert changed, agent
    # the collector generated for the refiners in turn 0 and for the generator in turn 1 only
    assert last[f"agent/{agents[0]}/completion_len"] > 0 and last["agent/generator/completion_len"] > 0


@pytest.mark.parametrize("how", ["trainable_false", "trainable_agents"])
def test_prompt_only_mode_freezes_the_generator(tmp_path, how):
    kwargs = (
        {"agent_overrides": {"generator": {"trainable": False}}}
        if how == "trainable_false"
        else {"trainable_agents": ("refiner_0", "refiner_1")}
    )
    trainer = Trainer(refine_config(tmp_path, 2, **kwargs))
    generator = next(a for a in trainer.actors if a.id == "generator")
    start = weights(generator.policy.model)
    refiner_start = weights(trainer.actors[0].policy.model)
    trainer.train()
    assert all(torch.equal(v, start[k]) for k, v in generator.policy.model.state_dict().items())
    for row in trainer.history[1:]:
        assert "agent/generator/loss" not in row
        assert row.get("agent/generator/weights_version", 0) == 0
    assert trainer.history[-1]["agent/refiner_0/weights_version"] > 0
    assert any(not torch.equal(v, refiner_start[k]) for k, v in trainer.actors[0].policy.model.state_dict().items())
    if how == "trainable_false":
        assert "generator" not in trainer.learners
    else:
        assert trainer.history[-1]["agent/generator/training"] == 0.0


def test_gpt2_and_llama_team_with_two_tokenizers_trains(tmp_path):
    cfg = refine_config(tmp_path, 1, agent_overrides={"generator": {"model": "tiny-llama"}})
    trainer = Trainer(cfg)
    refiner, generator = trainer.actors
    tok_r, tok_g = refiner.policy.tokenizer, generator.policy.tokenizer
    assert type(refiner.policy.model).__name__.startswith("GPT2") and type(generator.policy.model).__name__.startswith(
        "Llama"
    )
    assert (len(tok_r), tok_r.eos_token_id) != (len(tok_g), tok_g.eos_token_id)
    assert tok_r("ab")["input_ids"] != tok_g("ab")["input_ids"]  # the Llama-style one prepends <s>
    assert generator.policy.model.config.vocab_size == len(tok_g) != refiner.policy.model.config.vocab_size
    start = {a.id: weights(a.policy.model) for a in trainer.actors}
    trainer.train()
    last = trainer.history[-1]
    for a in trainer.actors:
        assert last[f"agent/{a.id}/weights_version"] > 0
        assert any(not torch.equal(v, start[a.id][k]) for k, v in a.policy.model.state_dict().items())
    assert torch.isfinite(torch.tensor(last["reward/mean"]))
    # the generator's allowed outputs are ids of its own tokenizer
    allowed = set(generator.policy.generation.allowed_tokens)
    assert allowed == set(tok_g(" a", add_special_tokens=False)["input_ids"])


def test_per_agent_credit_uses_each_refiners_own_term(tmp_path):
    trainer = Trainer(refine_config(tmp_path, 2, steps=1))
    items, seeds = [0, 1], [3, 4]
    rollout = trainer.collector.collect(items, seeds, 4)
    # refiners act only in turn 0, the generator only in turn 1
    assert rollout.active[:, :2, 0].all() and not rollout.active[:, :2, 1].any()
    assert rollout.active[:, 2, 1].all() and not rollout.active[:, 2, 0].any()
    terms = rollout.reward_terms  # [E, R] per term
    assert trainer.family.credit == "per_agent"
    own = credited_rewards(rollout.rewards, rollout.actor_roles, "per_agent").sum(-1)  # [E, A]
    assert torch.equal(own[:, 0], terms["refiner_0"][:, 0]) and torch.equal(own[:, 1], terms["refiner_1"][:, 1])
    assert torch.allclose(own[:, 2], terms["team"][:, 2])
    shared = credited_rewards(rollout.rewards, rollout.actor_roles, "shared").sum(-1)
    assert torch.allclose(shared, terms["team"][:, :1].expand(-1, 3))  # the mean over roles is the team score
