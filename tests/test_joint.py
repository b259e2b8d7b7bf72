"""The joint (centralized) actor: prompt building, parsing, loss identity and centralized training."""

import copy

import pytest
import torch
from toy import CategoricalPolicy

from textzoo.algorithms.batch import ActorStep, Rollout
from textzoo.algorithms.registry import ALGORITHMS
from textzoo.algorithms.reinforce.family import ReinforceConfig, ReinforceFamily
from textzoo.algorithms.rlmath import BatchNorm
from textzoo.config import AgentConfig, TrainConfig
from textzoo.decoding.generation import GenerationConfig
from textzoo.envs.base import StepResult, TextParallelEnv
from textzoo.envs.registry import register
from textzoo.errors import ConfigError
from textzoo.models.joint import JointActor, parse_joint
from textzoo.models.policy import Policy
from textzoo.models.team import AgentActor
from textzoo.runners.rollout import Collector, prompt_seed
from textzoo.runners.trainer import Trainer, rollout_metrics

STAND_IN = CategoricalPolicy(["-"])  # a policy these prompt-building tests never ask to act

torch.set_num_threads(1)

ROLE_SETS = [
    ("summary",),
    ("summary", "elaboration"),
    ("planner", "coder", "tester"),
    ("a", "b", "c", "d"),
]


def _answer(r: str) -> str:
    return f"answer of {r}, with: colons and {{braces}}"


# ---- prompt building ----------------------------------------------------------------------------
def test_single_role_prompt_is_the_observation():
    obs = {"summary": "Summarize: x\nSummary:"}
    assert JointActor(["summary"], policy=STAND_IN).build_prompt(obs) == AgentActor("summary", STAND_IN).build_prompt(
        obs
    )
    # a multi-role actor asked for one role (turn-taking env) also gets the plain observation
    assert (
        JointActor(["sender", "receiver"], STAND_IN).build_prompt({"receiver": "Message: A\nAnswer:"})
        == "Message: A\nAnswer:"
    )


@pytest.mark.parametrize("roles", ROLE_SETS[1:])
def test_joint_prompt_lists_every_role_in_role_order(roles):
    obs = {r: f"task of {r}\nline two" for r in reversed(roles)}  # dict order must not matter
    prompt = JointActor(roles, STAND_IN, joint_format="tags").build_prompt(obs)
    # structured: the prompt is the first role's task; the tags and later tasks are forced tokens
    assert (
        JointActor(roles, STAND_IN).build_prompt(obs)
        == f'<task role="{roles[0]}">\ntask of {roles[0]}\nline two\n</task>'
    )
    positions = [prompt.index(f'<task role="{r}">\ntask of {r}\nline two\n</task>') for r in roles]
    assert positions == sorted(positions)
    assert " ".join(f"<{r}>...</{r}>" for r in roles) in prompt
    assert prompt.endswith(f"\n<{roles[0]}>")  # the completion starts inside the first answer


def test_prompt_holds_only_the_active_roles():
    prompt = JointActor(["a", "b", "c"], STAND_IN, joint_format="tags").build_prompt({"c": "obs c", "b": "obs b"})
    assert '<task role="a">' not in prompt and "<a>" not in prompt
    assert prompt.index('<task role="b">') < prompt.index('<task role="c">')
    assert prompt.endswith("\n<b>")


def test_user_builder_and_parser_override_the_default():
    seen = {}

    def builder(obs):
        seen["obs"] = obs
        return " | ".join(f"{r}={o}" for r, o in obs.items())

    def parser(text, roles):
        return dict(zip(roles, text.split("|"))), False

    actor = JointActor(["x", "y"], STAND_IN, prompt_builder=builder, parser=parser, joint_format="tags")
    assert actor.build_prompt({"y": "2", "x": "1"}) == "x=1 | y=2"
    assert list(seen["obs"]) == ["x", "y"]
    assert actor.parse("one|two", ("x", "y")) == ({"x": "one", "y": "two"}, False)


def test_roles_must_be_distinct():
    with pytest.raises(ConfigError, match="distinct"):
        JointActor(["a", "a"], STAND_IN)
    with pytest.raises(ConfigError):
        JointActor([], STAND_IN)


