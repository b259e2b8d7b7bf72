"""Task presets (`textzoo.envs.presets`): the fields they set, and that each one makes its task."""

import importlib.util
import re
from pathlib import Path

import features
import pytest

from textzoo.config import AgentConfig, TrainConfig
from textzoo.envs import make
from textzoo.envs.debate_v0 import PRESETS as DEBATE
from textzoo.envs.debate_v0 import one_digit_sums, sums_and_differences
from textzoo.envs.planpath_v0 import PRESETS as PLANPATH
from textzoo.envs.presets import TaskPreset
from textzoo.envs.reasoning_gym_v0 import PRESETS as REASONING_GYM
from textzoo.envs.refine_v0 import PRESETS as REFINE
from textzoo.envs.sudoku_v0 import PRESETS as SUDOKU
from textzoo.errors import ConfigError, EnvError

HAS_REASONING_GYM = importlib.util.find_spec("reasoning_gym") is not None
ALL = [
    ("textzoo/Debate-v0", DEBATE),
    ("textzoo/Refine-v0", REFINE),
    ("textzoo/PlanPath-v0", PLANPATH),
    ("textzoo/Sudoku-v0", SUDOKU),
    pytest.param(
        "textzoo/ReasoningGym-v0",
        REASONING_GYM,
        marks=features.requires("reasoning-gym", HAS_REASONING_GYM, "reasoning_gym is not installed"),
    ),
]


def test_train_fields_by_hand():
    preset = TaskPreset({"size": 4}, {"tool": 160, "plan": 32}, temperature=0.5)
    assert preset.train_fields() == {
        "env_kwargs": {"size": 4},
        "agent_overrides": {"tool": {"max_new_tokens": 160}, "plan": {"max_new_tokens": 32}},
    }
    assert preset.train_fields("centralized") == {
        "env_kwargs": {"size": 4},
        "joint_max_new_tokens": 192,
        "joint_section_tokens": {"tool": 160, "plan": 32},
    }
    agent = AgentConfig(model="tiny", lr=1e-3)
    fields = preset.train_fields("centralized", agent=agent)
    assert fields["agent"] == AgentConfig(model="tiny", lr=1e-3, temperature=0.5) and agent.temperature == 1.0
    cfg = TrainConfig(env="textzoo/PlanPath-v0", collaboration="centralized", **fields)
    assert cfg.agent.temperature == 0.5 and cfg.joint_section_tokens == {"tool": 160, "plan": 32}
    with pytest.raises(EnvError, match="temperature must be > 0"):
        TaskPreset({}, temperature=0)
    with pytest.raises(ConfigError, match="joint_section_tokens"):
        TrainConfig(env="textzoo/PlanPath-v0", collaboration="centralized", joint_section_tokens={"tool": 0})


@pytest.mark.parametrize("env_id,presets", ALL)
def test_every_preset_makes_its_task_and_a_valid_config(env_id, presets):
    for name, preset in presets.items():
        env = make(env_id, split="eval", **preset.env_kwargs)
        obs, _ = env.reset(seed=0, options={"index": 0})
        assert sorted(preset.max_new_tokens) == sorted(env.possible_agents), name
        for mode in ("decentralized", "centralized"):
            TrainConfig(env=env_id, collaboration=mode, **preset.train_fields(mode))
        env.close()


def test_the_presets_are_the_easy_settings_they_name():
    sums = one_digit_sums()
    assert len(sums) == 100 and len({s["question"] for s in sums}) == 100
    for s in sums:
        a, b = (int(x) for x in s["question"].removeprefix("What is ").removesuffix("?").split(" + "))
        assert s["answer"] == a + b and 0 <= a <= 9 and 0 <= b <= 9
    env = make("textzoo/PlanPath-v0", **PLANPATH["open-4x4"].env_kwargs)
    env.reset(seed=0, options={"index": 3})
    assert "#" not in "".join(env.puzzle.rows) and len(env.puzzle.rows) == 4
    env = make("textzoo/Sudoku-v0", **SUDOKU["4x4-2-blanks"].env_kwargs)
    obs, _ = env.reset(seed=0, options={"index": 3})
    assert len(env.puzzle.blanks) == 2


