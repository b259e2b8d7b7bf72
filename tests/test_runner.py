"""The runner end to end: config validation, errors before work, CLI parsing, learning on Writing-v0."""

import json

import pytest
import torch

torch.set_num_threads(1)

from helpers import tiny_config  # noqa: E402

from textzoo.algorithms.registry import configure  # noqa: E402
from textzoo.config import AgentConfig, TrainConfig  # noqa: E402
from textzoo.config_files import from_dict, load_config, save_config, to_dict  # noqa: E402
from textzoo.errors import ConfigError, EnvError, ModelError  # noqa: E402
from textzoo.runners.cli import main  # noqa: E402
from textzoo.runners.trainer import Trainer  # noqa: E402


# ---- bad input fails before any work ---------------------------------------------------------------
def test_unknown_algorithm():
    with pytest.raises(ConfigError, match="unknown algo"):
        configure(tiny_config(algo="magic"))


def test_group_estimators_need_two_samples():
    with pytest.raises(ConfigError, match="group_size"):
        configure(tiny_config(algo="marloo", group_size=1))
    configure(tiny_config(algo="mareinforce", group_size=1))  # no group needed


def test_unknown_env(tmp_path):
    with pytest.raises(EnvError, match="Writing-v0"):
        Trainer(tiny_config(env="textzoo/Writting-v0"), run_dir=tmp_path)
    assert not any(tmp_path.iterdir())


def test_missing_model_path(tmp_path):
    cfg = tiny_config(agent=AgentConfig(model=str(tmp_path / "no-such-model")))
    with pytest.raises(ModelError):
        Trainer(cfg, run_dir=tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_overrides_for_agents_the_env_does_not_have(tmp_path):
    cfg = tiny_config(agent_overrides={"writer": {"lr": 1e-4}})
    with pytest.raises(ConfigError, match="writer"):
        Trainer(cfg, run_dir=tmp_path)


def test_override_with_unknown_field():
    with pytest.raises(ConfigError, match="learning_rate"):
        tiny_config(agent_overrides={"summary": {"learning_rate": 1e-4}})


def test_bad_field_values_name_the_field():
    with pytest.raises(ConfigError, match="batch_prompts"):
        tiny_config(batch_prompts=0)
    with pytest.raises(ConfigError, match="credit"):
        tiny_config(credit="everyone")
    with pytest.raises(ConfigError, match="lr"):
        AgentConfig(lr=-1)
    for modes in ((), ("beam",), ("greedy", "greedy")):
        with pytest.raises(ConfigError, match="eval_modes"):
            tiny_config(eval_modes=modes)


# ---- configs round-trip; old files keep new fields' defaults -----------------------------------------
def test_config_round_trip_and_missing_fields(tmp_path):
    cfg = tiny_config(seed=7, agent_overrides={"summary": {"lr": 1e-4, "stop_strings": ["\n"]}})
    save_config(cfg, tmp_path / "c.json")
    back = load_config(tmp_path / "c.json")
    assert to_dict(back) == to_dict(cfg)
    assert back.agent_config("summary").stop_strings == ("\n",)
    data = to_dict(cfg)
    del data["gamma"], data["agent"]["top_p"]  # a file written before these fields existed
    old = from_dict(TrainConfig, data)
    assert old.gamma == 1.0 and old.agent.top_p == 1.0
    with pytest.raises(ConfigError, match="unknown config field"):
        from_dict(TrainConfig, {**data, "bogus": 1})


def test_toml_config(tmp_path):
    (tmp_path / "run.toml").write_text(
        'algo = "marloo"\nsteps = 3\n[agent]\nlr = 0.0005\n[reinforce]\nadvantage_scale = "none"\n'
    )
    cfg = load_config(tmp_path / "run.toml")
    assert cfg.algo == "marloo" and cfg.agent.lr == 5e-4 and cfg.reinforce.advantage_scale == "none"


# ---- the CLI maps onto the configs ------------------------------------------------------------------
def test_cli_errors_are_one_clear_line(capsys):
    assert main(["train", "--algo", "nope"]) == 2
    out = capsys.readouterr()
    assert "unknown algo 'nope'" in out.out + out.err
    assert main(["fly"]) == 2
    assert "unknown command" in capsys.readouterr().err


def test_cli_train_with_file_and_overrides(tmp_path, capsys):
    cfg = tiny_config()
    save_config(cfg, tmp_path / "c.json")
    run = tmp_path / "run"
    assert main(["train", "--config", str(tmp_path / "c.json"), "--steps", "1", "--run-dir", str(run)]) == 0
    saved = json.loads((run / "config.json").read_text())
    assert saved["steps"] == 1 and saved["batch_prompts"] == 2
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1]
    assert main(["plot", str(run), "--out", str(tmp_path / "p.png")]) == 0
    assert (tmp_path / "p.png").stat().st_size > 1000


