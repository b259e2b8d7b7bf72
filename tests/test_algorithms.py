"""The algorithm registry, config rules checked when the run is built (before any model), old configs, imports."""

import json
import pkgutil
import subprocess
import sys

import pytest
import torch

torch.set_num_threads(1)

import textzoo.models  # noqa: E402
from textzoo.algorithms import registry as algorithms  # noqa: E402
from textzoo.algorithms.actor_critic.family import ActorCriticConfig, ActorCriticFamily  # noqa: E402
from textzoo.algorithms.family import RolloutNeeds  # noqa: E402
from textzoo.algorithms.preference.config import PreferenceConfig  # noqa: E402
from textzoo.algorithms.preference.madpo import MADPOFamily  # noqa: E402
from textzoo.algorithms.registry import ALGORITHMS, Algorithm, configure, register_algorithm, resolve_algorithm  # noqa: E402
from textzoo.algorithms.reinforce.atgrpo import ATGRPOFamily  # noqa: E402
from textzoo.algorithms.reinforce.family import ReinforceConfig, ReinforceFamily  # noqa: E402
from textzoo.config import TrainConfig  # noqa: E402
from textzoo.config_files import from_dict, load_config, to_dict  # noqa: E402
from textzoo.errors import ConfigError  # noqa: E402
from textzoo.runners import trainer as trainer_module  # noqa: E402


def small(**kwargs) -> TrainConfig:
    return TrainConfig(steps=1, batch_prompts=1, group_size=2, eval_prompts=1, progress=False, plot=False, **kwargs)


# ---- the registry ----------------------------------------------------------------------------------
def test_every_algorithm_builds_its_family(tmp_path):
    kinds = {"reinforce": ReinforceFamily, "actor_critic": ActorCriticFamily, "preference": MADPOFamily}
    for name, algorithm in ALGORITHMS.items():
        trainer = trainer_module.Trainer(small(algo=name, run_dir=str(tmp_path / name)))
        # marlhf learns with magrpo; atgrpo is the reinforce family's loss with its own grouping
        expected = {"marlhf": ReinforceFamily, "atgrpo": ATGRPOFamily}.get(name, kinds[algorithm.family])
        assert isinstance(trainer.family, expected), name
        assert isinstance(trainer.family.needs, RolloutNeeds)
    assert resolve_algorithm("grpo") is ALGORITHMS["magrpo"] and resolve_algorithm("IPPO") is ALGORITHMS["ippo"]
    with pytest.raises(ConfigError, match="unknown algo 'nope'; choose one of atgrpo, iac"):
        resolve_algorithm("nope")


def test_families_declare_the_extra_rollouts_they_need(tmp_path):
    assert trainer_module.Trainer(small(algo="maremax", run_dir=str(tmp_path / "a"))).family.needs.greedy
    cross = small(algo="magrpo", reinforce=ReinforceConfig(joint_mode="cross"), run_dir=str(tmp_path / "b"))
    needs = trainer_module.Trainer(cross).family.needs
    assert needs == RolloutNeeds(greedy=False, cross=True)
    assert trainer_module.Trainer(small(algo="iac", run_dir=str(tmp_path / "c"))).family.needs == RolloutNeeds()
    tree = small(algo="atgrpo", reinforce=ReinforceConfig(tree_rollout=True), run_dir=str(tmp_path / "d"))
    assert trainer_module.Trainer(tree).family.needs == RolloutNeeds(tree=True)


def test_a_registered_algorithm_is_configured_built_and_trained(tmp_path, monkeypatch):
    built = []

    def build(cfg, actors):
        built.append(cfg.reinforce.clip_range)
        return ALGORITHMS["marloo"].build(cfg, actors)

    def check(cfg):
        if cfg.group_size > 4:
            raise ConfigError("mine compares at most four samples")

    mine = Algorithm("reinforce", build, defaults={"clip_range": 0.3, "epochs": 2}, check=check)
    monkeypatch.setattr(algorithms, "ALGORITHMS", dict(ALGORITHMS))  # the registration ends with the test
    register_algorithm("mine", mine)
    with pytest.raises(ConfigError, match="already registered"):
        register_algorithm("mine", mine)
    cfg = small(algo="mine", run_dir=str(tmp_path / "run"))
    assert configure(cfg) is mine
    assert (cfg.reinforce.clip_range, cfg.reinforce.epochs) == (0.3, 2)  # its defaults, unless set
    with pytest.raises(ConfigError, match="at most four"):
        configure(TrainConfig(algo="mine", group_size=8))
    history = trainer_module.Trainer(cfg).train()
    assert built == [0.3] and history[-1]["step"] == 1


