"""The denoising loop as a chain of small steps (in the spirit of llama.cpp's sampler chain).

One `DenoiseState` holds everything a step reads or writes; every step has the same signature
`step(state, settings) -> None` and the loop just runs them in order after each decoder pass:

    mask_logits -> temperature -> sample -> token_entropy -> pins -> order_window -> entropy_bound -> renoise
    -> self_conditioning -> stable_and_confident -> eos_confident -> max_steps

Uniform-state diffusion: the canvas starts as uniformly random tokens, each step keeps the positions
the model is sure about (entropy-bound acceptance) and replaces all others with fresh random tokens.
The committed block is the argmax canvas, pins forced, cut at the first EOS.

Nothing here knows about the model: the loop takes a `denoiser(canvas, self_cond) -> logits` callable,
so every rule is testable with synthetic logits.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from dfim.engine.api import FillCancelled, SamplerSettings

NEG_INF = float("-inf")


@dataclass
class DenoiseState:
    """Everything one canvas batch carries through the denoising loop. Shapes: B candidates, L canvas, V vocab."""

    canvas: Tensor  # [B, L] long: the noisy canvas the denoiser sees next
    pinned: Tensor  # [L] bool: positions that always hold `pin_ids` and are never renoised
    pin_ids: Tensor  # [L] long: the pinned tokens (ignored where not pinned)
    generator: torch.Generator  # the only source of randomness (seeded runs are reproducible)
    vocab_size: int  # noise is uniform over [0, vocab_size), as in training
    eos_id: int
    pad_id: int
    max_steps: int
    banned: Tensor | None = None  # [V] bool: tokens never sampled anywhere (bos, FIM specials, reserved)
    no_end: Tensor | None = None  # [L] bool: positions where EOS and pad are banned (inner holes)
    allowed_at: dict[int, Tensor] = field(default_factory=dict)  # position -> [V] bool (token healing)
    # [V] bool: tokens that end the text as EOS does, because they hold one of the request's stop strings
    # (a newline token in a single-line fill): the text is cut there, so nothing after them is read.
    stop_tokens: Tensor | None = None
    # [V] bool: the stop tokens that begin with a stop string (a newline, a run of newlines): none of their
    # text reaches the fill, so for the stop rules they and EOS are one outcome, "the text ends here".
    stop_starts: Tensor | None = None
    step: int = 0  # denoising steps run so far (1-based once the first step ran)
    temperature: float = 1.0  # of the current step
    logits: Tensor | None = None  # [B, L, V] fp32: this step's logits, masked and temperature-scaled
    sampled: Tensor | None = None  # [B, L] a token drawn per position
    argmax: Tensor | None = None  # [B, L] the most likely token per position (pins forced)
    entropy: Tensor | None = None  # [B, L] nats of the processed distribution (0 at pins)
    accepted: Tensor | None = None  # [B, L] bool: kept this step (pins included)
    eligible: Tensor | None = None  # [B, L] bool: positions this step may accept (None: all)
    seeded: Tensor | None = None  # [B, L] bool: still holding a warm-start token (never renoised since)
    self_cond: Tensor | None = None  # [B, L, V] fed to the next decoder pass; None before the first
    history: list[Tensor] = field(default_factory=list)  # previous argmax canvases, oldest first
    finished: Tensor | None = None  # [B] bool
    stop_reason: list[str | None] = field(default_factory=list)  # per row, once finished
    steps: Tensor | None = None  # [B] long: decoder passes each row used
    # softmax(logits) and argmax(logits) of this step, shared by `sample` and `token_entropy`, and the
    # logits tensor they came from. A step that edits `logits` in place must reset `processed` to None
    # (inference tensors have no version counter to notice it by).
    processed: tuple[Tensor, Tensor] | None = field(default=None, repr=False)
    processed_of: Tensor | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        b = self.canvas.shape[0]
        if self.finished is None:
            self.finished = torch.zeros(b, dtype=torch.bool, device=self.canvas.device)
        if self.steps is None:
            self.steps = torch.zeros(b, dtype=torch.long, device=self.canvas.device)
        if not self.stop_reason:
            self.stop_reason = [None] * b

    @property
    def free(self) -> Tensor:
        """[L] bool: positions the sampler decides (not pinned)."""
        return ~self.pinned


Step = Callable[[DenoiseState, SamplerSettings], None]
Denoiser = Callable[
    [Tensor, "Tensor | None"], Tensor
]  # (canvas [B, L], self_cond | None) -> logits [B, L, V]


# --- building a state ---------------------------------------------------------------------------


def new_state(
    batch: int,
    pinned: Tensor,
    pin_ids: Tensor,
    *,
    vocab_size: int,
    eos_id: int,
    pad_id: int,
    settings: SamplerSettings,
    generator: torch.Generator,
    init_ids: Tensor | None = None,
    init_mask: Tensor | None = None,
    init_noise: float = 0.0,
    banned: Tensor | None = None,
    no_end: Tensor | None = None,
    allowed_at: dict[int, Tensor] | None = None,
    stop_tokens: Tensor | None = None,
    stop_starts: Tensor | None = None,
) -> DenoiseState:
    """A fresh canvas batch: uniform random tokens, pins in place.

    Warm start: where `init_mask` is set, the canvas starts from `init_ids` instead, and a fraction
    `init_noise` of those positions is renoised again (so the model can revise them). Both are [L] (every
    row) or [B, L] (per row: the encoder's draft seeds one candidate and leaves the others to noise).
    A canvas that starts from text with nothing renoised counts as the previous argmax canvas: a first step
    that reproduces it, confidently, has nothing left to change and stops (`stable_and_confident`).
    """
    length = pinned.shape[0]
    device = pinned.device
    # An EOS (or pad) before a pinned token would cut that pin off the committed text: free positions
    # before the last pinned token that is not padding may not end the text.
    content_pins = (pinned & (pin_ids != pad_id)).nonzero().flatten()
    if len(content_pins):
        before_pin = torch.arange(length, device=device) < content_pins[-1]
        inner = before_pin & ~pinned
        no_end = inner if no_end is None else (no_end | inner)
    canvas = uniform_tokens((batch, length), vocab_size, generator, device)
    if init_ids is not None and init_mask is not None:
        keep = init_mask.expand(batch, length).clone()
        if init_noise > 0:
            coin = torch.rand((batch, length), generator=generator, device=device)
            keep &= coin >= init_noise
        canvas = torch.where(keep, init_ids.expand(batch, length), canvas)
    else:
        keep = None
    canvas = torch.where(pinned[None], pin_ids[None], canvas)
    history = [canvas.clone()] if keep is not None and init_noise == 0 else []
    return DenoiseState(
        canvas=canvas,
        pinned=pinned,
        pin_ids=pin_ids,
        generator=generator,
        vocab_size=vocab_size,
        eos_id=eos_id,
        pad_id=pad_id,
        max_steps=settings.max_steps,
        banned=banned,
        no_end=no_end,
        allowed_at=dict(allowed_at or {}),
        stop_tokens=stop_tokens,
        stop_starts=stop_starts,
        seeded=keep,
        history=history,
    )


def uniform_tokens(shape: tuple[int, ...], vocab_size: int, generator: torch.Generator, device) -> Tensor:
    return torch.randint(0, vocab_size, shape, generator=generator, device=device)


# --- the steps ----------------------------------------------------------------------------------


def mask_logits(state: DenoiseState, settings: SamplerSettings) -> None:
    """Tokens that must never appear on the canvas get -inf: banned ids everywhere, EOS/pad inside inner
    holes, and everything outside a position's allowed set (token healing)."""
    x = state.logits
    state.processed = None  # edited in place below
    if state.banned is not None:
        x.masked_fill_(state.banned, NEG_INF)
    if state.no_end is not None and bool(state.no_end.any()):
        positions = state.no_end.nonzero().squeeze(-1)
        ends = torch.tensor([state.eos_id, state.pad_id], device=x.device)
        x[:, positions[:, None], ends[None, :]] = NEG_INF
    for position, allowed in state.allowed_at.items():
        x[:, position].masked_fill_(~allowed, NEG_INF)


def temperature_at(step: int, max_steps: int, t_min: float, t_max: float) -> float:
    """Linear schedule over the remaining-steps index k = N..1: t_max at the first step."""
    k = max_steps - step + 1
    return t_min + (t_max - t_min) * k / max_steps


def temperature(state: DenoiseState, settings: SamplerSettings) -> None:
    state.temperature = max(temperature_at(state.step, state.max_steps, settings.t_min, settings.t_max), 1e-6)
    state.logits.div_(state.temperature)
    state.processed = None


def processed(state: DenoiseState) -> tuple[Tensor, Tensor]:
    """(softmax, argmax) of state.logits over the vocabulary: each is a full pass over [B, L, V], so it
    is computed once per step however many steps read it."""
    logits = state.logits
    if state.processed is None or state.processed_of is not logits:
        state.processed = (torch.softmax(logits, dim=-1), logits.argmax(dim=-1))
        state.processed_of = logits
    return state.processed


def sample(state: DenoiseState, settings: SamplerSettings) -> None:
    """One token drawn per position from the processed distribution, and the argmax.

    Drawn by inverting the CDF with one uniform number per position: the same distribution as a
    categorical draw, and on CPU far cheaper than torch.multinomial or an exponential race (which needs a
    random number per vocabulary entry: ~4 ms per step for a 16 x 8192 canvas, most of the sampler)."""
    probs, mode = processed(state)
    cdf = probs.cumsum(dim=-1)  # nondecreasing; flat at zero-probability (banned) tokens, never drawn
    u = torch.rand(probs.shape[:-1], generator=state.generator, device=probs.device, dtype=cdf.dtype)
    target = (u * cdf[..., -1]).unsqueeze(-1)
    drawn = torch.searchsorted(cdf, target, right=True).squeeze(-1)  # first index with cdf > target
    # u * total can round up to the total itself: no index then; the mode stands in (probability ~0).
    state.sampled = torch.where(drawn < probs.shape[-1], drawn, mode)
    state.argmax = mode


def token_entropy(state: DenoiseState, settings: SamplerSettings) -> None:
    """H = -sum p log p, computed as -sum p (x - x_m) - log p_m with m the mode (log p = x - x_m + log p_m):
    no logarithm per vocabulary entry, and no cancellation since x - x_m <= 0. Tokens at -inf have
    p = 0, and nansum leaves their 0 * -inf out."""
    probs, mode = processed(state)
    top = mode.unsqueeze(-1)
    shifted = state.logits - state.logits.gather(-1, top)
    state.entropy = -torch.nansum(probs * shifted, dim=-1) - torch.log(probs.gather(-1, top).squeeze(-1))


def pins(state: DenoiseState, settings: SamplerSettings) -> None:
    """Pinned positions hold their token whatever the model says, and are certain (entropy 0)."""
    pinned = state.pinned[None]
    state.sampled = torch.where(pinned, state.pin_ids[None], state.sampled)
    state.argmax = torch.where(pinned, state.pin_ids[None], state.argmax)
    state.entropy = state.entropy.masked_fill(pinned, 0.0)


def order_window(state: DenoiseState, settings: SamplerSettings) -> None:
    """Left-to-right window (settings.window > 0): only free positions before the first one the previous
    step did not accept, plus `window` more, may be accepted now; the rest is renoised.

    Accepting many far-apart positions in one step is where a small model's fills go incoherent (each
    token is chosen without knowing the others: "value_value_value"); a narrow window lets every new
    token see the ones just left of it, the order code is written in, while the model still reads the
    whole canvas and the suffix. 0 leaves every position eligible (the released sampler). Tokens of a
    warm start (a rewrite's old text) stay eligible wherever they are until they are renoised: they
    were written in order already, and the window must not throw them away."""
    if settings.window <= 0:
        state.eligible = None
        return
    length = state.canvas.shape[-1]
    free = state.free[None].expand(state.canvas.shape[0], length)
    previous = state.accepted if state.accepted is not None else torch.zeros_like(free)
    open_ = free & ~previous
    index = torch.arange(length, device=free.device).expand_as(free)
    first_open = torch.where(open_, index, length).min(dim=-1, keepdim=True).values  # [B, 1]
    state.eligible = index < first_open + settings.window
    if state.seeded is not None:
        state.eligible |= state.seeded


def accept_by_entropy(
    entropy: Tensor, pinned: Tensor, bound: float, eligible: Tensor | None = None
) -> Tensor:
    """Entropy-bound acceptance over the free positions: sort ascending, accept i while
    cumsum(H)_i - H_i <= bound (the sum of all but the largest accepted entropy bounds their joint
    dependence), at least one. Pinned positions are always accepted and spend nothing of the bound.
    `eligible` [B, L]: only those free positions may be accepted (at least one of them)."""
    h = entropy.masked_fill(pinned[None], math.inf)  # pins sort last and never enter the sum
    if eligible is not None:
        h = h.masked_fill(~eligible, math.inf)
    sorted_h, order = torch.sort(h, dim=-1)
    out = torch.isinf(sorted_h)  # pins and ineligible positions
    finite = sorted_h.masked_fill(out, 0.0)
    select = (torch.cumsum(finite, dim=-1) - finite <= bound) & ~out
    select[:, 0] |= ~out[:, 0]  # at least one free, eligible position (NaN entropies sort after inf)
    accepted = torch.zeros_like(select).scatter(-1, order, select)
    return accepted | pinned[None]


def entropy_bound(state: DenoiseState, settings: SamplerSettings) -> None:
    state.accepted = accept_by_entropy(state.entropy, state.pinned, settings.entropy_bound, state.eligible)


def renoise(state: DenoiseState, settings: SamplerSettings) -> None:
    """Accepted positions keep the sampled token; all others get fresh uniform random tokens."""
    noise = uniform_tokens(tuple(state.canvas.shape), state.vocab_size, state.generator, state.canvas.device)
    keep = state.accepted | state.pinned[None]
    state.canvas = torch.where(keep, state.sampled, noise)
    if state.seeded is not None:
        state.seeded = state.seeded & keep


def self_conditioning(state: DenoiseState, settings: SamplerSettings) -> None:
    """This step's temperature-scaled logits condition the next decoder pass."""
    state.self_cond = state.logits if settings.self_conditioning else None


def mean_free_entropy(
    state: DenoiseState, read: Tensor | None = None, entropy: Tensor | None = None
) -> Tensor:
    """[B] mean entropy (default `state.entropy`) over the positions the sampler decides (pins are known,
    not predicted); where `read` ([B, L] bool) is given, positions outside it count as certain."""
    entropy = state.entropy if entropy is None else entropy
    entropy = entropy if read is None else entropy * read
    free = state.free.to(entropy.dtype)
    return (entropy * free[None]).sum(dim=-1) / free.sum().clamp(min=1.0)


def _finish(state: DenoiseState, rows: Tensor, reason: str) -> None:
    newly = rows & ~state.finished
    for b in newly.nonzero().flatten().tolist():
        state.stop_reason[b] = reason
    state.finished |= newly


def end_class(state: DenoiseState, ids: Tensor) -> Tensor:
    """`ids` with every stop token that begins with the stop string read as EOS: they end the text at the
    same place with nothing of their own, so which of them a position holds changes no answer."""
    if state.stop_starts is None:
        return ids
    return torch.where(state.stop_starts[ids], state.eos_id, ids)


def read_entropy(state: DenoiseState) -> Tensor:
    """[B, L] `state.entropy`, except at free positions whose argmax ends the text with nothing of its own
    (EOS, or a stop token that begins with the stop string): there the doubt that matters is whether the
    text ends, not which of those tokens ends it (a newline or three), so they count as one outcome.
    With log p = (x - x_m) + log p_m as in `token_entropy`: H' = H + sum_C p log p - q log q, q = p(C)."""
    if state.stop_starts is None:
        return state.entropy
    ends = state.stop_starts.clone()
    ends[state.eos_id] = True
    at = ends[state.argmax] & state.free[None]  # [B, L]: a handful of positions (a row's end)
    if not bool(at.any()):
        return state.entropy
    probs, mode = processed(state)
    probs, logits, mode = probs[at], state.logits[at], mode[at]  # [N, V], [N, V], [N]
    top = mode.unsqueeze(-1)
    shifted = logits - logits.gather(-1, top)
    in_class = ends.to(probs.dtype)
    q = (probs * in_class).sum(dim=-1)
    plogp = torch.nansum(probs * shifted * in_class, dim=-1) + q * torch.log(
        probs.gather(-1, top).squeeze(-1)
    )
    entropy = state.entropy.clone()
    entropy[at] = (entropy[at] + plogp - q * torch.log(q.clamp(min=1e-30))).clamp(min=0)
    return entropy


def stable_and_confident(state: DenoiseState, settings: SamplerSettings) -> None:
    """Stop a row once its argmax canvas equals the previous `stability_threshold` argmax canvases and
    the mean entropy over its free positions is below `confidence_threshold`. Positions after the
    text's end (its first EOS, or a stop token of the request) count as settled: the commit cuts them
    off, so their churn and doubt cannot change the answer."""
    need = settings.stability_threshold
    read = up_to(first_end(state), state.argmax.shape[-1])
    if need == 0:
        stable = torch.ones_like(state.finished)
    elif len(state.history) < need:
        stable = torch.zeros_like(state.finished)
    else:
        now = end_class(state, state.argmax)
        same = [(end_class(state, h) == now) | ~read for h in state.history[-need:]]
        stable = torch.stack([s.all(dim=-1) for s in same]).all(dim=0)
    state.history = (state.history + [state.argmax])[-max(need, 1) :]
    if settings.early_stop:
        doubt = mean_free_entropy(state, read, read_entropy(state))
        _finish(state, stable & (doubt < settings.confidence_threshold), "stable")


def first_index(mask: Tensor) -> Tensor:
    """[B] index of the first True per row of a [B, L] mask, L where there is none."""
    length = mask.shape[-1]
    index = torch.arange(length, device=mask.device).expand_as(mask)
    return torch.where(mask, index, length).min(dim=-1).values


def up_to(end: Tensor, length: int) -> Tensor:
    """[B, L] bool: the positions at or before each row's `end` index ([B])."""
    return torch.arange(length, device=end.device)[None] <= end[:, None]


def first_eos(ids: Tensor, eos_id: int) -> Tensor:
    """[B] index of the first EOS per row, L where there is none."""
    return first_index(ids == eos_id)


def first_end(state: DenoiseState) -> Tensor:
    """[B] index of the first position where the text ends (EOS or a stop token), L where none does."""
    ends = state.argmax == state.eos_id
    if state.stop_tokens is not None:
        ends |= state.stop_tokens[state.argmax]
    return first_index(ends)


def eos_confident(state: DenoiseState, settings: SamplerSettings) -> None:
    """Stop a row once every token up to and including the one that ends its text (its first EOS, or a
    stop token such as a newline in a single-line fill) is accepted and confident (entropy below
    `confidence_threshold`): what follows is padding or text the stop cuts off, which nobody reads, so
    waiting for it to settle too would only spend steps."""
    if not settings.early_stop:
        return
    length = state.argmax.shape[-1]
    end = first_end(state)
    span = up_to(end, length)
    ok = (state.accepted & (read_entropy(state) < settings.confidence_threshold)) | ~span
    done = (end < length) & ok.all(dim=-1)
    at_end = state.argmax.gather(1, end.clamp(max=length - 1)[:, None])[:, 0]
    _finish(state, done & (at_end == state.eos_id), "eos_confident")
    _finish(state, done, "stop_confident")


def max_steps(state: DenoiseState, settings: SamplerSettings) -> None:
    if state.step >= state.max_steps:
        _finish(state, torch.ones_like(state.finished), "max_steps")


DEFAULT_CHAIN: tuple[Step, ...] = (
    mask_logits,
    temperature,
    sample,
    token_entropy,
    pins,
    order_window,
    entropy_bound,
    renoise,
    self_conditioning,
    stable_and_confident,
    eos_confident,
    max_steps,
)

# Row tensors a finished row must keep unchanged while the rest of the batch denoises on.
_ROW_FIELDS = ("canvas", "sampled", "argmax", "entropy", "accepted", "seeded", "self_cond", "logits")


# --- the loop -----------------------------------------------------------------------------------


def denoise_step(
    state: DenoiseState, settings: SamplerSettings, logits: Tensor, chain: Sequence[Step] = DEFAULT_CHAIN
) -> None:
    """Run the chain on one decoder output. Rows that finished earlier are left exactly as they were."""
    done = state.finished.clone()
    before = {name: getattr(state, name) for name in _ROW_FIELDS} if bool(done.any()) else None
    state.step += 1
    state.steps += (~done).long()
    state.logits = logits.float().clone()
    for step in chain:
        step(state, settings)
    if before is not None:
        for name, old in before.items():
            new = getattr(state, name)
            if old is None or new is None:
                continue
            rows = done.view(-1, *([1] * (new.dim() - 1)))
            setattr(state, name, torch.where(rows, old, new))


def run(
    state: DenoiseState,
    settings: SamplerSettings,
    denoiser: Denoiser,
    *,
    chain: Sequence[Step] = DEFAULT_CHAIN,
    cancel: Callable[[], bool] | None = None,
    on_step: Callable[[DenoiseState], None] | None = None,
    between_steps: Callable[[], None] | None = None,
) -> Tensor:
    """Denoise until every row has stopped; returns the committed canvas [B, L]. `between_steps` runs
    before each decoder pass but the first (other work may run there: see FillRequest.between_steps)."""
    while not bool(state.finished.all()):
        if between_steps is not None and state.step > 0:
            between_steps()
        if cancel is not None and cancel():
            raise FillCancelled("fill cancelled")
        logits = active_rows_logits(state, denoiser)
        denoise_step(state, settings, logits, chain)
        if on_step is not None:
            on_step(state)
    return commit(state)


def active_rows_logits(state: DenoiseState, denoiser: Denoiser) -> Tensor:
    """The decoder's logits [B, L, V] for the rows still denoising; a finished row (a candidate that stopped
    before the others) costs no decoder pass and gets zeros, which `denoise_step` never keeps."""
    if not bool(state.finished.any()):
        return denoiser(state.canvas, state.self_cond)
    rows = (~state.finished).nonzero().squeeze(1)
    self_cond = None if state.self_cond is None else state.self_cond[rows]
    out = denoiser(state.canvas[rows], self_cond)
    logits = out.new_zeros((state.canvas.shape[0], *out.shape[1:]))
    logits[rows] = out
    return logits


def commit(state: DenoiseState) -> Tensor:
    """The argmax canvas with pins forced; everything after the first EOS becomes pad."""
    ids = torch.where(state.pinned[None], state.pin_ids[None], state.argmax)
    return pad_after_eos(ids, state.eos_id, state.pad_id)


def pad_after_eos(ids: Tensor, eos_id: int, pad_id: int) -> Tensor:
    end = first_eos(ids, eos_id)
    return ids.masked_fill(~up_to(end, ids.shape[-1]), pad_id)


def confidence(state: DenoiseState) -> Tensor:
    """[B, L] per-position confidence exp(-entropy) of the last step's distribution, in (0, 1]."""
    return torch.exp(-state.entropy)
