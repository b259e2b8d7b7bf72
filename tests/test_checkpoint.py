"""Checkpoint files: atomic writes, checksums, keep-last-k, weights of tied models, RNG round trip."""

import json
import random

import numpy as np
import pytest
import torch

from textzoo.config import AgentConfig, TrainConfig
from textzoo.errors import CheckpointError
from textzoo.models.policy import Policy
from textzoo.runners import checkpoint as ck

torch.set_num_threads(1)


def _model(seed: int = 0) -> torch.nn.Module:
    return Policy.tiny("gpt2", n_layer=1, n_embd=16, n_head=2, n_positions=32, seed=seed).model


def _save(run_dir, step, model, keep_last=0):
    return ck.write_checkpoint(run_dir, step, {"a": model}, {"note": step}, {"seed": 0}, keep_last)


def test_round_trip_restores_weights_and_state(tmp_path):
    src, dst = _model(0), _model(1)
    path = _save(tmp_path, 3, src)
    assert path.name == "step-00000003" and ck.verify(path) is None
    loaded = ck.read_checkpoint(path)
    assert loaded.step == 3 and loaded.state["note"] == 3 and loaded.config == {"seed": 0}
    ck.check_weights(dst, loaded.weights["a"], "a")
    ck.apply_weights(dst, loaded.weights["a"])
    for (name, p), q in zip(src.named_parameters(), dst.parameters()):
        assert torch.equal(p, q), name


def test_tied_weights_are_stored_once_and_stay_tied(tmp_path):
    model = _model(0)
    weights = ck.model_weights(model)
    state = model.state_dict()
    assert "lm_head.weight" in state and "lm_head.weight" not in weights  # GPT-2 ties it to wte
    other = _model(1)
    ck.apply_weights(other, ck.read_checkpoint(_save(tmp_path, 1, model)).weights["a"])
    assert other.lm_head.weight.data_ptr() == other.transformer.wte.weight.data_ptr()
    assert torch.equal(other.lm_head.weight, model.lm_head.weight)


def test_weights_of_another_shape_are_refused():
    small = ck.model_weights(_model(0))
    big = Policy.tiny("gpt2", n_layer=1, n_embd=32, n_head=2, n_positions=32).model
    with pytest.raises(CheckpointError, match="wte.weight"):
        ck.check_weights(big, small, "a")
    deeper = Policy.tiny("gpt2", n_layer=2, n_embd=16, n_head=2, n_positions=32).model
    with pytest.raises(CheckpointError, match="missing"):
        ck.check_weights(deeper, small, "a")


def test_corrupt_partial_and_missing_files_are_named(tmp_path):
    model = _model()
    first = _save(tmp_path, 1, model)
    second = _save(tmp_path, 2, model)
    third = _save(tmp_path, 3, model)
    weights = third / "weights-a.safetensors"
    data = bytearray(weights.read_bytes())
    data[-5] ^= 0xFF  # same size, different content: only the checksum can tell
    weights.write_bytes(bytes(data))
    assert "sha256" in ck.verify(third)
    (second / "manifest.json").unlink()
    assert "partial" in ck.verify(second)
    path, damage = ck.latest_intact(tmp_path)
    assert path == first and len(damage) == 2 and "step-00000003" in damage[0]
    (first / "state.pt").unlink()
    assert "state.pt is missing" in ck.verify(first)
    assert ck.latest_intact(tmp_path)[0] is None
    with pytest.raises(CheckpointError, match="sha256"):
        ck.read_checkpoint(third)


def test_keep_last_prunes_oldest(tmp_path):
    model = _model()
    for step in range(1, 6):
        _save(tmp_path, step, model, keep_last=2)
    assert [p.name for p in ck.list_checkpoints(tmp_path)] == ["step-00000004", "step-00000005"]
    _save(tmp_path, 6, model, keep_last=0)
    assert len(ck.list_checkpoints(tmp_path)) == 3


def test_stale_staging_folder_is_ignored_then_cleaned(tmp_path):
    model = _model()
    _save(tmp_path, 1, model)
    stale = ck.checkpoints_dir(tmp_path) / ".staging-step-00000002-999"
    stale.mkdir()
    (stale / "state.pt").write_bytes(b"half")
    assert [p.name for p in ck.list_checkpoints(tmp_path)] == ["step-00000001"]
    _save(tmp_path, 2, model)
    assert not stale.exists()
    assert [p.name for p in ck.list_checkpoints(tmp_path)] == ["step-00000001", "step-00000002"]


def test_saving_a_step_again_replaces_it(tmp_path):
    _save(tmp_path, 1, _model(0))
    path = _save(tmp_path, 1, _model(1))
    assert ck.verify(path) is None
    assert torch.equal(
        ck.read_checkpoint(path).weights["a"]["transformer.wte.weight"], _model(1).transformer.wte.weight
    )


def test_rng_round_trip_covers_python_numpy_torch():
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    state = ck.capture_rng()
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    random.seed(9)
    np.random.seed(9)
    torch.manual_seed(9)
    ck.restore_rng(state)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected


def test_config_diff_names_nested_fields_and_ignores_safe_ones():
    a = TrainConfig(steps=5, agent=AgentConfig(lr=1e-3))
    b = TrainConfig(steps=9, agent=AgentConfig(lr=2e-3), seed=1)
    diff = ck.config_diff(a, b, frozenset({"steps"}))
    assert sorted(diff) == ["agent.lr: 0.001 -> 0.002", "seed: 0 -> 1"]
    assert ck.config_diff(a, a, frozenset()) == []


def test_manifest_lists_every_file_with_size(tmp_path):
    path = _save(tmp_path, 1, _model())
    manifest = json.loads((path / "manifest.json").read_text())
    assert sorted(manifest["files"]) == ["config.json", "state.pt", "weights-a.safetensors"]
    for name, entry in manifest["files"].items():
        assert (path / name).stat().st_size == entry["bytes"]
