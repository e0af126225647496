"""The mixture of experts: the router and the experts, with every way to run them (one module: the
CPU engine, training and the GPU fast path all call `Experts.forward`, which picks a kernel by `mode`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from dfim.engine.model import triton_gemv, triton_moe, triton_norm
from dfim.engine.model.config import ModelConfig
from dfim.engine.model.ops import Packed, RMSNorm, gelu, linear

if TYPE_CHECKING:
    from dfim.engine.model.experts_fp8 import Fp8Experts


class Router(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.top_k = config.top_k_experts
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, with_scale=False)
        self.proj = nn.Linear(config.hidden_size, config.num_experts, bias=False)
        self.scale = nn.Parameter(torch.ones(config.hidden_size))
        self.per_expert_scale = nn.Parameter(torch.ones(config.num_experts))
        self.root_size = config.hidden_size**-0.5

    def input(self, x: Tensor) -> Tensor:
        """What the router's product reads: the residual normed, scaled."""
        return self.norm(x) * self.scale * self.root_size

    def forward(self, x: Tensor, normed: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """x: [N, H] -> weights [N, k] (fp32), expert indices [N, k]. `normed`: `input(x)`, where the caller
        has it already (`ops.feed_forward_inputs`)."""
        inputs = self.input(x) if normed is None else normed
        # one token (an AR token): the one-row kernel; else the module, whose forward hooks the fp32 check reads
        one_row = triton_gemv.fits(inputs, self.proj.weight)
        scores = triton_gemv.gemv(inputs, self.proj.weight) if one_row else self.proj(inputs)
        if triton_norm.applies(scores):
            return triton_moe.route(scores, self.top_k, self.per_expert_scale)
        probs = scores.softmax(dim=-1, dtype=torch.float32)
        weights, index = torch.topk(probs, self.top_k, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights * self.per_expert_scale[index], index


class Experts(nn.Module):
    """Expert weights as 3-D tensors, as in the checkpoint: gate_up_proj [E, 2I, H], down_proj [E, H, I]."""

    # How to run the experts: "dense" sends every token through every expert in one batched product
    # (no host sync, compile-friendly: training, and accelerators with few experts); "sparse" runs only
    # the chosen experts (CPU inference, where it is ~7% faster per step, and many experts); "auto" picks.
    # The GPU fast path sets one of the sync-free kernels of `GPU_KERNELS` ("grouped", "padded",
    # "gathered"), which CUDA graphs can capture (`pick_gpu_kernel`).
    mode = "auto"
    dense_max_experts = 8
    # FP8 copies of the weights for the kernels of `FP8_KERNELS` (dfim.engine.model.experts_fp8)
    fp8: Fp8Experts | None = None

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        e, h, i = config.num_experts, config.hidden_size, config.moe_intermediate_size
        self.num_experts = e
        self.gate_up_proj = nn.Parameter(torch.empty(e, 2 * i, h))
        self.down_proj = nn.Parameter(torch.empty(e, h, i))
        self.gate_up_packed: list[Packed | None] = [None] * e  # fp16 copies per expert (`pack_fp16`)
        self.down_packed: list[Packed | None] = [None] * e

    def forward(self, x: Tensor, weights: Tensor, index: Tensor) -> Tensor:
        """x: [N, H], weights/index: [N, k] -> [N, H]."""
        mode = self.mode
        if mode == "auto":
            cpu_inference = x.device.type == "cpu" and not torch.is_grad_enabled()
            mode = "sparse" if cpu_inference or self.num_experts > self.dense_max_experts else "dense"
        if mode in GPU_KERNELS:
            return GPU_KERNELS[mode](x, weights, index, self.gate_up_proj, self.down_proj)
        if mode in FP8_KERNELS:
            if self.fp8 is None:
                raise RuntimeError(f"experts mode {mode!r} without FP8 weights (experts_fp8.use_fp8_experts)")
            return FP8_KERNELS[mode](x, weights, index, self.fp8)
        return self._dense(x, weights, index) if mode == "dense" else self._sparse(x, weights, index)

    def _dense(self, x: Tensor, weights: Tensor, index: Tensor) -> Tensor:
        gate, up = torch.einsum("nh,eoh->eno", x, self.gate_up_proj).chunk(2, dim=-1)
        out = torch.einsum("eni,ehi->enh", gelu(gate) * up, self.down_proj)  # [E, N, H]
        routing = torch.zeros(x.shape[0], self.num_experts, dtype=weights.dtype, device=x.device)
        routing.scatter_(1, index, weights)  # [N, E], zero for experts not chosen
        return torch.einsum("enh,ne->nh", out.to(weights.dtype), routing).to(x.dtype)

    def _sparse(self, x: Tensor, weights: Tensor, index: Tensor) -> Tensor:
        if x.shape[0] == 1:
            # One token (the encoder's draft): its k experts in turn, no sorting or scatter (~2x faster).
            out = None
            for slot, expert in enumerate(index[0].tolist()):
                gate, up = linear(x, self.gate_up_proj[expert], self.gate_up_packed[expert]).chunk(2, dim=-1)
                y = linear(gelu(gate) * up, self.down_proj[expert], self.down_packed[expert])
                # weighted in fp32 and summed in x's dtype, as the general path below does
                y = (y * weights[0, slot : slot + 1]).to(x.dtype)
                out = y if out is None else out + y
            assert out is not None
            return out
        out = torch.zeros_like(x)
        flat_index = index.reshape(-1)
        order = flat_index.argsort()
        counts = torch.bincount(flat_index, minlength=self.num_experts).tolist()
        token_of_slot = order // index.shape[1]
        weight_of_slot = weights.reshape(-1)[order]
        start = 0
        for expert, count in enumerate(counts):
            if count == 0:
                continue
            tokens = token_of_slot[start : start + count]
            gate, up = linear(x[tokens], self.gate_up_proj[expert], self.gate_up_packed[expert]).chunk(
                2, dim=-1
            )
            y = linear(gelu(gate) * up, self.down_proj[expert], self.down_packed[expert])
            out.index_add_(0, tokens, (y * weight_of_slot[start : start + count, None]).to(x.dtype))
            start += count
        return out


# --- sync-free kernels for the GPU fast path (CUDA graphs capture them) ---------------------------


def _sort_by_expert(index: Tensor, num_experts: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """index [N, k] -> (order: slot ids sorted by expert, expert of each sorted slot, counts [E], offs [E])."""
    flat = index.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.zeros(num_experts, dtype=torch.int32, device=index.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat, dtype=torch.int32))  # bincount would sync
    offs = torch.cumsum(counts, dim=0, dtype=torch.int32)
    return order, flat[order], counts, offs


def moe_grouped(x: Tensor, weights: Tensor, index: Tensor, gate_up: Tensor, down: Tensor) -> Tensor:
    """Sort token-expert pairs by expert, one grouped GEMM per projection (`torch._grouped_mm`: one
    CUTLASS kernel for all experts, empty groups cost nothing), weighted sum back. x: [N, H]."""
    n, k = index.shape
    order, _, _, offs = _sort_by_expert(index, gate_up.shape[0])
    xs = x[order // k]  # [N*k, H], grouped by expert
    gate, up = torch._grouped_mm(xs, gate_up.transpose(1, 2), offs=offs).chunk(2, dim=-1)
    y = torch._grouped_mm(gelu(gate) * up, down.transpose(1, 2), offs=offs)  # [N*k, H]
    unsorted = torch.empty_like(y)
    unsorted[order] = y  # slot order again: [N, k, H]
    out = (unsorted.view(n, k, -1).float() * weights[..., None]).sum(dim=1)
    return out.to(x.dtype)


def moe_padded(x: Tensor, weights: Tensor, index: Tensor, gate_up: Tensor, down: Tensor) -> Tensor:
    """Fallback without `_grouped_mm`: every expert gets a static [N, H] slab (a token picks an expert at
    most once), batched matmul over all experts. Static shapes, no sync; N*E rows of compute."""
    n, k = index.shape
    e = gate_up.shape[0]
    order, expert, counts, offs = _sort_by_expert(index, e)
    rank = torch.arange(n * k, device=x.device) - (offs - counts).long()[expert]
    slab = x.new_zeros(e, n, x.shape[-1])
    slab[expert, rank] = x[order // k]
    gate, up = torch.bmm(slab, gate_up.transpose(1, 2)).chunk(2, dim=-1)
    y = torch.bmm(gelu(gate) * up, down.transpose(1, 2))[expert, rank]  # [N*k, H], sorted order
    unsorted = torch.empty_like(y)
    unsorted[order] = y
    return (unsorted.view(n, k, -1).float() * weights[..., None]).sum(dim=1).to(x.dtype)


def moe_gathered(x: Tensor, weights: Tensor, index: Tensor, gate_up: Tensor, down: Tensor) -> Tensor:
    """For few tokens (autoregressive): gather the chosen experts' weights, batched matmul."""
    n, k = index.shape
    flat = index.reshape(-1)
    xs = x.repeat_interleave(k, dim=0)[:, None]  # [N*k, 1, H]
    gate, up = torch.bmm(xs, gate_up[flat].transpose(1, 2)).chunk(2, dim=-1)
    y = torch.bmm(gelu(gate) * up, down[flat].transpose(1, 2))[:, 0]
    return (y.view(n, k, -1).float() * weights[..., None]).sum(dim=1).to(x.dtype)


def moe_triton(x: Tensor, weights: Tensor, index: Tensor, gate_up: Tensor, down: Tensor) -> Tensor:
    """Two Triton kernels: sort once, gate and up with the activation, routing weights applied in down
    (`dfim.engine.model.triton_moe`, imported here on first use: Triton is a GPU machine's)."""
    from dfim.engine.model import triton_moe

    return triton_moe.moe_triton(x, weights, index, gate_up, down)


GPU_KERNELS = {"triton": moe_triton, "grouped": moe_grouped, "padded": moe_padded, "gathered": moe_gathered}
# Kernels over `Experts.fp8`, registered by dfim.engine.model.experts_fp8 (which imports this module)
FP8_KERNELS: dict[str, Callable[[Tensor, Tensor, Tensor, Fp8Experts], Tensor]] = {}


def probe_routing(
    num_experts: int, hidden: int, device: torch.device, dtype: torch.dtype, tokens: int = 5, k: int = 2
) -> tuple[Tensor, Tensor, Tensor]:
    """A kernel's self-test input: `tokens` tokens [tokens, hidden], each routed to k distinct experts
    (weights, index)."""
    g = torch.Generator(device="cpu").manual_seed(0)
    k = min(k, num_experts)
    x = torch.randn(tokens, hidden, generator=g).to(device, dtype)
    index = torch.stack([torch.randperm(num_experts, generator=g)[:k] for _ in range(tokens)]).to(device)
    weights = torch.rand(tokens, k, generator=g).to(device)
    return x, weights, index


def _passes(kernel: Callable[..., Tensor], experts: Experts, device: torch.device, dtype: torch.dtype,
             graphs: bool) -> bool:  # fmt: skip
    """Whether `kernel` agrees with a per-expert reference on this device and dtype (with this checkpoint's
    real expert tensors and strides) and, with `graphs` on CUDA, can be captured in a CUDA graph."""
    try:
        e, hidden = experts.gate_up_proj.shape[0], experts.gate_up_proj.shape[2]
        x, weights, index = probe_routing(e, hidden, device, dtype)
        got = kernel(x, weights, index, experts.gate_up_proj, experts.down_proj).float()
        want = moe_gathered(x, weights, index, experts.gate_up_proj, experts.down_proj).float()
        err = (got - want).norm() / want.norm().clamp(min=1e-12)
        if not bool(err < 2e-2):
            return False
        if graphs and device.type == "cuda":
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                kernel(x, weights, index, experts.gate_up_proj, experts.down_proj)
        return True
    except Exception:  # noqa: BLE001 - any failure of a fast kernel means: try the next one
        return False


def pick_gpu_kernel(experts: Experts, device: torch.device, dtype: torch.dtype, graphs: bool = False) -> str:
    """The first of `triton` (CUDA with Triton only), `grouped` (where torch._grouped_mm exists) that agrees
    with a per-expert reference here and, with `graphs`, can be captured in a CUDA graph; else `padded`.
    (torch 2.11's grouped GEMM copies its problem sizes from the host on an H200, which a graph cannot
    capture: there the padded kernel would run.)"""
    if triton_norm.runs_on(device.type):
        if triton_moe.available() and _passes(moe_triton, experts, device, dtype, graphs):
            return "triton"
    if hasattr(torch, "_grouped_mm") and _passes(moe_grouped, experts, device, dtype, graphs):
        return "grouped"
    return "padded"
