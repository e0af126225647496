"""The fast inference path for big checkpoints on a GPU: static KV cache, CUDA graphs, grouped experts.

It runs `dfim.engine.model.network.DiffusionGemma` itself, the same modules and the same `Layer.forward`;
what it adds is where keys and values live, how the experts run, and graphs:

- **Static KV cache.** One preallocated [1, Hkv, max_len, D] tensor pair per layer. The encoder
  (`encode`) writes the context there, or `copy_context` copies it from a plain `KVCache`; the decoder writes the canvas keys/values into the scratch rows just
  after the context (so it needs no concatenation) and never moves `length`; the autoregressive
  decode writes one row per token. Attention reads a static slice [lo, hi) of the cache and each query
  sees only the key intervals its `bounds` row names, so one captured graph serves every context length
  inside a `bucket`. On CUDA the attention is a Triton kernel that reads the bounds
  (`dfim.engine.model.triton_attention`); elsewhere SDPA runs with the mask they say.
- **Fewer kernels a layer on CUDA.** q, k and v come from one product over row-fused weights (`ops.fuse_rows`),
  their norms and RoPE one kernel, the dense MLP's gate and up one product and one activation kernel,
  the norms around the residual are fused (`dfim.engine.model.triton_norm`), the router's top-k and the
  experts' sort are a kernel each (`dfim.engine.model.triton_moe`).
  An autoregressive token's dense products are one-row kernels (`dfim.engine.model.triton_gemv`),
  the MLP's activation inside its down projection.
- **Grouped mixture of experts.** The network's `Experts` run in a sync-free mode
  (`dfim.engine.model.experts.GPU_KERNELS`): token-expert pairs sorted by expert through
  `torch._grouped_mm` (one CUTLASS grouped GEMM for all 128 experts, empty groups cost nothing), or,
  where that is missing or fails its self-test, a padded batched matmul.
- **CUDA graphs.** A whole decoder pass (self-conditioning input, every layer, the LM head) is one
  graph replay per (cache bucket, canvas length); so is a whole greedy autoregressive token. A decoder
  pass never reads the device from the host.
- **torch.compile** (optional, `compile_layers`) of each layer's projections and feed-forward fuses
  norms, RoPE and activations.

There is no sampler here: `denoise` is a `dfim.engine.inference.sampler.Denoiser`, and the engine's one
sampler chain (pins, banned tokens, healing, window, stop tokens) runs on its logits
(`dfim.engine.inference.fast_backend`, which also keeps this cache in step with the engine's context
cache by copying the keys and values the plain encoder wrote).

One context at a time. The rows of a candidate batch share it: `denoise` lays them side by side in the
cache's scratch rows after the context, each at the same positions, each attending the context and its own
rows only, so one pass (and one read of the experts' weights) serves every row.
"""

from __future__ import annotations

import functools
import logging
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from dfim.engine.model import triton_attention, triton_gemv, triton_norm
from dfim.engine.model.attention import Attention, rope_inv_freq
from dfim.engine.model.config import FULL
from dfim.engine.model.experts import pick_gpu_kernel
from dfim.engine.model.kv_cache import KVCache
from dfim.engine.model.network import DiffusionGemma, compile_layers
from dfim.engine.model.ops import fuse_rows

log = logging.getLogger(__name__)

