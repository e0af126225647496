"""FP8 expert weights for the GPU fast path: W8A8 grouped GEMMs.

A denoising step of the 26B-A4B shape reads every expert's weights (256 canvas tokens at top-8 of 128
experts touch all of them), so the experts' bytes set the step's floor: 45.7 GB in bf16, 13.6 ms at an
H100's 3.35 TB/s (docs/gpu.md, "Where a step's time goes"). Kept in FP8 (e4m3, one scale per expert and
output channel) they are half of that. The activations are quantized per row on the fly (one scale per
token row), and `torch._scaled_grouped_mm` (CUTLASS, SM90) multiplies both for all experts in one kernel per
projection, accumulating in fp32 and writing the activation dtype. Routing, sorting and the weighted sum
are those of the bf16 grouped kernel (`dfim.engine.model.experts.moe_grouped`).

`moe_fp8_reference` runs the same arithmetic with dequantized tensors, expert by expert, on any device:
the CPU tests check the quantization against it, and the GPU check compares the kernel with it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
from torch import Tensor

from dfim.engine.model.experts import FP8_KERNELS, Experts, _sort_by_expert, probe_routing
from dfim.engine.model.fp8 import dequantize, scale_as_float, scale_layout
from dfim.engine.model.ops import gelu

log = logging.getLogger(__name__)

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0  # largest finite e4m3 value


@dataclass
class Fp8Experts:
    """One layer's experts in FP8: each weight row (expert, output channel) times its scale."""

    gate_up: Tensor  # [E, 2I, H] e4m3
    gate_up_scale: Tensor  # [E, 2I] float32
    down: Tensor  # [E, H, I] e4m3
    down_scale: Tensor  # [E, H] float32

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in vars(self).values())


def quantize_rows(w: Tensor) -> tuple[Tensor, Tensor]:
    """w [..., K] -> (q [..., K] e4m3, scale [...] float32) with w ~= q * scale, row by row. An all-zero
    row gets a tiny scale instead of a division by zero."""
    amax = w.abs().amax(dim=-1).float().clamp(min=1e-12)
    scale = amax / E4M3_MAX
    q = (w.float() / scale[..., None]).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)
    return q, scale


def dequantize_rows(q: Tensor, scale: Tensor) -> Tensor:
    return q.float() * scale[..., None]


def quantize_experts(gate_up: Tensor, down: Tensor) -> Fp8Experts:
    """A layer's bf16 expert tensors (checkpoint layout: gate_up [E, 2I, H], down [E, H, I]) in FP8."""
    gate_up_q, gate_up_scale = quantize_rows(gate_up)
    down_q, down_scale = quantize_rows(down)
    return Fp8Experts(gate_up_q, gate_up_scale, down_q, down_scale)