# ---- parsing ------------------------------------------------------------------------------------
@pytest.mark.parametrize("roles", ROLE_SETS)
def test_single_role_parse_is_the_whole_completion(roles):
    if len(roles) > 1:
        roles = roles[:1]
    for text in ["plain text", "<summary>tagged</summary>", "summary: labelled", "", "\x00garbage{"]:
        assert parse_joint(text, roles) == ({roles[0]: text}, False)


@pytest.mark.parametrize("roles", ROLE_SETS[1:])
def test_tags(roles):
    text = "\n".join(f"<{r}>{_answer(r)}</{r}>" for r in roles)
    assert parse_joint(text, roles) == ({r: _answer(r) for r in roles}, False)
    # the prompt opened the first tag: the completion starts inside the first answer
    text = f"{_answer(roles[0])}</{roles[0]}>\n" + "\n".join(f"<{r}>{_answer(r)}</{r}>" for r in roles[1:])
    assert parse_joint(text, roles) == ({r: _answer(r) for r in roles}, False)


@pytest.mark.parametrize("roles", ROLE_SETS[1:])
def test_missing_duplicated_unclosed_and_cased_tags(roles):
    first, last = roles[0], roles[-1]
    # missing: only the last role answered -> the others get empty actions, not a failure
    assert parse_joint(f"<{last}>only me</{last}>", roles) == (
        {r: ("only me" if r == last else "") for r in roles},
        False,
    )
    # duplicated: the first occurrence wins
    text = f"<{first}>one</{first}> <{first}>two</{first}>"
    assert parse_joint(text, roles)[0][first] == "one"
    # a repeated opening tag ends the section it interrupts
    assert parse_joint(f"<{first}>one<{first}>two</{first}>", roles)[0][first] == "one"
    # unclosed sections run to the next role tag or the end (a completion cut by the budget)
    text = f"<{first}> cut here <{last}> and cut"
    actions, failed = parse_joint(text, roles)
    assert (actions[first], actions[last], failed) == ("cut here", "and cut", False)
    # tag names are matched case-insensitively, with spaces inside the brackets
    text = f"< {first.upper()} >X</{first.capitalize()}>"
    assert parse_joint(text, roles)[0][first] == "X"
    # a stray closing tag of another role inside a section is text, not a section boundary
    actions, _ = parse_joint(f"<{first}>a</{last}>b</{first}>", roles)
    assert actions[first] == f"a</{last}>b" and actions[last] == ""


@pytest.mark.parametrize("roles", ROLE_SETS[1:])
def test_labelled_sections(roles):
    text = "Sure, here you go.\n" + "\n".join(f"{r.capitalize()}: {_answer(r)}" for r in roles)
    assert parse_joint(text, roles) == ({r: _answer(r) for r in roles}, False)
    text = "\n\n".join(f"**{r}:** {_answer(r)}\nmore of {r}" for r in roles)
    assert parse_joint(text, roles) == ({r: f"{_answer(r)}\nmore of {r}" for r in roles}, False)
    # duplicated label: first wins; a missing role is empty
    text = f"{roles[0]}: one\n{roles[0]}: two"
    assert parse_joint(text, roles) == ({r: ("one" if r == roles[0] else "") for r in roles}, False)


@pytest.mark.parametrize("roles", ROLE_SETS[1:])
def test_json_object(roles):
    import json

    obj = {r: _answer(r) for r in roles}
    text = "Here is my answer: " + json.dumps(obj) + " done"
    assert parse_joint(text, roles) == (obj, False)
    # upper-case keys, a non-string value, a missing role, an earlier unrelated object
    obj = {roles[0].upper(): [1, 2], "other": "x"}
    text = '{"unrelated": 1} then ' + json.dumps(obj)
    assert parse_joint(text, roles) == ({r: ("[1, 2]" if r == roles[0] else "") for r in roles}, False)


@pytest.mark.parametrize("roles", ROLE_SETS[1:])
def test_fenced_blocks(roles):
    text = "\n".join(f"```{r}\n{_answer(r)}\n```" for r in reversed(roles))
    assert parse_joint(text, roles) == ({r: _answer(r) for r in roles}, False)
    # unnamed blocks fill the roles in order; the last one may be cut by the budget
    text = "\n".join(f"```\nblock {i}\n```" for i in range(len(roles) - 1)) + "\n```\nlast, cut"
    expected = {r: f"block {i}" for i, r in enumerate(roles[:-1])} | {roles[-1]: "last, cut"}
    assert parse_joint(text, roles) == (expected, False)


