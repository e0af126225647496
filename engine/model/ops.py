"""The network's elementwise and product primitives: RMSNorm, GELU, and `linear`, which runs a product
through an fp16 or int8 copy of the weight on CPU where that is faster (`Packed`), else `F.linear`."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dfim.engine.model import triton_norm
from dfim.engine.model.int8 import int8_products_fast, linear_int8, pack_int8


class RMSNorm(nn.Module):
    """Gemma-4 RMSNorm: computed in fp32; `with_scale=False` is the scale-free variant (v norm, router)."""

    def __init__(self, dim: int, eps: float, with_scale: bool = True) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim)) if with_scale else None

    def forward(self, x: Tensor) -> Tensor:
        return rms_norm(x, self.weight, self.eps)


def rms_norm(x: Tensor, weight: Tensor | None, eps: float) -> Tensor:
    if triton_norm.applies(x):
        return triton_norm.rms_norm(x, weight, eps)  # one kernel where the reference launches ~8
    if (
        x.dtype == torch.float32
        and not torch.is_grad_enabled()
        and (weight is None or weight.dtype == x.dtype)
    ):
        # fp32 inference: the same arithmetic in one fused kernel instead of ~8 small ops; a decoder step
        # runs ~90 norms on [L, 256] rows, where per-op dispatch costs more than the arithmetic.
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    return rms_norm_reference(x, weight, eps)


def residual_norm(x: Tensor, y: Tensor, norm: RMSNorm) -> Tensor:
    """`x + norm(y)`: a branch normed and added to the residual (one kernel on CUDA)."""
    if norm.weight is not None and triton_norm.applies(x) and x.shape == y.shape:
        return triton_norm.residual_norm(x, y, norm.weight, norm.eps)
    return x + norm(y)


def feed_forward_inputs(
    x: Tensor, dense_norm: RMSNorm, experts_norm: RMSNorm, router: nn.Module
) -> tuple[Tensor, Tensor, Tensor]:
    """The three inputs of a Gemma-4 layer's feed-forward from its residual x: the dense MLP's
    (`dense_norm(x)`), the experts' (`experts_norm(x)`) and the router's (`router.input(x)`), in one kernel on
    CUDA where PyTorch launches five."""
    a, b = dense_norm.weight, experts_norm.weight
    if triton_norm.applies(x) and a is not None and b is not None:
        return triton_norm.feed_forward_inputs(x, a, b, router.scale, router.root_size, dense_norm.eps)
    return dense_norm(x), experts_norm(x), router.input(x)


def feed_forward_residual(
    x: Tensor, dense: Tensor, moe: Tensor, norms: tuple[RMSNorm, RMSNorm, RMSNorm], scalar: Tensor
) -> Tensor:
    """`(x + norms[2](norms[0](dense) + norms[1](moe))) * scalar`: a Gemma-4 layer's two feed-forward branches
    joined and added to the residual (one kernel on CUDA where PyTorch launches about ten)."""
    weights = tuple(n.weight for n in norms)
    if triton_norm.applies(x) and x.shape == dense.shape == moe.shape and None not in weights:
        return triton_norm.feed_forward_residual(x, dense, moe, weights, scalar, norms[2].eps)  # type: ignore[arg-type]
    return (x + norms[2](norms[0](dense) + norms[1](moe))) * scalar


def rms_norm_reference(x: Tensor, weight: Tensor | None, eps: float) -> Tensor:
    """Gemma's RMSNorm as written: fp32 throughout, one rounding to x's dtype at the end (what training
    differentiates, and what the fused kernels are checked against)."""
    y = x.float()
    y = y * torch.pow(y.pow(2).mean(-1, keepdim=True) + eps, -0.5)
    if weight is not None:
        y = y * weight.float()
    return y.type_as(x)


# Products with at most this many rows go through fbgemm's fp16-weight GEMM when the weights fit fp16
# (`pack_fp16`): a drafted token's pass reads every weight it uses from memory (~46 MB in fp32, more
# than the L3), and half the bytes make its products ~3x faster on the 2-core AVX2 machine; the
# arithmetic stays fp32. Denoising steps gain 30% (16 rows) to 8% (128); encoding a context (hundreds
# of rows) is compute-bound and gains nothing, so MKL's fp32 product stays there.
PACKED_MAX_ROWS = 128


@dataclass
class Packed:
    """fbgemm's fp16 (or int8: `kind`) copy of a [out, in] weight for `linear` (CPU inference). Valid while `linear` is handed
    the same memory (`ptr`: not after a new `.data` or a load with `assign=True`) and no tensor in `watched`
    was updated in place (the weight itself, and the parameters that view a fused matrix, whose version
    counters are their own). A write through `.data` is not seen: weights must not change that way after
    `prepare_cpu_inference`."""

    op: object  # torch.ops.quantized.linear_prepack_fp16's (or linear_prepack's) packed weight
    ptr: int
    watched: tuple[Tensor, ...]
    versions: tuple[int, ...]
    kind: str = "fp16"  # "int8": a checkpoint's 1-byte weights (dfim.engine.model.int8), for any row count

    def fresh_for(self, weight: Tensor) -> bool:
        return weight.data_ptr() == self.ptr and all(
            t._version == v for t, v in zip(self.watched, self.versions, strict=True)
        )


def pack_fp16(weight: Tensor, *also_watched: Tensor, exact: bool = True) -> Packed | None:
    """`weight` [out, in] packed for `linear`, or None: where fbgemm is missing (ARM), where fp16 would change
    a weight by more than a subnormal's rounding (fp32 checkpoints; bf16 ones fit: 1,112 of dfim-small's
    15.5 M weights move, by <= 3e-8), and for inference tensors (made under `torch.inference_mode`: no
    version counter to notice an update by). `also_watched`: parameters that view `weight`'s memory.
    `exact=False` accepts fp16's rounding (relative 2**-11) for weights already int8-quantized, whose own
    error is ~10x larger; fp16 overflow is still refused."""
    watched = (weight, *also_watched)
    if weight.dtype != torch.float32 or weight.device.type != "cpu" or any(t.is_inference() for t in watched):
        return None
    try:
        tolerance = 2**-24 if exact else weight.abs().max().item() * 2**-10
        if not (weight.half().float() - weight).abs().max() <= tolerance:  # also catches overflow (inf)
            return None
        op = torch.ops.quantized.linear_prepack_fp16(weight.contiguous(), None)
    except (AttributeError, NotImplementedError, RuntimeError):
        return None
    return Packed(op, weight.data_ptr(), watched, tuple(t._version for t in watched))


def pack_weight(weight: Tensor, *also_watched: Tensor, int8: bool = False) -> Packed | None:
    """`weight`'s copy for `linear`: fbgemm int8 for a model loaded from an int8 checkpoint (its weights are
    int8 values times per-channel scales, so the copy holds exactly the stored integers) where the int8
    products are the faster here (`int8_products_fast`), else fp16 (`pack_fp16`; an int8 model's values fit
    it within fp16's rounding). None where the kernel is missing or the weight does not fit, as `pack_fp16`."""
    watched = (weight, *also_watched)
    if int8 and int8_products_fast() and not any(t.is_inference() for t in watched):
        op = pack_int8(weight)
        if op is not None:
            return Packed(op, weight.data_ptr(), watched, tuple(t._version for t in watched), kind="int8")
    return pack_fp16(weight, *also_watched, exact=not int8)


def linear(x: Tensor, weight: Tensor, packed: Packed | None = None) -> Tensor:
    """`x @ weight.T`, through the fp16 copy for a few fp32 rows (see PACKED_MAX_ROWS): the same values up
    to fp32 rounding; or through the int8 copy of an int8 checkpoint for any number of rows (fbgemm's int8
    GEMM is 2-4x faster than fp32 from 1 row to 512 on the 2-core AVX2 machine), with the activations'
    per-tensor quantization error on top of the weights' own."""
    if (
        packed is not None
        and x.dtype == torch.float32  # not under CPU autocast
        and x.dim() >= 2
        and not torch.is_grad_enabled()
        and (packed.kind == "int8" or x.numel() <= PACKED_MAX_ROWS * x.shape[-1])
        and packed.fresh_for(weight)
    ):
        if packed.kind == "int8":
            return linear_int8(x, packed.op)
        return torch.ops.quantized.linear_dynamic_fp16(x, packed.op)
    return F.linear(x, weight)


def gelu(x: Tensor) -> Tensor:
    return F.gelu(x, approximate="tanh")


def fuse_linears(*linears: nn.Linear) -> Tensor:
    """Re-lay the weights of linears that read the same input as views of one [in, sum(out)] matrix and
    return it: `x @ fused` computes all of them in one GEMM, and each `linear(x, weight)` still works,
    now as an NN product (MKL is ~15% faster at these small shapes than on the transposed row-major
    weight). The values are unchanged; only their memory layout is (inference on CPU)."""
    fused = torch.cat([lin.weight.detach() for lin in linears]).t().contiguous()
    start = 0
    for lin in linears:
        out = lin.weight.shape[0]
        lin.weight.data = fused[:, start : start + out].t()
        start += out
    return fused


def fuse_rows(*linears: nn.Linear) -> Tensor:
    """Re-lay the weights of linears that read the same input as consecutive rows of one [sum(out), in]
    matrix and return it: `F.linear(x, fused)` computes all of them in one GEMM, each weight stays a
    contiguous row-major view (the GPU's layout; `fuse_linears` is the CPU's), and the values and the
    `state_dict` are unchanged."""
    fused = torch.cat([lin.weight.detach() for lin in linears])
    start = 0
    for lin in linears:
        out = lin.weight.shape[0]
        lin.weight.data = fused[start : start + out]
        start += out
    return fused


def row_views(fused: Tensor | None, *linears: nn.Linear | None) -> bool:
    """Whether `fused` (from `fuse_rows`) still holds these linears' weights, as `fused_views` asks."""
    if fused is None or torch.is_grad_enabled():
        return False
    start = fused.data_ptr()
    for lin in linears:
        if lin is None or lin.weight.data_ptr() != start or not lin.weight.is_contiguous():
            return False
        start += lin.weight.numel() * fused.element_size()
    return True


def fused_views(fused: Tensor | None, *linears: nn.Linear | None) -> bool:
    """Whether `fused` (from `fuse_linears`) still holds these linears' weights: not after `.to()`, a
    replaced Parameter or a fresh load, which fall back to one product per linear."""
    if fused is None or torch.is_grad_enabled():
        return False
    start = fused.data_ptr()
    for lin in linears:
        if lin is None or lin.weight.data_ptr() != start:
            return False
        start += lin.weight.shape[0] * fused.element_size()
    return True
