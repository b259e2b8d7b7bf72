"""The task template (docs/templates/task_v0.py), tested as a new task's tests are: check_env, the
score by hand, the declared arguments, and a few seeded training steps.

For a new task, copy this file to tests/test_<name>.py, import your module instead of loading the
template (`from textzoo.envs import <name>_v0`), use its registered id, and write its scores by hand.
"""

import importlib.util
from pathlib import Path

import pytest
from helpers import tiny_config

from textzoo.envs import check_env, make, register
from textzoo.errors import EnvError
from textzoo.runners.trainer import Trainer

TEMPLATE = Path(__file__).resolve().parents[1] / "docs" / "templates" / "task_v0.py"
_spec = importlib.util.spec_from_file_location("task_v0", TEMPLATE)
task_v0 = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(task_v0)

ID = "template/Count-v0"  # a built-in task is registered in textzoo/envs/__init__.py instead
register(ID, task_v0.parallel_env)


@pytest.mark.parametrize("split", ["train", "eval"])
def test_check_env(split):
    check_env(lambda: make(ID, split=split))


def test_the_score_by_hand():
    env = make(ID)  # train targets 2..11 but 6 and 11 (k % 5 == 4 is held out)
    assert env.targets == [2, 3, 4, 5, 7, 8, 9, 10]
    assert make(ID, split="eval").targets == [6, 11]
    obs, _ = env.reset(options={"index": 1})
    assert obs == {"writer": "Write exactly 3 words:"}
    _, rewards, terminations, _, infos = env.step({"writer": "one two"})  # 1 - |2 - 3| / 3
    assert rewards["writer"] == pytest.approx(2 / 3) and infos["writer"]["reward_terms"] == {
        "count": pytest.approx(2 / 3)
    }
    assert terminations == {"writer": True}
    env.reset(options={"index": 0})
    assert env.step({"writer": "a b c d e f"})[1]["writer"] == 0.0  # 6 words for 2: at least 0


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"min_words": 0}, r"min_words must be a positive int, got 0"),
        ({"split": "test"}, r"split must be one of 'train', 'eval', 'all'"),
        ({"min_words": 5, "max_words": 3}, r"min_words must be <= max_words"),
        ({"min_words": 2, "max_words": 4, "split": "eval"}, r"is empty"),
        ({"colour": "red"}, r"unknown argument"),
    ],
)
def test_bad_arguments_name_the_argument(kwargs, message):
    with pytest.raises(EnvError, match=message):
        make(ID, **kwargs)


def test_a_few_seeded_training_steps(tmp_path):
    """Two seeded runs train the task for 3 steps and log its reward term, step for step the same."""
    runs = []
    for name in ("a", "b"):
        cfg = tiny_config(env=ID, steps=3, seed=0, eval_prompts=2, run_dir=tmp_path / name)
        history = Trainer(cfg).train()
        runs.append([{k: v for k, v in row.items() if not k.startswith("time/")} for row in history])
    assert [row["step"] for row in runs[0]][-1] == 3 and "reward/count" in runs[0][-1]
    assert 0.0 <= runs[0][-1]["reward/mean"] <= 1.0
    assert runs[0] == runs[1]
