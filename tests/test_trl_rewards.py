"""TRL-style reward functions work as written for TRL: in Team-v0 and through the training API."""

import dataclasses
import json
import re

import features
import pytest
import torch

torch.set_num_threads(1)

from helpers import tiny_config  # noqa: E402

from textzoo.config import AgentConfig, TrainConfig  # noqa: E402
from textzoo.config_files import to_dict  # noqa: E402
from textzoo.envs import make  # noqa: E402
from textzoo.errors import EnvError  # noqa: E402
from textzoo.runners.trainer import Trainer  # noqa: E402


# Written as TRL's GRPOTrainer documentation writes reward functions: completions (and dataset
# columns) as keyword lists, **kwargs for the rest, one float per completion.
def reward_len(completions, **kwargs):
    return [-abs(20 - len(completion)) for completion in completions]


def boxed_accuracy(completions, ground_truth, **kwargs):
    matches = [re.search(r"\\boxed\{(.*?)\}", completion) for completion in completions]
    contents = [match.group(1) if match else "" for match in matches]
    return [1.0 if c == gt else 0.0 for c, gt in zip(contents, ground_truth)]


def differs_from_partners(prompts, completions, agent_id, other_completions, **kwargs):
    """Per-agent credit from the partners' answers: 1 when nobody else gave the same answer."""
    others = {c for partner in other_completions.values() for c in partner}
    return [None if not c else float(c not in others) for c in completions]


ROWS = [{"prompt": f"What is {i} + {i}? Answer in \\boxed{{}}.", "ground_truth": str(2 * i)} for i in range(10)]


def test_trl_reward_functions_as_written_with_weights_columns_and_partners():
    env = make(
        "textzoo/Team-v0",
        prompts=ROWS,
        agents=["a", "b", "c"],
        split="all",
        reward_fns=[reward_len, boxed_accuracy, differs_from_partners],
        reward_weights=[0.5, 2.0, 1.0],
    )
    env.reset(options={"index": 3})
    answers = {"a": "\\boxed{6}", "b": "\\boxed{6}", "c": ""}
    _, rewards, _, _, infos = env.step(answers)
    # a: len 9 -> -11 * 0.5; correct -> 2.0; "b" gave the same answer -> 0
    assert rewards["a"] == pytest.approx(-5.5 + 2.0 + 0.0)
    assert rewards["b"] == pytest.approx(-5.5 + 2.0 + 0.0)
    # c: empty -> -20 * 0.5; wrong; not applicable (None) counts 0 with a note
    assert rewards["c"] == pytest.approx(-10.0)
    assert infos["a"]["reward_terms"] == {"reward_len": -11.0, "boxed_accuracy": 1.0, "differs_from_partners": 0.0}
    assert infos["c"]["notes"] == ["reward 'differs_from_partners' not applicable (None); scored 0"]


def test_a_reward_function_in_env_kwargs_trains_and_is_recorded_by_name(tmp_path):
    cfg = tiny_config(
        env="textzoo/Team-v0",
        env_kwargs={"prompts": ROWS, "agents": 2, "reward_fns": [reward_len, boxed_accuracy]},
        steps=1,
        batch_prompts=1,
        eval_prompts=1,
        run_dir=tmp_path,
        agent=AgentConfig(n_layer=1, n_embd=16, max_new_tokens=4),
    )
    history = Trainer(cfg).train()
    assert history[-1]["step"] == 1 and "reward/reward_len" in history[-1]
    saved = json.loads((tmp_path / "config.json").read_text())["env_kwargs"]["reward_fns"]
    assert saved == [f"{__name__}:reward_len", f"{__name__}:boxed_accuracy"]
    assert to_dict(TrainConfig(env_kwargs={"fn": lambda x: x}))["env_kwargs"]["fn"].endswith(".<lambda>")


def picky(prompts, completions, **kwargs):
    """A reward function with a bug: it fails on completions without digits."""
    return [float(int("".join(ch for ch in c if ch.isdigit())) > 0) for c in completions]


def test_a_raising_reward_function_names_itself_the_item_and_the_exception():
    env = make("textzoo/Team-v0", prompts=ROWS, agents=2, reward_fns=[reward_len, picky], split="all")
    env.reset(options={"index": 4})
    env.step({"agent_0": "7", "agent_1": "42"})  # digits: fine
    env.reset(options={"index": 4})
    with pytest.raises(EnvError) as err:
        env.step({"agent_0": "7", "agent_1": "no digits here"})
    message = str(err.value)
    assert "'picky'" in message and "item 4" in message and "'agent_1'" in message
    assert "ValueError" in message and "invalid literal for int()" in message
    assert "no digits here" in message and "on_reward_error='score'" in message
    assert isinstance(err.value.__cause__, ValueError)


