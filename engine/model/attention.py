"""Gemma-4 attention and its rotary position tables: the projections (with q/k/v norms and RoPE) and the
three ways to attend (masked, one token over a cache, a few rows over a cache read in place)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dfim.engine.model import triton_gemv, triton_norm
from dfim.engine.model.config import FULL, ModelConfig
from dfim.engine.model.ops import Packed, RMSNorm, fused_views, linear, rms_norm, row_views


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
        self.qkv_rows: Tensor | None = None  # [(Hq + 2 Hkv) D, H] after `fuse_rows` (GPU inference)

    def project(
        self, x: Tensor, cos: Tensor, sin: Tensor, rolled: bool = False
    ) -> tuple[Tensor, Tensor, Tensor]:
        """x: [B, T, H] -> q [B, Hq, T, D], k and v [B, Hkv, T, D], rotated and normed. `rolled`: cos/sin
        come from `roll_tables` (the decoder's cached canvas tables)."""
        b, t, _ = x.shape
        hq, hkv, d = self.num_heads, self.num_kv_heads, self.head_dim
        own_v = [self.v_proj] if self.v_proj is not None else []
        if (
            not rolled
            and triton_norm.applies(x)
            and row_views(self.qkv_rows, self.q_proj, self.k_proj, *own_v)
        ):
            # GPU: one product for q, k and v, then one kernel norms and rotates every head (~16 ops)
            heads = triton_gemv.linear(x, self.qkv_rows).view(b, t, -1, d)
            weights = (self.q_norm.weight, self.k_norm.weight)
            return triton_norm.head_norm_rope(
                heads, (hq, hkv), bool(own_v), weights, cos, sin, self.q_norm.eps
            )
        if fused_views(self.qkv, self.q_proj, self.k_proj, *own_v):
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
