"""The bf16 x bf16 -> fp32 GEMM into a float32 tensor (`mixed_gemm`) and the linear node that writes
bf16 layers' weight gradients through it straight into the float32 ``.grad`` (`fastlm._LinearIntoGrad`)."""

import shutil

import pytest
import torch
from helpers import metrics_rows, tiny_config, tiny_llama_grads

from textzoo.config import AgentConfig
from textzoo.decoding import fastlm, mixed_gemm
from textzoo.runners import checkpoint as ck
from textzoo.runners.trainer import Trainer

torch.set_num_threads(1)
pytestmark = pytest.mark.skipif(not mixed_gemm.available(), reason="this torch has no MKL mixed GEMM")


def _exact(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a.double().T @ b.double()).float()


def test_add_product_accumulates_in_float32():
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(37, 70, generator=g).bfloat16(), torch.randn(37, 23, generator=g).bfloat16()
    total = torch.randn(70, 23, generator=g)
    expected = total.double() + _exact(a, b).double()
    mixed_gemm.add_product(total, a, b)
    # float32 products and sums: ~1e-6 relative, where a bf16 product would be off by ~4e-3
    torch.testing.assert_close(total.double(), expected, atol=1e-5, rtol=1e-5)
    fresh = torch.full((70, 23), float("nan"))  # without accumulate its contents are not read
    mixed_gemm.add_product(fresh, a, b, accumulate=False)
    torch.testing.assert_close(fresh, _exact(a, b), atol=1e-5, rtol=1e-5)


def test_add_product_gives_the_same_bits_at_any_address():
    """Exact resume needs the same sums from the same operands wherever the allocator puts them: copies at
    offsets that break 64-byte alignment give bit-identical results (MKL may otherwise pick kernels by
    alignment)."""
    g = torch.Generator().manual_seed(3)
    for n, m, k in ((37, 70, 23), (345, 576, 576)):
        a, b = torch.randn(n, m, generator=g).bfloat16(), torch.randn(n, k, generator=g).bfloat16()
        start = torch.randn(m, k, generator=g)
        results = []
        for shift in range(4):  # elements: 2-byte steps for the bf16 operands, 4-byte for the total
            pa = torch.empty(n * m + shift, dtype=torch.bfloat16)[shift:].view(n, m).copy_(a)
            pb = torch.empty(n * k + shift, dtype=torch.bfloat16)[shift:].view(n, k).copy_(b)
            total = torch.empty(m * k + shift)[shift:].view(m, k).copy_(start)
            mixed_gemm.add_product(total, pa, pb)
            results.append(total.clone())
        assert all(torch.equal(results[0], r) for r in results[1:]), (n, m, k)


def test_add_product_takes_a_column_slice_of_a_wider_gradient():
    g = torch.Generator().manual_seed(1)
    wide, b = torch.randn(9, 30, generator=g).bfloat16(), torch.randn(9, 5, generator=g).bfloat16()
    part = wide[:, 10:22]  # rows strided by 30: the GEMM's leading dimension, no copy
    total = torch.zeros(12, 5)
    mixed_gemm.add_product(total, part, b)
    torch.testing.assert_close(total, _exact(part, b), atol=1e-5, rtol=1e-5)


def test_add_product_refuses_what_it_cannot_multiply():
    a, b, total = torch.zeros(4, 3).bfloat16(), torch.zeros(4, 2).bfloat16(), torch.zeros(3, 2)
    with pytest.raises(ValueError, match="shapes do not match"):
        mixed_gemm.add_product(torch.zeros(2, 3), a, b)
    with pytest.raises(ValueError, match="bfloat16"):
        mixed_gemm.add_product(total, a.float(), b)
    with pytest.raises(ValueError, match="contiguous"):
        mixed_gemm.add_product(total, torch.zeros(3, 4).bfloat16().T, b)


