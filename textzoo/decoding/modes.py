"""The one save-and-restore of a module's train/eval mode (sampling runs in eval mode, updates in train mode)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def eval_mode(module: torch.nn.Module, training: bool = False) -> Iterator[torch.nn.Module]:
    """Run the block with `module` in eval mode (train mode with ``training=True``); restore its mode after."""
    was_training = module.training
    module.train(training)
    try:
        yield module
    finally:
        module.train(was_training)