def grouped_rows(x: Tensor, index: Tensor, num_experts: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The expert GEMM's input: x [N, H] quantized, one row per (token, chosen expert) pair sorted by
    expert -> (rows [N*k, H] e4m3, their scales [N*k], the pairs' order, the groups' end offsets [E]).
    The N token rows are quantized once and their k copies gathered (k times less work than quantizing
    the gathered rows); the gather goes through uint8, as not every index kernel takes float8."""
    order, _, _, offs = _sort_by_expert(index, num_experts)
    xq, x_scale = quantize_rows(x)
    token = order // index.shape[1]
    return xq.view(torch.uint8)[token].view(E4M3), x_scale[token], order, offs


def moe_grouped_fp8(x: Tensor, weights: Tensor, index: Tensor, experts: Fp8Experts) -> Tensor:
    """x [N, H], weights/index [N, k] -> [N, H]: the grouped kernel with FP8 weights and activations.
    No host sync, so CUDA graphs capture it where the scaled grouped GEMM itself can be captured."""
    n, k = index.shape
    xq, x_scale, order, offs = grouped_rows(x, index, experts.gate_up.shape[0])
    gate_up = torch._scaled_grouped_mm(
        xq, experts.gate_up.transpose(1, 2), x_scale, experts.gate_up_scale, offs=offs, out_dtype=x.dtype
    )
    gate, up = gate_up.chunk(2, dim=-1)
    hq, h_scale = quantize_rows(gelu(gate) * up)
    y = torch._scaled_grouped_mm(
        hq, experts.down.transpose(1, 2), h_scale, experts.down_scale, offs=offs, out_dtype=x.dtype
    )
    unsorted = torch.empty_like(y)
    unsorted[order] = y  # slot order again: [N, k, H]
    return (unsorted.view(n, k, -1).float() * weights[..., None]).sum(dim=1).to(x.dtype)


def moe_fp8_reference(x: Tensor, weights: Tensor, index: Tensor, experts: Fp8Experts) -> Tensor:
    """`moe_grouped_fp8`'s arithmetic in fp32 from dequantized tensors, one (token, expert) pair at a time:
    the same quantization of weights and activations, none of the kernel's accumulation order."""
    out = torch.zeros(x.shape[0], x.shape[1], dtype=torch.float32, device=x.device)
    for token in range(x.shape[0]):
        xq, x_scale = quantize_rows(x[token : token + 1])
        xd = dequantize_rows(xq, x_scale)
        for slot, expert in enumerate(index[token].tolist()):
            w_gate_up = dequantize_rows(experts.gate_up[expert], experts.gate_up_scale[expert])
            gate, up = (xd @ w_gate_up.t()).to(x.dtype).chunk(2, dim=-1)
            hq, h_scale = quantize_rows(gelu(gate) * up)
            w_down = dequantize_rows(experts.down[expert], experts.down_scale[expert])
            y = (dequantize_rows(hq, h_scale) @ w_down.t()).to(x.dtype)
            out[token] += y[0].float() * weights[token, slot].float()
    return out.to(x.dtype)


def fp8_kernel_works(
    experts: Fp8Experts, device: torch.device, dtype: torch.dtype, kernel: str = "grouped_fp8"
) -> str | None:
    """None if `kernel` (grouped_fp8, triton_fp8 or triton_w8a8) runs on this device and agrees with its
    fp32 reference within 2e-2 on two probes, a few pairs and 16 pairs an expert (the tiles of a typing
    fill's canvas and of a block's differ, `triton_moe.tiles_for`); else why not."""
    if device.type != "cuda":
        return "needs CUDA"
    if kernel not in FP8_REFERENCES:
        return f"no fp32 reference to check {kernel!r} against (known: {', '.join(FP8_REFERENCES)})"
    run, reference = FP8_KERNELS[kernel], FP8_REFERENCES[kernel]
    if kernel == "grouped_fp8" and not hasattr(torch, "_scaled_grouped_mm"):
        return "needs torch._scaled_grouped_mm (SM90)"
    if kernel.startswith("triton"):
        from dfim.engine.model import triton_moe

        if not triton_moe.available():
            return "needs Triton"
    e, hidden = experts.gate_up.shape[0], experts.gate_up.shape[2]
    for tokens, k in ((5, 2), (2 * e, 8)):
        try:
            x, weights, index = probe_routing(e, hidden, device, dtype, tokens, k)
            got = run(x, weights, index, experts).float()
            want = reference(x, weights, index, experts).float()
            err = float((got - want).norm() / want.norm().clamp(min=1e-12))
        except Exception as exc:  # noqa: BLE001 - any failure of the kernel means: not here
            return f"{type(exc).__name__}: {exc}"
        if not err < 2e-2:
            return f"relative error {err:.3g} against the reference ({tokens} tokens, top-{k})"
    return None


def moe_triton_fp8(
    x: Tensor, weights: Tensor, index: Tensor, experts: Fp8Experts, products: torch.dtype | None = None
) -> Tensor:
    """The Triton experts (`dfim.engine.model.triton_moe`) over FP8 weights, activations unquantized (W8A16):
    each weight tile is widened in the kernel, so the weights are read in FP8 and nothing else is quantized.
    The products run in float16 for 16-bit inputs (`products` overrides: e4m3 widens to float16 in one
    instruction a pair, to bfloat16 in three), in fp32 for fp32 inputs. Its reference is the fp32 arithmetic
    over the dequantized weights (`moe_w8a16_reference`)."""
    from dfim.engine.model import triton_moe

    if products is None and x.dtype in (torch.bfloat16, torch.float16):
        products = torch.float16
    return triton_moe.moe_triton(
        x, weights, index, experts.gate_up, experts.down,
        gate_up_scale=experts.gate_up_scale, down_scale=experts.down_scale, products=products,
    )  # fmt: skip


def moe_w8a16_reference(x: Tensor, weights: Tensor, index: Tensor, experts: Fp8Experts) -> Tensor:
    """`moe_triton_fp8`'s arithmetic in fp32: the dequantized weights, x as it is, one expert at a time."""
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for expert in index.unique().tolist():
        token, slot = (index == expert).nonzero(as_tuple=True)
        w_gate_up = dequantize_rows(experts.gate_up[expert], experts.gate_up_scale[expert])
        gate, up = (x[token].float() @ w_gate_up.t()).chunk(2, dim=-1)
        y = (gelu(gate) * up) @ dequantize_rows(experts.down[expert], experts.down_scale[expert]).t()
        out.index_add_(0, token, y * weights[token, slot, None].float())
    return out.to(x.dtype)


def moe_triton_w8a8(x: Tensor, weights: Tensor, index: Tensor, experts: Fp8Experts) -> Tensor:
    """The Triton experts with FP8 weights and FP8 activations (W8A8, as vLLM serves FP8 checkpoints): x
    quantized a token row at a time, the experts' activations a pair and tile of columns at a time. Its
    reference is `moe_w8a8_reference`; the FP8 default for 16-bit models (decision 128)."""
    from dfim.engine.model import triton_moe

    return triton_moe.moe_triton(
        x, weights, index, experts.gate_up, experts.down,
        gate_up_scale=experts.gate_up_scale, down_scale=experts.down_scale, products=E4M3,
    )  # fmt: skip


def moe_w8a8_reference(
    x: Tensor, weights: Tensor, index: Tensor, experts: Fp8Experts, group: int | None = None
) -> Tensor:
    """`moe_triton_w8a8`'s arithmetic in fp32, one expert at a time: x's rows quantized, the products over the
    dequantized weights, the activations quantized in groups of `group` columns (None: the kernel's tile
    for these pairs, `triton_moe.tiles_for`)."""
    from dfim.engine.model import triton_moe

    n, k = index.shape
    inter = experts.down.shape[2]
    group = group or triton_moe.tiles_for(
        n * k, experts.gate_up.shape[0], fp8=True, fp8_act=True
    ).activation_group(inter)
    xd = dequantize_rows(*quantize_rows(x))
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for expert in index.unique().tolist():
        token, slot = (index == expert).nonzero(as_tuple=True)
        w_gate_up = dequantize_rows(experts.gate_up[expert], experts.gate_up_scale[expert])
        gate, up = (xd[token] @ w_gate_up.t()).chunk(2, dim=-1)
        act = gelu(gate) * up
        pad = -inter % group  # the last group may be narrower: zeros do not change its largest value
        grouped = torch.nn.functional.pad(act, (0, pad)).view(len(token), -1, group)
        h = dequantize_rows(*quantize_rows(grouped)).view(len(token), -1)[:, :inter]
        y = h @ dequantize_rows(experts.down[expert], experts.down_scale[expert]).t()
        out.index_add_(0, token, y * weights[token, slot, None].float())
    return out.to(x.dtype)


def pick_fp8_kernel(experts: Fp8Experts, device: torch.device, dtype: torch.dtype) -> str:
    """The first FP8 kernel that runs on this device and agrees with its reference (`fp8_kernel_works`):
    for 16-bit models `triton_w8a8` (activations quantized a token row at a time, as vLLM serves FP8
    checkpoints, multiplied on FP8 tensor cores: the fastest, decision 128), then `triton_fp8` (W8A16:
    activations as they are, and the only Triton choice for fp32 models, whose exactness was asked for),
    `grouped_fp8`, and else `w8a16_reference` (any device: each expert's weights widened when it is
    used)."""
    first = ("triton_w8a8",) if dtype in (torch.bfloat16, torch.float16) else ()
    for kernel in (*first, "triton_fp8", "grouped_fp8"):
        why = fp8_kernel_works(experts, device, dtype, kernel)
        if why is None:
            return kernel
        log.info("FP8 experts: %s does not run here: %s", kernel, why)
    return "w8a16_reference"


FP8_KERNELS["grouped_fp8"] = moe_grouped_fp8
FP8_KERNELS["triton_fp8"] = moe_triton_fp8
FP8_KERNELS["triton_w8a8"] = moe_triton_w8a8
FP8_KERNELS["w8a16_reference"] = moe_w8a16_reference
# each kernel's arithmetic in fp32, what `fp8_kernel_works` checks it against
FP8_REFERENCES = {
    "grouped_fp8": moe_fp8_reference,
    "triton_fp8": moe_w8a16_reference,
    "triton_w8a8": moe_w8a8_reference,
}


def row_scaled(
    weight: Tensor, scale: Tensor, blocks: tuple[tuple[int, int], ...] = ()
) -> tuple[Tensor, Tensor]:
    """An expert tensor as an FP8 checkpoint stores it (weight [E, out, in] float8, its scale per tensor,
    expert, channel or block: `fp8.scale_layout`) -> (e4m3 [E, out, in], float32 [E, out]): the layout
    the kernels read. Per-tensor and per-channel e4m3 weights are kept byte for byte (the scale broadcast
    to every row); block scales, and other float8 formats, are dequantized in fp32 and quantized again
    row by row, which rounds each weight a second time."""
    (_, rows_in_scale, cols_in_scale), block = scale_layout(tuple(weight.shape), tuple(scale.shape), blocks)
    if block is None and cols_in_scale == 1 and weight.dtype == E4M3:
        e, rows = weight.shape[0], weight.shape[1]
        s = scale_as_float(scale).to(weight.device).reshape(-1, rows_in_scale, 1)
        return weight, s.expand(e, rows, 1)[..., 0].contiguous()
    return quantize_rows(dequantize(weight, scale, torch.float32, blocks))


def keep_fp8(experts: Experts, fp8: Fp8Experts, kernel: str, dtype: torch.dtype) -> None:
    """Run a layer's experts from `fp8` with `kernel` (of `FP8_KERNELS`) from now on; the bf16 tensors are
    left empty (never made, or freed), in the model's `dtype`."""
    experts.fp8 = fp8
    experts.mode = kernel
    for name in ("gate_up_proj", "down_proj"):
        empty = torch.empty(0, dtype=dtype, device=fp8.gate_up.device)
        setattr(experts, name, torch.nn.Parameter(empty, requires_grad=False))


def kept_in_fp8(model: torch.nn.Module) -> bool:
    """Whether some layer's experts run from FP8 weights alone (`keep_fp8`): nothing to train or save."""
    return any(
        isinstance(m, Experts) and m.fp8 is not None and m.gate_up_proj.numel() == 0 for m in model.modules()
    )


def scaled_expert_pairs(scales: Mapping[str, str]) -> dict[str, tuple[str, str]]:
    """An FP8 checkpoint's experts modules whose two tensors both carry a scale -> (gate_up key, down key); a
    layer with unscaled experts (left in high precision by the quantizer) loads as any other tensor."""
    names = sorted(
        key.removesuffix(".gate_up_proj") for key in scales if key.endswith(".experts.gate_up_proj")
    )
    return {
        name: (f"{name}.gate_up_proj", f"{name}.down_proj") for name in names if f"{name}.down_proj" in scales
    }


def keep_experts_in_fp8(
    model: torch.nn.Module,
    device: torch.device,
    dtype: torch.dtype,
    pairs: Mapping[str, tuple[str, str]] | None = None,
    read: Callable[[str], tuple[Tensor, Tensor]] | None = None,
    blocks: tuple[tuple[int, int], ...] = (),
) -> None:
    """The experts on FP8 weights, one layer at a time: those `pairs` names, from the checkpoint's (weight,
    scale) that `read` returns for a key (`row_scaled`), or without them every layer's, quantized from its own
    weights (random ones). One kernel, picked on the first layer, runs them all (`pick_fp8_kernel`); where no
    FP8 kernel runs on a CUDA device (the widening reference would stop every CUDA graph), the weights are
    widened to `dtype` instead, as before FP8 experts existed, and the log says so."""
    kernel, widen = "", False
    for name, module in model.named_modules():  # each module once, shared ones included
        if not isinstance(module, Experts) or (pairs is not None and name not in pairs):
            continue
        if pairs is not None and read is not None:
            gate_up, gate_up_scale = row_scaled(*read(pairs[name][0]), blocks)
            down, down_scale = row_scaled(*read(pairs[name][1]), blocks)
            fp8 = Fp8Experts(gate_up, gate_up_scale, down, down_scale)
        else:
            fp8 = quantize_experts(module.gate_up_proj.data, module.down_proj.data)
        if not kernel:
            kernel = pick_fp8_kernel(fp8, device, dtype)
            widen = kernel == "w8a16_reference" and device.type == "cuda"
            if widen:
                log.warning(
                    "no FP8 experts kernel runs on %s: the experts' weights are widened to %s", device, dtype
                )
        if widen:
            for param, q, scale in (
                ("gate_up_proj", fp8.gate_up, fp8.gate_up_scale),
                ("down_proj", fp8.down, fp8.down_scale),
            ):
                weight = dequantize_rows(q, scale).to(dtype)
                setattr(module, param, torch.nn.Parameter(weight, requires_grad=False))
        else:
            keep_fp8(module, fp8, kernel, dtype)


def use_fp8_experts(experts: Experts, drop_bf16: bool = False) -> Fp8Experts:
    """Quantize a layer's experts to FP8 and run them with `moe_grouped_fp8` from now on. `drop_bf16`
    frees the bf16 tensors (a 26B model's bf16 and FP8 experts together do not fit an 80 GB card); the
    layer then runs only in this mode."""
    if experts.fp8 is None:  # quantized once: a second call only switches the mode (or drops bf16)
        experts.fp8 = quantize_experts(experts.gate_up_proj.data, experts.down_proj.data)
    experts.mode = "grouped_fp8"
    if drop_bf16:
        for param in (experts.gate_up_proj, experts.down_proj):
            param.data = param.data.new_empty(0)
    return experts.fp8