def test_linear_into_grad_matches_the_exact_gradients():
    """Two float32 weights fused into one bf16 copy: each weight's ``.grad`` gets its rows of
    ``grad.T @ x`` in float32 (added to what it held), the input and bias gradients are autograd's."""
    g = torch.Generator().manual_seed(2)
    w1 = torch.randn(6, 8, generator=g).requires_grad_()
    w2 = torch.randn(4, 8, generator=g).requires_grad_()
    w2.grad = torch.ones(4, 8)  # an earlier micro-batch's gradient
    x = torch.randn(3, 5, 8, generator=g).bfloat16().requires_grad_()
    bias = torch.randn(10, generator=g).bfloat16().requires_grad_()
    copy = torch.cat([w1, w2]).detach().bfloat16()
    out_grad = torch.randn(3, 5, 10, generator=g).bfloat16()
    out = fastlm._LinearIntoGrad.apply(x, copy, bias, w1, w2)
    assert torch.equal(out, torch.nn.functional.linear(x, copy, bias))
    out.backward(out_grad)
    rows, inputs = out_grad.reshape(15, 10), x.detach().reshape(15, 8)
    torch.testing.assert_close(w1.grad, _exact(rows[:, :6], inputs), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(w2.grad, 1 + _exact(rows[:, 6:], inputs), atol=1e-5, rtol=1e-5)
    x_ref, bias_ref = x.detach().requires_grad_(), bias.detach().requires_grad_()
    torch.nn.functional.linear(x_ref, copy, bias_ref).backward(out_grad)
    assert torch.equal(x.grad, x_ref.grad) and torch.equal(bias.grad, bias_ref.grad)


def _llama_grads(into: bool, monkeypatch, autocast=torch.bfloat16):
    calls = []
    real = mixed_gemm.add_product
    monkeypatch.setattr(fastlm, "GRAD_INTO_WEIGHTS", into)
    monkeypatch.setattr(mixed_gemm, "add_product", lambda *a, **k: calls.append(tuple(a[0].shape)) or real(*a, **k))
    _, _, grads, policy = tiny_llama_grads(autocast)
    matrices = sorted(tuple(p.shape) for p in policy.model.parameters() if p.dim() == 2)
    return grads, sorted(calls), matrices


def test_a_bf16_decoder_sends_every_weight_gradient_through_the_mixed_gemm(monkeypatch):
    """tiny-llama under bf16 autocast: each weight matrix (q, k, v, o, gate, up, down of both layers and
    the head tied to the embedding) gets its gradient from one mixed GEMM; the gradients agree with the
    bf16-product path's and with fp32's to bf16 accuracy."""
    into, calls, matrices = _llama_grads(True, monkeypatch)
    before, none, _ = _llama_grads(False, monkeypatch)
    fp32, _, _ = _llama_grads(False, monkeypatch, autocast=None)
    assert calls == matrices and len(calls) == 15 and not none
    for name in fp32:
        scale = float(fp32[name].norm())
        assert float((into[name] - before[name]).norm()) < 0.02 * scale, name
        assert float((into[name] - fp32[name]).norm()) < 0.05 * scale, name


def test_a_bf16_run_through_the_mixed_gemm_resumes_bit_identically(tmp_path, monkeypatch):
    """tiny-llama in bf16-mixed, full fine-tuning: a run resumed from its step-2 checkpoint ends with the
    same weights and metrics rows as the uninterrupted one (the weight gradients went through the GEMM)."""
    calls = []
    real = mixed_gemm.add_product
    monkeypatch.setattr(fastlm, "GRAD_INTO_WEIGHTS", True)  # the default takes it only on CPUs with AMX
    monkeypatch.setattr(mixed_gemm, "add_product", lambda *a, **k: calls.append(1) or real(*a, **k))
    agent = AgentConfig(model="tiny-llama", n_layer=2, n_embd=32, n_head=2, max_new_tokens=6, precision="bf16-mixed")

    def run(run_dir, resume=None):
        cfg = tiny_config(steps=3, threads=1, save_every=1, keep_last=0, run_dir=run_dir, agent=agent)
        Trainer(cfg, resume=resume).train()

    run(tmp_path / "a")
    assert calls  # the update used the mixed GEMM
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    shutil.rmtree(tmp_path / "b" / "checkpoints" / "step-00000003")
    run(tmp_path / "b", resume=tmp_path / "b")
    for run_dir in ("a", "b"):
        assert ck.list_checkpoints(tmp_path / run_dir)[-1].name == "step-00000003"
    want = ck.read_checkpoint(tmp_path / "a" / "checkpoints" / "step-00000003").weights
    got = ck.read_checkpoint(tmp_path / "b" / "checkpoints" / "step-00000003").weights
    assert sorted(got) == sorted(want) and want
    for model in want:
        for name, tensor in want[model].items():
            assert torch.equal(got[model][name], tensor), f"{model}:{name}"
    assert metrics_rows(tmp_path / "a") == metrics_rows(tmp_path / "b")


@pytest.mark.parametrize("flags", [{"avx512_bf16", "amx_bf16"}, {"avx512_bf16"}, set()])
def test_by_default_the_mixed_gemm_serves_only_cpus_with_amx(monkeypatch, flags):
    """`GRAD_INTO_WEIGHTS` None (the default): the mixed GEMM where the CPU has AMX, where MKL runs it on the
    matrix units; without AMX (an EPYC with avx512_bf16) MKL runs it at about float32 speed, half the bf16
    product's, so bf16 products cast and added serve there. True and False force it either way."""
    monkeypatch.setattr(mixed_gemm, "cpu_flags", lambda: frozenset(flags))
    assert fastlm.GRAD_INTO_WEIGHTS is None
    assert mixed_gemm.fast() == fastlm.grad_into_weights() == ("amx_bf16" in flags)
    _, calls, matrices = _llama_grads(None, monkeypatch)
    assert calls == (matrices if "amx_bf16" in flags else [])
    for forced in (True, False):
        monkeypatch.setattr(fastlm, "GRAD_INTO_WEIGHTS", forced)
        assert fastlm.grad_into_weights() is forced