def test_opt_in_scores_a_raising_function_and_counts_it():
    env = make(
        "textzoo/Team-v0",
        prompts=ROWS,
        agents=2,
        reward_fns=[reward_len, picky],
        reward_weights=[1.0, 3.0],
        split="all",
        on_reward_error="score",
        reward_error_value=-1.0,
    )
    env.reset(options={"index": 0})
    _, rewards, _, _, infos = env.step({"agent_0": "12345678901234567890", "agent_1": "none"})
    # agent_0: len 20 -> 0, picky 1 -> 3.0; agent_1: len 4 -> -16, picky raised -> -1 * 3.0
    assert rewards == {"agent_0": pytest.approx(3.0), "agent_1": pytest.approx(-16.0 - 3.0)}
    assert infos["agent_0"]["reward_terms"] == {"reward_len": 0.0, "picky": 1.0, "reward_errors": 0.0}
    assert infos["agent_1"]["reward_terms"] == {"reward_len": -16.0, "picky": -1.0, "reward_errors": 1.0}
    assert any("'picky' raised ValueError" in n and "scored -1.0" in n for n in infos["agent_1"]["notes"])


def test_a_raising_team_reward_is_counted_for_every_agent():
    def team(prompts, completions, **kwargs):
        raise KeyError("missing judge")

    env = make("textzoo/Team-v0", prompts=ROWS, agents=2, team_reward_fn=team, split="all", on_reward_error="score")
    env.reset(options={"index": 1})
    _, rewards, _, _, infos = env.step({"agent_0": "a", "agent_1": "b"})
    assert rewards == {"agent_0": 0.0, "agent_1": 0.0}
    assert all(infos[a]["reward_terms"]["reward_errors"] == 1.0 for a in rewards)
    strict = make("textzoo/Team-v0", prompts=ROWS, agents=2, team_reward_fn=team, split="all")
    strict.reset(options={"index": 1})
    with pytest.raises(EnvError, match="'team' raised KeyError.*item 1.*the team reward"):
        strict.step({"agent_0": "a", "agent_1": "b"})


def test_bad_error_settings_are_refused():
    with pytest.raises(EnvError, match="on_reward_error"):
        make("textzoo/Team-v0", prompts=ROWS, reward_fns=picky, on_reward_error="ignore")
    with pytest.raises(EnvError, match="reward_error_value"):
        make(
            "textzoo/Team-v0", prompts=ROWS, reward_fns=picky, on_reward_error="score", reward_error_value=float("nan")
        )


def test_a_run_goes_on_past_failing_rewards_and_logs_their_count(tmp_path):
    cfg = tiny_config(
        env="textzoo/Team-v0",
        env_kwargs={"prompts": ROWS, "agents": 2, "reward_fns": [reward_len, picky], "on_reward_error": "score"},
        batch_prompts=1,
        eval_prompts=1,
        run_dir=tmp_path,
        agent=AgentConfig(n_layer=1, n_embd=16, max_new_tokens=4),
    )
    history = Trainer(cfg).train()
    assert history[-1]["step"] == 2
    # tiny random models rarely write digits: most samples make `picky` raise, each counted
    assert history[-1]["reward/reward_errors"] > 0
    strict = dataclasses.replace(
        cfg, env_kwargs={**cfg.env_kwargs, "on_reward_error": "raise"}, run_dir=str(tmp_path / "b")
    )
    with pytest.raises(EnvError, match="'picky' raised"):
        Trainer(strict).train()


# ---- TRL's conversational format: completions (and prompts) as message lists -------------------
# Written as TRL's documentation writes reward functions for conversational datasets.
def format_reward_func(completions, **kwargs):
    pattern = r"^<think>.*?</think><answer>.*?</answer>$"
    completion_contents = [completion[0]["content"] for completion in completions]
    return [1.0 if re.match(pattern, content) else 0.0 for content in completion_contents]


def chat_accuracy(prompts, completions, solution, **kwargs):
    asked = [p[-1]["content"] for p in prompts]  # the last (user) message of each prompt
    return [float(c[0]["content"].strip() == s and "Answer" in q) for c, s, q in zip(completions, solution, asked)]


def annotated_length(completions: list[list[dict[str, str]]], **kwargs) -> list[float]:
    return [float(len(c[0]["content"])) for c in completions]


def plain_length(completions: list[str], **kwargs) -> list[float]:
    return [float(len(c)) for c in completions]


