"""TRL-style reward functions work as written for TRL: in Team-v0 and through the training API."""

import json
import re

import pytest
import torch

torch.set_num_threads(1)

from textzoo.envs import make  # noqa: E402
from textzoo.runners.config import AgentConfig, TrainConfig, to_dict  # noqa: E402
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
    cfg = TrainConfig(
        env="textzoo/Team-v0",
        env_kwargs={"prompts": ROWS, "agents": 2, "reward_fns": [reward_len, boxed_accuracy]},
        steps=1,
        batch_prompts=1,
        group_size=2,
        eval_prompts=1,
        progress=False,
        plot=False,
        run_dir=str(tmp_path),
        agent=AgentConfig(n_layer=1, n_embd=16, max_new_tokens=4),
    )
    history = Trainer(cfg).train()
    assert history[-1]["step"] == 1 and "reward/reward_len" in history[-1]
    saved = json.loads((tmp_path / "config.json").read_text())["env_kwargs"]["reward_fns"]
    assert saved == [f"{__name__}:reward_len", f"{__name__}:boxed_accuracy"]
    assert to_dict(TrainConfig(env_kwargs={"fn": lambda x: x}))["env_kwargs"]["fn"].endswith(".<lambda>")
