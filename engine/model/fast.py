"""The fast inference path for big checkpoints on a GPU: static KV cache, CUDA graphs, grouped experts.

It runs the *same* weights as `dfim.engine.model.network.DiffusionGemma` (it only holds references to them, no
copy) through functional code written for speed:

- **Static KV cache.** One preallocated [1, Hkv, max_len, D] tensor pair per layer. The encoder
  writes the context there; the decoder writes the canvas keys/values into the scratch rows just
  after the context (so it needs no concatenation) and never moves `length`; the autoregressive
  decode writes one row per token. Attention reads a static slice [lo, hi) of the cache and masks
  what is not valid, so one captured graph serves every context length inside a `bucket`.
- **Grouped mixture of experts.** Token-expert pairs are sorted by expert and run through
  `torch._grouped_mm` (one CUTLASS grouped GEMM for all 128 experts, empty groups cost nothing):
  no Python loop over experts, no host sync (counts come from `scatter_add_`, not `bincount`).
  Fallback where `_grouped_mm` is missing or fails its self-test: a padded batched matmul.
- **CUDA graphs.** A whole denoising step (decoder, temperature, sampling, entropy-bound acceptance,
  renoise, self-conditioning, the stable-and-confident test) is one graph replay; so is a whole
  autoregressive token. The step loop launches replays only: no host syncs (fixed-step mode never
  reads the device; adaptive mode reads one flag every `check_every` steps).
- **torch.compile** (optional) of the per-layer functions fuses norms, RoPE and activations.

Sampler semantics are transformers' `DiffusionGemmaForBlockDiffusion.generate` (uniform noise,
linear temperature over remaining steps, entropy-bound acceptance, self-conditioning on the
processed logits, stable-and-confident stop, argmax canvas committed, pad after the first EOS).
Sampling uses the exponential race (argmax p/E, E ~ Exp(1)), which draws from the same categorical
distribution as `torch.multinomial` without its host-side checks.

Batch 1 only (one user, one canvas): the canvas keys/values live in the cache's scratch rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from dfim.engine.model.config import FULL
from dfim.engine.model.network import DiffusionGemma, apply_rope, gelu, rms_norm, rope_inv_freq


class LayerWeights(NamedTuple):
    """References to one layer's tensors (a NamedTuple: torch.compile treats it as a plain tuple)."""

    input_norm: Tensor
    q: Tensor
    k: Tensor
    v: Tensor | None  # None on full layers: V is k_proj's output
    o: Tensor
    q_norm: Tensor
    k_norm: Tensor
    post_attn_norm: Tensor
    pre_ff_norm: Tensor
    post_ff_norm: Tensor
    post_ff_norm_1: Tensor
    pre_ff_norm_2: Tensor
    post_ff_norm_2: Tensor
    gate: Tensor
    up: Tensor
    down: Tensor
    router_proj: Tensor
    router_scale: Tensor
    per_expert_scale: Tensor
    gate_up_proj: Tensor  # [E, 2I, H]
    expert_down: Tensor  # [E, H, I]
    dec_scalar: Tensor
    enc_scalar: Tensor


@dataclass(frozen=True)
class LayerShape:
    sliding: bool
    heads: int
    kv_heads: int
    head_dim: int


# --- functional building blocks (rms_norm, gelu and apply_rope are dfim.engine.model.network's own) ---------------


def router(w: LayerWeights, x: Tensor, top_k: int, eps: float) -> tuple[Tensor, Tensor]:
    """x: [N, H] -> weights [N, k] fp32, expert index [N, k]."""
    root = x.shape[-1] ** -0.5
    scores = F.linear(rms_norm(x, None, eps) * w.router_scale * root, w.router_proj)
    probs = scores.softmax(dim=-1, dtype=torch.float32)
    weights, index = torch.topk(probs, top_k, dim=-1)
    weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights * w.per_expert_scale[index], index


def _sort_by_expert(index: Tensor, num_experts: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """index [N, k] -> (order: slot ids sorted by expert, expert of each sorted slot, counts [E], offs [E])."""
    flat = index.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.zeros(num_experts, dtype=torch.int32, device=index.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat, dtype=torch.int32))  # bincount would sync
    offs = torch.cumsum(counts, dim=0, dtype=torch.int32)
    return order, flat[order], counts, offs