# ---- contradictions are rejected before anything is built ------------------------------------------
@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"algo": "iac", "reinforce": ReinforceConfig(joint_mode="cross")}, "iac learns from aligned"),
        ({"algo": "maac", "reinforce": ReinforceConfig(joint_mode="cross")}, "maac learns from aligned"),
        ({"algo": "madpo", "reinforce": ReinforceConfig(joint_mode="cross")}, "pair aligned joint samples"),
        (
            {"algo": "magrpo", "collaboration": "centralized", "reinforce": ReinforceConfig(joint_mode="cross")},
            "one joint actor",
        ),
        ({"algo": "madpo", "normalize_per_agent": True}, "madpo has none"),
        ({"algo": "maac", "actor_critic": ActorCriticConfig(critic_model="actor")}, "critic_model='actor'"),
        ({"algo": "mappo", "credit": "per_agent"}, "credit='shared'"),
        ({"algo": "marlhf", "preference": PreferenceConfig(rl_algo="madpo")}, "online algorithm"),
        (
            {
                "algo": "marlhf",
                "preference": PreferenceConfig(rl_algo="iac"),
                "reinforce": ReinforceConfig(joint_mode="cross"),
            },
            "aligned",
        ),
    ],
)
def test_contradictions_fail_when_the_run_is_built(kwargs, match):
    cfg = TrainConfig(**kwargs)  # a config is data: the algorithm's rules run when a run is built from it
    with pytest.raises(ConfigError, match=match):
        configure(cfg)


def test_cross_mode_with_too_many_agents_fails_before_any_model_is_built(tmp_path, monkeypatch):
    def no_models(*args, **kwargs):
        raise AssertionError("a model was built before the team was checked")

    monkeypatch.setattr(trainer_module, "build_actors", no_models)
    cfg = small(
        env="textzoo/Refine-v0",
        env_kwargs={"num_refiners": 6},  # six refiners and a generator: 2^7 combinations per prompt
        reinforce=ReinforceConfig(joint_mode="cross"),
        run_dir=str(tmp_path / "run"),
    )
    with pytest.raises(ConfigError, match="N = 7 agents"):
        trainer_module.Trainer(cfg)


# ---- one per-agent standardiser, and configs written before it ----------------------------------------
@pytest.mark.parametrize(
    "algo, section, key, expected",
    [
        ("magrpo", "reinforce", "normalize_per_agent", True),
        ("iac", "actor_critic", "normalize_advantages", True),
        ("iac", "reinforce", "normalize_per_agent", False),  # a field the run's family never read
        ("marlhf", "actor_critic", "normalize_advantages", False),  # marlhf learns with its rl_algo, magrpo
    ],
)
def test_an_old_config_json_still_loads(tmp_path, algo, section, key, expected):
    old = to_dict(TrainConfig(algo=algo))
    del old["normalize_per_agent"]
    old["reinforce"]["normalize_per_agent"] = False
    old["actor_critic"]["normalize_advantages"] = False
    old[section][key] = True
    path = tmp_path / "config.json"
    path.write_text(json.dumps(old))
    cfg = load_config(path)
    assert cfg.normalize_per_agent is expected
    assert to_dict(cfg) == to_dict(TrainConfig(algo=algo, normalize_per_agent=expected))


def test_an_old_field_contradicting_the_new_one_is_named():
    data = {"algo": "iac", "normalize_per_agent": False, "actor_critic": {"normalize_advantages": True}}
    with pytest.raises(ConfigError, match="keep only normalize_per_agent"):
        from_dict(TrainConfig, data)
    with pytest.raises(ConfigError, match="unknown config field"):
        from_dict(TrainConfig, {"reinforce": {"normalize_advantages": True}})


def test_the_standardiser_reaches_both_families(tmp_path):
    for algo in ("magrpo", "iac"):
        cfg = small(algo=algo, normalize_per_agent=True, run_dir=str(tmp_path / algo))
        family = trainer_module.Trainer(cfg).family
        assert family.normalize_per_agent is True


# ---- imports flow runners -> {agents, envs} -------------------------------------------------------
def test_imports_flow_runners_agents_envs():
    code = (
        "import sys, importlib\n"
        "for name in sys.argv[1:]:\n"
        "    importlib.import_module(name)\n"
        "print(sorted(m for m in sys.modules if m.startswith('textzoo.')))\n"
    )

    def loaded(*modules):
        out = subprocess.run([sys.executable, "-c", code, *modules], capture_output=True, text=True, check=True)
        return out.stdout

    agents = loaded(*sorted(m.name for m in pkgutil.walk_packages(textzoo.models.__path__, "textzoo.models.")))
    assert "textzoo.runners" not in agents and "textzoo.envs" not in agents
    envs = loaded("textzoo.envs")
    assert "textzoo.models" not in envs and "textzoo.runners" not in envs
    assert "textzoo.runners.trainer" not in loaded(
        "textzoo.algorithms.preference.rounds", "textzoo.algorithms.registry"
    )
