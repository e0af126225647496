"""DiffusionGemma in plain PyTorch: one text stack used twice.

The *encoder* runs the context causally and writes a KV cache; the *decoder* runs the canvas with
bidirectional attention over [cached context ; canvas] and never writes the cache. Both share every
weight; only the per-layer `layer_scalar` buffers are separate, and only the decoder has the
self-conditioning MLP. Module names equal the HF checkpoint keys (`model.decoder.layers.3.mlp...`),
so a released checkpoint loads with `load_state_dict` and no converter.

Shapes: B batch, T new tokens, P cached context tokens, L canvas tokens, H hidden, V vocab,
Hq/Hkv query/key-value heads, D head dim.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dfim.engine.model.config import FULL, ModelConfig
from dfim.engine.model.int8 import linear_int8, pack_int8

# How a layer's attention reads its keys and values: (attention module, q, k, v) -> attended [B, T, H].
# The loops over layers differ only in this (a mask over the batch, a KV cache, the encoder's keys).
Attend = Callable[["Attention", Tensor, Tensor, Tensor], Tensor]


class RMSNorm(nn.Module):
    """Gemma-4 RMSNorm: computed in fp32; `with_scale=False` is the scale-free variant (v norm, router)."""

    def __init__(self, dim: int, eps: float, with_scale: bool = True) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim)) if with_scale else None

    def forward(self, x: Tensor) -> Tensor:
        return rms_norm(x, self.weight, self.eps)


def rms_norm(x: Tensor, weight: Tensor | None, eps: float) -> Tensor:
    if (
        x.dtype == torch.float32
        and not torch.is_grad_enabled()
        and (weight is None or weight.dtype == x.dtype)
    ):
        # fp32 inference: the same arithmetic in one fused kernel instead of ~8 small ops; a decoder step
        # runs ~90 norms on [L, 256] rows, where per-op dispatch costs more than the arithmetic.
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
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
    int8 values times per-channel scales, so the copy holds exactly the stored integers), else fp16
    (`pack_fp16`). None where the kernel is missing or the weight does not fit, as `pack_fp16`."""
    watched = (weight, *also_watched)
    if not int8:
        return pack_fp16(weight, *also_watched)
    if any(t.is_inference() for t in watched):
        return None
    op = pack_int8(weight)
    if op is None:
        return None
    return Packed(op, weight.data_ptr(), watched, tuple(t._version for t in watched), kind="int8")


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


def rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rope_inv_freq(config: ModelConfig, layer_type: str) -> Tensor:
    """Sliding layers rotate the whole head; full layers ("proportional" RoPE) only a leading share,
    with the exponent still taken over the whole head dim and zero frequencies for the rest.
    Always built on the CPU (also while the model is built on the meta device) and moved when used."""
    if layer_type == FULL:
        dim = config.global_head_dim
        angles = int(config.full_partial_rotary_factor * dim // 2)
        rotated = 1.0 / (
            config.full_rope_theta ** (torch.arange(0, 2 * angles, 2, device="cpu").float() / dim)
        )
        return torch.cat([rotated, torch.zeros(dim // 2 - angles, device="cpu")])
    dim = config.head_dim
    return 1.0 / (config.sliding_rope_theta ** (torch.arange(0, dim, 2, device="cpu").float() / dim))


class Rotary:
    """cos/sin tables per layer type for given positions. Plain tensors, not buffers: nothing to load."""

    def __init__(self, config: ModelConfig) -> None:
        self.inv_freq = {t: rope_inv_freq(config, t) for t in set(config.layer_types or [])}

    def __call__(self, positions: Tensor, dtype: torch.dtype) -> dict[str, tuple[Tensor, Tensor]]:
        # positions: [B, T] -> cos, sin: [B, T, D] per layer type, computed in fp32
        tables = {}
        for layer_type, inv_freq in self.inv_freq.items():
            freqs = positions.float()[..., None] * inv_freq.to(positions.device)[None, None, :]
            emb = torch.cat([freqs, freqs], dim=-1)
            tables[layer_type] = (emb.cos().to(dtype), emb.sin().to(dtype))
        return tables


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    # x: [B, T, Hx, D]; cos/sin: [B, T, D]
    return x * cos[:, :, None] + rotate_half(x) * sin[:, :, None]


def roll_tables(cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
    """[B, T, D] tables -> [B, T, 1, D] for `apply_rolled_rope`: sin's first half negated, because
    rotate_half(x) = cat(-x2, x1) = roll(x, D/2) * (-1 for the first half)."""
    half = sin.shape[-1] // 2
    signed = torch.cat([-sin[..., :half], sin[..., half:]], dim=-1)
    return cos[:, :, None].contiguous(), signed[:, :, None].contiguous()


def apply_rolled_rope(x: Tensor, cos: Tensor, sin_signed: Tensor) -> Tensor:
    """`apply_rope` in 3 ops instead of ~10 (the products are the same, signs moved to the table)."""
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, dims=-1), sin_signed)


class Attention(nn.Module):
    """Gemma-4 attention: q/k RMSNorm, scale-free v norm, scaling 1.0. Full layers have wider heads,
    their own KV head count and no v_proj: V is k_proj's output before the k norm."""

    def __init__(self, config: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        assert config.layer_types is not None
        self.is_sliding = config.layer_types[layer_idx] != FULL
        self.head_dim = config.head_dim if self.is_sliding else config.global_head_dim
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads if self.is_sliding else config.global_kv_heads
        hidden, d = config.hidden_size, self.head_dim
        self.q_proj = nn.Linear(hidden, self.num_heads * d, bias=False)
        self.k_proj = nn.Linear(hidden, self.num_kv_heads * d, bias=False)
        self.v_proj = nn.Linear(hidden, self.num_kv_heads * d, bias=False) if self.is_sliding else None
        self.o_proj = nn.Linear(self.num_heads * d, hidden, bias=False)
        self.q_norm = RMSNorm(d, config.rms_norm_eps)
        self.k_norm = RMSNorm(d, config.rms_norm_eps)
        self.v_norm = RMSNorm(d, config.rms_norm_eps, with_scale=False)
        self.qkv: Tensor | None = None  # [H, (Hq + 2 Hkv) D] after `fuse_linears` (CPU inference)
        self.qkv_packed: Packed | None = None  # fp16 copies for few-row products (`pack_fp16`)
        self.o_packed: Packed | None = None

    def project(
        self, x: Tensor, cos: Tensor, sin: Tensor, rolled: bool = False
    ) -> tuple[Tensor, Tensor, Tensor]:
        """x: [B, T, H] -> q [B, Hq, T, D], k and v [B, Hkv, T, D], rotated and normed. `rolled`: cos/sin
        come from `roll_tables` (the decoder's cached canvas tables)."""
        b, t, _ = x.shape
        hq, hkv, d = self.num_heads, self.num_kv_heads, self.head_dim
        if fused_views(
            self.qkv, self.q_proj, self.k_proj, *([self.v_proj] if self.v_proj is not None else [])
        ):
            # One GEMM instead of two or three, and one norm over every head's row instead of three (the
            # q and k norm weights are applied after it; v's norm has none): per-op cost dominates here.
            heads = rms_norm(
                linear(x, self.qkv.t(), self.qkv_packed).view(b, t, -1, d), None, self.q_norm.eps
            )
            rope = apply_rolled_rope if rolled else apply_rope
            q = rope(heads[:, :, :hq] * self.q_norm.weight, cos, sin)
            k = rope(heads[:, :, hq : hq + hkv] * self.k_norm.weight, cos, sin)
            v = heads[:, :, hq + hkv :] if self.v_proj is not None else heads[:, :, hq:]
            return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        q = self.q_proj(x).view(b, t, hq, d)
        k_raw = self.k_proj(x).view(b, t, hkv, d)
        v = self.v_proj(x).view(b, t, hkv, d) if self.v_proj is not None else k_raw
        rope = apply_rolled_rope if rolled else apply_rope
        q = rope(self.q_norm(q), cos, sin)
        k = rope(self.k_norm(k_raw), cos, sin)
        v = self.v_norm(v)
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
        """q: [B, Hq, T, D], k/v: [B, Hkv, S, D], mask: bool [B|1, 1, T, S] (True = attend) -> [B, T, H]."""
        groups = self.num_heads // self.num_kv_heads
        if groups > 1:
            k = k.repeat_interleave(groups, dim=1)
            v = v.repeat_interleave(groups, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=1.0)
        b, _, t, _ = q.shape
        return linear(
            out.transpose(1, 2).reshape(b, t, self.num_heads * self.head_dim),
            self.o_proj.weight,
            self.o_packed,
        )

    def attend_one(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """One new token over keys/values that already hold its own (a drafted token): q [1, Hq, 1, D], k/v
        [1, Hkv, S, D] -> [1, 1, H]. It sees every key, so no mask; the query heads of one KV head become
        that head's query rows, so one fused sdpa needs no repeated keys (3x faster than `attend_cached`
        on a sliding layer's 512 keys, 1.7x on a full layer's 1,100)."""
        b, hq, _, d = q.shape
        rows = q.reshape(
            b, self.num_kv_heads, hq // self.num_kv_heads, d
        )  # query head i reads KV head i // groups
        out = F.scaled_dot_product_attention(rows, k, v, scale=1.0)
        return linear(out.reshape(b, 1, hq * d), self.o_proj.weight, self.o_packed)

    def attend_cached(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        past_k: Tensor,
        past_v: Tensor,
        past_mask: Tensor | None = None,
        new_mask: Tensor | None = None,
    ) -> Tensor:
        """Attention of L new rows over [cached context ; themselves], reading the context's keys/values
        where the cache holds them. q: [B, Hq, L, D], k/v: [B, Hkv, L, D], past_k/past_v: [1, Hkv, P, D]
        (one cache shared by all B rows) -> [B, L, H]. Unmasked (the canvas, bidirectional) unless
        `past_mask` [L, P] / `new_mask` [L, L] say otherwise (True = attend: a few causal tokens).

        Concatenating [past ; canvas] and repeating KV heads for sdpa copied the whole context's keys and
        values (~2 MB per full layer) every step; here every query row of one KV head (all batch rows
        and grouped query heads folded together) multiplies the cache in place, and the two score blocks
        share one softmax. Same arithmetic, scale 1.0 as in `attend`."""
        b, hq, length, d = q.shape
        hkv = self.num_kv_heads
        rows = b * (hq // hkv) * length
        p = past_k.shape[2]
        grouped = q.reshape(b, hkv, rows // b, d)  # query head i reads KV head i // groups
        folded = grouped.transpose(0, 1).reshape(hkv, rows, d)
        scores_past = torch.matmul(folded, past_k[0].transpose(1, 2))  # [Hkv, rows, P]
        scores_new = torch.matmul(grouped, k.transpose(2, 3))  # [B, Hkv, rows/B, L]: own canvas only
        if past_mask is not None:
            scores_past = scores_past.view(hkv, rows // length, length, p).masked_fill(~past_mask, -math.inf)
            scores_past = scores_past.view(hkv, rows, p)
        if new_mask is not None:
            scores_new = scores_new.view(b, hkv, rows // (b * length), length, length)
            scores_new = scores_new.masked_fill(~new_mask, -math.inf)
        scores_new = scores_new.reshape(b, hkv, rows // b, length).transpose(0, 1).reshape(hkv, rows, length)
        probs = torch.cat([scores_past, scores_new], dim=-1).softmax(dim=-1)
        out_new = torch.matmul(probs[..., p:].reshape(hkv, b, rows // b, length).transpose(0, 1), v)
        out_past = torch.matmul(probs[..., :p], past_v[0]).reshape(hkv, b, rows // b, d).transpose(0, 1)
        out = (out_past + out_new).reshape(b, hq, length, d)
        return linear(out.transpose(1, 2).reshape(b, length, hq * d), self.o_proj.weight, self.o_packed)


class MLP(nn.Module):
    """Gated GELU MLP (dense branch of every layer)."""

    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)
        self.gate_up: Tensor | None = None  # [H, 2I] after `fuse_linears` (CPU inference)
        self.gate_up_packed: Packed | None = None  # fp16 copies for few-row products (`pack_fp16`)
        self.down_packed: Packed | None = None

    def forward(self, x: Tensor) -> Tensor:
        if fused_views(self.gate_up, self.gate_proj, self.up_proj):
            gate, up = linear(x, self.gate_up.t(), self.gate_up_packed).chunk(2, dim=-1)
            return linear(gelu(gate) * up, self.down_proj.weight, self.down_packed)
        return self.down_proj(gelu(self.gate_proj(x)) * self.up_proj(x))


class Router(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.top_k = config.top_k_experts
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, with_scale=False)
        self.proj = nn.Linear(config.hidden_size, config.num_experts, bias=False)
        self.scale = nn.Parameter(torch.ones(config.hidden_size))
        self.per_expert_scale = nn.Parameter(torch.ones(config.num_experts))
        self.root_size = config.hidden_size**-0.5

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """x: [N, H] -> weights [N, k] (fp32), expert indices [N, k]."""
        scores = self.proj(self.norm(x) * self.scale * self.root_size)
        probs = scores.softmax(dim=-1, dtype=torch.float32)
        weights, index = torch.topk(probs, self.top_k, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights * self.per_expert_scale[index], index


class Experts(nn.Module):
    """Expert weights as 3-D tensors, as in the checkpoint: gate_up_proj [E, 2I, H], down_proj [E, H, I]."""

    # How to run the experts: "dense" sends every token through every expert in one batched product
    # (no host sync, compile-friendly: training, and accelerators with few experts); "sparse" runs only
    # the chosen experts (CPU inference, where it is ~7% faster per step, and many experts); "auto" picks.
    mode = "auto"
    dense_max_experts = 8

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


class Layer(nn.Module):
    """One Gemma-4 layer: attention, then a dense MLP and a mixture of experts summed."""

    def __init__(self, config: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        hidden, eps = config.hidden_size, config.rms_norm_eps
        self.self_attn = Attention(config, layer_idx)
        self.mlp = MLP(hidden, config.intermediate_size)
        self.router = Router(config)
        self.experts = Experts(config)
        self.input_layernorm = RMSNorm(hidden, eps)
        self.post_attention_layernorm = RMSNorm(hidden, eps)
        self.pre_feedforward_layernorm = RMSNorm(hidden, eps)
        self.post_feedforward_layernorm = RMSNorm(hidden, eps)
        self.post_feedforward_layernorm_1 = RMSNorm(hidden, eps)
        self.pre_feedforward_layernorm_2 = RMSNorm(hidden, eps)
        self.post_feedforward_layernorm_2 = RMSNorm(hidden, eps)
        self.register_buffer("layer_scalar", torch.ones(1))  # the decoder's; the encoder has its own

    def forward(
        self,
        x: Tensor,
        rope: tuple[Tensor, Tensor],
        attend: Attend,
        scalar: Tensor,
        *,
        rolled: bool = False,
        rows: int | None = None,
    ) -> Tensor:
        """x [B, T, H] -> [B, T, H]. `attend` says where the keys and values come from (a mask, a cache,
        the encoder's keys); `scalar` is the encoder's or the decoder's layer scale; `rolled`: `rope` is in
        `roll_tables` form. With `rows`, only the last `rows` positions go on through the feed-forward (the
        last layer of a causal pass: it shapes no key or value), and none at all for rows=0."""
        q, k, v = self.self_attn.project(self.input_layernorm(x), *rope, rolled=rolled)
        x = x + self.post_attention_layernorm(attend(self.self_attn, q, k, v))
        if rows is not None:
            x = x[:, x.shape[1] - rows :]
            if rows == 0:
                return x
        return (x + self.feed_forward(x)) * scalar

    def feed_forward(self, x: Tensor) -> Tensor:
        dense = self.post_feedforward_layernorm_1(self.mlp(self.pre_feedforward_layernorm(x)))
        flat = x.reshape(-1, x.shape[-1])
        weights, index = self.router(flat)  # the router reads the un-normed residual
        moe = self.experts(self.pre_feedforward_layernorm_2(flat), weights, index).reshape(x.shape)
        return self.post_feedforward_layernorm(dense + self.post_feedforward_layernorm_2(moe))


class SelfConditioning(nn.Module):
    """Feeds the previous step's prediction back in: softmax(logits) @ E * sqrt(H), normed, through a
    gated MLP, added to the canvas embeddings, then a scale-free RMSNorm (also on the first step)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        hidden, eps = config.hidden_size, config.rms_norm_eps
        self.pre_norm = RMSNorm(hidden, eps)
        self.post_norm = RMSNorm(hidden, eps, with_scale=False)
        self.gate_proj = nn.Linear(hidden, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, hidden, bias=False)
        self.gate_up: Tensor | None = None  # [H, 2I] after `fuse_linears` (CPU inference)
        self.gate_up_packed: Packed | None = None  # fp16 copies for few-row products (`pack_fp16`)
        self.down_packed: Packed | None = None

    def forward(self, canvas_embeds: Tensor, soft_embeds: Tensor) -> Tensor:
        normed = self.pre_norm(soft_embeds)
        if fused_views(self.gate_up, self.gate_proj, self.up_proj):
            gate, up = linear(normed, self.gate_up.t(), self.gate_up_packed).chunk(2, dim=-1)
            signal = linear(gelu(gate) * up, self.down_proj.weight, self.down_packed)
        else:
            signal = self.down_proj(gelu(self.gate_proj(normed)) * self.up_proj(normed))
        return self.post_norm(canvas_embeds + signal)


class Decoder(nn.Module):
    """The shared text stack (named `decoder` as in the checkpoint, where the encoder's copy is tied to it)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(Layer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_conditioning = SelfConditioning(config)
        self.embed_scale = config.hidden_size**0.5

    def embed(self, ids: Tensor) -> Tensor:
        weight = self.embed_tokens.weight
        # The scale is rounded to the weight dtype first, as the reference does (sqrt(H) in bf16).
        return F.embedding(ids, weight) * torch.tensor(self.embed_scale, dtype=weight.dtype)


class EncoderLayerScalar(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("layer_scalar", torch.ones(1))


class EncoderLanguageModel(nn.Module):
    """All the encoder owns: one scalar per layer. Everything else is the decoder's (tied) weights."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(EncoderLayerScalar() for _ in range(config.num_hidden_layers))


class Encoder(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.language_model = EncoderLanguageModel(config)


class Backbone(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.encoder = Encoder(config)
        self.decoder = Decoder(config)


class KVCache:
    """Keys and values of the encoded context, per layer: [B, Hkv, P, D]. Sliding layers keep the whole
    context too (the window is applied when attending), so truncating to any length stays exact.

    Each layer's keys and values are views of the first P positions of a buffer with room to grow, so
    appending a token writes it in place instead of copying the whole cache (a one-token pass, as the
    encoder's draft runs ~10 of per fill, would otherwise copy every layer's keys and values each time)."""

    GROW = 256  # spare positions a buffer gets when it is (re)allocated

    def __init__(self, num_layers: int) -> None:
        self.keys: list[Tensor | None] = [None] * num_layers
        self.values: list[Tensor | None] = [None] * num_layers
        self.length = 0
        self._buffers: list[tuple[Tensor, Tensor] | None] = [None] * num_layers

    def append(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        old_k, old_v = self.keys[layer], self.values[layer]
        n = 0 if old_k is None else old_k.shape[2]
        t = k.shape[2]
        buffer = self._buffers[layer]
        fits = (
            buffer is not None
            and old_k is not None
            and buffer[0].shape[2] >= n + t
            and buffer[0].shape[:2] == k.shape[:2]
            and buffer[0].dtype == k.dtype
            and buffer[0].device == k.device
            and old_k.data_ptr() == buffer[0].data_ptr()  # still a view of this buffer (not replaced)
            # a buffer made under inference_mode cannot be written outside it
            and (torch.is_inference_mode_enabled() or not buffer[0].is_inference())
        )
        if not fits:
            if old_k is None or old_v is None:
                old_k, old_v = k[:, :, :0], v[:, :, :0]
            shape_k = (*k.shape[:2], n + t + self.GROW, k.shape[3])
            shape_v = (*v.shape[:2], n + t + self.GROW, v.shape[3])
            buffer = (k.new_empty(shape_k), v.new_empty(shape_v))
            buffer[0][:, :, :n] = old_k
            buffer[1][:, :, :n] = old_v
            self._buffers[layer] = buffer
        assert buffer is not None
        buffer[0][:, :, n : n + t] = k
        buffer[1][:, :, n : n + t] = v
        self.keys[layer], self.values[layer] = buffer[0][:, :, : n + t], buffer[1][:, :, : n + t]
        return self.keys[layer], self.values[layer]

    def tail(self, n: int) -> list[tuple[Tensor | None, Tensor | None]]:
        """Copies of the last `n` positions' keys and values, per layer (to `extend` with later)."""
        assert 0 < n <= self.length
        return [
            (None, None) if k is None or v is None else (k[:, :, -n:].clone(), v[:, :, -n:].clone())
            for k, v in zip(self.keys, self.values, strict=True)
        ]

    def extend(self, keys_values: list[tuple[Tensor | None, Tensor | None]]) -> None:
        """Append what `tail` copied (computed after exactly what this cache now holds)."""
        n = 0
        for layer, (k, v) in enumerate(keys_values):
            if k is not None and v is not None:
                self.append(layer, k, v)
                n = k.shape[2]
        self.length += n

    def get(self, layer: int) -> tuple[Tensor | None, Tensor | None]:
        return self.keys[layer], self.values[layer]

    def shared_prefix(self, length: int, batch: int) -> KVCache:
        """A new cache over this one's first `length` tokens, repeated for `batch` rows without a copy (rows
        appended to it go to the new cache only: scoring several continuations of one context at once)."""
        view = KVCache(len(self.keys))
        for i, (k, v) in enumerate(zip(self.keys, self.values, strict=True)):
            if k is not None and v is not None:
                view.keys[i] = k[:, :, :length].expand(batch, -1, -1, -1)
                view.values[i] = v[:, :, :length].expand(batch, -1, -1, -1)
        view.length = min(length, self.length)
        return view

    def truncate(self, length: int) -> None:
        """Forget everything after the first `length` context tokens."""
        if length >= self.length:
            return
        for i, (k, v) in enumerate(zip(self.keys, self.values, strict=True)):
            if k is not None and v is not None:
                self.keys[i], self.values[i] = k[:, :, :length], v[:, :, :length]
        self.length = length


# Up to this many new tokens after a cache take `attend_cached` (no copy of the cache) in a causal pass;
# longer runs (a context's first encode) build full masks, as training does.
FEW_TOKENS = 16


def causal_mask(q_pos: Tensor, k_pos: Tensor, window: int | None) -> Tensor:
    """q_pos: [T], k_pos: [S] absolute indices -> bool [T, S]: key at or before the query (and inside
    the window: q - k < window, the query itself included)."""
    diff = q_pos[:, None] - k_pos[None, :]
    mask = diff >= 0
    if window is not None:
        mask = mask & (diff < window)
    return mask


class DiffusionGemma(nn.Module):
    """`DiffusionGemmaForBlockDiffusion`, text only. The LM head is the (tied) embedding matrix."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.model = Backbone(config)
        self.rotary = Rotary(config)
        # ((device, dtype), RoPE tables over positions [0, N) per layer type): see `rope_rows`
        self._rope_table: tuple[tuple, dict[str, tuple[Tensor, Tensor]]] = ((), {})
        # fp16 copies of the tied embedding for few-row products (`pack_fp16`): the LM head, and the
        # self-conditioning's probabilities @ embedding
        self.head_packed: Packed | None = None
        self.soft_packed: Packed | None = None
        # Set by the loader for an int8 checkpoint (dfim.engine.model.int8): `prepare_cpu_inference` then packs
        # the stored integers for fbgemm's int8 products instead of fp16 copies.
        self.int8_weights = False

    @property
    def decoder(self) -> Decoder:
        return self.model.decoder

    def new_cache(self) -> KVCache:
        return KVCache(self.config.num_hidden_layers)

    @torch.no_grad()
    def prepare_cpu_inference(self) -> None:
        """Re-lay the weights for fast CPU inference; values, names, shapes and `state_dict` stay the same.

        Linears that read one input (q/k/v, gate/up) become views of one fused matrix (one GEMM, see
        `fuse_linears`); every other matrix, the experts and the tied embedding are stored transposed
        (column-major), so each product runs as an NN GEMM, measurably faster in MKL for the ~16-row
        activations of a canvas (the LM head: 3.8 -> 3.2 ms on the 2-core dev machine). Every matrix also
        gets an fp16 copy for products of a few rows (`pack_fp16`, `linear`) where the weights fit fp16, or,
        for a model loaded from an int8 checkpoint (`int8_weights`), an int8 copy used for every product; a
        load or an in-place update afterwards sends the products it touches back to fp32. The one exception
        of an int8 model is the self-conditioning's probabilities @ embedding: the embedding's scales are
        per vocabulary row, its input channels there, and the probabilities (mostly tiny) would not survive
        8-bit activation quantization, so that product keeps an fp16 copy."""
        int8 = self.int8_weights

        def pack(weight: Tensor, *also_watched: Tensor) -> Packed | None:
            return pack_weight(weight, *also_watched, int8=int8)

        def transpose_storage(*weights: Tensor) -> None:
            for weight in weights:
                weight.data = weight.data.transpose(-1, -2).contiguous().transpose(-1, -2)

        def fused(*linears: nn.Linear | None) -> tuple[Tensor, Packed | None]:
            # the parameters that view the fused matrix keep version counters of their own: watch them too
            present = [lin for lin in linears if lin is not None]
            matrix = fuse_linears(*present)
            return matrix, pack(matrix.t(), *(lin.weight for lin in present))

        for layer in self.decoder.layers:
            attn, mlp, experts = layer.self_attn, layer.mlp, layer.experts
            attn.qkv, attn.qkv_packed = fused(attn.q_proj, attn.k_proj, attn.v_proj)
            mlp.gate_up, mlp.gate_up_packed = fused(mlp.gate_proj, mlp.up_proj)
            transpose_storage(
                attn.o_proj.weight,
                mlp.down_proj.weight,
                layer.router.proj.weight,
                experts.gate_up_proj,
                experts.down_proj,
            )
            attn.o_packed, mlp.down_packed = pack(attn.o_proj.weight), pack(mlp.down_proj.weight)
            experts.gate_up_packed = [pack(w) for w in experts.gate_up_proj]  # views: the 3-D's version
            experts.down_packed = [pack(w) for w in experts.down_proj]
        conditioning = self.decoder.self_conditioning
        conditioning.gate_up, conditioning.gate_up_packed = fused(
            conditioning.gate_proj, conditioning.up_proj
        )
        embedding = self.decoder.embed_tokens.weight
        transpose_storage(conditioning.down_proj.weight, embedding)
        conditioning.down_packed = pack(conditioning.down_proj.weight)
        self.head_packed = pack(embedding)
        # a view: shares the embedding's version counter
        self.soft_packed = pack_fp16(embedding.t(), exact=not int8)

    def logits(self, hidden: Tensor) -> Tensor:
        logits = linear(self.decoder.norm(hidden), self.decoder.embed_tokens.weight, self.head_packed).float()
        cap = self.config.final_logit_softcapping
        if torch.is_grad_enabled():
            return torch.tanh(logits / cap) * cap
        # inference: in place on the fresh [B, L, V] product (no two more vocabulary-sized buffers)
        return logits.div_(cap).tanh_().mul_(cap)

    def canvas_embeddings(self, canvas_ids: Tensor, self_cond_logits: Tensor | None) -> Tensor:
        decoder = self.decoder
        x = decoder.embed(canvas_ids)
        if self_cond_logits is None:
            soft = torch.zeros_like(x)
        else:
            weight = decoder.embed_tokens.weight
            probs = self_cond_logits.softmax(dim=-1, dtype=torch.float32).to(weight.dtype)
            soft = linear(probs, weight.t(), self.soft_packed) * torch.tensor(
                decoder.embed_scale, dtype=x.dtype
            )
        return decoder.self_conditioning(x, soft)

    # --- inference --------------------------------------------------------------------------------

    def encode(self, input_ids: Tensor, cache: KVCache) -> None:
        """Run the context causally and append its keys/values to `cache`. input_ids: [B, T]."""
        scalars = [layer.layer_scalar for layer in self.model.encoder.language_model.layers]
        self._causal_pass(input_ids, cache, scalars, rows=0)  # nobody reads its hidden states

    def context_lm(self, input_ids: Tensor, cache: KVCache, last: int | None = None) -> Tensor:
        """The diffusion encoder read as a causal LM (its training's context LM loss): input_ids [B, T] run
        after what `cache` holds, keys/values appended -> next-token logits [B, T, V] (of the `last` positions
        only: [B, last, V])."""
        scalars = [layer.layer_scalar for layer in self.model.encoder.language_model.layers]
        return self.logits(self._causal_pass(input_ids, cache, scalars, rows=last))

    def _causal_pass(
        self, input_ids: Tensor, cache: KVCache, scalars: list[Tensor], rows: int | None = None
    ) -> Tensor:
        """The stack run causally over input_ids [B, T] after what `cache` holds; appends their keys and
        values and returns the hidden states [B, T, H], or of the last `rows` positions only: the last
        layer's feed-forward shapes no key or value, so it runs on those rows alone (none for an encode).
        `scalars`: the per-layer output scales (the encoder's for the diffusion context, the decoder's for
        the causal LM)."""
        b, t = input_ids.shape
        start = cache.length
        positions = torch.arange(start, start + t, device=input_ids.device)
        tables = self.rope_rows(start, t, input_ids.device)  # rolled, [1, T, 1, D]: shared by every row
        x = self.decoder.embed(input_ids)
        # A few new tokens after a cache (a drafted token, the few tokens just typed) go through
        # `attend_cached`, which reads the cache in place instead of copying it per grouped head, with a
        # [T, T] causal mask over themselves (windowed on sliding layers); a sliding layer reads the cached
        # tokens from the first one's window on (`first`), masking, per later token, the columns that left
        # its window. One token needs no mask at all (`attend_one`, after its keys join the cache).
        few = b == 1 and 0 < start and t <= FEW_TOKENS and not torch.is_grad_enabled()
        window = self.config.sliding_window
        first = max(0, start - (window - 1))
        masks = {}
        past_mask = None
        new_masks: dict[bool, Tensor | None] = {False: None, True: None}  # by "is sliding"
        if few and t > 1:
            new = torch.arange(t, device=input_ids.device)
            new_masks = {False: causal_mask(new, new, None), True: causal_mask(new, new, window)}
            cut = (positions - (window - 1)).clamp(min=0) - first  # [T]: leading columns out of the window
            if int(cut[-1]) > 0:
                past_mask = torch.arange(start - first, device=input_ids.device)[None, :] >= cut[:, None]
        if not few:
            key_positions = torch.arange(start + t, device=input_ids.device)
            masks = {
                False: causal_mask(positions, key_positions, None),
                True: causal_mask(positions, key_positions, window),
            }
        attend: Callable[..., Tensor]
        if few and t == 1:
            attend = partial(self._attend_one_cached, cache, first)
        elif few:
            attend = partial(self._attend_few_cached, cache, first, past_mask, new_masks)
        else:
            attend = partial(self._attend_appended, cache, masks)
        layers = self.decoder.layers
        last = len(layers) - 1
        for i, layer in enumerate(layers):
            rope = tables[self.config.layer_types[i]]
            x = layer(x, rope, partial(attend, i), scalars[i], rolled=True, rows=rows if i == last else None)
        cache.length = start + t
        return x

    @staticmethod
    def _attend_one_cached(
        cache: KVCache, first: int, i: int, attn: Attention, q: Tensor, k: Tensor, v: Tensor
    ) -> Tensor:
        keys, values = cache.append(i, k, v)  # the token attends to itself too
        if attn.is_sliding:
            keys, values = keys[:, :, first:], values[:, :, first:]
        return attn.attend_one(q, keys, values)

    @staticmethod
    def _attend_few_cached(
        cache: KVCache,
        first: int,
        past_mask: Tensor | None,
        new_masks: dict[bool, Tensor | None],
        i: int,
        attn: Attention,
        q: Tensor,
        k: Tensor,
        v: Tensor,
    ) -> Tensor:
        past_k, past_v = cache.get(i)
        assert past_k is not None and past_v is not None
        if attn.is_sliding:
            past_k, past_v = past_k[:, :, first:], past_v[:, :, first:]
            attended = attn.attend_cached(q, k, v, past_k, past_v, past_mask, new_masks[True])
        else:
            attended = attn.attend_cached(q, k, v, past_k, past_v, None, new_masks[False])
        cache.append(i, k, v)
        return attended

    @staticmethod
    def _attend_appended(
        cache: KVCache, masks: dict[bool, Tensor], i: int, attn: Attention, q: Tensor, k: Tensor, v: Tensor
    ) -> Tensor:
        k, v = cache.append(i, k, v)
        return attn.attend(q, k, v, masks[attn.is_sliding][None, None])

    def _attend_canvas(
        self, cache: KVCache, i: int, attn: Attention, q: Tensor, k: Tensor, v: Tensor
    ) -> Tensor:
        """The canvas over [cached context ; canvas], bidirectional. A sliding layer sees the last
        `window - 1` context tokens plus the whole canvas (as the reference's sliding cache keeps them),
        a full layer sees everything: no mask needed."""
        past_k, past_v = cache.get(i)
        if past_k is not None and past_v is not None and attn.is_sliding:
            first = max(0, cache.length - (self.config.sliding_window - 1))
            past_k, past_v = past_k[:, :, first:], past_v[:, :, first:]
        if past_k is not None and past_v is not None and past_k.shape[0] == 1:
            return attn.attend_cached(q, k, v, past_k, past_v)  # the usual case: one context
        if past_k is not None and past_v is not None:
            b = q.shape[0]
            if past_k.shape[0] != b:
                past_k, past_v = past_k.expand(b, -1, -1, -1), past_v.expand(b, -1, -1, -1)
            k, v = torch.cat([past_k, k], dim=2), torch.cat([past_v, v], dim=2)
        return attn.attend(q, k, v, None)

    def denoise(self, canvas_ids: Tensor, cache: KVCache, self_cond_logits: Tensor | None = None) -> Tensor:
        """One decoder pass: canvas_ids [B, L] over [cache ; canvas] -> logits [B, L, V] (fp32, capped)."""
        length = canvas_ids.shape[1]
        tables = self.rope_rows(cache.length, length, canvas_ids.device)
        x = self.canvas_embeddings(canvas_ids, self_cond_logits)
        for i, layer in enumerate(self.decoder.layers):
            rope = tables[self.config.layer_types[i]]
            x = layer(x, rope, partial(self._attend_canvas, cache, i), layer.layer_scalar, rolled=True)
        return self.logits(x)

    def rope_rows(self, start: int, length: int, device: torch.device) -> dict[str, tuple[Tensor, Tensor]]:
        """RoPE tables per layer type for positions start..start+length, in `roll_tables` form [1, T, 1, D].
        While gradients are off they are slices of one table per layer type over positions [0, N), built once
        and grown by doubling: a drafted token or a denoising step then costs no trigonometry. While they are
        on (training) they are built fresh: a table made under inference_mode must never be saved for backward."""
        dtype = self.decoder.embed_tokens.weight.dtype
        end = start + length
        if torch.is_grad_enabled():
            tables = self.rotary(torch.arange(start, end, device=device)[None], dtype)
            return {kind: roll_tables(cos, sin) for kind, (cos, sin) in tables.items()}
        key, tables = self._rope_table
        if key != (device, dtype) or next(iter(tables.values()))[0].shape[1] < end:
            n = max(4096, 2 * end)
            tables = self.rotary(torch.arange(n, device=device)[None], dtype)
            tables = {kind: roll_tables(cos, sin) for kind, (cos, sin) in tables.items()}
            self._rope_table = ((device, dtype), tables)
        return {kind: (cos[:, start:end], sin[:, start:end]) for kind, (cos, sin) in tables.items()}

    # --- training ---------------------------------------------------------------------------------

    def forward_train(
        self,
        context_ids: Tensor,
        canvas_ids: Tensor,
        self_cond_logits: Tensor | None = None,
        context_pad: Tensor | None = None,
    ) -> Tensor:
        """Encoder over the context and decoder over the canvas in one call -> canvas logits [B, L, V].

        context_pad: bool [B, n], True on LEFT padding; pads are never attended and positions count
        real tokens only, so a padded example computes what `encode` + `denoise` compute unpadded.
        """
        canvas_logits, _ = self.forward_train_lm(
            context_ids, canvas_ids, self_cond_logits, context_pad, context_lm=False
        )
        return canvas_logits

    def forward_train_lm(
        self,
        context_ids: Tensor,
        canvas_ids: Tensor,
        self_cond_logits: Tensor | None = None,
        context_pad: Tensor | None = None,
        *,
        context_lm: bool = True,
    ) -> tuple[Tensor, Tensor | None]:
        """`forward_train`, and with context_lm the encoder's final hidden states [B, n, H] as well.

        Those feed the context language-model loss of training (`dfim.engine.training.train --context-lm-weight`):
        next-token prediction on every context token, through the encoder's own layer scalars and
        the last layer's feed-forward, which inference (`encode`) skips. It is a dense training signal
        for the shared stack; it changes nothing `encode` + `denoise` compute."""
        b, n = context_ids.shape
        length = canvas_ids.shape[1]
        device = context_ids.device
        dtype = self.decoder.embed_tokens.weight.dtype
        if context_pad is None:
            context_pad = torch.zeros(b, n, dtype=torch.bool, device=device)
        real = (~context_pad).long()
        ctx_positions = (real.cumsum(dim=1) - 1).clamp(min=0)  # [B, n]
        canvas_positions = real.sum(dim=1, keepdim=True) + torch.arange(length, device=device)  # [B, L]
        ctx_tables = self.rotary(ctx_positions, dtype)
        canvas_tables = self.rotary(canvas_positions, dtype)

        idx = torch.arange(n, device=device)
        key_ok = ~context_pad[:, None, None, :]  # [B, 1, 1, n]
        eye = torch.eye(n, dtype=torch.bool, device=device)  # pad queries attend to themselves: no NaN
        enc_masks = {
            False: (causal_mask(idx, idx, None) & key_ok) | eye,
            True: (causal_mask(idx, idx, self.config.sliding_window) & key_ok) | eye,
        }
        window = self.config.sliding_window - 1
        in_window = idx >= n - window  # the sliding cache keeps the last window-1 context tokens
        canvas_ok = torch.ones(b, 1, 1, length, dtype=torch.bool, device=device)
        dec_masks = {
            False: torch.cat([key_ok, canvas_ok], dim=-1),
            True: torch.cat([key_ok & in_window, canvas_ok], dim=-1),
        }

        x = self.decoder.embed(context_ids)
        y = self.canvas_embeddings(canvas_ids, self_cond_logits)
        encoder_scalars = self.model.encoder.language_model.layers
        context_kv: list[
            tuple[Tensor, Tensor]
        ] = []  # the current layer's context keys/values, for the canvas

        def attend_context(attn: Attention, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
            context_kv[:] = [(k, v)]
            return attn.attend(q, k, v, enc_masks[attn.is_sliding])

        def attend_canvas(attn: Attention, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
            ctx_k, ctx_v = context_kv[0]
            keys, values = torch.cat([ctx_k, k], dim=2), torch.cat([ctx_v, v], dim=2)
            return attn.attend(q, keys, values, dec_masks[attn.is_sliding])

        layers = self.decoder.layers
        for i, layer in enumerate(layers):
            layer_type = self.config.layer_types[i]
            if context_lm or i < len(layers) - 1:
                x = layer(x, ctx_tables[layer_type], attend_context, encoder_scalars[i].layer_scalar)
            else:  # the last layer need only provide the context's keys/values
                _, k, v = layer.self_attn.project(layer.input_layernorm(x), *ctx_tables[layer_type])
                context_kv[:] = [(k, v)]
            y = layer(y, canvas_tables[layer_type], attend_canvas, layer.layer_scalar)
        return self.logits(y), (x if context_lm else None)

    # --- bookkeeping ------------------------------------------------------------------------------

    @torch.no_grad()
    def init_weights(self, std: float = 0.02, generator: torch.Generator | None = None) -> None:
        """Random init for training from scratch: normal(0, std) matrices, ones for norms and scales."""
        for p in self.parameters():
            if p.ndim >= 2:
                p.normal_(0.0, std, generator=generator)
            else:
                p.fill_(1.0)
        for layer in self.decoder.layers:
            # scale residual-branch outputs down with depth (GPT-2 style) for stable early training
            for proj in (layer.self_attn.o_proj.weight, layer.mlp.down_proj.weight, layer.experts.down_proj):
                proj.mul_(1.0 / math.sqrt(2 * self.config.num_hidden_layers))

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    # --- autoregressive mode ----------------------------------------------------------------------
    # The same network read as a causal language model (the same-size AR baseline of the evaluation,
    # trained with `dfim.engine.training.train --objective causal`): every layer runs causally with the decoder's
    # layer scalars and feed-forward; self-conditioning and the encoder scalars are unused.

    def causal_lm(self, input_ids: Tensor, cache: KVCache, last: int | None = None) -> Tensor:
        """Run input_ids [B, T] causally after what `cache` holds and append their keys/values.
        Returns logits for the next token after each position: [B, T, V] (of the `last` only: [B, last, V])."""
        scalars = [layer.layer_scalar for layer in self.decoder.layers]
        return self.logits(self._causal_pass(input_ids, cache, scalars, rows=last))

    def causal_forward_train(self, ids: Tensor, pad: Tensor) -> Tensor:
        """ids [B, N] with LEFT padding marked True in pad [B, N] (right padding needs no mask: nothing
        after it is read) -> next-token logits [B, N, V]. Positions count real tokens only, so a padded
        row computes what `causal_lm` computes on it unpadded."""
        b, n = ids.shape
        device = ids.device
        real = (~pad).long()
        positions = (real.cumsum(dim=1) - 1).clamp(min=0)
        tables = self.rotary(positions, self.decoder.embed_tokens.weight.dtype)
        idx = torch.arange(n, device=device)
        key_ok = ~pad[:, None, None, :]
        eye = torch.eye(n, dtype=torch.bool, device=device)  # pad queries attend to themselves: no NaN
        masks = {
            False: (causal_mask(idx, idx, None) & key_ok) | eye,
            True: (causal_mask(idx, idx, self.config.sliding_window) & key_ok) | eye,
        }
        x = self.decoder.embed(ids)

        def attend(attn: Attention, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
            return attn.attend(q, k, v, masks[attn.is_sliding])

        for i, layer in enumerate(self.decoder.layers):
            x = layer(x, tables[self.config.layer_types[i]], attend, layer.layer_scalar)
        return self.logits(x)
