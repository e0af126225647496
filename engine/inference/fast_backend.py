"""The fast GPU path (`dfim.engine.model.fast`) as a backend of the one sampler.

The engine's sampler chain (`sampler.run`, the steps of `sampler_steps`) only needs a
`Denoiser(canvas, self_cond) -> logits`. `FastBackend.denoiser(cache)` gives it the fast path's decoder
pass (static KV cache, one CUDA graph replay per pass) over the context a `ContextCache` holds, so
pins, banned tokens, token healing, the window and stop tokens apply unchanged on the GPU.

Encoding the context: the backend is each `ContextCache`'s runner (`ContextRunner`). The tokens a cache
lacks run through the fast path's encoder (padded chunks, one graph replay each), and their keys and values
are appended to the `ContextCache` too, so both hold the same context; the encoder's draft reads its
next-token logits from the same passes. Where the `ContextCache` went on without it (parked tokens written
back), `sync` copies what it holds into the static cache, only the rows the static cache does not hold yet
(the token ids decide, as `ContextCache` does).

What stays on the plain network, because the fast path has no equivalent of it: the greedy decode of a
causal checkpoint (its cache is the causal LM's) and the likelihood ranking of candidates (a batch of
rows over a shared prefix).

One backend serves every cache slot of an engine: its static cache follows whichever context the
current fill reads (copying only what differs), so a second slot costs no second static cache and no
second set of graphs.

Host syncs: the decoder pass has none, and the loop reads which rows still run from the host
(`DenoiseState.running`), so a fixed-step block (stop steps off) reads nothing back per
step. What remains, per step, in the engine's chain: one read of the rows the stop steps finished
(`DenoiseState.stop_reason`, decision 115), and a candidate batch whose rows finished at different steps (the
rows still running are gathered by index). The rows of a batch share one graph replay where
they fit the canvas buffers together (`FastDiffusionGemma.fits_rows`), else run one replay each.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import Tensor

from dfim.engine.api import SamplerSettings
from dfim.engine.inference import sampler
from dfim.engine.inference.cache import ContextCache, common_prefix_length
from dfim.engine.inference.sampler_state import Constraints, DenoiseState
from dfim.engine.inference.sampler_steps import build_chain
from dfim.engine.model.fast import LOGIT_ROWS, FastDiffusionGemma
from dfim.engine.model.network import DiffusionGemma


class FastBackend:
    """A `FastDiffusionGemma` over an engine's network, kept in step with the engine's context caches."""

    def __init__(
        self,
        model: DiffusionGemma,
        *,
        max_len: int,
        bucket: int = 256,
        graphs: bool | None = None,
        compile: bool = False,
    ) -> None:
        # prefill_chunk is unused: the context comes from the ContextCache (see the module docstring)
        self.fast = FastDiffusionGemma(model, max_len=max_len, bucket=bucket, graphs=graphs, compile=compile)
        self.held: list[int] = []  # the token ids whose keys/values the static cache holds
        self.owner: ContextCache | None = None  # the context cache it was last synced with

    def fits(self, context: int, canvas: int) -> bool:
        """Whether a canvas of `canvas` tokens after `context` cached tokens fits the static cache."""
        return canvas <= self.fast.canvas_length and context + canvas <= self.fast.cache_rows

    def sync(self, cache: ContextCache) -> None:
        """Make the static cache hold what `cache` holds: keep the rows of the longest common run of token
        ids, copy the rest from `cache.kv` (the plain encoder's keys and values)."""
        ids = cache.ids
        if cache.kv.length != len(ids):
            raise RuntimeError(f"context cache holds {cache.kv.length} rows for {len(ids)} ids")
        shared = common_prefix_length(self.held, ids)
        self.fast.truncate(shared)
        self.held = self.held[:shared]
        self.fast.copy_context(cache.kv, shared)
        self.held = list(ids)
        self.owner = cache

    def takes(self, cache: ContextCache, tokens: int, logit_rows: int) -> bool:
        """Whether `encode` runs these tokens for `cache` (`ContextRunner`): not a causal checkpoint's cache
        (its context is the causal LM's, which the fast path does not run), within the static cache."""
        return (
            not cache.causal and logit_rows <= LOGIT_ROWS and len(cache.ids) + tokens <= self.fast.cache_rows
        )

    def encode(
        self, cache: ContextCache, ids: list[int], logit_rows: int
    ) -> tuple[list[tuple[Tensor, Tensor]], Tensor | None]:
        """Run `ids` after `cache`'s context on the fast path's encoder (padded chunks, one graph replay each)
        -> their keys and values for `cache` to append, and the next-token logits after the last
        `logit_rows` of them (`ContextRunner`). The plain encoder runs eagerly, and on a GPU an eager pass
        over three typed tokens costs as much as one over a thousand: one launch per op."""
        self.sync(cache)
        start = self.fast.length
        try:
            logits = self.fast.encode(torch.tensor([ids], dtype=torch.long), logit_rows)
        except BaseException:
            self.held, self.owner = [], None  # the static cache may be half-written
            self.fast.truncate(0)
            raise
        self.held = self.held + list(ids)  # what `cache` holds once it appends them
        return self.fast.context_rows(start, start + len(ids)), logits

    def denoiser(self, cache: ContextCache) -> sampler.Denoiser:
        """The sampler's decoder pass over `cache`'s context, on the fast path: a candidate batch's rows in
        one pass where they fit together, else one after another."""
        self.sync(cache)
        fast = self.fast

        def denoise(canvas: Tensor, self_cond: Tensor | None) -> Tensor:
            if self.owner is not cache:  # a fill run from `between_steps` synced another slot meanwhile
                self.sync(cache)
            if fast.fits_rows(*canvas.shape):
                # the chain copies the logits at once (`sampler.denoise_step`): no copy of our own
                return fast.denoise(canvas, self_cond, clone=False)
            out = torch.empty((*canvas.shape, fast.vocab), dtype=torch.float32, device=canvas.device)
            for row in range(canvas.shape[0]):
                row_cond = None if self_cond is None else self_cond[row : row + 1]
                out[row] = fast.denoise(canvas[row : row + 1], row_cond, clone=False)[0]
            return out

        return denoise


def fixed_step_block(
    denoiser: sampler.Denoiser,
    *,
    length: int,
    vocab_size: int,
    eos_id: int,
    pad_id: int,
    steps: int,
    generator: torch.Generator,
    settings: SamplerSettings | None = None,
) -> tuple[Tensor, DenoiseState]:
    """One canvas from noise, no pins, denoised for exactly `steps` steps by the engine's own chain with the
    stop steps off (`early_stop=False`): the benchmark's fixed-step mode -> (committed ids [1, L], state)."""
    device = generator.device
    rules = Constraints.build(
        torch.zeros(length, dtype=torch.bool, device=device),
        torch.zeros(length, dtype=torch.long, device=device),
        vocab_size=vocab_size,
        eos_id=eos_id,
        pad_id=pad_id,
    )
    chain = build_chain(replace(settings or SamplerSettings(), max_steps=steps, early_stop=False))
    state = sampler.new_state(1, rules, generator=generator)
    return sampler.run(state, chain, denoiser), state
