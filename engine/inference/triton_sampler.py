"""The sampler's reads of a step's distribution as two row-wise Triton kernels, on CUDA.

Why: a denoising step's logits are [B, L, V] fp32, and at the 26B shape V is 262,144, so a 256-token
canvas's logits are 268 MB. The chain's reads of them in PyTorch (softmax, argmax, the entropy's products
and sum, the cumulative sum and search of the draw) are about ten passes over that (docs/gpu.md). Here
`chunk_stats` reads each chunk of 4,096 logits of each row once (a program per row and chunk, so the 64 rows of
a single-line fill still fill the card; one program a row had been latency-bound, ~0.2 ms a row), and
`combine_rows` turns a row's chunks into four numbers: the mode, the entropy, the log-normaliser and the drawn
token, reading one chunk again to place the draw. No [.., V] tensor is written.

The arithmetic is `sampler_state.Distribution`'s: the mode is the first index of the largest logit (as
`torch.argmax`); the entropy is `log A - B / A` with `A = sum exp(x - m)` and `B = sum exp(x - m) (x - m)`,
which is `-sum p (x - m) - log p_m`; the draw inverts the CDF at `u * total` with the same uniform number per
position, so both paths draw from one random stream. Sums run in another order than PyTorch's, so values
agree to rounding, and a draw can differ only where `u * total` falls within rounding of a CDF step.

`works` checks the kernel against that reference once per device kind before it is used; where it fails (or
Triton is missing) the PyTorch reads run and the log says why.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from dfim.engine.model import triton_kernels, triton_norm

KERNELS = "dfim.engine.inference.triton_sampler_kernels"
BLOCK = 4096  # the chunk of a row one program reads: 16 logits a thread at 8 warps


@dataclass(frozen=True)
class RowStats:
    """What the kernels read off processed logits [..., V]: each [...]."""

    mode: Tensor  # long: the first index of the largest logit
    entropy: Tensor  # float32, nats
    log_normalizer: Tensor  # float32: logsumexp of the row
    sampled: Tensor | None  # long: the inverse CDF's token at the given uniform numbers (None: not asked)


def available() -> bool:
    """Whether the kernel can run here (Triton imports)."""
    return triton_kernels.load(KERNELS) is not None


def applies(logits: Tensor) -> bool:
    """Whether the kernel reads these logits: fp32, needing no gradient, on CUDA (or the CPU under the tests'
    interpreter), with Triton present and the kernel checked on this kind of device."""
    device = logits.device.type
    return (
        logits.dtype == torch.float32
        and not logits.requires_grad
        and triton_norm.runs_on(device)
        and available()
        and works(device)
    )


def describe(device_type: str) -> str | None:
    """What reads the sampler's distributions on this kind of device, for dfim/stats: "triton" or "torch", or
    None until a fill has run the kernel's check (a stats request must not run it, and its compilation, on
    the server's loop)."""
    if not (triton_norm.runs_on(device_type) and available()):
        return "torch"
    if device_type not in _checked:
        return None
    return "triton" if _checked[device_type] else "torch"


def row_stats(logits: Tensor, u: Tensor | None = None) -> RowStats:
    """logits [..., V] fp32 -> `RowStats` per row; with `u` ([...], uniform in [0, 1)) also the draw."""
    triton, kernels = triton_kernels.require(KERNELS)
    shape, vocab = logits.shape[:-1], logits.shape[-1]
    flat = logits.reshape(-1, vocab)
    if flat.stride(-1) != 1:
        flat = flat.contiguous()
    rows, device = flat.shape[0], logits.device
    mode = torch.empty(rows, dtype=torch.long, device=device)
    entropy = torch.empty(rows, dtype=torch.float32, device=device)
    lse = torch.empty(rows, dtype=torch.float32, device=device)
    sampled = torch.empty(rows, dtype=torch.long, device=device) if u is not None else None
    if u is not None and u.numel() != rows:
        raise ValueError(f"{u.numel()} uniform numbers for {rows} rows")
    uniform = u.reshape(-1).to(torch.float32).contiguous() if u is not None else entropy
    if rows:
        block = min(BLOCK, max(triton.next_power_of_2(vocab), 16))
        chunks = triton.cdiv(vocab, block)
        stats = torch.empty(rows, chunks, 3, dtype=torch.float32, device=device)
        first = torch.empty(rows, chunks, dtype=torch.int32, device=device)
        warps = 8 if block >= 2048 else 4
        kernels.chunk_stats[(rows, chunks)](
            flat, stats, first, vocab, flat.stride(0), chunks, BLOCK=block, num_warps=warps
        )
        kernels.combine_rows[(rows,)](
            flat, uniform, stats, first, mode, entropy, lse, sampled if sampled is not None else mode, vocab,
            flat.stride(0), chunks, BLOCK=block, CHUNKS=max(triton.next_power_of_2(chunks), 2),
            SAMPLE=u is not None, num_warps=warps,
        )  # fmt: skip
    return RowStats(
        mode.view(shape),
        entropy.view(shape),
        lse.view(shape),
        sampled.view(shape) if sampled is not None else None,
    )