@features.requires("reasoning-gym", HAS_REASONING_GYM, "reasoning_gym is not installed")
def test_the_reasoning_gym_presets_ask_two_small_terms_never_trained_on():
    for name, ops in (("chain-sum-team", "+-"), ("basic-arithmetic-team", "+-*")):
        kwargs = REASONING_GYM[name].env_kwargs
        questions = {}
        for split in ("train", "eval"):
            env = make("textzoo/ReasoningGym-v0", split=split, **kwargs)
            questions[split] = set()
            for k in range(env.num_items()):
                obs, _ = env.reset(seed=0, options={"index": k})
                question = obs["agent_0"].split("\n")[0]
                terms = re.search(rf"\b(\d+) [{re.escape(ops)}] (\d+)\b", question)
                assert terms and max(int(t) for t in terms.groups()) <= 10, (name, question)
                questions[split].add(question)
            env.close()
        assert questions["eval"] and not questions["eval"] & questions["train"], name


def test_sums_and_differences_are_every_small_question_once_with_its_answer():
    rows = sums_and_differences(30)
    assert len(rows) == 30 * 30 + 30 * 31 // 2 == 1365 and len({r["question"] for r in rows}) == 1365
    for r in rows:
        a, op, b = r["question"].removeprefix("What is ").removesuffix("?").split(" ")
        a, b = int(a), int(b)
        assert 0 <= a < 30 and 0 <= b < 30 and r["answer"] == (a + b if op == "+" else a - b) >= 0
    assert sums_and_differences(30) == rows  # a fixed order


@pytest.mark.parametrize(
    "env_id,preset",
    [
        ("textzoo/Debate-v0", DEBATE["sums-30"]),
        ("textzoo/Refine-v0", REFINE["two-keywords"]),
        ("textzoo/Refine-v0", REFINE["two-keywords-on-topic"]),
    ],
)
def test_the_chosen_presets_hold_out_at_least_200_items_never_trained_on(env_id, preset):
    held, train = (make(env_id, split=split, **preset.env_kwargs) for split in ("eval", "train"))
    assert held.num_items() >= 200

    def tasks(env):
        seen = set()
        for k in range(env.num_items()):
            obs, _ = env.reset(seed=0, options={"index": k})
            seen.add(tuple(sorted(obs.items())))
        return seen

    if env_id == "textzoo/Debate-v0":  # a question is never both trained on and held out
        assert not tasks(held) & tasks(train)


def test_the_docs_table_lists_every_preset_with_its_budgets_and_temperature():
    """docs/concepts/tasks.md's presets table is every module's `PRESETS`, budgets and temperature as in code."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "concepts" / "tasks.md").read_text()
    table = text[text.index("| task | preset | setting | budgets (tokens) | temperature |") :].split("\n\n")[0]
    documented = {}
    for row in table.splitlines()[2:]:
        task, name, _, budgets, temperature = (cell.strip() for cell in row.strip("|").split("|"))
        tokens = dict(budget.split(" ") for budget in budgets.split(", "))
        documented[(f"textzoo/{task}", name.strip("`"))] = ({k: int(v) for k, v in tokens.items()}, float(temperature))
    in_code = {
        (env_id, name): (preset.max_new_tokens, preset.temperature)
        for env_id, presets in [
            ("textzoo/Debate-v0", DEBATE),
            ("textzoo/Refine-v0", REFINE),
            ("textzoo/PlanPath-v0", PLANPATH),
            ("textzoo/Sudoku-v0", SUDOKU),
            ("textzoo/ReasoningGym-v0", REASONING_GYM),
        ]
        for name, preset in presets.items()
    }
    assert documented == in_code