# Chunk lengths a graphed encode pads to: a few typed tokens, a pasted line or two, a fresh context.
ENCODE_CHUNKS = (16, 64, 256, 1024)
# Next-token logits an encode can return (the draft's pass: a token and its guesses; `next_logits`: 1-2).
LOGIT_ROWS = 16


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
        self.cache_rows = (max_len // bucket) * bucket  # the rows a graph bucket can reach
        self.canvas_length = c.canvas_length
        self.window = c.sliding_window
        self.vocab = c.vocab_size
        self.layers = model.decoder.layers
        self.encoder_scalars = [layer.layer_scalar for layer in model.model.encoder.language_model.layers]
        self.cache_k = [
            torch.zeros(
                1,
                layer.self_attn.num_kv_heads,
                max_len,
                layer.self_attn.head_dim,
                device=self.device,
                dtype=self.dtype,
            )
            for layer in self.layers
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
        self.use_graphs = (self.device.type == "cuda") if graphs is None else graphs
        self.pad_encode = self.use_graphs  # encode chunks padded to ENCODE_CHUNKS (one graph each)
        # The network's own experts, run by a kernel CUDA graphs can capture (no host sync).
        experts = self.layers[0].experts
        if moe == "auto" and experts.fp8 is not None:  # quantized by experts_fp8.use_fp8_experts
            from dfim.engine.model.experts_fp8 import pick_fp8_kernel

            moe = pick_fp8_kernel(experts.fp8, self.device, self.dtype)
        self.moe = (
            pick_gpu_kernel(experts, self.device, self.dtype, graphs=self.use_graphs)
            if moe == "auto"
            else moe
        )
        for layer in self.layers:
            layer.experts.mode = self.moe
        kernels_here = triton_norm.runs_on(self.device.type)
        if kernels_here:  # one q/k/v and one gate/up product (the weights become views of one copy)
            for layer in self.layers:
                attn, mlp = layer.self_attn, layer.mlp
                attn.qkv_rows = fuse_rows(attn.q_proj, attn.k_proj, *([attn.v_proj] if attn.v_proj else []))
                mlp.gate_up_rows = fuse_rows(mlp.gate_proj, mlp.up_proj)
        heads = {
            (a.num_heads, a.num_kv_heads, a.head_dim) for a in (layer.self_attn for layer in self.layers)
        }
        self.attention = pick_attention(self.device, self.dtype, tuple(sorted(heads)))
        # the fused norm, MLP and router kernels (`triton_norm.applies`), checked here once, before any capture
        self.fused = kernels_here and triton_norm.works(self.device.type)
        self.compiled = compile
        if compile:
            compile_layers(model)
        self._graphs: dict[tuple, torch.cuda.CUDAGraph] = {}
        # Graphs kept at most: one per (cache bucket, canvas length) and per (cache bucket, encode chunk), and a
        # skeleton's canvas can have any length; past this many, new shapes run eagerly (same code, same
        # numbers) instead of capturing more. They share one memory pool.
        self.max_graphs = 128
        self._pool = None
        self._init_buffers()

    def _init_buffers(self) -> None:
        d, length, v = self.device, self.canvas_length, self.vocab
        self.canvas = torch.zeros(1, length, dtype=torch.long, device=d)
        self.probs = torch.zeros(1, length, v, dtype=self.dtype, device=d)  # self-conditioning input
        self.logits_out = torch.zeros(1, length, v, dtype=torch.float32, device=d)
        self.ar_token = torch.zeros(1, 1, dtype=torch.long, device=d)
        self.ar_pos = torch.zeros(1, dtype=torch.long, device=d)
        self.ar_idx = torch.zeros(1, dtype=torch.long, device=d)
        self.ar_out = torch.zeros(1, 4096, dtype=torch.long, device=d)
        self.logit_index = torch.zeros(LOGIT_ROWS, dtype=torch.long, device=d)
        self.logits_encode = torch.zeros(1, LOGIT_ROWS, v, dtype=torch.float32, device=d)
        self.encode_ids = torch.zeros(
            1, max(self.prefill_chunk, ENCODE_CHUNKS[-1]), dtype=torch.long, device=d
        )

    def describe(self) -> dict[str, object]:
        """What a decoder pass runs (dfim/stats): graphs (a capture that fails turns them off for good), how
        many are captured, the experts' kernel and whether the layers are compiled."""
        graphs = {"graphs": self.use_graphs, "graphs_captured": len(self._graphs)}
        kernels = {"experts": self.moe, "attention": self.attention, "fused_kernels": self.fused}
        return {**graphs, **kernels, "compiled": self.compiled}

    # --- cache ------------------------------------------------------------------------------------

    def reset(self) -> None:
        self.truncate(0)

    def truncate(self, length: int) -> None:
        """Forget context rows from `length` on (the rows stay allocated; the attention's bounds hide them)."""
        self.length = min(self.length, length)
        self.length_t.fill_(self.length)

    @torch.no_grad()
    def copy_context(self, kv: KVCache, start: int) -> None:
        """Hold the context `kv` holds: its rows from `start` on are copied in, the rows before `start` must
        already be the same (the caller compares token ids). The keys and values are the plain encoder's,
        so the decoder reads exactly what `DiffusionGemma.denoise` reads from `kv`."""
        end = kv.length
        if end > self.max_len:
            raise ValueError(f"context of {end} tokens exceeds the static cache ({self.max_len})")
        start = min(start, self.length, end)
        if end > start:
            for i in range(len(self.layers)):
                k, v = kv.get(i)
                assert k is not None and v is not None and k.shape[0] == 1, "a batch-1 context cache"
                self.cache_k[i][:, :, start:end].copy_(k[:, :, start:end])
                self.cache_v[i][:, :, start:end].copy_(v[:, :, start:end])
        self.length = end
        self.length_t.fill_(end)

    def _roundup(self, n: int) -> int:
        hi = -(-n // self.bucket) * self.bucket
        if hi > self.max_len:
            raise ValueError(f"{n} cache rows needed, the static cache holds {self.max_len} (raise max_len)")
        return hi

    def _causal_bounds(self, positions: Tensor) -> dict[bool, Tensor]:
        """Per layer kind (sliding or not), the keys each query at `positions` [T] sees: its own and those
        before it, within the window on sliding layers -> bounds [T, 4] (`triton_attention`)."""
        none = torch.zeros_like(positions)
        lowest = (positions - self.window + 1).clamp(min=0)
        return {
            s: torch.stack([lowest if s else none, positions + 1, none, none], dim=1).int()
            for s in (False, True)
        }

    def _run_layers(
        self,
        x: Tensor,
        positions: Tensor,
        lo_hi: dict[bool, tuple[int, int]],
        bounds: dict[bool, Tensor],
        *,
        encoder: bool,
        last_ffn: bool = True,
        slots: Tensor | None = None,
    ) -> Tensor:
        """The network's layers over T new tokens at `positions`, reading and writing the static cache at
        `slots` (the cache rows of their keys/values; default `positions`)."""
        tables = {s: (cos[positions][None], sin[positions][None]) for s, (cos, sin) in self.rope.items()}
        slots = positions if slots is None else slots
        last = len(self.layers) - 1
        masks = {}  # SDPA's masks, built once a pass per layer kind (the Triton kernel reads the bounds)
        if self.attention != "triton":
            masks = {
                s: triton_attention.interval_mask(bounds[s], lo, hi)[None, None]
                for s, (lo, hi) in lo_hi.items()
            }
        for i, layer in enumerate(self.layers):
            sliding = layer.self_attn.is_sliding
            lo, hi = lo_hi[sliding]
            attend = partial(self._attend_static, i, slots, lo, hi, bounds[sliding], masks.get(sliding))
            scalar = self.encoder_scalars[i] if encoder else layer.layer_scalar
            x = layer(x, tables[sliding], attend, scalar, rows=0 if i == last and not last_ffn else None)
        return x

    def _attend_static(
        self,
        i: int,
        slots: Tensor,
        lo: int,
        hi: int,
        bounds: Tensor,
        mask: Tensor | None,
        attn: Attention,
        q: Tensor,
        k: Tensor,
        v: Tensor,
    ) -> Tensor:
        """Write the new keys/values at rows `slots` of layer i's static cache, attend over its rows [lo, hi)
        where `bounds` [T, 4] allows (`mask` [1, 1, T, hi - lo] says the same for SDPA). SDPA's grouped-query
        attention without copying K/V: the query heads sharing one KV head are folded into the query-length
        axis ([1, Hkv, G*T, D]), so SDPA sees plain multi-head attention (the Triton kernel folds them the
        same way)."""
        cache_k, cache_v = self.cache_k[i], self.cache_v[i]
        if self.attention == "triton":
            triton_attention.store_kv(cache_k, cache_v, k, v, slots)
            attended = triton_attention.attend(q, cache_k, cache_v, lo, hi, bounds)
            return triton_gemv.linear(attended, attn.o_proj.weight)
        cache_k[:, :, slots] = k
        cache_v[:, :, slots] = v
        b, heads, t, head_dim = q.shape
        kv_heads = attn.num_kv_heads
        groups = heads // kv_heads
        qg = q.reshape(b, kv_heads, groups * t, head_dim)
        assert mask is not None
        if groups > 1:
            mask = mask[:, :, None].expand(1, 1, groups, t, hi - lo).reshape(1, 1, groups * t, hi - lo)
        out = F.scaled_dot_product_attention(
            qg, cache_k[:, :, lo:hi], cache_v[:, :, lo:hi], attn_mask=mask, scale=1.0
        )
        return attn.o_proj(out.reshape(b, heads, t, head_dim).transpose(1, 2).reshape(b, t, heads * head_dim))

    def logits(self, x: Tensor, out: Tensor | None = None) -> Tensor:
        return self.model.logits(x, out)

    def embed(self, ids: Tensor) -> Tensor:
        return self.model.decoder.embed(ids)

    @torch.no_grad()
    def encode(self, ids: Tensor, logit_rows: int = 0) -> Tensor | None:
        """Causal prefill of context ids [1, T] after what the cache holds, in chunks of `prefill_chunk`;
        with `logit_rows`, the encoder read as a causal LM (`DiffusionGemma.context_lm`): the next-token
        logits [1, logit_rows, V] fp32 after each of the last `logit_rows` tokens (at most `LOGIT_ROWS`).

        With graphs, a chunk is padded to the next of `ENCODE_CHUNKS` and runs as one replay per (chunk,
        cache bucket, logits or not): eagerly, a pass over three typed tokens costs as much as over a
        thousand (~60 ms at the 26B shape: one launch per op), which every keystroke's fill and every token
        of the encoder's draft would pay. The padding's keys and values land in rows after the context,
        which `length` leaves out and the next pass overwrites; a causal mask by position keeps them out of
        the real tokens' attention."""
        if ids.shape[0] != 1:
            raise ValueError("the fast path serves batch 1")
        total = ids.shape[1]
        if not 0 <= logit_rows <= min(LOGIT_ROWS, total):
            raise ValueError(f"logits of {logit_rows} rows after {total} tokens (at most {LOGIT_ROWS})")
        ids = ids.to(self.device)
        wanted = range(total - logit_rows, total)  # the tokens whose next-token logits are returned
        out: list[Tensor] = []
        for start in range(0, total, self.prefill_chunk):
            chunk = ids[:, start : start + self.prefill_chunk]
            s, t = self.length, chunk.shape[1]
            if s + t > self.max_len:
                raise ValueError(f"context of {s + t} tokens exceeds the static cache ({self.max_len})")
            size = next((c for c in ENCODE_CHUNKS if c >= t), t) if self.pad_encode else t
            if s + size > self.cache_rows:
                size = t  # no room for the padding: this chunk runs at its own length
            self.encode_ids[:, :t].copy_(chunk)
            self.encode_ids[:, t:size].zero_()
            rows = [r - start for r in wanted if start <= r < start + t]
            if rows:  # the rows whose logits this chunk gives, padded with its last one
                self.logit_index.copy_(torch.tensor(rows + [rows[-1]] * (LOGIT_ROWS - len(rows))))
            hi, lo_hi = self._diffusion_window(size)

            def run(hi: int = hi, lo_hi: dict = lo_hi, size: int = size, logits: bool = bool(rows)) -> None:
                self._encode(hi, lo_hi, size, logits)

            with torch.compiler.set_stance("force_eager"):  # prefill shapes vary: never compiled
                if size in ENCODE_CHUNKS:
                    self._run(("encode", hi, size, bool(rows)), run)
                else:
                    run()
            if rows:
                out.append(self.logits_encode[:, : len(rows)].clone())
            self.length = s + t
            self.length_t.fill_(self.length)
        return torch.cat(out, dim=1) if out else None

    def _encode(self, hi: int, lo_hi: dict[bool, tuple[int, int]], size: int, logits: bool) -> None:
        """The encoder over the first `size` ids of `encode_ids` at the positions after `length_t`; with
        `logits`, the causal LM's logits at the rows `logit_index` names go to `logits_encode`."""
        positions = self.length_t + torch.arange(size, device=self.device)
        x = self.embed(self.encode_ids[:, :size])
        x = self._run_layers(
            x, positions, lo_hi, self._causal_bounds(positions), encoder=True, last_ffn=logits
        )
        if logits:
            self.logits(x[:, self.logit_index], self.logits_encode)

    def context_rows(self, start: int, end: int) -> list[tuple[Tensor, Tensor]]:
        """Views of every layer's keys and values of context rows [start, end) (a plain `KVCache` copies
        them in with `extend`)."""
        if not 0 <= start <= end <= self.length:
            raise ValueError(f"rows {start}..{end} of a cache holding {self.length}")
        return [
            (k[:, :, start:end], v[:, :, start:end]) for k, v in zip(self.cache_k, self.cache_v, strict=True)
        ]

    # --- diffusion --------------------------------------------------------------------------------

    def _diffusion_window(self, tokens: int) -> tuple[int, dict[bool, tuple[int, int]]]:
        hi = self._roundup(self.length + tokens)
        sliding_lo = max(0, hi - tokens - self.bucket - self.window + 1)
        return hi, {False: (0, hi), True: (sliding_lo, hi)}

    def _decoder_logits(
        self, hi: int, lo_hi: dict[bool, tuple[int, int]], rows: int, length: int, out: Tensor
    ) -> Tensor:
        """Decoder over [cache ; canvas rows] from the static `canvas` and `probs` buffers' first
        rows * length positions (row r's tokens at r * length + [0, length)) -> logits [1, rows * length, V]
        in `out`.
        Every row sits at the positions right after the context and its keys/values in its own cache rows;
        a row attends the context and itself, never another row."""
        decoder = self.model.decoder
        tokens = rows * length
        soft = self.model.soft_embeddings(self.probs[:, :tokens])
        x = decoder.self_conditioning(self.embed(self.canvas[:, :tokens]), soft)
        offsets = torch.arange(tokens, device=self.device)
        slots = self.length_t + offsets
        positions = self.length_t + offsets % length
        # each query sees the context (within the window on sliding layers) and its own row's cache rows
        context = self.length_t.expand(tokens)
        start = self.length_t + (offsets // length) * length
        lowest = (context - self.window + 1).clamp(min=0)
        bounds = {
            s: torch.stack(
                [lowest if s else torch.zeros_like(start), context, start, start + length], dim=1
            ).int()
            for s in (False, True)
        }
        return self.logits(self._run_layers(x, positions, lo_hi, bounds, encoder=False, slots=slots), out)

    def fits_rows(self, rows: int, length: int) -> bool:
        """Whether one pass takes `rows` canvases of `length` tokens after the context held: they share the
        canvas buffers and lie side by side in the cache's rows after the context."""
        tokens = rows * length
        return 0 < length and tokens <= self.canvas_length and self.length + tokens <= self.cache_rows

    @torch.no_grad()
    def denoise(
        self, canvas_ids: Tensor, self_cond_logits: Tensor | None = None, *, clone: bool = True
    ) -> Tensor:
        """Drop-in for `DiffusionGemma.denoise` over this cache: canvas [B, L] (B * L up to `canvas_length`)
        -> logits [B, L, V] fp32. One graph replay per (cache bucket, B, L). clone=False returns the static
        output buffer itself, which the next call overwrites (for a caller that copies it at once)."""
        if canvas_ids.dim() != 2 or not self.fits_rows(*canvas_ids.shape):
            raise ValueError(
                f"canvas of shape {tuple(canvas_ids.shape)}; the fast path runs [B, L] with "
                f"B * L <= {self.canvas_length}"
            )
        rows, length = canvas_ids.shape
        tokens = rows * length
        self.canvas[:, :tokens].copy_(canvas_ids.reshape(1, tokens))
        probs = self.probs[:, :tokens]
        if self_cond_logits is None:
            probs.zero_()  # zero soft embeddings: exactly the reference's first step
        else:
            self.model.self_conditioning_probs(self_cond_logits.reshape(1, tokens, -1), out=probs)
        hi, lo_hi = self._diffusion_window(tokens)
        out = self.logits_out[:, :tokens]
        self._run(("denoise", hi, rows, length), lambda: self._decoder_logits(hi, lo_hi, rows, length, out))
        out = out.view(rows, length, -1)
        return out.clone() if clone else out

    # --- autoregressive decode --------------------------------------------------------------------

    def _ar_window(self, pos: int) -> tuple[int, dict[bool, tuple[int, int]]]:
        hi = self._roundup(pos + 1)
        return hi, {False: (0, hi), True: (max(0, hi - self.bucket - self.window + 1), hi)}

    def _ar_forward(self, hi: int, lo_hi: dict[bool, tuple[int, int]]) -> Tensor:
        """The network as a causal LM for the token in `ar_token` at `ar_pos` -> logits [1, 1, V]."""
        bounds = self._causal_bounds(self.ar_pos)
        x = self._run_layers(self.embed(self.ar_token), self.ar_pos, lo_hi, bounds, encoder=True)
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
        if not self.use_graphs or key in self._graphs or len(self._graphs) >= self.max_graphs:
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
        try:
            with torch.cuda.graph(graph, pool=self._pool):
                fn()
        except RuntimeError as err:  # an op that cannot be captured: the same code runs eagerly from now on
            log.warning("CUDA graph capture of %s failed (%s); the fast path runs without graphs", key, err)
            self.use_graphs = False
            return
        self._graphs[key] = graph

    def _replay(self, key: tuple, fn) -> None:
        if self.use_graphs and key in self._graphs:
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


@functools.cache
def pick_attention(
    device: torch.device, dtype: torch.dtype, heads_of: tuple[tuple[int, int, int], ...]
) -> str:
    """The attention kernel: "triton" where `triton_attention` runs here and agrees with SDPA
    (`triton_attention.self_test`) for every (query heads, KV heads, head dim) of the model's layers, else
    "sdpa"."""
    if not triton_norm.runs_on(device.type) or not triton_attention.available():
        return "sdpa"
    try:
        error = triton_attention.self_test(device, dtype, heads_of)
        if not error < (1e-4 if dtype == torch.float32 else 2e-2):
            raise ValueError(f"relative error {error:.2e} against SDPA")
    except Exception as err:  # a kernel that fails to build or to agree: SDPA, with the reason in the log
        log.warning("the Triton attention kernel is not used (%s); SDPA runs instead", err)
        return "sdpa"
    return "triton"


def weight_bytes(model: DiffusionGemma) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def expected_experts_touched(tokens: int, experts: int, top_k: int) -> float:
    """Expected share of experts that at least one of `tokens` tokens routes to, if routing is uniform
    (each token picks `top_k` distinct experts, so misses a given one with probability 1 - k/E)."""
    return 1.0 - (1.0 - top_k / experts) ** tokens