# ---- metrics --------------------------------------------------------------------------------------
def test_metrics_rows_have_the_documented_fields(tmp_path):
    trainer = Trainer(tiny_config(steps=1), run_dir=tmp_path)
    history = trainer.train()
    row = history[-1]
    for key in (
        "reward/mean",
        "reward/std",
        "reward/length_ratio",
        "agent/summary/loss",
        "agent/summary/grad_norm",
        "agent/elaboration/completion_len",
        "agent/summary/frac_reward_zero_std",
        "agent/elaboration/truncated",
        "no_signal_streak",
        "agent/summary/weights_version",
        "time/generate",
        "time/reward",
        "time/update",
        "time/tokens_per_s",
        "eval/greedy/reward/mean",
        "eval/sampled/reward/mean",
    ):
        assert key in row, key
    assert row["agent/summary/weights_version"] == 1


def test_eval_modes_choose_the_evaluation_rollouts(tmp_path, capsys):
    """greedy only: no sampled rollout is played, logged or written to samples.jsonl; eval --show uses it."""
    trainer = Trainer(tiny_config(steps=1, eval_modes=("greedy",)), run_dir=tmp_path)
    history = trainer.train()
    assert "eval/greedy/reward/mean" in history[-1]
    assert not any(k.startswith("eval/sampled") for row in history for k in row)
    splits = {json.loads(line)["split"] for line in (tmp_path / "samples.jsonl").read_text().splitlines()}
    assert splits == {"train", "eval/greedy"}
    assert main(["eval", "--run-dir", str(tmp_path), "--prompts", "2", "--show", "1"]) == 0
    metrics = json.loads(capsys.readouterr().out)
    assert set(k.split("/")[1] for k in metrics) == {"greedy"}


# ---- learning ---------------------------------------------------------------------------------------
def length_ratio_rewards(seed: int, run_dir, lr: float = 1e-3, steps: int = 40) -> list[float]:
    """The training reward of each step of one seeded run of two tiny GPT-2s on Writing-v0 (length ratio)."""
    cfg = tiny_config(
        steps=steps, batch_prompts=8, group_size=4, seed=seed, agent=AgentConfig(max_new_tokens=24, lr=lr)
    )
    history = Trainer(cfg, run_dir=run_dir).train()
    return [r["reward/mean"] for r in history if r["step"] > 0]


def length_ratio_gain(rewards: list[float]) -> float:
    """The mean reward of the last 5 steps minus the first 5's."""
    return sum(rewards[-5:]) / 5 - sum(rewards[:5]) / 5


def test_tiny_llm_team_learns_the_length_ratio(tmp_path):
    """Two tiny GPT-2s raise Writing-v0's length-ratio reward (seeds 0 and 1, 40 steps each)."""
    gains = [length_ratio_gain(length_ratio_rewards(seed, tmp_path / f"seed-{seed}")) for seed in (0, 1)]
    # Measured per seed over seeds 0-5 (transformers 5.19, torch 2.13), the mean reward of steps 36-40 minus
    # steps 1-5: +0.126 mean, 0.025 sd (+0.097 to +0.154); not learning (lr 1e-9): -0.023, 0.021 sd (-0.055
    # to +0.000). Means of 2 seeds: learning +0.098 to +0.153 (seeds 0-1: +0.126), not learning -0.045 to
    # -0.002 (-0.008). The bar +0.06 sits between the two. (Under transformers 5.24 the same test measured
    # +0.134 mean, 0.028 sd, on one seed.)
    assert sum(gains) / len(gains) > 0.06, gains


def test_evaluation_never_changes_training(tmp_path):
    """Evaluating more or less often leaves the training trajectory bit-identical."""
    runs = []
    for i, every in enumerate((0, 1)):
        trainer = Trainer(tiny_config(steps=3, eval_every=every), run_dir=tmp_path / str(i))
        history = trainer.train()
        rows = [{k: v for k, v in r.items() if not k.startswith(("eval/", "time/"))} for r in history if r["step"] > 0]
        weights = {k: v.clone() for a in trainer.actors for k, v in a.policy.model.state_dict().items()}
        runs.append((rows, weights))
    assert runs[0][0] == runs[1][0]
    assert all(torch.equal(runs[0][1][k], runs[1][1][k]) for k in runs[0][1])


