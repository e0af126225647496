"""FP8 experts (engine/model/experts_fp8.py) on the CPU: the quantization, the reference arithmetic the GPU
kernel is checked against, and the mode switch. The kernel itself needs an SM90 GPU
(`python3 scripts/bench_fp8.py` runs it there against this reference)."""

from __future__ import annotations

import pytest
import torch

from dfim.engine.model.config import ModelConfig
from dfim.engine.model.experts import Experts, moe_gathered
from dfim.engine.model.experts_fp8 import (
    E4M3_MAX,
    dequantize_rows,
    fp8_kernel_works,
    grouped_rows,
    moe_fp8_reference,
    quantize_experts,
    quantize_rows,
    use_fp8_experts,
)


def test_rows_round_trip_within_e4m3_precision():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(64, 96, generator=g) * torch.logspace(-3, 2, 64)[:, None]  # rows of very different size
    w[3] = 0.0
    q, scale = quantize_rows(w)
    assert q.dtype == torch.float8_e4m3fn and scale.shape == (64,)
    assert float(q.float().abs().amax()) == E4M3_MAX  # each nonzero row uses the whole range
    back = dequantize_rows(q, scale)
    assert torch.equal(back[3], torch.zeros(96))  # an all-zero row stays zero, no NaN
    rel = (back - w).norm(dim=-1) / w.norm(dim=-1).clamp(min=1e-12)
    assert float(rel.max()) < 0.05  # 3 mantissa bits: about 2-3% per row, whatever the row's scale


def test_the_reference_is_close_to_the_bf16_experts():
    g = torch.Generator().manual_seed(1)
    gate_up = torch.randn(8, 64, 64, generator=g) * 0.1
    down = torch.randn(8, 64, 32, generator=g) * 0.1
    x = torch.randn(6, 64, generator=g)
    index = torch.stack([torch.randperm(8, generator=g)[:2] for _ in range(6)])
    weights = torch.rand(6, 2, generator=g)
    want = moe_gathered(x, weights, index, gate_up, down)
    got = moe_fp8_reference(x, weights, index, quantize_experts(gate_up, down))
    rel = float((got - want).norm() / want.norm())
    assert 1e-4 < rel < 0.08  # quantized (not equal), yet the same function


def test_fp8_mode_runs_only_with_its_weights():
    config = ModelConfig(hidden_size=32, num_experts=4, top_k_experts=2, moe_intermediate_size=16)
    experts = Experts(config)
    torch.nn.init.normal_(experts.gate_up_proj, std=0.1)
    torch.nn.init.normal_(experts.down_proj, std=0.1)
    x, weights = torch.randn(3, 32), torch.rand(3, 2)
    index = torch.tensor([[0, 1], [2, 3], [1, 2]])
    experts.mode = "grouped_fp8"
    with pytest.raises(RuntimeError, match="without FP8 weights"):
        experts(x, weights, index)
    fp8 = use_fp8_experts(experts, drop_bf16=True)
    assert experts.mode == "grouped_fp8" and experts.gate_up_proj.numel() == 0
    assert fp8.nbytes == 4 * 32 * 32 + 4 * 32 * 4 + 4 * 32 * 16 + 4 * 32 * 4  # 1-byte weights, fp32 scales
    # No SM90 GPU here: the kernel reports why it cannot run instead of failing later.
    assert fp8_kernel_works(fp8, torch.device("cpu"), torch.float32) is not None


def test_grouped_rows_are_each_pairs_token_quantized_and_sorted_by_expert():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(5, 48, generator=g)
    index = torch.tensor([[3, 0], [1, 3], [0, 2], [3, 1], [2, 0]])
    rows, scales, order, offs = grouped_rows(x, index, num_experts=4)
    assert rows.dtype == torch.float8_e4m3fn and rows.shape == (10, 48)
    assert offs.tolist() == [3, 5, 7, 10]  # experts 0..3 chose 3, 2, 2 and 3 pairs
    experts = index.reshape(-1)[order]
    assert experts.tolist() == sorted(experts.tolist())
    q, s = quantize_rows(x)
    for row, pair in enumerate(order.tolist()):
        token = pair // 2
        assert torch.equal(rows[row].view(torch.uint8), q[token].view(torch.uint8))
        assert scales[row] == s[token]


def test_the_fp8_kernel_is_the_first_that_passes_its_check(monkeypatch):
    from dfim.engine.model import experts_fp8

    experts = quantize_experts(torch.randn(4, 16, 8), torch.randn(4, 8, 8))
    cuda = torch.device("cuda")
    failing: set[str] = set()
    asked: list[str] = []

    def works(fp8, device, dtype, kernel="grouped_fp8"):
        asked.append(kernel)
        return "fails here" if kernel in failing else None

    monkeypatch.setattr(experts_fp8, "fp8_kernel_works", works)
    assert experts_fp8.pick_fp8_kernel(experts, cuda, torch.bfloat16) == "triton_w8a8"
    # fp32 models keep W8A16: they asked for exactness, and W8A8 rounds the activations
    asked.clear()
    assert experts_fp8.pick_fp8_kernel(experts, cuda, torch.float32) == "triton_fp8"
    assert "triton_w8a8" not in asked
    failing.update({"triton_w8a8", "triton_fp8"})
    assert experts_fp8.pick_fp8_kernel(experts, cuda, torch.float16) == "grouped_fp8"
    failing.add("grouped_fp8")
    assert experts_fp8.pick_fp8_kernel(experts, cuda, torch.bfloat16) == "w8a16_reference"
    # every kernel it can pick has a reference to be checked against
    assert set(experts_fp8.FP8_REFERENCES) == {"triton_w8a8", "triton_fp8", "grouped_fp8"}
    monkeypatch.undo()
    assert "no fp32 reference" in fp8_kernel_works(experts, cuda, torch.bfloat16, "w8a16_reference")


def test_fp8_activations_need_fp8_weights():
    from dfim.engine.model import triton_moe

    gate_up, down = torch.randn(4, 16, 8), torch.randn(4, 8, 8)
    x, weights, index = torch.randn(3, 8), torch.rand(3, 2), torch.tensor([[0, 1]] * 3)
    with pytest.raises(ValueError, match="FP8 weights"):
        triton_moe.moe_triton(x, weights, index, gate_up, down, products=torch.float8_e4m3fn)
