"""The denoising loop: one canvas batch, a chain of small steps (`sampler_steps`), run after each decoder
pass until every row has stopped.

    rules = Constraints.build(pinned, pin_ids, vocab_size=..., eos_id=..., pad_id=..., banned=...)
    state = new_state(candidates, rules, generator=generator)
    committed = run(state, build_chain(settings), denoiser)

The request's fixed constraints (`sampler_state.Constraints`) are built once per canvas; the state carries
the canvas and each step's tensors; the chain derives the distribution once per step (`denoise_step`).
The committed block is the argmax canvas, pins forced, cut at the first EOS.

Nothing here knows about the model: the loop takes a `denoiser(canvas, self_cond) -> logits` callable,
so every rule is testable with synthetic logits.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from dfim.engine.api import FillCancelled
from dfim.engine.inference.sampler_state import (
    Constraints,
    DenoiseState,
    pad_after_eos,
    uniform_tokens,
)
from dfim.engine.inference.sampler_steps import Chain

Denoiser = Callable[
    [Tensor, "Tensor | None"], Tensor
]  # (canvas [B, L], self_cond | None) -> logits [B, L, V]

# Row tensors a finished row must keep unchanged while the rest of the batch denoises on.
_ROW_FIELDS = ("canvas", "sampled", "argmax", "entropy", "accepted", "seeded", "self_cond", "logits")


def new_state(
    batch: int,
    rules: Constraints,
    *,
    generator: torch.Generator,
    init_ids: Tensor | None = None,
    init_mask: Tensor | None = None,
    init_noise: float = 0.0,
) -> DenoiseState:
    """A fresh canvas batch: uniform random tokens, pins in place.

    Warm start: where `init_mask` is set, the canvas starts from `init_ids` instead, and a fraction
    `init_noise` of those positions is renoised again (so the model can revise them). Both are [L] (every
    row) or [B, L] (per row: the encoder's draft seeds one candidate and leaves the others to noise).
    A canvas that starts from text with nothing renoised counts as the previous argmax canvas: a first step
    that reproduces it, confidently, has nothing left to change and stops (`stable_and_confident`).
    """
    length, device = rules.length, rules.pinned.device
    canvas = uniform_tokens((batch, length), rules.vocab_size, generator, device)
    keep: Tensor | None = None
    if init_ids is not None and init_mask is not None:
        keep = init_mask.expand(batch, length).clone()
        if init_noise > 0:
            coin = torch.rand((batch, length), generator=generator, device=device)
            keep &= coin >= init_noise
        canvas = torch.where(keep, init_ids.expand(batch, length), canvas)
    canvas = torch.where(rules.pinned[None], rules.pin_ids[None], canvas)
    previous = canvas.clone() if keep is not None and init_noise == 0 else None
    return DenoiseState(rules=rules, canvas=canvas, generator=generator, previous=previous, seeded=keep)


def denoise_step(state: DenoiseState, chain: Chain, logits: Tensor) -> None:
    """Run the chain on one decoder output: the steps that edit the logits, then the steps that read what
    the state derives from them (`DenoiseState.derive`: each value once, when first read) and decide. Rows that finished earlier are left exactly as they were. The chain's memories are reset
    before a fresh state's first step."""
    assert state.finished is not None and state.steps is not None
    if state.step == 0:
        chain.reset(state)
    done = state.finished.clone()
    some_done = len(state.running) < len(state.stop_reason)
    before = {name: getattr(state, name) for name in _ROW_FIELDS} if some_done else None
    state.step += 1
    state.steps += (~done).long()
    state.take_logits(logits)
    for step in chain.logit_steps:
        step.apply(state)
    state.keep_logits()
    state.derive()
    for step in chain.token_steps:
        step.apply(state)
    assert state.argmax is not None and state.entropy is not None  # derived now, if no step read them
    # `dist` stays until the next step derives its own: freed here, its [B, L, V] buffers would go back to
    # the system and the next step's come back page by page (~0.5 ms a step for 32 x 8192 on the CPU).
    if before is not None:
        state.dist = None  # it describes the new logits of every row, and finished rows keep their old ones
        for name, old in before.items():
            new = getattr(state, name)
            if old is None or new is None:
                continue
            rows = done.view(-1, *([1] * (new.dim() - 1)))
            setattr(state, name, torch.where(rows, old, new))


def run(
    state: DenoiseState,
    chain: Chain,
    denoiser: Denoiser,
    *,
    cancel: Callable[[], bool] | None = None,
    on_step: Callable[[DenoiseState], None] | None = None,
    between_steps: Callable[[], None] | None = None,
) -> Tensor:
    """Denoise until every row has stopped; returns the committed canvas [B, L]. `between_steps` runs
    before each decoder pass but the first (other work may run there: see FillRequest.between_steps)."""
    assert state.finished is not None
    # Read now, while the device is idle: read in the first step it would wait for the first pass
    state.rules.no_end_positions  # noqa: B018 - a cached property
    # Which rows run is read from the host (`DenoiseState.running`): with the stop steps off a step reads
    # nothing back from the device; with them, the rows they finished, once a step (decision 115).
    while state.running:
        if between_steps is not None and state.step > 0:
            between_steps()
        if cancel is not None and cancel():
            raise FillCancelled("fill cancelled")
        logits = active_rows_logits(state, denoiser)
        denoise_step(state, chain, logits)
        if on_step is not None:
            on_step(state)
    return commit(state)


def active_rows_logits(state: DenoiseState, denoiser: Denoiser) -> Tensor:
    """The decoder's logits [B, L, V] for the rows still denoising; a finished row (a candidate that stopped
    before the others) costs no decoder pass and gets zeros, which `denoise_step` never keeps."""
    running = state.running
    if len(running) == len(state.stop_reason):
        return denoiser(state.canvas, state.self_cond)
    rows = torch.tensor(running, dtype=torch.long, device=state.canvas.device)
    self_cond = None if state.self_cond is None else state.self_cond[rows]
    out = denoiser(state.canvas[rows], self_cond)
    logits = out.new_zeros((state.canvas.shape[0], *out.shape[1:]))
    logits[rows] = out
    return logits


def commit(state: DenoiseState) -> Tensor:
    """The argmax canvas with pins forced; everything after the first EOS becomes pad."""
    assert state.argmax is not None
    rules = state.rules
    ids = torch.where(rules.pinned[None], rules.pin_ids[None], state.argmax)
    return pad_after_eos(ids, rules.eos_id, rules.pad_id)


def confidence(state: DenoiseState) -> Tensor:
    """[B, L] per-position confidence exp(-entropy) of the last step's distribution, in (0, 1]."""
    assert state.entropy is not None
    return torch.exp(-state.entropy)


def token_logprob(state: DenoiseState, ids: Tensor) -> Tensor:
    """[B, L] log p of `ids` ([B, L], the committed canvas) under each row's last processed distribution
    (masked and at that step's temperature: the one the sampler decided from). No model pass: a row's last
    logits stay in the state. Where this step's distribution is still derived (no row finished early), its
    probabilities are read; otherwise one log-sum-exp over the logits. -inf where a token was masked
    (pins, pad after EOS): callers read free text positions only."""
    assert state.logits is not None
    index = ids.unsqueeze(-1)
    if state.dist is not None:
        return state.dist.log_prob(ids)
    return state.logits.gather(-1, index).squeeze(-1) - torch.logsumexp(state.logits, dim=-1)