def test_eval_at_start_off_skips_the_untrained_row_only(tmp_path):
    """`eval_at_start=False` drops the step-0 evaluation (a grid measures the untrained row once, apart); the
    run trains the same and still evaluates at its end."""
    runs = []
    for i, at_start in enumerate((True, False)):
        trainer = Trainer(tiny_config(steps=2, eval_at_start=at_start), run_dir=tmp_path / str(i))
        history = trainer.train()
        evals = [r["step"] for r in history if "eval/greedy/reward/mean" in r]
        rows = [{k: v for k, v in r.items() if not k.startswith(("eval/", "time/"))} for r in history if r["step"] > 0]
        runs.append((evals, rows, [r["step"] for r in history]))
    assert runs[0][0] == [0, 2] and runs[1][0] == [2]
    assert runs[1][2] == [1, 2]  # no step-0 row at all
    assert runs[0][1] == runs[1][1]


def test_prompt_budget_leaves_room_for_the_completion_within_the_models_positions(tmp_path):
    # tiny GPT-2s have 512 learned positions: a 384-token prompt + 200 new tokens would index past them
    cfg = tiny_config(
        eval_prompts=16,
        steps=1,
        batch_prompts=1,
        run_dir=tmp_path / "a",
        agent=AgentConfig(max_new_tokens=200, max_prompt_tokens=384),
        eval_every=0,
    )
    trainer = Trainer(cfg)
    assert all(a.policy.generation.max_prompt_tokens == 312 for a in trainer.actors)
    prompts = ["x" * 600, "y" * 600]  # longer than the budget: the last 312 tokens are kept
    gen = trainer.actors[0].policy.generate(prompts, generator=torch.Generator().manual_seed(0))
    assert gen.prompt_mask.sum(1).tolist() == [312, 312]
    assert int(gen.prompt_mask.sum(1).max()) + gen.completion_ids.shape[1] <= 512
    # the centralized joint actor reads every role's prompt: N x the agent's budget, within positions
    joint = Trainer(
        TrainConfig(steps=1, collaboration="centralized", progress=False, plot=False, run_dir=str(tmp_path / "j"))
    )
    actor = joint.actors[0]
    tags = sum(len(s) for s in actor.script(dict.fromkeys(actor.roles, "")) if s.forced)  # the forced markers
    assert actor.policy.generation.max_prompt_tokens == 512 - 2 * 32 - tags - 2 * 2  # 2 tokens of slack per role
    # structured: the prompt (the first task) and the completion (tags, the second task, two sections) fit the
    # positions even for long observations cut inside multi-byte characters
    prompt = actor.build_prompt({r: "é" * 301 + "x" * 300 for r in actor.roles})
    gen = actor.generate([prompt], generator=torch.Generator().manual_seed(0))
    assert int(gen.prompt_mask.sum()) + gen.completion_ids.shape[1] <= 512
    with pytest.raises(ConfigError, match="max_new_tokens=512 leaves no room"):
        Trainer(
            TrainConfig(
                steps=1, progress=False, plot=False, run_dir=str(tmp_path / "b"), agent=AgentConfig(max_new_tokens=512)
            )
        )
    with pytest.raises(ConfigError, match="max_prompt_tokens"):
        AgentConfig(max_prompt_tokens=0)


def test_every_sampling_setting_of_an_agent_reaches_its_policy():
    import dataclasses

    from textzoo.decoding.generation import GenerationConfig, SamplingConfig
    from textzoo.models.build import build_policy

    names = {cls: {f.name for f in dataclasses.fields(cls)} for cls in (SamplingConfig, GenerationConfig, AgentConfig)}
    assert names[SamplingConfig] <= names[AgentConfig]
    # the one GenerationConfig field an agent does not declare is derived (from allowed_outputs, by the tokenizer)
    assert names[GenerationConfig] - names[AgentConfig] == {"allowed_tokens"}
    agent = AgentConfig(
        max_new_tokens=7, temperature=0.7, top_p=0.9, top_k=5, stop_strings=("!",), max_prompt_tokens=100
    )
    policy = build_policy(agent, 0, torch.device("cpu"))
    assert policy.generation.sampling() == agent.sampling()
    assert policy.generation.allowed_tokens is None
    with pytest.raises(ConfigError, match="agent.top_p"):
        AgentConfig(top_p=0)


def test_help_answers_without_importing_torch_or_transformers():
    import subprocess
    import sys

    code = (
        "import sys\nfrom textzoo.runners.cli import main\nassert main(['--help']) == 0\n"
        "heavy = sorted(m for m in ('torch', 'transformers', 'textzoo.runners.commands') if m in sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "usage: textzoo {train,eval,export,plot,sft,bench,serve-engine}" in done.stdout