def reference(logits: Tensor, u: Tensor) -> RowStats:
    """`row_stats` in PyTorch, as `Distribution` computes it without the kernel."""
    probs = torch.softmax(logits, dim=-1)
    mode = logits.argmax(dim=-1)
    shifted = logits - logits.gather(-1, mode.unsqueeze(-1))
    entropy = -torch.nansum(probs * shifted, dim=-1) - torch.log(
        probs.gather(-1, mode.unsqueeze(-1)).squeeze(-1)
    )
    cdf = probs.cumsum(dim=-1)
    drawn = torch.searchsorted(cdf, (u * cdf[..., -1]).unsqueeze(-1), right=True).squeeze(-1)
    sampled = torch.where(drawn < logits.shape[-1], drawn, mode)
    return RowStats(mode, entropy, torch.logsumexp(logits, dim=-1), sampled)


def valid_draw(logits: Tensor, u: Tensor | float, token: int, eps: float = 1e-5) -> bool:
    """Whether `token` is the inverse CDF's draw at `u` for one row of logits [V], up to rounding: a token of
    nonzero probability whose CDF step holds `u * total` within `eps` (sums in another order than the
    reference's may put a draw on the neighbour of its token, never elsewhere)."""
    if not 0 <= token < logits.shape[-1] or logits[token] == -float("inf"):
        return False
    cdf = torch.softmax(logits.float(), dim=-1).cumsum(dim=-1)
    target = float(u) * float(cdf[-1])
    lower = float(cdf[token - 1]) if token > 0 else 0.0
    return lower - eps <= target < float(cdf[token]) + eps


def mismatches(device: torch.device | str, vocab: int = 5000, rows: int = 6) -> list[str]:
    """The kernels against `reference` on random logits with masked (-inf) tokens, two chunks and a tie for
    the mode; each draw must be the inverse CDF's at its uniform number, up to rounding (`valid_draw`)."""
    g = torch.Generator(device="cpu").manual_seed(0)
    logits = (torch.randn(rows, vocab, generator=g) * 3).to(device)
    logits[:, ::7] = -float("inf")
    logits[1, 10] = logits[1, 20] = logits[1].max() + 1  # a tie: the first index wins
    u = torch.rand(rows, generator=g).to(device)
    got, want = row_stats(logits, u), reference(logits, u)
    bad = []
    if not torch.equal(got.mode, want.mode):
        bad.append(f"mode {got.mode.tolist()} != {want.mode.tolist()}")
    for name in ("entropy", "log_normalizer"):
        a, b = getattr(got, name), getattr(want, name)
        if not torch.allclose(a, b, rtol=1e-4, atol=1e-4):
            bad.append(f"{name} off by {float((a - b).abs().max()):.3g}")
    assert got.sampled is not None
    bad += [
        f"row {row} drew {k}"
        for row, k in enumerate(got.sampled.tolist())
        if not valid_draw(logits[row], u[row], k)
    ]
    return bad


_checked: dict[str, bool] = {}  # `works`' answer per device kind


def works(device_type: str) -> bool:
    """Whether the kernel builds and agrees with `reference` on this kind of device (run once); where not,
    the sampler's PyTorch reads run and the log says why."""
    if device_type not in _checked:
        _checked[device_type] = triton_kernels.passes_check(
            lambda: mismatches(device_type), "The sampler's Triton kernel is", device_type
        )
    return _checked[device_type]