@pytest.mark.parametrize("roles", ROLE_SETS[1:])
def test_fallback_order(roles):
    import json

    # tags beat labels, JSON and fences; the first method that finds anything decides alone
    text = f"{roles[1]}: label\n<{roles[0]}>tag</{roles[0]}>\n" + json.dumps({roles[1]: "json"})
    assert parse_joint(text, roles) == ({r: ("tag" if r == roles[0] else "") for r in roles}, False)
    # labels beat JSON
    text = f"{roles[0]}: label " + json.dumps({roles[1]: "json"})
    assert parse_joint(text, roles)[0][roles[0]].startswith("label")
    assert parse_joint(text, roles)[0][roles[1]] == ""
    # JSON beats fences
    text = json.dumps({roles[1]: "json"}) + f"\n```{roles[0]}\nfence\n```"
    assert parse_joint(text, roles) == ({r: ("json" if r == roles[1] else "") for r in roles}, False)


@pytest.mark.parametrize("roles", ROLE_SETS[1:])
@pytest.mark.parametrize(
    "text",
    [
        "",
        "   ",
        "random words with no sections at all",
        "\x00\x01\ufffd garbage {not json",
        "<other>not a role</other>",
        "summaryish text: no",
        "[1, 2, 3]",
        "```python\nprint(1)\n```",
    ],
)
def test_garbage_is_a_parse_failure(roles, text):
    assert parse_joint(text, roles) == ({r: "" for r in roles}, True)


def test_tags_of_roles_not_asked_for_are_not_sections():
    # turn-taking: only `b` is active, so an `<a>` section is text and `b` has no section
    assert parse_joint("<a>x</a>", ("b", "c")) == ({"b": "", "c": ""}, True)


# ---- loss identity ------------------------------------------------------------------------------
def _policy(seed: int = 0, max_new_tokens: int = 6) -> Policy:
    return Policy.tiny(
        n_layer=1, n_embd=32, n_head=2, seed=seed, generation=GenerationConfig(max_new_tokens=max_new_tokens)
    )


def _clone(policy: Policy) -> Policy:
    return Policy(copy.deepcopy(policy.model), policy.tokenizer, policy.generation)


def _rollout(actor_id: str, roles: list[str], gen, role_rewards: torch.Tensor) -> Rollout:
    """One prompt, G samples, one turn: `role_rewards` [G, R]."""
    G = len(gen)
    rewards = role_rewards.unsqueeze(-1)  # [E, R, 1]
    return Rollout(
        num_prompts=1,
        group_size=G,
        roles=roles,
        actors=[actor_id],
        actor_roles=[tuple(range(len(roles)))],
        items=[0],
        steps=[ActorStep(actor_id, 0, torch.arange(G), gen)],
        rewards=rewards,
        active=torch.ones(G, 1, 1, dtype=torch.bool),
        states=[[""] * G],
    )


def _loss_and_grads(job, policy):
    policy.model.zero_grad()
    contrib, _ = job.loss(job.batch, BatchNorm.of(job.batch.gen.completion_mask, job.max_new_tokens))
    contrib.sum().backward()
    return contrib.detach(), [p.grad.clone() for p in policy.model.parameters()]


