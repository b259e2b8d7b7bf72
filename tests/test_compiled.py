"""The plain decoder's elementwise regions, compiled for bf16 update passes on CPU (`textzoo.decoding.compiled`)."""

import logging
import subprocess
import sys

import features
import pytest
import torch
from helpers import tiny_llama_grads
from torch._dynamo.utils import counters

from textzoo.decoding import compiled, fastlm

torch.set_num_threads(1)

needs_compiler = features.requires("compiler", compiled.compiler_available(), "inductor needs a C++ compiler")


def _flat(grads: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([g.flatten() for g in grads.values()])


def _error(grads, reference) -> float:
    return float((_flat(grads) - _flat(reference)).norm() / _flat(reference).norm())


def _graphs() -> int:
    return counters["stats"]["unique_graphs"]


def test_importing_the_trainer_leaves_inductor_unloaded():
    """`torch.compile` runs at a region's first compiled call: importing inductor's compiler (~1.2 s) is paid
    by a process that runs a bf16 update, not by every process that imports a model."""
    code = "import sys, textzoo.runners.trainer; print('torch._inductor.compile_fx' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False"]


@pytest.fixture(autouse=True)
def tiny_models_compile(monkeypatch):
    """The tiny test models are narrower than `compiled.MIN_WIDTH`: compile them here."""
    monkeypatch.setattr(compiled, "MIN_WIDTH", 0)


@needs_compiler
def test_a_bf16_update_pass_runs_compiled_regions_with_eager_gradients_to_bf16_accuracy(monkeypatch):
    """The regions compile (norms with and without the residual add, RoPE, SwiGLU) and the gradients land
    as close to float32's as the eager bf16 pass's do; the sampled tokens and the weights' gradient
    names are unchanged."""
    calls = []
    applies = compiled._applies
    monkeypatch.setattr(compiled, "_applies", lambda *args: calls.append(applies(*args)) or calls[-1])
    gen, logp, grads, _ = tiny_llama_grads(torch.bfloat16)
    assert calls.count(True) == 2 * 4  # the scoring pass: two norms, RoPE and SwiGLU per layer (sampling: none)
    monkeypatch.setattr(compiled, "COMPILE_UPDATE", False)
    gen_eager, logp_eager, grads_eager, _ = tiny_llama_grads(torch.bfloat16)
    _, _, grads32, _ = tiny_llama_grads(None)
    assert torch.equal(gen.completion_ids, gen_eager.completion_ids) and list(grads) == list(grads_eager)
    assert not torch.equal(logp, logp_eager)  # fused kernels round differently: the compiled pass did run
    torch.testing.assert_close(logp, logp_eager, atol=2e-2, rtol=0)
    compiled_error, eager_error = _error(grads, grads32), _error(grads_eager, grads32)
    assert compiled_error < 0.03 and eager_error < 0.03, (compiled_error, eager_error)
    assert _error(grads, grads_eager) < 0.03


@needs_compiler
def test_one_compile_serves_every_token_count(monkeypatch):
    """Only the token dimensions are dynamic: passes over other numbers of tokens reuse the graphs."""
    policy = tiny_llama_grads(torch.bfloat16)[3]
    before, calls = _graphs(), []
    applies = compiled._applies
    monkeypatch.setattr(compiled, "_applies", lambda *args: calls.append(applies(*args)) or calls[-1])
    for prompts in (["a"], ["a longer prompt", "b", "c"], ["hello there"] * 2):
        gen = policy.generate(prompts, generator=torch.Generator().manual_seed(1))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            policy.score(gen.prompt_ids, gen.prompt_mask, gen.completion_ids, gen.completion_mask).sum().backward()
    assert calls.count(True) == 3 * 2 * 4  # three passes ran compiled ...
    assert _graphs() == before  # ... on the graphs of the first one


@needs_compiler
def test_a_pass_under_a_dispatch_mode_runs_as_written_and_later_passes_compiled_again():
    """torch.compile skips a frame for good when a dispatch mode is active (FlopCounterMode, an op timer):
    such a pass runs the regions as written, and the passes after it compiled again, bit for bit as before."""
    from torch.utils.flop_counter import FlopCounterMode

    policy = tiny_llama_grads(torch.bfloat16)[3]
    gen = policy.generate(["hello there", "abc"], generator=torch.Generator().manual_seed(2))

    def log_probs() -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logp = policy.score(gen.prompt_ids, gen.prompt_mask, gen.completion_ids, gen.completion_mask)
        logp.sum().backward()
        return logp.detach()

    before = log_probs()
    with FlopCounterMode(display=False) as counter:
        counted = log_probs()
    after = log_probs()
    compiled.COMPILE_UPDATE = False
    try:
        eager = log_probs()
    finally:
        compiled.COMPILE_UPDATE = True
    assert counter.get_total_flops() > 0
    assert torch.equal(counted, eager)  # under the mode: as written
    assert torch.equal(after, before) and not torch.equal(after, eager)  # compiled again afterwards


