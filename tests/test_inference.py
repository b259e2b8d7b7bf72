"""Running models outside an update: eval mode, chunks, the one no-grad scorer."""

import pytest
import torch

torch.set_num_threads(1)

from textzoo.decoding.generation import GenerationConfig  # noqa: E402
from textzoo.decoding.inference import chunks, score_no_grad  # noqa: E402
from textzoo.decoding.modes import eval_mode  # noqa: E402
from textzoo.models.policy import Policy  # noqa: E402


def test_eval_mode_sets_and_restores_the_mode_even_on_error():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.5)).train()
    with eval_mode(model):
        assert not model.training and not model[1].training
    assert model.training and model[1].training
    model.eval()
    with pytest.raises(RuntimeError), eval_mode(model, training=True):
        assert model.training
        raise RuntimeError("boom")
    assert not model.training


def test_chunked_no_grad_scores_are_the_scores_of_the_whole_batch():
    policy = Policy.tiny(seed=0, generation=GenerationConfig(max_new_tokens=6))
    policy.model.train()
    gen = policy.generate([f"prompt {i} " * (i % 3 + 1) for i in range(7)], generator=torch.Generator().manual_seed(0))
    assert [len(part) for part in chunks(gen, 3)] == [3, 3, 1] and list(chunks(gen.select([]), 3)) == []
    with torch.no_grad(), eval_mode(policy.model):
        whole = policy.score(gen.prompt_ids, gen.prompt_mask, gen.completion_ids, gen.completion_mask)
    chunked = score_no_grad(policy, gen, chunk=3)
    assert chunked.shape == gen.completion_ids.shape and not chunked.requires_grad
    torch.testing.assert_close(chunked, whole, atol=1e-5, rtol=0)
    torch.testing.assert_close(chunked, gen.logprobs, atol=1e-5, rtol=0)  # what was sampled is what is scored
    assert policy.model.training  # the mode is restored