def moe_grouped(x: Tensor, weights: Tensor, index: Tensor, gate_up: Tensor, down: Tensor) -> Tensor:
    """Sort token-expert pairs by expert, one grouped GEMM per projection, weighted sum back. x: [N, H]."""
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
    """Fallback for few tokens (autoregressive): gather the chosen experts' weights, batched matmul."""
    n, k = index.shape
    flat = index.reshape(-1)
    xs = x.repeat_interleave(k, dim=0)[:, None]  # [N*k, 1, H]
    gate, up = torch.bmm(xs, gate_up[flat].transpose(1, 2)).chunk(2, dim=-1)
    y = torch.bmm(gelu(gate) * up, down[flat].transpose(1, 2))[:, 0]
    return (y.view(n, k, -1).float() * weights[..., None]).sum(dim=1).to(x.dtype)


MOE_IMPLS = {"grouped": moe_grouped, "padded": moe_padded, "gathered": moe_gathered}


def feed_forward(w: LayerWeights, x: Tensor, top_k: int, eps: float, moe: str) -> Tensor:
    dense = rms_norm(
        F.linear(gelu(F.linear(h := rms_norm(x, w.pre_ff_norm, eps), w.gate)) * F.linear(h, w.up), w.down),
        w.post_ff_norm_1,
        eps,
    )
    flat = x.reshape(-1, x.shape[-1])
    weights, index = router(w, flat, top_k, eps)  # the router reads the un-normed residual
    experts = MOE_IMPLS[moe](
        rms_norm(flat, w.pre_ff_norm_2, eps), weights, index, w.gate_up_proj, w.expert_down
    )
    return rms_norm(dense + rms_norm(experts.reshape(x.shape), w.post_ff_norm_2, eps), w.post_ff_norm, eps)


def layer_forward(
    w: LayerWeights,
    x: Tensor,
    cos: Tensor,
    sin: Tensor,
    cache_k: Tensor,
    cache_v: Tensor,
    write_pos: Tensor,
    lo: int,
    hi: int,
    mask: Tensor,
    heads: int,
    kv_heads: int,
    head_dim: int,
    eps: float,
    top_k: int,
    moe: str,
    ffn: bool,
    encoder: bool,
) -> Tensor:
    """One layer for T new tokens (batch 1). Writes their keys/values at `write_pos` of the static cache,
    attends over cache rows [lo, hi) where `mask` [1, 1, T|1, hi-lo] allows, then the feed-forward.

    Grouped-query attention without copying K/V: the query heads sharing one KV head are folded into
    the query-length axis ([1, Hkv, G*T, D]), so SDPA sees plain multi-head attention."""
    b, t, _ = x.shape
    h = rms_norm(x, w.input_norm, eps)
    q = F.linear(h, w.q).view(b, t, heads, head_dim)
    k_raw = F.linear(h, w.k).view(b, t, kv_heads, head_dim)
    v = F.linear(h, w.v).view(b, t, kv_heads, head_dim) if w.v is not None else k_raw
    q = apply_rope(rms_norm(q, w.q_norm, eps), cos, sin)
    k = apply_rope(rms_norm(k_raw, w.k_norm, eps), cos, sin)
    v = rms_norm(v, None, eps)
    cache_k[:, :, write_pos] = k.transpose(1, 2)
    cache_v[:, :, write_pos] = v.transpose(1, 2)
    groups = heads // kv_heads
    qg = q.transpose(1, 2).reshape(b, kv_heads, groups * t, head_dim)
    if mask.shape[-2] > 1 and groups > 1:
        mask = mask[:, :, None].expand(1, 1, groups, t, hi - lo).reshape(1, 1, groups * t, hi - lo)
    out = F.scaled_dot_product_attention(
        qg, cache_k[:, :, lo:hi], cache_v[:, :, lo:hi], attn_mask=mask, scale=1.0
    )
    out = out.reshape(b, heads, t, head_dim).transpose(1, 2).reshape(b, t, heads * head_dim)
    x = x + rms_norm(F.linear(out, w.o), w.post_attn_norm, eps)
    if not ffn:
        return x
    return (x + feed_forward(w, x, top_k, eps, moe)) * (w.enc_scalar if encoder else w.dec_scalar)


