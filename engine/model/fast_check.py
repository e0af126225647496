"""A correctness check of the fast path that can fail: layer by layer, fp32, a well-conditioned model.

The fast path (`dfim.engine.model.fast`) runs our network's own modules, so its bugs live in what it adds:
the static KV cache, its slices and masks, its RoPE tables, the expert kernels, CUDA graphs. The check runs
one context and canvas through the fast path, through our plain network (`DiffusionGemma.encode` +
`denoise`) and, where transformers is installed, through transformers' `DiffusionGemmaForBlockDiffusion`
(the reference our tests compare against) on the same weight tensors, and compares the canvas hidden states
after every decoder layer and the logits, with and without self-conditioning, plus one autoregressive
token's logits (fast path against the plain network's context LM).

Why fp32 and this init: in bf16 with random weights the paths drift apart by design (rounding in different
orders, amplified over 30 random layers: the old check saw a relative error of 1.23 and could not fail). In
fp32 with small matrices (std 0.02), unit norms and unit layer scalars, every activation stays O(1), so
agreeing paths differ by float rounding alone (~1e-6 relative) and a real bug (a wrong mask row, a stale
cache row, a mis-rotated key, a wrong expert) shows as 1e-3 or more.

Tolerances (relative error ||a - b|| / ||b|| over the whole [1, L, H] or [1, L, V] tensor):
- FAST_TOLERANCE = 5e-4: fast path against our network (the same modules; other attention and expert
  kernels, graph replays);
- HF_TOLERANCE = 5e-4: transformers against our network (another implementation of the same function).
On the CPU agreeing paths differ by ~2e-6. On an H200 (2026-11-27, the 26B shape) they grew about 3x a
layer, 4e-6 / 2e-5 / 4e-5 / 1.1e-4 over the four layers and 2e-4 for an autoregressive token: fp32
reductions over 2,816 and 704 terms in other orders (grouped expert GEMMs, fused attention), amplified by
the layers. 5e-4 stays above that and 30x below one weight moved by 5 std (1.6e-2). A router near-tie (two
experts' scores within rounding) flipping a token's expert would also exceed it: such a token is named and
left out (`near_ties`), where its reference margin shows a tie and it is one of very few.

TF32 is switched off for the check: it would add 1e-3 errors of its own.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from dfim.engine.model import triton_norm
from dfim.engine.model.config import FULL, SLIDING, ModelConfig
from dfim.engine.model.fast import FastDiffusionGemma
from dfim.engine.model.network import DiffusionGemma

FAST_TOLERANCE = 5e-4
HF_TOLERANCE = 5e-4
# Both layer kinds twice (the full layers use the wider heads: head_dim 512 in the 26B shape).
CHECK_LAYER_TYPES = [SLIDING, FULL, SLIDING, FULL]


def check_model(shape: dict, device: torch.device | str, std: float = 0.02, seed: int = 0) -> DiffusionGemma:
    """`shape` (ModelConfig fields) with CHECK_LAYER_TYPES' four layers, fp32, created on `device`:
    matrices normal(0, std), norms and layer scalars exactly one (see the module docstring)."""
    config = ModelConfig(
        **{**shape, "num_hidden_layers": len(CHECK_LAYER_TYPES), "layer_types": CHECK_LAYER_TYPES}
    )
    with torch.device("meta"):
        model = DiffusionGemma(config)
    model = model.to_empty(device=device).float().eval()
    g = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim >= 2:
                p.normal_(0.0, std, generator=g)
            else:
                p.fill_(1.0)
        for b in model.buffers():
            b.fill_(1.0)
    model.requires_grad_(False)
    return model


class LayerRecorder:
    """The output of each of `layers` for the latest pass over `length` tokens, copied into buffers made once.
    The copies run inside a forward hook, so a CUDA graph captures them with the pass and a replay records as
    an eager pass does. Passes over another number of tokens (an encoder chunk, an AR token) are ignored."""

    def __init__(self, layers: Sequence[nn.Module], length: int, hidden: int, device: torch.device) -> None:
        self.length = length
        self.outputs = [torch.zeros(1, length, hidden, device=device) for _ in layers]
        self._handles = [layer.register_forward_hook(self._hook(i)) for i, layer in enumerate(layers)]

    def _hook(self, i: int) -> Callable:
        def record(module: nn.Module, args: tuple, output: Tensor) -> None:
            out = output[0] if isinstance(output, tuple) else output
            if out.shape[-2] == self.length and out.shape[0] == 1:
                self.outputs[i].copy_(out.float())

        return record

    def snapshot(self) -> list[Tensor]:
        return [out.clone() for out in self.outputs]

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()


class RoutingRecorder:
    """Each layer's expert choice [L, k] (sorted) and the margin of that choice for every one of a pass's
    `length` tokens: the gap between its k-th and (k+1)-th router scores over their spread. Copied in forward
    hooks like `LayerRecorder`, so a graph replay records too."""

    def __init__(self, layers: Sequence[nn.Module], length: int, top_k: int, device: torch.device) -> None:
        self.length, self.top_k = length, top_k
        self.index = [torch.zeros(length, top_k, dtype=torch.long, device=device) for _ in layers]
        self.margin = [torch.zeros(length, device=device) for _ in layers]
        self._handles = []
        for i, layer in enumerate(layers):
            self._handles.append(layer.router.register_forward_hook(self._choice(i)))
            self._handles.append(layer.router.proj.register_forward_hook(self._scores(i)))

    def _choice(self, i: int) -> Callable:
        def record(module: nn.Module, args: tuple, output: tuple[Tensor, Tensor]) -> None:
            if output[1].shape[0] == self.length:
                self.index[i].copy_(output[1].sort(dim=-1).values)

        return record

    def _scores(self, i: int) -> Callable:
        def record(module: nn.Module, args: tuple, scores: Tensor) -> None:
            if scores.shape[0] == self.length:
                top = scores.float().topk(self.top_k + 1, dim=-1).values
                self.margin[i].copy_((top[:, -2] - top[:, -1]) / scores.float().std(dim=-1).clamp(min=1e-30))

        return record

    def snapshot(self) -> tuple[list[Tensor], list[Tensor]]:
        return [t.clone() for t in self.index], [t.clone() for t in self.margin]

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()


# Two agreeing fp32 paths' hidden states differ by 1e-6..1e-4 (relative), and so do their router scores: a
# token whose k-th and (k+1)-th scores are closer than that may pick another expert on each path, which moves
# its hidden state by ~1e-2 (the check once failed so: one token of 256, one layer, every other token within
# 1e-4). Such a token is left out of the comparison from that layer on, and named, where its reference margin
# was below TIE_MARGIN (of the scores' spread) and at most MAX_TIES tokens are; a choice that differs with a
# clear margin, or in more tokens, is a failure.
TIE_MARGIN = 1e-3
MAX_TIES = 2


@dataclass
class CheckResult:
    lines: list[str] = field(default_factory=list)  # one per comparison, for the log
    failures: list[str] = field(default_factory=list)  # comparisons over their tolerance

    @property
    def ok(self) -> bool:
        return not self.failures

    def compare(
        self, what: str, got: Tensor, want: Tensor, tolerance: float, skip: Tensor | None = None
    ) -> None:
        """Relative error of the [1, L, ...] tensors, over the tokens `skip` [L] (bool) leaves in."""
        if skip is not None and bool(skip.any()):
            got, want = got[:, ~skip], want[:, ~skip]
            what = f"{what} ({int(skip.sum())} near-tie token(s) left out)"
        rel = ((got.float() - want.float()).norm() / want.float().norm().clamp(min=1e-30)).item()
        bad = not rel <= tolerance  # NaN fails too
        line = f"{what}: rel err {rel:.2e} (tolerance {tolerance:.0e}){'  FAIL' if bad else ''}"
        self.lines.append(line)
        if bad:
            self.failures.append(line)


@contextlib.contextmanager
def exact_fp32() -> Iterator[None]:
    """fp32 products in full precision (no TF32) for the duration."""
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn


def hf_decoder_layers(hf: nn.Module) -> list[nn.Module]:
    return [m for m in hf.modules() if type(m).__name__ == "DiffusionGemmaDecoderTextLayer"]


@torch.no_grad()
def check_fast(
    model: DiffusionGemma,
    fast: FastDiffusionGemma,
    context_tokens: int,
    hf: nn.Module | None = None,
    seed: int = 7,
) -> CheckResult:
    """Compare `fast` (over `model`'s weights, or a copy of them) with `model` and, if given, with `hf`
    (transformers' model on the same weights), layer by layer. `context_tokens` should exceed the sliding
    window and the fast path's prefill chunk, so every static-cache slice and mask is exercised.

    Give it a fast path made for the check, never used afterwards: the graphs it captures here hold the
    recorder's copies, whose buffers are gone once the check returns."""
    config = model.config
    device = model.decoder.embed_tokens.weight.device
    length, hidden, vocab = config.canvas_length, config.hidden_size, config.vocab_size
    g = torch.Generator(device="cpu").manual_seed(seed)
    ctx = torch.randint(0, vocab, (1, context_tokens + 1), generator=g).to(device)
    canvas = torch.randint(0, vocab, (1, length), generator=g).to(device)
    ours = LayerRecorder(model.decoder.layers, length, hidden, device)
    routing = RoutingRecorder(model.decoder.layers, length, config.top_k_experts, device)
    theirs = (
        LayerRecorder(fast.model.decoder.layers, length, hidden, device) if fast.model is not model else ours
    )
    reference = LayerRecorder(hf_decoder_layers(hf), length, hidden, device) if hf is not None else None
    result = CheckResult()
    try:
        with exact_fp32():
            cache = model.new_cache()
            with triton_norm.disabled():  # the reference: PyTorch's ops, not the fused kernels under test
                model.encode(ctx[:, :-1], cache)
            fast.reset()
            fast.encode(ctx[:, :-1])
            self_cond = None
            for name in ("no self-cond", "self-cond"):
                with triton_norm.disabled():
                    want = model.denoise(canvas, cache, self_cond)
                want_layers = ours.snapshot()
                want_index, margins = routing.snapshot()
                got = fast.denoise(canvas, self_cond)
                got_index, _ = routing.snapshot() if fast.model is model else (want_index, None)
                skip = torch.zeros(length, dtype=torch.bool, device=device)
                for i, (a, b) in enumerate(zip(theirs.snapshot(), want_layers, strict=True)):
                    skip |= near_ties(
                        result, f"{name}, layer {i}", got_index[i], want_index[i], margins[i], skip
                    )
                    result.compare(f"fast vs ours, {name}, layer {i}", a, b, FAST_TOLERANCE, skip)
                result.compare(f"fast vs ours, {name}, logits", got, want, FAST_TOLERANCE, skip)
                if hf is not None and reference is not None:
                    hf_logits = hf_forward(hf, ctx[:, :-1], canvas, self_cond)
                    for i, (a, b) in enumerate(zip(reference.snapshot(), want_layers, strict=True)):
                        result.compare(f"transformers vs ours, {name}, layer {i}", a, b, HF_TOLERANCE)
                    result.compare(f"transformers vs ours, {name}, logits", hf_logits, want, HF_TOLERANCE)
                self_cond = want * 3.0  # a peaked distribution: the self-conditioning path carries signal
            # one autoregressive token: the fast path's causal pass against the encoder read as a causal LM
            with triton_norm.disabled():
                want_ar = model.context_lm(ctx[:, -1:], cache)[:, -1]
            got_ar = fast.ar_logits(int(ctx[0, -1]))
            result.compare("fast vs ours, autoregressive token, logits", got_ar, want_ar, FAST_TOLERANCE)
    finally:
        for recorder in {id(r): r for r in (ours, theirs, reference) if r is not None}.values():
            recorder.close()
        routing.close()
    return result


def near_ties(
    result: CheckResult, what: str, got: Tensor, want: Tensor, margin: Tensor, skipped: Tensor
) -> Tensor:
    """The tokens [L] (bool) whose experts differ between the paths (`got`/`want` [L, k], sorted) for the first
    time (not among `skipped`, the earlier layers' ties: their states differ since, so may their choices)
    where the reference's choice was a near tie (TIE_MARGIN); a new differing choice with a clear margin, or
    more than MAX_TIES over the pass, is a failure of `result`."""
    differ = (got != want).any(dim=-1) & ~skipped
    if not bool(differ.any()):
        return differ
    tokens = differ.nonzero().flatten().tolist()
    worst = float(margin[differ].max())
    line = (
        f"fast vs ours, {what}: token(s) {tokens} routed to other experts (reference margin <= {worst:.1e})"
    )
    if worst > TIE_MARGIN or int((differ | skipped).sum()) > MAX_TIES:
        line += "  FAIL"
        result.failures.append(line)
    result.lines.append(line)
    return differ


def hf_forward(hf: nn.Module, context: Tensor, canvas: Tensor, self_cond: Tensor | None) -> Tensor:
    from transformers import DynamicCache

    cache = DynamicCache(config=hf.config.text_config)
    out = hf(
        input_ids=context, past_key_values=cache, decoder_input_ids=canvas, self_conditioning_logits=self_cond
    )
    return out.logits


# --- transformers on our tensors --------------------------------------------------------------------


@contextlib.contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Modules built inside get their parameters on the meta device (buffers stay real)."""
    register = nn.Module.register_parameter

    def on_meta(module, name, param):
        if param is not None:
            param = nn.Parameter(param.to("meta"), requires_grad=False)
        register(module, name, param)

    nn.Module.register_parameter = on_meta
    try:
        yield
    finally:
        nn.Module.register_parameter = register


def transformers_view(model: DiffusionGemma) -> tuple[nn.Module, bool]:
    """transformers' DiffusionGemmaForBlockDiffusion whose weights ARE our tensors (no copy) -> (model,
    whether the embedding is shared)."""
    from transformers import DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion

    weight = model.decoder.embed_tokens.weight
    device, dtype = weight.device, weight.dtype
    hf_config = DiffusionGemmaConfig.from_dict(model.config.to_hf(str(dtype).removeprefix("torch.")))
    with parameters_on_meta():
        hf = DiffusionGemmaForBlockDiffusion(hf_config)
    ours = model.state_dict()
    enc = "model.encoder.language_model."
    state = {}
    for key, t in hf.state_dict().items():
        if key in ours:
            state[key] = ours[key]
        elif key == "lm_head.weight":
            state[key] = ours["model.decoder.embed_tokens.weight"]
        elif key.startswith(enc) and "model.decoder." + key[len(enc) :] in ours:
            state[key] = ours["model.decoder." + key[len(enc) :]]
        else:  # the tiny vision tower that transformers insists on building
            state[key] = (
                torch.randn(t.shape, device=device).to(t.dtype if t.is_floating_point() else dtype) * 0.02
            )
    hf.load_state_dict(state, strict=True, assign=True)
    hf = hf.to(device).eval()  # non-persistent buffers (RoPE tables, embed scale); params already there
    shared = weight.data_ptr() == hf.model.decoder.embed_tokens.weight.data_ptr()
    return hf, shared


# RMSNorm's Triton kernel against the reference: fp32 within float rounding, bf16 within two roundings of
# the output (the kernel's sum of squares runs in another order, which can flip one rounding).
NORM_TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2.0**-6}


def norm_mismatches(
    device: torch.device | str, widths: Sequence[int], rows: Sequence[int] = (0, 1, 7)
) -> list[str]:
    """Where `dfim.engine.model.triton_norm.rms_norm` differs from `ops.rms_norm_reference` beyond
    NORM_TOLERANCE (relative, per element): every width, dtype and row count, with and without a weight,
    plus a strided 4-D view (the q/k norms see [B, T, heads, D]). Empty: they agree."""
    from dfim.engine.model import ops, triton_norm

    g = torch.Generator(device=device).manual_seed(0)
    found: list[str] = []
    with torch.no_grad():
        for width in widths:
            for dtype, tol in NORM_TOLERANCE.items():
                for n in rows:
                    x = (torch.randn(n, width, generator=g, device=device) * 3).to(dtype)
                    for weight in (None, (torch.rand(width, generator=g, device=device) + 0.5).to(dtype)):
                        got = triton_norm.rms_norm(x, weight, 1e-6)
                        want = ops.rms_norm_reference(x, weight, 1e-6)
                        err = (got.float() - want.float()).abs() / want.float().abs().clamp(min=1e-3)
                        worst = float(err.max()) if n else 0.0
                        if got.dtype != want.dtype or got.shape != want.shape or worst > tol:
                            found.append(
                                f"width {width}, {dtype}, {n} rows, weight {weight is not None}: {worst:.2e}"
                            )
        x = torch.randn(2, 5, 3, 64, generator=g, device=device).transpose(1, 2)
        worst = float(
            (triton_norm.rms_norm(x, None, 1e-6) - ops.rms_norm_reference(x, None, 1e-6)).abs().max()
        )
        if worst > NORM_TOLERANCE[torch.float32]:
            found.append(f"strided [2, 3, 5, 64] view: {worst:.2e}")
    return found


def fused_norm_mismatches(device: torch.device | str, width: int = 2816, head_dim: int = 256) -> list[str]:
    """Where the fused kernels of `dfim.engine.model.triton_norm` (the residual norms, the feed-forward's
    inputs, the heads' norm and RoPE, the gated activation) differ from the PyTorch ops they replace beyond
    NORM_TOLERANCE (relative, per element), in every dtype of NORM_TOLERANCE that `device` computes; with and
    without v heads of their own. Empty: they agree."""
    from dfim.engine.model import ops, triton_norm
    from dfim.engine.model.attention import apply_rope

    g = torch.Generator(device=device).manual_seed(0)
    found: list[str] = []

    def compare(what: str, got: Tensor, want: Tensor, tol: float) -> None:
        # relative, but against at least 1: the inputs are O(1) after a norm, and a sum that cancels (RoPE's
        # two products, a residual) carries its terms' rounding, one ulp of the terms, not of the result
        err = (got.float() - want.float()).abs() / want.float().abs().clamp(min=1.0)
        worst = float(err.max()) if want.numel() else 0.0
        if got.dtype != want.dtype or got.shape != want.shape or worst > tol:
            found.append(f"{what}: {worst:.2e}")

    def rand(*shape: int, dtype: torch.dtype, scale: float = 3.0) -> Tensor:
        return (torch.randn(*shape, generator=g, device=device) * scale).to(dtype)

    def reference_norm(t: Tensor, w: Tensor | None) -> Tensor:
        return ops.rms_norm_reference(t, w, 1e-6)

    dtypes = [torch.float32, torch.float16] if str(device) == "cpu" else list(NORM_TOLERANCE)
    with torch.no_grad():
        for dtype in dtypes:
            tol = NORM_TOLERANCE.get(dtype, 2.0**-9)
            x, y, a, b = (rand(1, 7, width, dtype=dtype) for _ in range(4))
            w = [(torch.rand(width, generator=g, device=device) + 0.5).to(dtype) for _ in range(3)]
            scalar = torch.tensor([0.75], device=device).to(dtype)
            compare(
                f"residual_norm {dtype}",
                triton_norm.residual_norm(x, y, w[0], 1e-6),
                x + reference_norm(y, w[0]),
                tol,
            )
            want = (x + reference_norm(reference_norm(a, w[0]) + reference_norm(b, w[1]), w[2])) * scalar
            got = triton_norm.feed_forward_residual(x, a, b, (w[0], w[1], w[2]), scalar, 1e-6)
            compare(f"feed_forward_residual {dtype}", got, want, tol)
            root = width**-0.5
            got3 = triton_norm.feed_forward_inputs(x, w[0], w[1], w[2], root, 1e-6)
            want3 = (reference_norm(x, w[0]), reference_norm(x, w[1]), reference_norm(x, None) * w[2] * root)
            for name, got_t, want_t in zip(("dense", "experts", "router"), got3, want3, strict=True):
                compare(f"feed_forward_inputs {name} {dtype}", got_t, want_t, tol)
            logits = rand(1, 3, 5000, dtype=dtype, scale=40.0)  # past the cap, and a row over two blocks
            want_cap = torch.tanh(logits.float() / 30.0) * 30.0
            into = torch.full((1, 3, 5000), float("nan"), device=device)
            triton_norm.softcap(logits, 30.0, into)  # what the buffer holds after it
            for what, got_cap in (("", triton_norm.softcap(logits, 30.0)), (" into a buffer", into)):
                # against the cap (30): a GPU's fast exp and division in tanh's sigmoid form err by ~1e-5
                # absolute after the cap near zero, where a relative error would reject a correct kernel
                worst = float((got_cap - want_cap).abs().max()) / 30.0
                if got_cap.dtype != torch.float32 or got_cap.shape != want_cap.shape or not worst <= 1e-5:
                    found.append(f"softcap{what} {dtype}: {worst:.2e} of the cap")
            logits32 = logits.float()
            logits32[0, 1, ::3] = -float("inf")  # masked tokens: probability 0
            probs = triton_norm.softmax_into(logits32, torch.empty_like(logits))
            want_p = torch.softmax(logits32, dim=-1)
            # relative to each probability (they are far below 1), down to the dtype's smallest normal value
            # (float16's subnormals below 6e-5 keep fewer bits)
            rel = (probs.float() - want_p).abs() / want_p.clamp(min=torch.finfo(dtype).tiny)
            worst = float(rel.max())
            if probs.dtype != dtype or not worst <= 2 * tol or bool((probs[0, 1, ::3] != 0).any()):
                found.append(f"softmax_into {dtype}: {worst:.2e}")
            gate_up = rand(1, 7, 2 * width, dtype=dtype, scale=1.5)
            gate, up = gate_up.chunk(2, dim=-1)
            compare(f"gelu_mul {dtype}", triton_norm.gelu_mul(gate_up), ops.gelu(gate) * up, tol)
            for hq, hkv, hv in ((4, 2, 2), (4, 1, 0)):
                heads = rand(1, 5, hq + hkv + hv, head_dim, dtype=dtype)
                wq, wk = (
                    (torch.rand(head_dim, generator=g, device=device) + 0.5).to(dtype) for _ in range(2)
                )
                angles = torch.rand(5, head_dim // 2, generator=g, device=device) * 6
                emb = torch.cat([angles, angles], dim=-1)[None]
                cos, sin = emb.cos().to(dtype), emb.sin().to(dtype)
                q, k, v = triton_norm.head_norm_rope(heads, (hq, hkv), hv > 0, (wq, wk), cos, sin, 1e-6)
                want_q = apply_rope(reference_norm(heads[:, :, :hq], wq), cos, sin).transpose(1, 2)
                want_k = apply_rope(reference_norm(heads[:, :, hq : hq + hkv], wk), cos, sin).transpose(1, 2)
                want_v = reference_norm(heads[:, :, hq + hkv :] if hv else heads[:, :, hq : hq + hkv], None)
                for name, got_t, want_t in (
                    ("q", q, want_q),
                    ("k", k, want_k),
                    ("v", v, want_v.transpose(1, 2)),
                ):
                    compare(f"head_norm_rope {name} {dtype} v heads {hv}", got_t, want_t, tol)
    return found


def routing_mismatches(device: torch.device | str) -> list[str]:
    """Where the router's and the experts' sort kernels (`triton_moe.route`, `triton_moe.sort_pairs`) differ
    from torch.topk's routing and `experts._sort_by_expert`: the same experts and order exactly, the weights
    within fp32 rounding. Empty: they agree."""
    from dfim.engine.model import experts, triton_moe

    g = torch.Generator().manual_seed(0)
    found: list[str] = []
    with torch.no_grad():
        # one program's sort (few pairs) and one program per expert (SPREAD_PAIRS or more, with experts left empty)
        cases = [(5, 2, 8), (37, 8, 128), (3, 4, 20), (1, 8, 128), (300, 2, 8), (40, 8, 200), (64, 8, 128)]
        cases.append((256, 8, 128))  # a block
        if str(device) != "cpu":
            cases.append((1024, 8, 128))  # an encode chunk
        for n, k, e in cases:
            index = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(n)]).to(device)
            order, tokens, offs, active = triton_moe.sort_pairs(index, e)
            want_order, _, counts, want_offs = experts._sort_by_expert(index, e)
            want_active = torch.full((min(e, n * k),), -1, dtype=torch.int32)
            used = (counts > 0).nonzero().flatten().int().cpu()
            want_active[: len(used)] = used
            same = torch.equal(order, want_order) and torch.equal(tokens, want_order // k)
            if not (same and torch.equal(offs, want_offs) and torch.equal(active.cpu(), want_active)):
                found.append(f"sort_pairs n={n} k={k} e={e}")
            scores = torch.randn(n, e, generator=g).to(device)
            scale = (torch.rand(e, generator=g) + 0.5).to(device)
            weights, chosen = triton_moe.route(scores, k, scale)
            want, want_index = torch.topk(scores.softmax(-1, dtype=torch.float32), k, dim=-1)
            want = want / want.sum(-1, keepdim=True) * scale[want_index]
            if not torch.equal(chosen, want_index) or not torch.allclose(weights, want, rtol=1e-5, atol=1e-6):
                found.append(f"route n={n} k={k} e={e}")
    return found


# (outputs, inputs) of the one-row products' startup check: neither a multiple of a tile, so the masks count
GEMV_CHECK_SHAPES = ((37, 96), (5, 600))
# The 26B shape's dense products: fused q/k/v of a sliding layer, q/k of a full layer (its keys are its
# values), both output projections, the MLP's gate/up and its down projection (gated: the activation fused).
GEMV_26B_SHAPES = ((8192, 2816), (9216, 2816), (2816, 4096), (2816, 8192), (4224, 2816), (2816, 2112))


def gemv_mismatches(
    device: torch.device | str, shapes: Sequence[tuple[int, int]] = GEMV_CHECK_SHAPES
) -> list[str]:
    """Where `triton_gemv.gemv` (plain and gated) differs from the product in fp64 of the same rounded
    inputs beyond NORM_TOLERANCE, measured against the typical size of an output, sqrt(sum of its terms
    squared) averaged over the outputs (a sum of signed terms is exact to its terms' rounding, not to its
    own size, which cancellation can make tiny), for every dtype of NORM_TOLERANCE on CUDA (fp32 only on the
    CPU's interpreter, whose casts to bf16 truncate where a GPU rounds), each tile `tile` picks or a small
    one, and a weight whose rows are contiguous and one whose rows are views with a longer stride. Empty:
    they agree."""
    from dfim.engine.model import ops, triton_gemv

    g = torch.Generator(device=device).manual_seed(0)
    found: list[str] = []
    dtypes = [torch.float32] if str(device) == "cpu" else list(NORM_TOLERANCE)
    with torch.no_grad():
        for dtype in dtypes:
            for n_out, n_in in shapes:
                wide = (torch.randn(n_out, n_in + 3, generator=g, device=device) * n_in**-0.5).to(dtype)
                gate_up = torch.randn(1, 1, 2 * n_in, generator=g, device=device).to(dtype)
                gate, up = gate_up.chunk(2, dim=-1)
                for gated, w in (
                    (False, wide[:, :n_in].contiguous()),
                    (True, wide[:, :n_in]),
                    (False, wide[:, 3:]),
                ):
                    x = gate_up if gated else gate.contiguous()
                    inputs = ops.gelu(gate) * up if gated else gate
                    want = (inputs.double() @ w.double().T).float()
                    size = (inputs.double() ** 2 @ w.double().T ** 2).sqrt().mean().float()
                    for block_n, block_k in ((None, None), (4, 64)):
                        got = triton_gemv.gemv(x, w, gated=gated, block_n=block_n, block_k=block_k)
                        worst = float((got.float() - want).abs().max() / size)
                        if got.dtype != dtype or got.shape != (1, 1, n_out) or worst > NORM_TOLERANCE[dtype]:
                            found.append(
                                f"gemv {n_out}x{n_in} {dtype} gated {gated} row stride {w.stride(0)} "
                                f"tile {block_n}x{block_k}: {worst:.2e}"
                            )
    return found


def fused_kernels_mismatches(device: torch.device | str) -> list[str]:
    """Every fused kernel the layers use on a GPU (`triton_norm`, the router's and the sort's), on small
    shapes against their references: what `triton_norm.works` runs once before any of them is used."""
    return (
        norm_mismatches(device, (96,), rows=(3,))
        + fused_norm_mismatches(device, width=96, head_dim=64)
        + routing_mismatches(device)
    )