CHAT_ROWS = [
    {
        "prompt": [{"role": "system", "content": "Be terse."}, {"role": "user", "content": f"Answer {i} + 1."}],
        "solution": str(i + 1),
    }
    for i in range(10)
]


def test_conversational_reward_functions_work_unchanged_on_chat_data():
    env = make(
        "textzoo/Team-v0",
        prompts=CHAT_ROWS,
        agents=2,
        split="all",
        reward_fns=[format_reward_func, chat_accuracy, plain_length],
    )
    assert env.reward_fns["agent_0"].formats == ["conversational", "conversational", "standard"]
    env.reset(options={"index": 2})
    _, rewards, _, _, infos = env.step({"agent_0": "<think>2+1</think><answer>3</answer>", "agent_1": "3"})
    assert infos["agent_0"]["reward_terms"] == {"format_reward_func": 1.0, "chat_accuracy": 0.0, "plain_length": 36.0}
    assert infos["agent_1"]["reward_terms"] == {"format_reward_func": 0.0, "chat_accuracy": 1.0, "plain_length": 1.0}
    assert rewards == {"agent_0": pytest.approx(37.0), "agent_1": pytest.approx(2.0)}


def test_text_data_takes_a_declared_or_annotated_conversational_function():
    seen = {}

    def spy(prompts, completions, other_completions, **kwargs):
        seen.update(prompts=prompts, completions=completions, others=other_completions)
        return [0.0]

    env = make(
        "textzoo/Team-v0",
        prompts=ROWS,
        agents=["a", "b"],
        split="all",
        reward_fns=[spy, annotated_length],
        reward_format=["conversational", "auto"],
    )
    assert env.reward_fns["a"].formats == ["conversational", "conversational"]
    env.reset(options={"index": 1})
    _, _, _, _, infos = env.step({"a": "hi", "b": "there"})
    assert seen["prompts"] == [[{"role": "user", "content": ROWS[1]["prompt"]}]]
    assert seen["completions"] == [[{"role": "assistant", "content": "there"}]]  # b was scored last
    assert seen["others"] == {"a": [[{"role": "assistant", "content": "hi"}]]}
    assert infos["a"]["reward_terms"]["annotated_length"] == 2.0
    # undeclared and unannotated on text data: TRL's standard format, as before
    assert make("textzoo/Team-v0", prompts=ROWS, reward_fns=reward_len).reward_fns["agent_0"].formats == ["standard"]


def test_ambiguous_formats_fail_with_what_to_declare():
    mixed = ROWS[:5] + CHAT_ROWS[:5]
    with pytest.raises(EnvError, match="mix text and chat message lists.*reward_format='standard'"):
        make("textzoo/Team-v0", prompts=mixed, reward_fns=reward_len, split="all")
    env = make("textzoo/Team-v0", prompts=mixed, reward_fns=reward_len, split="all", reward_format="standard")
    assert env.reward_fns["agent_0"].formats == ["standard"]
    with pytest.raises(EnvError, match="declared reward_format='standard'.*annotation says 'conversational'"):
        make("textzoo/Team-v0", prompts=ROWS, reward_fns=annotated_length, reward_format="standard")
    with pytest.raises(EnvError, match="reward_format must be one of"):
        make("textzoo/Team-v0", prompts=ROWS, reward_fns=reward_len, reward_format="chat")


def test_a_conversational_function_called_with_text_says_to_declare_it():
    env = make("textzoo/Team-v0", prompts=ROWS, agents=1, reward_fns=format_reward_func, split="all")
    env.reset(options={"index": 0})
    with pytest.raises(EnvError, match="called with standard completions.*reward_format='conversational'"):
        env.step({"agent_0": "text"})


def test_conversational_rewards_in_reasoning_gym():
    features.importorskip("reasoning-gym", "reasoning_gym")

    def exact(completions, answer, **kwargs):  # reasoning-gym's reference answer is a column
        return [float(c[0]["content"].rsplit("####", 1)[-1].strip() == a) for c, a in zip(completions, answer)]

    env = make(
        "textzoo/ReasoningGym-v0",
        dataset="chain_sum",
        size=20,
        eval_size=5,
        reward_fns=[format_reward_func, exact],
        reward_weights=[0.5, 1.0],
        reward_format="conversational",
    )
    env.reset(options={"index": 0})
    gold = env.entry["answer"]
    _, rewards, _, _, infos = env.step({"solver": f"#### {gold}"})
    assert infos["solver"]["reward_terms"] == {"solved": 1.0, "valid": 1.0, "format_reward_func": 0.0, "exact": 1.0}
    assert rewards["solver"] == pytest.approx(1.0 + 0.5 * 0.0 + 1.0)
