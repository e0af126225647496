"""`dfim.engine.model.ops.pack_fp16` / `linear`: fbgemm's fp16-weight GEMM for few-row products, only where the
weights fit fp16, never while gradients are on, and never from a stale copy."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from dfim.engine.model import ops


def bf16_valued(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0)).bfloat16().float()


def packed_or_skip(weight: torch.Tensor) -> ops.Packed:
    packed = ops.pack_fp16(weight)
    if packed is None:
        pytest.skip("no fbgemm fp16 GEMM in this torch build (ARM)")
    return packed


def test_a_few_rows_use_the_copy_and_match_fp32():
    weight = bf16_valued(48, 32)
    packed = packed_or_skip(weight)
    x = torch.randn(3, 5, 32)
    with torch.inference_mode():
        got = ops.linear(x, weight, packed)
    assert got.shape == (3, 5, 48) and got.dtype == torch.float32
    assert (got - F.linear(x, weight)).abs().max().item() <= 1e-5


def test_weights_that_do_not_fit_fp16_get_no_copy():
    assert ops.pack_fp16(torch.randn(8, 8) * 1.1) is None  # fp32 values: fp16 would round them
    assert ops.pack_fp16(torch.full((8, 8), 2.0**20)) is None  # beyond fp16's range
    assert ops.pack_fp16(bf16_valued(8, 8).bfloat16()) is None  # only fp32 tensors are read


def test_many_rows_gradients_and_stale_copies_take_the_fp32_product(monkeypatch):
    weight = bf16_valued(16, 8)
    packed = packed_or_skip(weight)

    def fail(*args):
        raise AssertionError("the fp16 copy was used")

    monkeypatch.setattr(torch.ops.quantized, "linear_dynamic_fp16", fail, raising=False)
    with torch.inference_mode():
        ops.linear(torch.randn(ops.PACKED_MAX_ROWS + 1, 8), weight, packed)  # many rows
        ops.linear(torch.randn(8), weight, packed)  # one vector (fbgemm wants a matrix)
        ops.linear(torch.randn(2, 8).bfloat16(), weight.bfloat16(), packed)  # CPU autocast's dtype
        ops.linear(torch.randn(2, 8), weight.clone(), packed)  # other memory than the copy's
    x = torch.randn(2, 8, requires_grad=True)
    ops.linear(x, weight, packed).sum().backward()  # training: autograd through F.linear
    assert x.grad is not None
    with torch.no_grad():
        weight.mul_(2)  # an in-place update makes the copy stale
    assert not packed.fresh_for(weight)
    with torch.inference_mode():
        assert torch.equal(ops.linear(torch.ones(1, 8), weight, packed), F.linear(torch.ones(1, 8), weight))
