"""textzoo/ReasoningGym-v0: reasoning-gym's generators and verifiers in textzoo's arrangements."""

import features
import pytest
import torch

torch.set_num_threads(1)
features.importorskip("reasoning-gym", "reasoning_gym")

from helpers import tiny_config  # noqa: E402

from textzoo.config import (  # noqa: E402
    AgentConfig,  # noqa: E402
)
from textzoo.envs import check_env, make  # noqa: E402
from textzoo.errors import EnvError  # noqa: E402
from textzoo.runners.trainer import Trainer  # noqa: E402

ID = "textzoo/ReasoningGym-v0"
# pools kept small: countdown takes ~20 ms an item to generate
SMALL = {"size": 40, "eval_size": 15}


@pytest.mark.parametrize("dataset", ["mini_sudoku", "chain_sum", "basic_arithmetic", "maze", "countdown"])
@pytest.mark.parametrize("split", ["train", "eval"])
def test_a_sample_of_datasets_passes_check_env(dataset, split):
    check_env(lambda: make(ID, dataset=dataset, split=split, **SMALL), num_cycles=50)


@pytest.mark.parametrize("arrangement", ["team", "debate", "toolplan"])
def test_every_arrangement_passes_check_env(arrangement):
    check_env(lambda: make(ID, dataset="mini_sudoku", arrangement=arrangement, split="eval", **SMALL), num_cycles=50)


def test_the_verifier_score_is_the_solved_term_and_the_format_term_is_apart():
    env = make(ID, dataset="chain_sum", **SMALL)
    env.reset(options={"index": 3})
    gold = env.entry["answer"]
    _, rewards, _, _, infos = env.step({"solver": f"Adding up.\n#### {gold}"})
    assert rewards["solver"] == pytest.approx(0.9 * 1.0 + 0.1 * 1.0)
    assert infos["solver"]["reward_terms"] == {"solved": 1.0, "valid": 1.0}
    env.reset(options={"index": 3})
    _, rewards, _, _, infos = env.step({"solver": gold})  # the right answer without the mark: not valid
    assert infos["solver"]["reward_terms"] == {"solved": 1.0, "valid": 0.0}
    assert rewards["solver"] == pytest.approx(0.9)
    assert any("'####'" in n for n in infos["solver"]["notes"])
    # maze: reasoning-gym's verifier gives partial credit when the answer holds extra text
    maze = make(ID, dataset="maze", **SMALL)
    maze.reset(options={"index": 0})
    steps = maze.entry["answer"]
    partial = maze.dataset.score_answer(answer=f"{steps} steps", entry=maze.entry)
    assert 0 < partial < 1
    _, rewards, _, _, infos = maze.step({"solver": f"#### {steps} steps"})
    assert infos["solver"]["reward_terms"]["solved"] == pytest.approx(partial)
    assert rewards["solver"] == pytest.approx(0.9 * partial + 0.1)


def test_held_out_items_come_from_other_seeds_and_never_repeat_a_train_question():
    # two one-digit terms: ~200 possible questions, so seeds alone would let eval repeat train ones
    config = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}
    train = make(ID, dataset="chain_sum", config=config, size=60, eval_size=60, split="train")
    held = make(ID, dataset="chain_sum", config=config, size=60, eval_size=60, split="eval")
    train_q = {item["question"] for item in train._items}
    eval_q = [item["question"] for item in held._items]
    assert not train_q & set(eval_q)
    assert 0 < len(eval_q) < 60  # some eval draws repeated a train question and were dropped
    # the eval split is reasoning-gym's dataset of seed `seed + size`
    import reasoning_gym as rg

    other = rg.create_dataset("chain_sum", seed=60, size=60, **config)
    assert eval_q == [other[i]["question"] for i in range(60) if other[i]["question"] not in train_q]
    both = make(ID, dataset="chain_sum", config=config, size=60, eval_size=60, split="all")
    assert both.num_items() == 60 + len(eval_q)


def test_team_answers_are_combined_by_vote_and_debate_rewards_score_changes():
    team = make(ID, dataset="chain_sum", arrangement="team", num_agents=3, **SMALL)
    team.reset(options={"index": 0})
    gold = team.entry["answer"]
    _, rewards, _, _, infos = team.step({"agent_0": "#### 1", "agent_1": f"#### {gold}", "agent_2": f"#### {gold}"})
    # the team's answer is the majority's (gold): 0.6 * 1 + 0.3 * own + 0.1 * valid
    assert rewards == {"agent_0": pytest.approx(0.7), "agent_1": pytest.approx(1.0), "agent_2": pytest.approx(1.0)}
    assert infos["agent_0"]["reward_terms"] == {"solved": 1.0, "own_solved": 0.0, "valid": 1.0}

    debate = make(ID, dataset="chain_sum", arrangement="debate", num_agents=2, turns=2, **SMALL)
    obs, _ = debate.reset(options={"index": 0})
    _, rewards, _, _, infos = debate.step({"debater_0": f"#### {gold}", "debater_1": "#### 5"})
    # debater_0: solved, no agreement, valid -> 0.8; debater_1: 0.1
    assert rewards == {"debater_0": pytest.approx(0.8), "debater_1": pytest.approx(0.1)}
    obs = debate.state()
    assert f"answer read: {gold}" in obs and "answer read: 5" in obs
    _, rewards, terms, _, infos = debate.step({"debater_0": f"#### {gold}", "debater_1": f"#### {gold}"})
    # both end solved and agreeing (score 1.0): the reward is the change of score
    assert rewards == {"debater_0": pytest.approx(0.2), "debater_1": pytest.approx(0.9)}
    assert infos["debater_1"]["reward_terms"] == {"solved": 1.0, "agreement": 1.0, "valid": 0.0}
    assert all(terms.values())


def test_unknown_datasets_and_bad_configs_fail_with_the_fix():
    with pytest.raises(EnvError, match="Did you mean 'mini_sudoku'"):
        make(ID, dataset="mini_sudok")
    with pytest.raises(EnvError, match=r"no field\(s\) \['max_term'\].*'max_terms'"):
        make(ID, dataset="chain_sum", config={"max_term": 3})
    with pytest.raises(EnvError, match="refused by reasoning-gym: max_terms must be >= min_terms"):
        make(ID, dataset="chain_sum", config={"min_terms": 5, "max_terms": 2})
    with pytest.raises(EnvError, match="pass seed= and size= to the env"):
        make(ID, dataset="chain_sum", config={"seed": 3})
    with pytest.raises(EnvError, match="arrangement must be one of"):
        make(ID, arrangement="duel")


def test_a_training_run_on_reasoning_gym_logs_the_verifier_term(tmp_path):
    cfg = tiny_config(
        env=ID,
        env_kwargs={"dataset": "chain_sum", "size": 40, "eval_size": 10},
        run_dir=tmp_path,
        agent=AgentConfig(n_layer=1, n_embd=16, max_new_tokens=8),
    )
    history = Trainer(cfg).train()
    assert history[-1]["step"] == 2 and "reward/solved" in history[-1] and "reward/valid" in history[-1]
    assert "eval/greedy/reward/mean" in history[-1]
