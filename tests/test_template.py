"""The family-folder template of CONTRIBUTING's "add an algorithm" recipe registers, is checked and trains."""

import dataclasses
import importlib
import shutil
import sys
from pathlib import Path

import pytest
import torch

torch.set_num_threads(1)

from textzoo.algorithms import registry  # noqa: E402
from textzoo.config import AgentConfig, TrainConfig  # noqa: E402
from textzoo.errors import ConfigError  # noqa: E402
from textzoo.runners.trainer import Trainer  # noqa: E402

TEMPLATE = Path(__file__).resolve().parents[1] / "docs" / "templates" / "family"


@pytest.fixture
def median(tmp_path, monkeypatch):
    """The template copied as the package `median_family`, its entries registered for this test only."""
    shutil.copytree(TEMPLATE, tmp_path / "median_family")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "ALGORITHMS", dict(registry.ALGORITHMS))
    entries = importlib.import_module("median_family.entries")
    config = importlib.import_module("median_family.config")
    for name, algorithm in entries.ENTRIES.items():
        registry.register_algorithm(name, algorithm)
    # the field a built-in family adds to TrainConfig
    with_median = dataclasses.make_dataclass(
        "MedianTrainConfig",
        [("median", config.MedianConfig, dataclasses.field(default_factory=config.MedianConfig))],
        bases=(TrainConfig,),
    )
    yield with_median
    for module in [m for m in sys.modules if m.startswith("median_family")]:
        del sys.modules[module]


def test_the_template_family_is_checked_when_the_run_is_built(median):
    cfg = median(algo="mamedian", group_size=2)  # a config is data: nothing is checked yet
    with pytest.raises(ConfigError, match="median.min_group=3"):
        registry.configure(cfg)


def test_the_template_family_trains(median, tmp_path):
    cfg = median(
        algo="mamedian",
        steps=2,
        batch_prompts=2,
        group_size=3,
        eval_prompts=1,
        agent=AgentConfig(max_new_tokens=6, n_layer=1, n_embd=32),
        progress=False,
        plot=False,
        run_dir=str(tmp_path / "run"),
    )
    trainer = Trainer(cfg)
    assert type(trainer.family).__name__ == "MedianFamily"
    history = trainer.train()
    assert [row["step"] for row in history[1:]] == [1, 2] and 0.0 <= history[-1]["reward/mean"] <= 1.0