@pytest.mark.parametrize("credit", ["shared", "per_agent"])
@pytest.mark.parametrize("aggregation", ["seq_sum", "constant"])
def test_joint_sample_has_the_decentralized_loss_and_gradient(credit, aggregation):
    """A decentralized sample and the same tokens scored by the joint actor: equal loss and gradient."""
    solo = _policy(seed=1)
    torch.manual_seed(0)
    gen = solo.generate(["the joint prompt"] * 4)
    team = torch.tensor([0.0, 1.0, 0.5, 0.25])  # [G]
    cfg = ReinforceConfig(loss_aggregation=aggregation)

    agent = AgentActor("a", solo)
    dec = ReinforceFamily(cfg, [agent], "grpo", credit=credit, group_size=4)
    (dec_job,), _ = dec.jobs(_rollout("a", ["a"], gen, team[:, None]))

    joint = JointActor(["a", "b"], _clone(solo))
    cen = ReinforceFamily(cfg, [joint], "grpo", credit=credit, group_size=4)
    # per-role rewards differ, their mean is the team reward the joint actor is credited with
    per_role = torch.stack([team + 0.3, team - 0.3], dim=1)  # [G, 2]
    (cen_job,), _ = cen.jobs(_rollout("joint", ["a", "b"], gen, per_role))

    dec_loss, dec_grads = _loss_and_grads(dec_job, solo)
    cen_loss, cen_grads = _loss_and_grads(cen_job, joint.policy)
    torch.testing.assert_close(cen_job.batch.advantages, dec_job.batch.advantages, rtol=0, atol=0)
    torch.testing.assert_close(cen_loss, dec_loss, rtol=0, atol=0)
    for g_dec, g_cen in zip(dec_grads, cen_grads):
        torch.testing.assert_close(g_cen, g_dec, rtol=0, atol=0)

    # and both are the hand-written objective: -sum_s A_s sum_k logp_sk / (S * divisor)
    with torch.no_grad():
        lp = solo.score(gen.prompt_ids, gen.prompt_mask, gen.completion_ids, gen.completion_mask)  # [S, C]
    adv = (team - team.mean()) / (team.std() + 1e-6)
    divisor = 1 if aggregation == "seq_sum" else solo.generation.max_new_tokens
    expected = -(adv * lp.sum(-1)) / (4 * divisor)
    torch.testing.assert_close(cen_loss, expected, rtol=1e-5, atol=1e-6)


class CountEnv(TextParallelEnv):
    """Test task: every role writes text; its reward is the share of ASCII letters in its action."""

    metadata = {"name": "count_v0", "render_modes": ["ansi"], "is_parallelizable": True}

    def __init__(self, roles=("solo",), split: str = "train", render_mode=None):
        super().__init__(list(roles), render_mode=render_mode)
        self.split = split

    def num_items(self) -> int:
        return 6

    def _reset_task(self, index: int) -> dict[str, str]:
        return {r: f"Item {index}. As {r}, write letters:" for r in self.possible_agents}

    def _step_task(self, actions, notes) -> StepResult:
        share = {r: sum(c.isascii() and c.isalpha() for c in a) / max(len(a), 1) for r, a in actions.items()}
        return StepResult(rewards=share, reward_terms={r: {"letters": v} for r, v in share.items()})


register("test-joint/Count-v0", CountEnv)


def _cfg(**kw) -> TrainConfig:
    base = dict(steps=2, batch_prompts=2, group_size=3, eval_prompts=2, progress=False, plot=False, threads=1)
    base["agent"] = kw.pop("agent", None) or AgentConfig(n_layer=1, n_embd=32, max_new_tokens=6)
    return TrainConfig(**(base | kw))


FAMILY_ALGOS = [a for a in ("magrpo", "iac", "maac", "madpo") if a in ALGORITHMS]
# MADPO pairs whole episodes and refuses an actor that acts in several turns (the joint actor on Relay)
ONLINE_ALGOS = [a for a in FAMILY_ALGOS if ALGORITHMS[a].family != "preference"]


@pytest.mark.parametrize("algo", FAMILY_ALGOS)
def test_single_role_env_centralized_is_the_plain_agent(tmp_path, algo):
    """N = 1: same prompts, samples, losses and gradients, hence bit-identical weights after training."""
    runs = {}
    for mode in ("decentralized", "centralized"):
        cfg = _cfg(
            env="test-joint/Count-v0", env_kwargs={}, algo=algo, collaboration=mode, run_dir=str(tmp_path / mode)
        )
        trainer = Trainer(cfg)
        assert trainer.actors[0].policy.generation.max_new_tokens == 6  # N x budget with N = 1
        history = trainer.train()
        runs[mode] = (trainer, history)
    (dec, dec_hist), (cen, cen_hist) = runs["decentralized"], runs["centralized"]
    assert isinstance(cen.actors[0], JointActor) and isinstance(dec.actors[0], AgentActor)
    assert cen.learners["joint"].version == dec.learners["solo"].version >= 2
    for p_dec, p_cen in zip(dec.actors[0].policy.model.parameters(), cen.actors[0].policy.model.parameters()):
        assert torch.equal(p_dec, p_cen)
    for row_dec, row_cen in zip(dec_hist, cen_hist):
        shared = {k: v for k, v in row_dec.items() if not k.startswith(("agent/", "time/"))}
        assert shared == {k: row_cen[k] for k in shared}
        if "agent/solo/loss" in row_dec:
            assert row_cen["agent/joint/loss"] == row_dec["agent/solo/loss"]
            assert row_cen["agent/joint/grad_norm"] == row_dec["agent/solo/grad_norm"]


