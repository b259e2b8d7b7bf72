"""benchmarks/parity.py: both sides get the same settings, the sweep resumes, the verdict's arithmetic, and the
shared held-out evaluator runs textzoo's trained LoRA weights exactly (real model)."""

import dataclasses
import json
import subprocess

import features
import pytest
import torch
from helpers import load_benchmark

bench = load_benchmark("parity")


@pytest.mark.parametrize("compare", ["trl", "comlrl"])
def test_textzoo_side_gets_the_comparisons_settings(compare):
    s = bench.setting(bench.Args(), compare)
    cfg = bench.textzoo_config(s, seed=3, folder="some/folder", run_dir="run")
    agent = cfg.agent
    assert (cfg.algo, cfg.group_size, cfg.batch_prompts, cfg.steps, cfg.seed) == ("magrpo", s.group_size, 1, 40, 3)
    assert (agent.lr, agent.lr_schedule, agent.warmup_steps) == (s.lr, "constant", 0)
    assert (agent.weight_decay, agent.max_grad_norm, agent.precision) == (s.weight_decay, s.max_grad_norm, "fp32")
    assert (agent.max_new_tokens, agent.temperature, agent.top_p, agent.top_k) == (s.max_new_tokens, 1.0, 1.0, 0)
    assert (agent.lora.rank, agent.lora.alpha, agent.lora.dropout) == (16, 32.0, 0.0)
    assert agent.lora.target_modules == ("q_proj", "k_proj", "v_proj", "o_proj")
    r = cfg.reinforce
    assert (r.advantage_scale, r.kl_coef, r.clip_range, r.epochs, r.std_floor) == ("std", 0.0, None, 1, 0.0)
    assert r.loss_aggregation == {"trl": "token_mean", "comlrl": "seq_sum"}[compare]
    assert cfg.update.skip_zero_grad_steps is False  # the references step AdamW on every batch
    assert cfg.env_kwargs == s.env_kwargs and cfg.agent.prompt_format == "chat"


def test_trl_side_matches_textzoos_config_field_for_field():
    s = bench.setting(bench.Args(steps=41), "trl")
    cfg = bench.textzoo_config(s, seed=2, folder="m", run_dir="r")
    kw = bench.trl_config(s, seed=2, out="o")
    assert kw["per_device_train_batch_size"] == cfg.batch_prompts * cfg.group_size
    assert (kw["num_generations"], kw["gradient_accumulation_steps"], kw["max_steps"]) == (cfg.group_size, 1, 41)
    assert (kw["learning_rate"], kw["lr_scheduler_type"], kw["warmup_steps"]) == (cfg.agent.lr, "constant", 0)
    assert (kw["weight_decay"], kw["max_grad_norm"]) == (cfg.agent.weight_decay, cfg.agent.max_grad_norm)
    assert kw["max_completion_length"] == cfg.agent.max_new_tokens
    assert (kw["temperature"], kw["top_p"], kw["top_k"]) == (cfg.agent.temperature, cfg.agent.top_p, cfg.agent.top_k)
    assert (kw["beta"], kw["num_iterations"]) == (cfg.reinforce.kl_coef, cfg.reinforce.epochs)
    assert (kw["loss_type"], kw["scale_rewards"]) == ("dapo", "group")  # = token_mean, / group std
    assert (kw["seed"], kw["bf16"], kw["shuffle_dataset"]) == (2, False, False)
    with pytest.raises(ValueError, match="dapo"):
        bench.trl_config(dataclasses.replace(s, loss_aggregation="seq_sum"), 0, "o")


def test_trl_takes_every_argument_as_given():
    trl = features.importorskip("trl", "trl")  # the `parity` extra
    s = bench.setting(bench.Args(), "trl")
    kw = bench.trl_config(s, seed=1, out="o")
    config = trl.GRPOConfig(**kw)
    for key, value in kw.items():
        assert getattr(config, key) == ([] if key == "report_to" else value), key  # "none" is stored as []


def test_comlrl_side_gets_peer_comlrls_writing_task_and_the_settings():
    s = bench.setting(bench.Args(), "comlrl")
    peer = bench.peer_args(s, seed=4)
    assert (peer.group_size, peer.max_new_tokens, peer.lr, peer.seed) == (s.group_size, s.max_new_tokens, s.lr, 4)
    assert s.env_kwargs == bench.peer_comlrl.env_kwargs(peer)  # the length-ratio reward on the cut sources
    assert s.env_kwargs["terms"] == {"length_ratio": 1.0} and len(s.env_kwargs["dataset"]) == 400
    # CoMLRL's AdamW has torch's default weight decay and no clipping: textzoo's side is set to the same
    assert (s.weight_decay, s.max_grad_norm) == (torch.optim.AdamW([torch.zeros(1)]).defaults["weight_decay"], 0.0)


def test_train_items_are_textzoos_batches_in_order():
    s = dataclasses.replace(bench.SETTINGS["trl"], batch_prompts=3, steps=5)
    sampler = bench.ItemSampler(7, 11)
    expected = [i for _ in range(5) for i in sampler.next(3)]
    items = bench.train_items(s, 11, 7)
    assert items == expected and len(items) == 15
    assert sorted(items[:7]) == list(range(7))  # a shuffled pass over the items, then the next pass


