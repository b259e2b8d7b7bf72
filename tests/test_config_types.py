"""Config values of the wrong type fail with the field's dotted name, the expected type and the value given,
whether they come from a TOML/JSON file, a command-line flag or the Python API."""

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Literal

import pytest

from textzoo.config import TrainConfig
from textzoo.config_files import load_config
from textzoo.errors import ConfigError
from textzoo.runners import cli
from textzoo.typecheck import check_mapping, check_value, field_types, matches


def from_toml(tmp_path, text: str) -> TrainConfig:
    path = tmp_path / "run.toml"
    path.write_text(text)
    return load_config(path)


def from_json(tmp_path, data: dict) -> TrainConfig:
    path = tmp_path / "run.json"
    path.write_text(json.dumps(data))
    return load_config(path)


@pytest.mark.parametrize(
    "toml, message",
    [
        # int: a string, a float and a bool are not ints (the case: was "'<' not supported ...")
        ('steps = "x"', r"^steps must be an int, got 'x' \(str\)$"),
        ("steps = 2.5", r"^steps must be an int, got 2\.5 \(float\)$"),
        ("group_size = true", r"^group_size must be an int, got True \(bool\)$"),
        # float (an int is accepted, see below)
        ("gamma = 'high'", r"^gamma must be a float \(an int is fine\), got 'high' \(str\)$"),
        ("[agent]\nlr = 'fast'", r"^agent\.lr must be a float \(an int is fine\), got 'fast' \(str\)$"),
        # bool: neither 1 nor "yes"
        ("progress = 1", r"^progress must be true or false \(a bool\), got 1 \(int\)$"),
        ("[agent]\ntrainable = 'yes'", r"^agent\.trainable must be true or false \(a bool\), got 'yes' \(str\)$"),
        # str
        ("env = 3", r"^env must be a string, got 3 \(int\)$"),
        # tuples: one string is not a list of strings, and each item is checked
        ('eval_modes = "greedy"', r"^eval_modes must be a list of strings, got 'greedy' \(str\)$"),
        ('eval_modes = ["greedy", 3]', r"^eval_modes must be a list of strings, got \['greedy', 3\] \(list\)$"),
        ('[agent]\nstop_strings = "\\n"', r"^agent\.stop_strings must be a list of strings, got '\\n' \(str\)$"),
        # dicts
        ("env_kwargs = 3", r"^env_kwargs must be a JSON object / TOML table, got 3 \(int\)$"),
        # Literal choices, with the closest one
        (
            '[agent]\nlr_schedule = "cosin"',
            r"^agent\.lr_schedule must be one of 'constant', 'linear', 'cosine', got 'cosin' \(str\); "
            r"did you mean 'cosine'\?$",
        ),
        ('collaboration = "solo"', r"^collaboration must be one of 'decentralized', 'centralized', got 'solo'"),
        # nested sections: a value that is not a table, a mistyped value inside one
        ("reinforce = 3", r"^reinforce must be a table of ReinforceConfig fields, got 3 \(int\)$"),
        ("[reinforce]\nepochs = '2'", r"^reinforce\.epochs must be an int, got '2' \(str\)$"),
        ("[update]\nper_sample_backward = 'no'", r"^update\.per_sample_backward must be true or false"),
        ("[preference]\nbeta = [0.1]", r"^preference\.beta must be a float \(an int is fine\), got \[0\.1\]"),
        # Optional: a float or None
        (
            "[actor_critic]\ncritic_lr = 'x'",
            r"^actor_critic\.critic_lr must be a float \(an int is fine\) or None \(null\), got 'x' \(str\)$",
        ),
        # unknown keys name the closest valid one, at any depth
        ("stepz = 3", r"^unknown config field 'stepz'; did you mean 'steps'\? \(valid fields: actor_critic, agent, "),
        (
            "[reinforce]\nkl_cof = 0.1",
            r"^unknown config field 'reinforce\.kl_cof'; did you mean 'reinforce\.kl_coef'\?",
        ),
        (
            "[agent]\nlrr = 0.1",
            r"^unknown config field 'agent\.lrr'; did you mean 'agent\.lr'\? \(valid fields of agent: ",
        ),
        ("zzzz = 1", r"^unknown config field 'zzzz' \(valid fields: "),  # nothing close: no guess
    ],
)
def test_a_file_value_of_the_wrong_type_names_the_field(tmp_path, toml, message):
    with pytest.raises(ConfigError, match=message):
        from_toml(tmp_path, toml)


