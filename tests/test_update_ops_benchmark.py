"""benchmarks/update_ops.py: its op timer counts the matrix products' FLOPs as torch's FlopCounterMode does,
and the script runs end to end on a tiny model."""

import pytest
import torch
from helpers import load_benchmark
from torch.utils.flop_counter import FlopCounterMode

from textzoo.config import AgentConfig
from textzoo.decoding import fastlm, mixed_gemm
from textzoo.models.build import build_policy
from textzoo.models.policy import Policy


def _script():
    return load_benchmark("update_ops")


def test_the_timer_counts_matmul_flops_as_torchs_counter_does():
    ops = _script()
    # gpt2's biased projections run addmm, llama's mm; attention bmm; llama under bf16 autocast sends its
    # weight gradients through the mixed GEMM (textzoo::add_product), where the CPU wheel has it
    for arch, autocast in (("gpt2", None), ("llama", None), ("llama", torch.bfloat16)):
        policy = Policy.tiny(arch, seed=0)
        policy.autocast = autocast
        ids, mask = policy.encode(["a prompt", "another, longer prompt"])
        gen = policy.generate_ids(ids, mask, generator=torch.Generator().manual_seed(0))
        with FlopCounterMode(display=False) as counter, ops.OpTimer() as timer:
            policy.score(gen.prompt_ids, gen.prompt_mask, gen.completion_ids, gen.completion_mask).sum().backward()
        counts = counter.get_flop_counts()["Global"]
        want = sum(n for op, n in counts.items() if op.__name__ in ops.MATMULS)
        assert want > 0 and timer.matmul_flop() == want, (arch, timer.matmul_flop(), counts)
        assert {k[0] for k in timer.operands} <= set(ops.MATMULS)
        assert all(timer.seconds[k] > 0 for k in timer.operands)
        # under bf16 the weight gradients take the mixed GEMM exactly where it is the default (CPUs with AMX)
        took_gemm = "add_product" in {k[0] for k in timer.operands}
        assert took_gemm == (autocast is not None and fastlm.grad_into_weights())


def test_the_script_reports_a_tiny_models_micro_batch(capsys):
    ops = _script()
    first = ops.main(ops.Args(model="tiny-llama", repeats=1, top=3))
    out = capsys.readouterr().out
    assert "forward+backward" in out and "matrix products:" in out and "GFLOP/s" in out
    assert "minor page faults" in out and "a first one (fresh gradients)" in out
    assert "against the float32 matmul peak measured now (" in out and "the ceiling at these shapes" in out
    assert "with the compiled elementwise regions" in out
    assert len(out.split("ms alone  op")[1].strip().splitlines()) == 3  # the table: the top 3 ops
    later = ops.main(ops.Args(model="tiny-llama", repeats=1, top=3, accumulate=True))
    assert "a later micro-batch (gradients accumulated)" in capsys.readouterr().out
    # the same one pass is timed, now adding each weight's gradient into the one already there
    assert later.matmul_flop() == first.matmul_flop() > 0
    params = build_policy(AgentConfig(model="tiny-llama"), 0, torch.device("cpu")).model.parameters()
    assert later.calls[("add_",)] == len(list(params))  # one in-place add per weight
    assert first.calls[("add_",)] == 0


@pytest.mark.skipif(not mixed_gemm.available(), reason="this torch has no MKL mixed GEMM")
def test_the_script_times_the_mixed_gemm_beside_the_bf16_products(capsys):
    ops = _script()
    timer = ops.main(ops.Args(model="tiny-llama", precision="bf16-mixed", repeats=1, top=3))
    out = capsys.readouterr().out
    assert "weight gradients by the mixed GEMM into float32 .grad:" in out and "as bf16 products cast and added" in out
    assert "against the bfloat16 matmul peak measured now (" in out
    # the timed pass took the default: the mixed GEMM on CPUs with AMX, bf16 products elsewhere
    assert any(k[0] == "add_product" for k in timer.calls) == fastlm.grad_into_weights()
    assert fastlm.GRAD_INTO_WEIGHTS is None  # the comparison leaves the default as it was