def test_moving_average_by_hand():
    assert bench.moving_average([1.0, 3.0, 5.0, 7.0], 2) == [1.0, 2.0, 4.0, 6.0]
    assert bench.moving_average([2.0, 4.0, 9.0], 5) == [2.0, 3.0, 5.0]


def _result(path, compare, side, seed, after, curve=(0.1, 0.2)):
    out = {"compare": compare, "side": side, "seed": seed, "heldout": {"reward": after, "items": 5}}
    out["curve"] = [{"reward": r, "seconds": 2.0} for r in curve]
    path.write_text(json.dumps(out))


def test_sweep_runs_only_missing_runs_whole_seeds_first(tmp_path, monkeypatch):
    a = bench.Args(results=str(tmp_path), seeds=(0, 1))
    _result(tmp_path / "trl-before.json", "trl", "before", 0, 0.1)
    _result(tmp_path / "trl-trl-seed0.json", "trl", "trl", 0, 0.2)
    _result(tmp_path / "comlrl-textzoo-seed1.json", "comlrl", "textzoo", 1, 0.2)
    launched = []

    def fake_run(cmd, env):
        flags = dict(f[2:].split("=", 1) for f in cmd[2:])
        launched.append((flags["compare"], flags["side"], int(flags["seed"])))
        assert env["OMP_NUM_THREADS"] == "1"
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(bench.subprocess, "run", fake_run)
    bench.sweep(a, ("trl", "comlrl"))
    assert launched == [
        ("comlrl", "before", 0),
        ("trl", "textzoo", 0),
        ("comlrl", "comlrl", 0),
        ("comlrl", "textzoo", 0),
        ("trl", "trl", 1),
        ("trl", "textzoo", 1),
        ("comlrl", "comlrl", 1),
    ]
    monkeypatch.setattr(bench.subprocess, "run", lambda cmd, env: subprocess.CompletedProcess(cmd, 3))
    with pytest.raises(SystemExit, match="comlrl before seed 0 run failed"):
        bench.sweep(a, ("comlrl",))


@pytest.mark.parametrize(("ours", "holds"), [((0.33, 0.31, 0.32), True), ((0.28, 0.29, 0.27), False)])
def test_report_gains_and_the_parity_verdict(tmp_path, ours, holds, capsys):
    root = tmp_path / "parity"
    root.mkdir()
    _result(root / "trl-before.json", "trl", "before", 0, 0.1)
    for seed, (ref, mine) in enumerate(zip((0.3, 0.4, 0.5), ours)):
        _result(root / f"trl-trl-seed{seed}.json", "trl", "trl", seed, ref)
        _result(root / f"trl-textzoo-seed{seed}.json", "trl", "textzoo", seed, mine, curve=(0.1, 0.3, 0.2))
    out = bench.report(bench.Args(results=str(root)), "trl")
    # reference gains 0.2, 0.3, 0.4: mean 0.3, std 0.1; parity needs textzoo's mean gain >= 0.2
    ref_mean, ref_std = out["gains"]["trl"]
    assert ref_mean == pytest.approx(0.3) and ref_std == pytest.approx(0.1)
    assert out["gains"]["textzoo"][0] == pytest.approx(sum(ours) / 3 - 0.1)
    assert out["holds"] is holds
    assert (tmp_path / "parity-trl.png").stat().st_size > 1000
    printed = capsys.readouterr().out
    assert "| TRL 1.16.0 GRPOTrainer | 0, 1, 2 | 0.400 ± 0.100 | +0.300 ± 0.100 | 2.0 |" in printed
    assert bench.report(bench.Args(results=str(root)), "comlrl") is None  # no results: nothing to say


def test_heldout_evaluator_runs_textzoos_trained_adapter_exactly(smollm2):
    """The evaluator's model (base + merged LoRA weights from `adapter_state_dict`) gives the logits of the
    textzoo policy that holds that adapter."""
    from textzoo.models.lora import adapter_state_dict
    from textzoo.runners.build import build_actors

    s = bench.setting(bench.Args(), "trl")
    cfg = bench.textzoo_config(s, seed=0, folder=str(smollm2), run_dir="unused")
    (actor,) = build_actors(cfg, ["solver"])
    view = actor.policy.model
    torch.manual_seed(0)
    with torch.no_grad():  # a trained-looking adapter: lora_B is 0 at init, which would hide a mismatch
        for name, p in view.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.02)
    ids = actor.policy.tokenizer("What is 3 + 4? #### 7", return_tensors="pt").input_ids
    with torch.no_grad():
        ours = view(input_ids=ids).logits
        merged = bench.load_agent(str(smollm2), s, adapter_state_dict(view))(input_ids=ids).logits
        base = bench.load_agent(str(smollm2), s, None)(input_ids=ids).logits
    assert (ours - base).abs().max() > 0.05  # the adapter changes the logits
    torch.testing.assert_close(merged, ours, atol=2e-4, rtol=1e-4)
