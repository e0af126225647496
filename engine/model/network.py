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
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dfim.engine.model import triton_gemv, triton_norm
from dfim.engine.model.attention import Attention, Rotary, roll_tables
from dfim.engine.model.config import ModelConfig
from dfim.engine.model.experts import Experts, Router
from dfim.engine.model.kv_cache import KVCache
from dfim.engine.model.ops import (
    Packed,
    RMSNorm,
    feed_forward_inputs,
    feed_forward_residual,
    fuse_linears,
    fused_views,
    gelu,
    linear,
    pack_fp16,
    pack_weight,
    residual_norm,
    row_views,
)

# How a layer's attention reads its keys and values: (attention module, q, k, v) -> attended [B, T, H].
# The loops over layers differ only in this (a mask over the batch, a KV cache, the encoder's keys).
Attend = Callable[["Attention", Tensor, Tensor, Tensor], Tensor]


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
        self.gate_up_rows: Tensor | None = None  # [2I, H] after `fuse_rows` (GPU inference)

    def forward(self, x: Tensor) -> Tensor:
        if triton_norm.applies(x) and row_views(self.gate_up_rows, self.gate_proj, self.up_proj):
            return triton_gemv.gelu_linear(triton_gemv.linear(x, self.gate_up_rows), self.down_proj.weight)
        if fused_views(self.gate_up, self.gate_proj, self.up_proj):
            gate, up = linear(x, self.gate_up.t(), self.gate_up_packed).chunk(2, dim=-1)
            return linear(gelu(gate) * up, self.down_proj.weight, self.down_packed)
        return self.down_proj(gelu(self.gate_proj(x)) * self.up_proj(x))


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
        x = residual_norm(x, attend(self.self_attn, q, k, v), self.post_attention_layernorm)
        if rows is not None:
            x = x[:, x.shape[1] - rows :]
            if rows == 0:
                return x
        return self.feed_forward(x, scalar)

    def feed_forward(self, x: Tensor, scalar: Tensor) -> Tensor:
        """(x + the dense MLP's and the experts' outputs, each normed, summed and normed) * scalar."""
        flat = x.reshape(-1, x.shape[-1])
        dense_in, experts_in, router_in = feed_forward_inputs(
            flat, self.pre_feedforward_layernorm, self.pre_feedforward_layernorm_2, self.router
        )
        dense = self.mlp(dense_in).reshape(x.shape)
        weights, index = self.router(flat, router_in)  # the router reads the un-normed residual, its own norm
        moe = self.experts(experts_in, weights, index).reshape(x.shape)
        norms = (
            self.post_feedforward_layernorm_1,
            self.post_feedforward_layernorm_2,
            self.post_feedforward_layernorm,
        )
        return feed_forward_residual(x, dense, moe, norms, scalar)


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
        return F.embedding(ids, weight) * rounded_scale(self.embed_scale, weight.dtype)


def rounded_scale(scale: float, dtype: torch.dtype) -> float:
    """`scale` rounded to `dtype` first, as the reference does (sqrt(H) in bf16), as a Python number: a CPU
    tensor here would be a host-to-device copy in every step, which a CUDA graph cannot capture."""
    return float(torch.tensor(scale, dtype=dtype))


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
            transpose_storage(attn.o_proj.weight, mlp.down_proj.weight, layer.router.proj.weight)
            attn.o_packed, mlp.down_packed = pack(attn.o_proj.weight), pack(mlp.down_proj.weight)
            if experts.fp8 is None:  # FP8 experts run on their own kernel (experts_fp8), unpacked
                transpose_storage(experts.gate_up_proj, experts.down_proj)
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

    def logits(self, hidden: Tensor, out: Tensor | None = None) -> Tensor:
        """hidden [B, L, H] -> soft-capped logits [B, L, V] fp32, written into `out` when given."""
        logits = linear(self.decoder.norm(hidden), self.decoder.embed_tokens.weight, self.head_packed)
        cap = self.config.final_logit_softcapping
        if triton_norm.applies(hidden):  # GPU inference: the cap in one pass, straight into `out`
            return triton_norm.softcap(logits, cap, out)
        logits = logits.float()
        if torch.is_grad_enabled():
            logits = torch.tanh(logits / cap) * cap
        else:  # inference: in place on the fresh [B, L, V] product (no two more vocabulary-sized buffers)
            logits = logits.div_(cap).tanh_().mul_(cap)
        return logits if out is None else out.copy_(logits)

    def canvas_embeddings(self, canvas_ids: Tensor, self_cond_logits: Tensor | None) -> Tensor:
        decoder = self.decoder
        x = decoder.embed(canvas_ids)
        if self_cond_logits is None:
            soft = torch.zeros_like(x)
        else:
            soft = self.soft_embeddings(self.self_conditioning_probs(self_cond_logits))
        return decoder.self_conditioning(x, soft)

    def self_conditioning_probs(self, self_cond_logits: Tensor, out: Tensor | None = None) -> Tensor:
        """softmax(logits [B, L, V]) in fp32, rounded to the weight dtype (into `out` when given): the
        probabilities `soft_embeddings` reads. GPU inference writes them in one fused pass."""
        dtype = self.decoder.embed_tokens.weight.dtype
        if self_cond_logits.dtype == torch.float32 and triton_norm.applies(self_cond_logits, chunked=True):
            if out is None:
                out = torch.empty(self_cond_logits.shape, dtype=dtype, device=self_cond_logits.device)
            return triton_norm.softmax_into(self_cond_logits, out)
        probs = self_cond_logits.softmax(dim=-1, dtype=torch.float32).to(dtype)
        return probs if out is None else out.copy_(probs)

    def soft_embeddings(self, probs: Tensor) -> Tensor:
        """The self-conditioning's input: probabilities [B, L, V] (in the weight dtype) @ E * sqrt(H), the
        scale rounded to the weight dtype as `Decoder.embed` rounds it (the fast path calls this too)."""
        weight = self.decoder.embed_tokens.weight
        return linear(probs, weight.t(), self.soft_packed) * rounded_scale(
            self.decoder.embed_scale, weight.dtype
        )

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


def compile_layers(model: DiffusionGemma, mode: str | None = None) -> None:
    """torch.compile each layer's projections and feed-forward, where the norms, RoPE and activations
    (most of a small model's kernels) fuse; attention and the loss stay eager. Every layer runs the
    same code, so a handful of graphs serve all of them: a first step compiles in about a minute, where
    compiling a whole training forward took minutes without finishing. `uncompile_layers` undoes it."""
    for layer in model.decoder.layers:
        layer.feed_forward = torch.compile(layer.feed_forward, mode=mode)
        layer.self_attn.project = torch.compile(layer.self_attn.project, mode=mode)


def uncompile_layers(model: DiffusionGemma) -> None:
    """Back to the eager methods (after a compiler failure)."""
    for layer in model.decoder.layers:
        layer.__dict__.pop("feed_forward", None)
        layer.self_attn.__dict__.pop("project", None)