# ---- centralized training and metrics -----------------------------------------------------------
def test_collector_asks_the_joint_actor_for_active_roles_and_splits_lengths():
    roles = ["r0", "r1", "r2"]

    def env_fn():
        return CountEnv(roles)

    def parser(text, asked):
        # fixed per-role actions of known lengths
        return {r: "a" * (i + 1) for i, r in enumerate(asked)}, False

    policy = _policy()
    joint = JointActor(roles, policy, parser=parser, joint_format="tags")
    rollout = Collector(env_fn, [joint]).collect([0, 1], [5, 6], 2)
    (step,) = rollout.steps
    assert step.actor == "joint" and len(step.gen) == 4
    for text in policy.tokenizer.batch_decode(step.gen.prompt_ids, skip_special_tokens=True):
        assert all(f'<task role="{r}">' in text for r in roles) and text.endswith("<r0>")
    metrics = rollout_metrics(rollout)
    assert [metrics[f"role/{r}/completion_chars"] for r in roles] == [1.0, 2.0, 3.0]
    assert [metrics[f"role/{r}/reward"] for r in roles] == [1.0, 1.0, 1.0]  # all-letter actions
    assert metrics["parse_failure_rate"] == 0.0
    assert metrics["tokens_generated"] == float(step.gen.completion_mask.sum())


def test_parse_failures_are_counted_and_score_low():
    def env_fn():
        return CountEnv(["x", "y"])

    joint = JointActor(
        ["x", "y"], _policy(), parser=lambda text, asked: ({r: "" for r in asked}, True), joint_format="tags"
    )
    rollout = Collector(env_fn, [joint]).collect([0], [1], 3)
    metrics = rollout_metrics(rollout)
    assert metrics["parse_failures"] == 3.0 and metrics["parse_failure_rate"] == 1.0
    assert metrics["reward/mean"] == 0.0
    assert metrics["role/x/completion_chars"] == metrics["role/y/completion_chars"] == 0.0


@pytest.mark.parametrize("algo", FAMILY_ALGOS)
def test_centralized_writing_trains_and_logs_per_role_columns(tmp_path, algo):
    cfg = _cfg(env="textzoo/Writing-v0", algo=algo, collaboration="centralized", run_dir=str(tmp_path / "w"))
    trainer = Trainer(cfg)
    (joint,) = trainer.actors
    assert isinstance(joint, JointActor) and joint.roles == ("summary", "elaboration")
    assert joint.policy.generation.max_new_tokens == 12  # 2 roles x 6 tokens
    assert joint.joint_format == "structured"  # the tags are forced: a random tiny model's answers parse
    before = [p.detach().clone() for p in joint.policy.model.parameters()]
    history = trainer.train()
    assert trainer.learners["joint"].version >= 2
    assert any(not torch.equal(b, p) for b, p in zip(before, joint.policy.model.parameters()))
    last = history[-1]
    for role in ("summary", "elaboration"):
        for key in ("completion_chars", "reward", "reward/length_ratio"):
            assert f"role/{role}/{key}" in last and f"eval/greedy/role/{role}/{key}" in last
    assert last["agent/joint/optimizer_steps"] >= 1
    assert last["parse_failure_rate"] == 0.0