def test_only_wide_bf16_passes_with_gradients_on_cpu_compile(monkeypatch):
    monkeypatch.setattr(compiled, "compiler_available", lambda: True)
    monkeypatch.setattr(compiled, "MIN_WIDTH", 256)
    x = torch.zeros(2, 576, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert compiled._applies(x, 576)  # an update pass of a real model
        assert not compiled._applies(x, 64)  # a tiny model
        with torch.no_grad():
            assert not compiled._applies(x, 576)  # sampling, old and reference log-probs
    assert not compiled._applies(x, 576)  # float32
    with torch.autocast("cpu", dtype=torch.float16):
        assert not compiled._applies(x, 576)
    monkeypatch.setattr(compiled, "COMPILE_UPDATE", False)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not compiled._applies(x, 576)


def test_a_regions_width_is_its_elements_per_token(monkeypatch):
    """Queries [N, H, D] count H * D per token: RoPE compiles in the same models as the norms."""
    widths = []
    monkeypatch.setattr(compiled, "_applies", lambda first, width: widths.append(width) or False)
    q, k = torch.zeros(5, 9, 64), torch.zeros(5, 3, 64)
    cos = sin = torch.zeros(5, 1, 64)
    fastlm._ROPE_CAST(q, k, cos, sin, None)
    fastlm._ADD_NORM(torch.zeros(2, 7, 576), None, torch.ones(576), 1e-5, None)
    assert widths == [9 * 64, 576]


def test_without_a_compiler_the_regions_run_as_written(monkeypatch):
    monkeypatch.setattr(compiled, "compiler_available", lambda: False)
    _, logp, grads, _ = tiny_llama_grads(torch.bfloat16)
    monkeypatch.setattr(compiled, "COMPILE_UPDATE", False)
    _, logp_eager, grads_eager, _ = tiny_llama_grads(torch.bfloat16)
    assert torch.equal(logp, logp_eager)
    assert all(torch.equal(grads[n], grads_eager[n]) for n in grads)


def test_a_failed_compile_warns_once_and_runs_as_written(monkeypatch, caplog):
    def broken(*args):
        raise RuntimeError("no toolchain")

    monkeypatch.setattr(compiled, "_failed", [])
    monkeypatch.setattr(compiled, "compiler_available", lambda: True)
    monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: broken)
    region = compiled.region(fastlm._silu_mul, fixed=(1, 1))
    gate, up = (torch.randn(4, 6, requires_grad=True) for _ in range(2))
    with caplog.at_level(logging.WARNING, logger="textzoo.decoding.compiled"):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            first = region(gate, up)
            second = region(gate, up)
    assert torch.equal(first, fastlm._silu_mul(gate, up)) and torch.equal(second, first)
    assert compiled._failed and "no toolchain" in compiled._failed[0]
    assert [r.getMessage() for r in caplog.records].count(caplog.records[0].getMessage()) == 1
    assert "running them as written" in caplog.records[0].getMessage()


def _two_bf16_steps(tmp_path, parallel_jobs: int, compile_regions: bool = True) -> list[dict[str, torch.Tensor]]:
    from helpers import tiny_config

    from textzoo.config import AgentConfig
    from textzoo.runners.trainer import Trainer
    from textzoo.runners.update import UpdateConfig

    cfg = tiny_config(
        agent=AgentConfig(model="tiny-llama", precision="bf16-mixed", max_new_tokens=8),
        threads=1,
        update=UpdateConfig(micro_batch_size=4, parallel_jobs=parallel_jobs, compile_regions=compile_regions),
        run_dir=tmp_path / f"jobs-{parallel_jobs}-{compile_regions}",
    )
    trainer = Trainer(cfg)
    for _ in range(2):
        trainer.train_step()
    return [{n: p.detach().clone() for n, p in a.policy.model.named_parameters()} for a in trainer.actors]


@needs_compiler
def test_compiled_updates_are_deterministic_and_safe_in_parallel_jobs(tmp_path, monkeypatch):
    """Two agents' bf16 updates through the compiled regions, in two threads or one after the other: the
    same weights bit for bit (and different from the regions run as written: they did run). A run with
    ``update.compile_regions`` off lands on the regions-as-written weights bit for bit."""
    torch._dynamo.reset()  # the regions first compile in the two threads (while one compiles, the other runs)
    parallel = _two_bf16_steps(tmp_path, parallel_jobs=2)
    sequential = _two_bf16_steps(tmp_path, parallel_jobs=1)
    configured_off = _two_bf16_steps(tmp_path, parallel_jobs=2, compile_regions=False)  # the run's switch
    monkeypatch.setattr(compiled, "COMPILE_UPDATE", False)  # the process's switch
    eager = _two_bf16_steps(tmp_path, parallel_jobs=1)
    assert len(parallel) == 2
    for par, seq, off, plain in zip(parallel, sequential, configured_off, eager):
        assert all(torch.equal(par[n], w) for n, w in seq.items())
        assert any(not torch.equal(plain[n], w) for n, w in seq.items())
        assert all(torch.equal(off[n], w) for n, w in plain.items())