# --- the engine -----------------------------------------------------------------------------------


def pick_moe(w: LayerWeights, device: torch.device, dtype: torch.dtype) -> str:
    """`grouped` if torch._grouped_mm exists and agrees with a per-expert reference on this device and
    dtype (with this checkpoint's real expert tensors and strides), else `padded`."""
    if not hasattr(torch, "_grouped_mm"):
        return "padded"
    try:
        g = torch.Generator(device="cpu").manual_seed(0)
        e, hidden = w.gate_up_proj.shape[0], w.gate_up_proj.shape[2]
        x = torch.randn(5, hidden, generator=g).to(device, dtype)
        index = torch.stack([torch.randperm(e, generator=g)[:2] for _ in range(5)]).to(device)
        weights = torch.rand(5, 2, generator=g).to(device)
        got = moe_grouped(x, weights, index, w.gate_up_proj, w.expert_down).float()
        want = moe_gathered(x, weights, index, w.gate_up_proj, w.expert_down).float()
        err = (got - want).norm() / want.norm().clamp(min=1e-12)
        return "grouped" if bool(err < 2e-2) else "padded"
    except Exception:  # noqa: BLE001 - any failure of the fast kernel means: use the fallback
        return "padded"


class FastDiffusionGemma:
    """Fast batch-1 inference over a `DiffusionGemma`'s weights. See the module docstring."""

    def __init__(
        self,
        model: DiffusionGemma,
        max_len: int = 8192,
        bucket: int = 256,
        prefill_chunk: int = 1024,
        graphs: bool | None = None,
        compile: bool = False,
        moe: str = "auto",
    ) -> None:
        self.model = model
        self.config = c = model.config
        weight = model.decoder.embed_tokens.weight
        self.device, self.dtype = weight.device, weight.dtype
        self.max_len, self.bucket, self.prefill_chunk = max_len, bucket, prefill_chunk
        self.canvas_length = c.canvas_length
        self.eps, self.top_k, self.window = c.rms_norm_eps, c.top_k_experts, c.sliding_window
        self.vocab = c.vocab_size
        # sqrt(H) rounded to the weight dtype first, as the reference does
        self.embed_scale = float(torch.tensor(c.hidden_size**0.5, dtype=self.dtype))
        self.layers = [self._layer_weights(i) for i in range(c.num_hidden_layers)]
        self.shapes = [
            LayerShape(
                sliding=t != FULL,
                heads=c.num_attention_heads,
                kv_heads=c.num_key_value_heads if t != FULL else c.global_kv_heads,
                head_dim=c.head_dim if t != FULL else c.global_head_dim,
            )
            for t in c.layer_types
        ]
        self.cache_k = [
            torch.zeros(1, s.kv_heads, max_len, s.head_dim, device=self.device, dtype=self.dtype)
            for s in self.shapes
        ]
        self.cache_v = [torch.zeros_like(k) for k in self.cache_k]
        positions = torch.arange(max_len, device=self.device).float()
        self.rope: dict[bool, tuple[Tensor, Tensor]] = {}
        for layer_type in set(c.layer_types):
            inv_freq = rope_inv_freq(c, layer_type).to(self.device)
            freqs = positions[:, None] * inv_freq[None, :]
            emb = torch.cat([freqs, freqs], dim=-1)
            self.rope[layer_type != FULL] = (emb.cos().to(self.dtype), emb.sin().to(self.dtype))
        self.length = 0  # context rows held by the cache (host copy; never read back from the device)
        self.length_t = torch.zeros(1, dtype=torch.long, device=self.device)
        self.moe = pick_moe(self.layers[0], self.device, self.dtype) if moe == "auto" else moe
        self.use_graphs = (self.device.type == "cuda") if graphs is None else graphs
        self._layer_fn = layer_forward
        if compile:
            torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
            self._layer_fn = torch.compile(layer_forward, dynamic=False)
        self._graphs: dict[tuple, torch.cuda.CUDAGraph] = {}
        self._pool = None
        self._init_buffers()

    def _layer_weights(self, i: int) -> LayerWeights:
        layer = self.model.decoder.layers[i]
        attn = layer.self_attn
        return LayerWeights(
            input_norm=layer.input_layernorm.weight,
            q=attn.q_proj.weight,
            k=attn.k_proj.weight,
            v=attn.v_proj.weight if attn.v_proj is not None else None,
            o=attn.o_proj.weight,
            q_norm=attn.q_norm.weight,
            k_norm=attn.k_norm.weight,
            post_attn_norm=layer.post_attention_layernorm.weight,
            pre_ff_norm=layer.pre_feedforward_layernorm.weight,
            post_ff_norm=layer.post_feedforward_layernorm.weight,
            post_ff_norm_1=layer.post_feedforward_layernorm_1.weight,
            pre_ff_norm_2=layer.pre_feedforward_layernorm_2.weight,
            post_ff_norm_2=layer.post_feedforward_layernorm_2.weight,
            gate=layer.mlp.gate_proj.weight,
            up=layer.mlp.up_proj.weight,
            down=layer.mlp.down_proj.weight,
            router_proj=layer.router.proj.weight,
            router_scale=layer.router.scale,
            per_expert_scale=layer.router.per_expert_scale,
            gate_up_proj=layer.experts.gate_up_proj,
            expert_down=layer.experts.down_proj,
            dec_scalar=layer.layer_scalar,
            enc_scalar=self.model.model.encoder.language_model.layers[i].layer_scalar,
        )

    def _init_buffers(self) -> None:
        d, length, v = self.device, self.canvas_length, self.vocab
        self.canvas = torch.zeros(1, length, dtype=torch.long, device=d)
        self.probs = torch.zeros(1, length, v, dtype=self.dtype, device=d)  # self-conditioning input
        self.logits_out = torch.zeros(1, length, v, dtype=torch.float32, device=d)
        self.argmax = torch.full((1, length), -1, dtype=torch.long, device=d)
        self.entropy = torch.zeros(1, length, dtype=torch.float32, device=d)
        self.finished = torch.zeros(1, dtype=torch.bool, device=d)
        self.steps_used = torch.zeros(1, dtype=torch.long, device=d)
        self.step_idx = torch.zeros(1, dtype=torch.long, device=d)
        self.temps = torch.ones(4096, dtype=torch.float32, device=d)
        self.entropy_bound = torch.full((1,), 0.1, dtype=torch.float32, device=d)
        self.confidence = torch.full((1,), 0.005, dtype=torch.float32, device=d)
        self.ar_token = torch.zeros(1, 1, dtype=torch.long, device=d)
        self.ar_pos = torch.zeros(1, dtype=torch.long, device=d)
        self.ar_idx = torch.zeros(1, dtype=torch.long, device=d)
        self.ar_out = torch.zeros(1, 4096, dtype=torch.long, device=d)

    # --- cache ------------------------------------------------------------------------------------

    def reset(self) -> None:
        self.truncate(0)

    def truncate(self, length: int) -> None:
        """Forget context rows from `length` on (the rows stay allocated; masks hide them)."""
        self.length = min(self.length, length)
        self.length_t.fill_(self.length)

    def _roundup(self, n: int) -> int:
        hi = -(-n // self.bucket) * self.bucket
        if hi > self.max_len:
            raise ValueError(f"{n} cache rows needed, the static cache holds {self.max_len} (raise max_len)")
        return hi

    def _run_layers(
        self,
        x: Tensor,
        positions: Tensor,
        lo_hi: dict[bool, tuple[int, int]],
        masks: dict[bool, Tensor],
        *,
        encoder: bool,
        last_ffn: bool = True,
        eager: bool = False,
    ) -> Tensor:
        n = len(self.layers)
        layer_fn = layer_forward if eager else self._layer_fn  # prefill shapes vary: never compiled
        tables = {s: (cos[positions][None], sin[positions][None]) for s, (cos, sin) in self.rope.items()}
        for i, (w, s) in enumerate(zip(self.layers, self.shapes, strict=True)):
            lo, hi = lo_hi[s.sliding]
            x = layer_fn(
                w, x, *tables[s.sliding], self.cache_k[i], self.cache_v[i], positions, lo, hi, masks[s.sliding],
                s.heads, s.kv_heads, s.head_dim, self.eps, self.top_k, self.moe,
                last_ffn or i < n - 1, encoder,
            )  # fmt: skip
        return x

    def logits(self, x: Tensor) -> Tensor:
        weight = self.model.decoder.embed_tokens.weight
        logits = F.linear(rms_norm(x, self.model.decoder.norm.weight, self.eps), weight).float()
        cap = self.config.final_logit_softcapping
        return torch.tanh(logits / cap) * cap

    def embed(self, ids: Tensor) -> Tensor:
        return F.embedding(ids, self.model.decoder.embed_tokens.weight) * self.embed_scale

    @torch.no_grad()
    def encode(self, ids: Tensor) -> None:
        """Causal prefill of context ids [1, T] after what the cache holds, in chunks (eager, no graph)."""
        if ids.shape[0] != 1:
            raise ValueError("the fast path serves batch 1")
        ids = ids.to(self.device)
        for start in range(0, ids.shape[1], self.prefill_chunk):
            chunk = ids[:, start : start + self.prefill_chunk]
            s, t = self.length, chunk.shape[1]
            hi = s + t
            if hi > self.max_len:
                raise ValueError(f"context of {hi} tokens exceeds the static cache ({self.max_len})")
            positions = torch.arange(s, hi, device=self.device)
            lo_hi = {False: (0, hi), True: (max(0, s - self.window + 1), hi)}
            masks = {}
            for sliding, (lo, _) in lo_hi.items():
                diff = positions[:, None] - torch.arange(lo, hi, device=self.device)[None, :]
                ok = diff >= 0
                if sliding:
                    ok = ok & (diff < self.window)
                masks[sliding] = ok[None, None]
            self._run_layers(
                self.embed(chunk), positions, lo_hi, masks, encoder=True, last_ffn=False, eager=True
            )
            self.length = hi
        self.length_t.fill_(self.length)

    # --- diffusion --------------------------------------------------------------------------------

    def _diffusion_window(self) -> tuple[int, dict[bool, tuple[int, int]]]:
        length = self.canvas_length
        hi = self._roundup(self.length + length)
        sliding_lo = max(0, hi - length - self.bucket - self.window + 1)
        return hi, {False: (0, hi), True: (sliding_lo, hi)}

    def _decoder_logits(self, hi: int, lo_hi: dict[bool, tuple[int, int]]) -> Tensor:
        """Decoder over [cache ; canvas] from the static `canvas` and `probs` buffers -> logits [1, L, V]."""
        length = self.canvas_length
        decoder = self.model.decoder
        sc = decoder.self_conditioning
        x = self.embed(self.canvas)
        soft = (self.probs @ decoder.embed_tokens.weight) * self.embed_scale
        normed = rms_norm(soft, sc.pre_norm.weight, self.eps)
        signal = F.linear(gelu(F.linear(normed, sc.gate_proj.weight)) * F.linear(normed, sc.up_proj.weight),
                          sc.down_proj.weight)  # fmt: skip
        x = rms_norm(x + signal, None, self.eps)
        positions = self.length_t + torch.arange(length, device=self.device)
        masks = {}
        for sliding, (lo, _) in lo_hi.items():
            keys = torch.arange(lo, hi, device=self.device)
            ok = keys < self.length_t + length
            if sliding:
                ok = ok & (keys >= self.length_t - self.window + 1)
            masks[sliding] = ok[None, None, None]
        return self.logits(self._run_layers(x, positions, lo_hi, masks, encoder=False))

    @torch.no_grad()
    def denoise(self, canvas_ids: Tensor, self_cond_logits: Tensor | None = None) -> Tensor:
        """Drop-in for `DiffusionGemma.denoise` over this cache: canvas [1, L] -> logits [1, L, V] fp32."""
        if canvas_ids.shape != self.canvas.shape:
            raise ValueError(
                f"canvas of shape {tuple(canvas_ids.shape)}; the fast path runs {tuple(self.canvas.shape)}"
            )
        self.canvas.copy_(canvas_ids)
        if self_cond_logits is None:
            self.probs.zero_()  # zero soft embeddings: exactly the reference's first step
        else:
            self.probs.copy_(self_cond_logits.softmax(dim=-1, dtype=torch.float32).to(self.dtype))
        hi, lo_hi = self._diffusion_window()
        self._run(("denoise", hi), lambda: self.logits_out.copy_(self._decoder_logits(hi, lo_hi)))
        return self.logits_out.clone()

    def _sampler_step(self, hi: int, lo_hi: dict[bool, tuple[int, int]]) -> None:
        """One whole denoising step on the static buffers (transformers' generate semantics)."""
        logits = self._decoder_logits(hi, lo_hi) / self.temps[self.step_idx]
        logp = torch.log_softmax(logits, dim=-1)
        p = logp.exp()
        entropy = -(p * logp).sum(dim=-1)  # [1, L]; logits are soft-capped, so logp is finite
        argmax = logits.argmax(dim=-1)
        sampled = (p / torch.empty_like(p).exponential_()).argmax(dim=-1)  # exponential race
        sorted_h, order = torch.sort(entropy, dim=-1)
        select = torch.cumsum(sorted_h, dim=-1) - sorted_h <= self.entropy_bound
        accepted = torch.zeros_like(select).scatter(-1, order, select)
        noise = torch.randint(0, self.vocab, self.canvas.shape, device=self.device)
        done = self.finished.clone()
        stable = (argmax == self.argmax).all(dim=-1)
        confident = entropy.mean(dim=-1) < self.confidence
        self.canvas.copy_(torch.where(accepted, sampled, noise))
        self.probs.copy_(p.to(self.dtype))
        self.entropy.copy_(torch.where(done[:, None], self.entropy, entropy))
        self.argmax.copy_(torch.where(done[:, None], self.argmax, argmax))  # the committed canvas
        self.steps_used.add_((~done).long())
        self.finished.copy_(done | (stable & confident))
        self.step_idx.add_(1)

    @torch.no_grad()
    def generate_block(
        self,
        steps: int = 48,
        *,
        fixed: bool = False,
        t_min: float = 0.4,
        t_max: float = 0.8,
        entropy_bound: float = 0.1,
        confidence_threshold: float = 0.005,
        check_every: int = 4,
        eos_id: int | None = None,
        pad_id: int | None = None,
    ) -> tuple[Tensor, int]:
        """Denoise one canvas after the cached context -> (committed ids [1, L], decoder passes used).

        fixed=True runs exactly `steps` steps (benchmarks); otherwise stops on stable-and-confident,
        looking at the device flag every `check_every` steps (the only host syncs of the loop)."""
        hi, lo_hi = self._diffusion_window()
        key = ("step", hi)
        self._ensure_graph(key, lambda: self._sampler_step(hi, lo_hi))
        k = torch.arange(steps, 0, -1, dtype=torch.float32)  # remaining steps N..1
        self.temps[:steps].copy_(t_min + (t_max - t_min) * k / steps)
        self.entropy_bound.fill_(entropy_bound)
        self.confidence.fill_(-1.0 if fixed else confidence_threshold)  # fixed: never confident
        self.canvas.random_(0, self.vocab)
        self.probs.zero_()
        self.argmax.fill_(-1)
        self.finished.zero_()
        self.steps_used.zero_()
        self.step_idx.zero_()
        for i in range(steps):
            self._replay(key, lambda: self._sampler_step(hi, lo_hi))
            if not fixed and (i + 1) % check_every == 0 and bool(self.finished.all()):
                break
        ids = self.argmax.clone()
        eos = self.config.eos_token_id if eos_id is None else eos_id
        pad = self.config.pad_token_id if pad_id is None else pad_id
        is_eos = (ids == eos).long().cumsum(dim=-1)
        ids = ids.masked_fill((is_eos > 0) & ~((is_eos == 1) & (ids == eos)), pad)
        return ids, int(self.steps_used.item())

    # --- autoregressive decode --------------------------------------------------------------------

    def _ar_window(self, pos: int) -> tuple[int, dict[bool, tuple[int, int]]]:
        hi = self._roundup(pos + 1)
        return hi, {False: (0, hi), True: (max(0, hi - self.bucket - self.window + 1), hi)}

    def _ar_forward(self, hi: int, lo_hi: dict[bool, tuple[int, int]]) -> Tensor:
        """The network as a causal LM for the token in `ar_token` at `ar_pos` -> logits [1, 1, V]."""
        masks = {}
        for sliding, (lo, _) in lo_hi.items():
            keys = torch.arange(lo, hi, device=self.device)
            ok = keys <= self.ar_pos
            if sliding:
                ok = ok & (keys > self.ar_pos - self.window)
            masks[sliding] = ok[None, None, None]
        x = self._run_layers(self.embed(self.ar_token), self.ar_pos, lo_hi, masks, encoder=True)
        return self.logits(x)

    def _ar_step(self, hi: int, lo_hi: dict[bool, tuple[int, int]]) -> None:
        nxt = self._ar_forward(hi, lo_hi).argmax(dim=-1)  # [1, 1] greedy
        self.ar_out[:, self.ar_idx] = nxt
        self.ar_token.copy_(nxt)
        self.ar_pos.add_(1)
        self.ar_idx.add_(1)

    @torch.no_grad()
    def ar_logits(self, token: int) -> Tensor:
        """Logits [1, V] for `token` at the next cache row, appending its keys/values (tests, eager)."""
        self.ar_token.fill_(token)
        self.ar_pos.fill_(self.length)
        hi, lo_hi = self._ar_window(self.length)
        logits = self._ar_forward(hi, lo_hi)[:, 0]
        self.length += 1
        self.length_t.fill_(self.length)
        return logits

    @torch.no_grad()
    def generate_ar(self, first_token: int, n: int) -> Tensor:
        """Greedy autoregressive decode of `n` tokens, starting by feeding `first_token` at the next cache
        row (prefill the context without its last token, then pass that token here) -> ids [1, n]."""
        if self.length + n + 2 > self.max_len or n > self.ar_out.shape[1]:  # +2: graph warm-up writes
            raise ValueError("autoregressive decode longer than the static cache")
        self.ar_token.fill_(first_token)
        self.ar_pos.fill_(self.length)
        self.ar_idx.zero_()
        for i in range(n):
            pos = self.length + i
            hi, lo_hi = self._ar_window(pos)
            key = ("ar", hi)
            if key not in self._graphs and self.use_graphs:
                # capture runs warm-up steps: save and restore the decode state around it
                saved = (self.ar_token.clone(), self.ar_pos.clone(), self.ar_idx.clone())
                self._ensure_graph(key, lambda hi=hi, lo_hi=lo_hi: self._ar_step(hi, lo_hi))
                for buf, old in zip((self.ar_token, self.ar_pos, self.ar_idx), saved, strict=True):
                    buf.copy_(old)
            self._replay(key, lambda hi=hi, lo_hi=lo_hi: self._ar_step(hi, lo_hi))
        self.length += n
        self.length_t.fill_(self.length)
        return self.ar_out[:, :n].clone()

    # --- graphs -----------------------------------------------------------------------------------

    def _ensure_graph(self, key: tuple, fn) -> None:
        if not self.use_graphs or key in self._graphs:
            return
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):  # warm-up: allocator, cuBLAS handles, compilation
                fn()
        torch.cuda.current_stream().wait_stream(stream)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            fn()
        self._graphs[key] = graph

    def _replay(self, key: tuple, fn) -> None:
        if self.use_graphs:
            self._graphs[key].replay()
        else:
            fn()

    def _run(self, key: tuple, fn) -> None:
        self._ensure_graph(key, fn)
        self._replay(key, fn)


# --- loading --------------------------------------------------------------------------------------


def load_fast(
    folder: str | Path, device: str = "cuda", dtype: torch.dtype = torch.bfloat16, **options
) -> FastDiffusionGemma:
    """Load an HF-format DiffusionGemma folder (memory-mapped safetensors) straight into the fast path.
    Errors (wrong architecture, missing or misshaped weights) are `dfim.engine.api.CheckpointError`."""
    from dfim.engine.model.checkpoint import load_model

    model, _ = load_model(folder, device=device, dtype=dtype)
    return FastDiffusionGemma(model, **options)


def weight_bytes(model: DiffusionGemma) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def expected_experts_touched(tokens: int, experts: int, top_k: int) -> float:
    """Expected share of experts that at least one of `tokens` tokens routes to, if routing is uniform
    (each token picks `top_k` distinct experts, so misses a given one with probability 1 - k/E)."""
    return 1.0 - (1.0 - top_k / experts) ** tokens