def test_joint_budget_and_config_errors():
    cfg = _cfg(env="textzoo/Writing-v0", collaboration="centralized", joint_max_new_tokens=5)
    from textzoo.runners.build import build_actors

    assert build_actors(cfg, ["summary", "elaboration"])[0].policy.generation.max_new_tokens == 5
    with pytest.raises(ConfigError, match="joint_max_new_tokens"):
        _cfg(joint_max_new_tokens=-1)
    with pytest.raises(ConfigError, match="centralized"):
        build_actors(
            _cfg(collaboration="centralized", agent_overrides={"summary": {"lr": 1e-4}}), ["summary", "elaboration"]
        )


@pytest.mark.parametrize("algo", ONLINE_ALGOS)
def test_centralized_relay_answers_only_the_active_role_each_turn(tmp_path, algo):
    # one symbol per message and answer; one role acts per turn, so the joint budget is one token too
    agent = AgentConfig(n_layer=1, n_embd=32, max_new_tokens=1, allowed_outputs=("A", "B", "C", "D"))
    runs = {}
    for mode in ("decentralized", "centralized"):
        cfg = _cfg(
            env="textzoo/Relay-v0",
            env_kwargs={},
            algo=algo,
            collaboration=mode,
            agent=agent,
            steps=3,
            joint_max_new_tokens=1,
            run_dir=str(tmp_path / mode),
        )
        trainer = Trainer(cfg)
        runs[mode] = trainer, trainer.train()
    trainer, history = runs["centralized"]
    (joint,) = trainer.actors
    assert joint.policy.generation.max_new_tokens == 1
    rollout = trainer.collector.collect([0, 5], [prompt_seed(0, 9, 0), prompt_seed(0, 9, 1)], 2)
    assert [s.turn for s in rollout.steps] == [0, 1]  # one joint generate call per turn
    sender_prompts = rollout.steps[0].gen.prompt_ids
    texts = joint.policy.tokenizer.batch_decode(sender_prompts, skip_special_tokens=True)
    assert all(t.startswith("Secret") or "secret" in t for t in texts) and not any("<task" in t for t in texts)
    assert bool(rollout.active.all())  # the joint actor acted in every turn of every env copy
    assert rollout.infos["parse_failures"] == 0
    assert trainer.learners["joint"].version >= 1
    # both modes log the same columns apart from the per-actor ones
    dec_cols = {k for k in runs["decentralized"][1][-1] if not k.startswith(("agent/", "time/"))}
    cen_cols = {k for k in history[-1] if not k.startswith(("agent/", "time/"))}
    assert dec_cols == cen_cols
    assert {
        "role/sender/completion_chars",
        "role/receiver/completion_chars",
        "role/receiver/reward/correct",
    } <= cen_cols


def _relay_cfg(tmp_path, algo, mode, steps, name):
    agent = AgentConfig(n_layer=1, n_embd=32, max_new_tokens=1, allowed_outputs=("A", "B", "C", "D"))
    # eval_every=2: the 2-step run evaluates at its end, so the straight run must evaluate there too
    # (sampled evaluation draws from the global RNG that training samples from)
    return _cfg(
        env="textzoo/Relay-v0",
        env_kwargs={},
        algo=algo,
        collaboration=mode,
        agent=agent,
        steps=steps,
        joint_max_new_tokens=1,
        save_every=1,
        eval_every=2,
        run_dir=str(tmp_path / name),
    )


@pytest.mark.parametrize("mode", ["decentralized", "centralized"])
@pytest.mark.parametrize("algo", [a for a in ("magrpo", "maac") if a in ONLINE_ALGOS])
def test_resume_is_exact_in_both_modes(tmp_path, algo, mode):
    """3 steps straight == 2 steps, then a resumed run to step 3: same training rows and weights."""
    straight = Trainer(_relay_cfg(tmp_path, algo, mode, 3, "straight"))
    straight.train()
    Trainer(_relay_cfg(tmp_path, algo, mode, 2, "cut")).train()
    resumed = Trainer(_relay_cfg(tmp_path, algo, mode, 3, "cut"), resume=tmp_path / "cut")
    assert resumed.step == 2
    resumed.train()

    def last(history):
        return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in history if r["step"] == 3]

    assert last(resumed.history) == last(straight.history) != []
    assert sorted(resumed.learners) == sorted(straight.learners)
    for name, learner in straight.learners.items():
        for p, q in zip(learner.model.parameters(), resumed.learners[name].model.parameters()):
            assert torch.equal(p, q), name