def test_right_values_load_as_their_types(tmp_path):
    cfg = from_toml(
        tmp_path,
        'gamma = 1\neval_modes = ["sampled"]\n[agent]\nlr = 1\nlr_schedule = "cosine"\n[actor_critic]\ncritic_lr = 2',
    )
    assert (cfg.gamma, cfg.agent.lr, cfg.actor_critic.critic_lr) == (1, 1, 2)  # ints where floats are asked
    assert cfg.eval_modes == ("sampled",) and cfg.agent.lr_schedule == "cosine"
    assert from_json(tmp_path, {"actor_critic": {"critic_lr": None}}).actor_critic.critic_lr is None  # Optional
    with pytest.raises(ConfigError, match=r"^actor_critic\.value_clip must be a float \(an int is fine\) or None"):
        from_json(tmp_path, {"actor_critic": {"value_clip": "off"}})


def test_agent_overrides_are_checked_as_agent_fields(tmp_path):
    with pytest.raises(ConfigError, match=r"^agent_overrides\.summary\.lr must be a float \(an int is fine\), got 'x'"):
        from_json(tmp_path, {"agent_overrides": {"summary": {"lr": "x"}}})
    with pytest.raises(
        ConfigError, match=r"^unknown config field 'agent_overrides\.summary\.max_new_token'; did you mean"
    ):
        TrainConfig(agent_overrides={"summary": {"max_new_token": 8}})


def test_python_api_values_are_checked_too():
    with pytest.raises(ConfigError, match=r"^steps must be an int, got 'x' \(str\)$"):
        TrainConfig(steps="x")
    with pytest.raises(ConfigError, match=r"^agent\.n_layer must be an int, got 2\.0 \(float\)$"):
        dataclasses.replace(TrainConfig().agent, n_layer=2.0)
    assert TrainConfig(trainable_agents=["summary"]).trainable_agents == ("summary",)  # a list for a tuple is fine


def run_cli(capsys, *argv: str) -> tuple[int, str]:
    """The exit code and stderr as one line of words (tyro draws its errors in a wrapped box)."""
    code = cli.main(["train", *argv])
    return code, " ".join(capsys.readouterr().err.replace("│", " ").split())


def test_flags_of_the_wrong_type_name_the_flag(capsys):
    code, err = run_cli(capsys, "--steps", "x")  # tyro parses typed flags itself
    assert code == 2 and "--steps" in err and "'x'" in err
    code, err = run_cli(capsys, "--agent.lr-schedule", "cosin")
    assert code == 2 and "--agent.lr-schedule" in err and "cosine" in err
    code, err = run_cli(capsys, "--agent-overrides", '{"summary": {"top_k": "3"}}')  # JSON flags: checked by textzoo
    assert code == 2 and "agent_overrides.summary.top_k must be an int, got '3' (str)" in err
    code, err = run_cli(capsys, "--agent-overrides", '{"summary": {"temprature": 0.5}}')
    assert code == 2 and "did you mean 'agent_overrides.summary.temperature'?" in err


def test_every_config_annotation_is_understood():
    """Each field's default matches its own annotation (so the checker models every annotation in use)."""

    def walk(cls, where=""):
        for f in dataclasses.fields(cls):
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            tp = field_types(cls)[f.name]
            assert matches(tp, default), f"{where}{f.name}: {tp} vs {default!r}"
            if dataclasses.is_dataclass(default):
                walk(type(default), f"{where}{f.name}.")

    walk(TrainConfig)


@dataclass
class Section:
    pair: tuple[int, float] = (1, 2.0)
    mode: Literal["a", "b"] | None = None
    weights: dict[str, float] = field(default_factory=dict)


@pytest.mark.parametrize(
    "data, message",
    [
        ({"pair": [1]}, r"^s\.pair must be a list of 2 values \(an int, a float \(an int is fine\)\), got \[1\]"),
        ({"pair": [1.5, 2]}, r"^s\.pair must be a list of 2 values"),
        ({"mode": "c"}, r"^s\.mode must be one of 'a', 'b' or None \(null\), got 'c' \(str\)$"),
        ({"mode": True}, r"^s\.mode must be one of 'a', 'b' or None"),
        ({"weights": {"x": "heavy"}}, r"^s\.weights must be a JSON object / TOML table, got \{'x': 'heavy'\}"),
    ],
)
def test_fixed_tuples_optional_literals_and_typed_dicts(data, message):
    with pytest.raises(ConfigError, match=message):
        check_mapping(Section, data, "s.")
    check_mapping(Section, {"pair": (3, 4), "mode": "b", "weights": {"x": 1}}, "s.")  # right values pass


def test_literal_values_must_have_the_choice_type():
    check_value(Literal[1, 2], 1, "k")
    with pytest.raises(ConfigError, match=r"^k must be one of 1, 2, got True \(bool\)$"):
        check_value(Literal[1, 2], True, "k")  # True == 1, but it is not the choice 1
