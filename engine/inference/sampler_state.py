"""What the sampler's steps read and write: the request's fixed `Constraints`, the per-step `DenoiseState`,
and the `Distribution` the chain derives once per step from the processed logits.

Constraints are built once per canvas (pins, banned tokens, inner holes, token healing, stop tokens) and
never change while it denoises; the state holds the canvas and this step's tensors. Steps never compute
probabilities, argmax or entropy themselves: once the steps that edit the logits have run, the loop calls
`DenoiseState.derive` and each value is computed when first read, once per step, so nothing has to be
invalidated by hand (`dfim.engine.inference.sampler.denoise_step`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property

import torch
from torch import Tensor

from dfim.engine.inference import triton_sampler
from dfim.engine.inference.canvas import CanvasPlan
from dfim.engine.inference.triton_sampler import RowStats


@dataclass(frozen=True, eq=False)
class Constraints:
    """What a request fixes for every step of one canvas. Shapes: L canvas, V vocab."""

    pinned: Tensor  # [L] bool: positions that always hold `pin_ids` and are never renoised
    pin_ids: Tensor  # [L] long: the pinned tokens (ignored where not pinned)
    vocab_size: int  # noise is uniform over [0, vocab_size), as in training
    eos_id: int
    pad_id: int
    banned: Tensor | None = None  # [V] bool: tokens never sampled anywhere (bos, FIM specials, reserved)
    no_end: Tensor | None = None  # [L] bool: positions where EOS and pad are banned (inner holes)
    allowed_at: Mapping[int, Tensor] = field(default_factory=dict)  # position -> [V] bool (token healing)
    # [V] bool: tokens that end the text as EOS does, because they hold one of the request's stop strings
    # (a newline token in a single-line fill): the text is cut there, so nothing after them is read.
    stop_tokens: Tensor | None = None
    # [V] bool: the stop tokens that begin with a stop string (a newline, a run of newlines): none of their
    # text reaches the fill, so for the stop rules they and EOS are one outcome, "the text ends here".
    stop_starts: Tensor | None = None

    @classmethod
    def build(
        cls,
        pinned: Tensor,
        pin_ids: Tensor,
        *,
        vocab_size: int,
        eos_id: int,
        pad_id: int,
        banned: Tensor | None = None,
        no_end: Tensor | None = None,
        allowed_at: Mapping[int, Tensor] | None = None,
        stop_tokens: Tensor | None = None,
        stop_starts: Tensor | None = None,
    ) -> Constraints:
        """The constraints of one canvas. An EOS (or pad) before a pinned token would cut that pin off the
        committed text: free positions before the last pinned token that is not padding may not end it."""
        content_pins = (pinned & (pin_ids != pad_id)).nonzero().flatten()
        if len(content_pins):
            before_pin = torch.arange(pinned.shape[0], device=pinned.device) < content_pins[-1]
            inner = before_pin & ~pinned
            no_end = inner if no_end is None else (no_end | inner)
        return cls(
            pinned=pinned,
            pin_ids=pin_ids,
            vocab_size=vocab_size,
            eos_id=eos_id,
            pad_id=pad_id,
            banned=banned,
            no_end=no_end,
            allowed_at=dict(allowed_at or {}),
            stop_tokens=stop_tokens,
            stop_starts=stop_starts,
        )

    @property
    def length(self) -> int:
        return int(self.pinned.shape[0])

    @cached_property
    def free(self) -> Tensor:
        """[L] bool: positions the sampler decides (not pinned)."""
        return ~self.pinned

    @cached_property
    def no_end_positions(self) -> Tensor | None:
        """[N] the positions where EOS and pad are banned, None where there are none: read from the device
        once per canvas, not once per step."""
        if self.no_end is None or not bool(self.no_end.any()):
            return None
        return self.no_end.nonzero().squeeze(-1)

    @cached_property
    def banned_ids(self) -> Tensor | None:
        """[N] the banned tokens' ids, None where none are (found once per canvas): filling those columns
        writes N values a position, where a [V] mask is a pass over every logit."""
        if self.banned is None:
            return None
        ids = self.banned.nonzero().squeeze(-1)
        return ids if len(ids) else None

    @cached_property
    def end_ids(self) -> Tensor:
        """[2] EOS and pad, on the constraints' device (made once: a copy to the GPU waits for it)."""
        return torch.tensor([self.eos_id, self.pad_id], device=self.pinned.device)

    @cached_property
    def ends(self) -> Tensor | None:
        """[V] bool: EOS and the stop tokens that begin with a stop string (the text ends there with nothing
        of their own); None without stop strings."""
        if self.stop_starts is None:
            return None
        ends = self.stop_starts.clone()
        ends[self.eos_id] = True
        return ends


def plan_constraints(
    plan: CanvasPlan,
    banned: Tensor,
    *,
    eos_id: int,
    pad_id: int,
    stop_tokens: Tensor | None = None,
    stop_starts: Tensor | None = None,
) -> Constraints:
    """A canvas plan's constraints (its pins, inner holes and healing set) with the `banned` [V] tokens, over
    the vocabulary `banned` spans: what the denoising chain and the greedy decoder both honour."""
    device = banned.device
    allowed_at: dict[int, Tensor] = {}
    if plan.heal_allowed:
        allowed = torch.zeros_like(banned)
        allowed[plan.heal_allowed] = True
        allowed_at[0] = allowed
    return Constraints.build(
        torch.tensor(plan.pinned, dtype=torch.bool, device=device),
        torch.tensor(plan.pin_ids, dtype=torch.long, device=device),
        vocab_size=int(banned.shape[0]),
        eos_id=eos_id,
        pad_id=pad_id,
        banned=banned,
        no_end=torch.tensor(plan.no_end, dtype=torch.bool, device=device),
        allowed_at=allowed_at,
        stop_tokens=stop_tokens,
        stop_starts=stop_starts,
    )


class Distribution:
    """The processed logits [..., V] of one step and what follows from them, each computed at most once
    (a full pass over [B, L, V] apiece): the logits must not change once this is built. On CUDA the mode,
    the entropy, the log-normaliser and the draw come from one row-wise kernel (`triton_sampler`) and the
    probabilities are only computed where something still reads them."""

    def __init__(self, logits: Tensor) -> None:
        self.logits = logits

    @cached_property
    def _row_stats(self) -> RowStats | None:
        """The fused kernel's reads where it runs (one launch, no [.., V] tensor written), else None."""
        return triton_sampler.row_stats(self.logits) if triton_sampler.applies(self.logits) else None

    @cached_property
    def probs(self) -> Tensor:
        return torch.softmax(self.logits, dim=-1)

    def probs_at(self, where: Tensor | tuple[Tensor, ...]) -> Tensor:
        """[N, V] the probabilities of the positions `where` selects (a mask, or index tensors: those need no
        read of the device), without the whole softmax when it has not been computed (the same values:
        softmax is row by row)."""
        if "probs" in self.__dict__:
            return self.probs[where]
        return torch.softmax(self.logits[where], dim=-1)

    @cached_property
    def mode(self) -> Tensor:
        """The most likely token per position (pins not forced)."""
        stats = self._row_stats
        return stats.mode if stats is not None else self.logits.argmax(dim=-1)

    @cached_property
    def entropy(self) -> Tensor:
        """H = -sum p log p, computed as -sum p (x - x_m) - log p_m with m the mode (log p = x - x_m + log p_m):
        no logarithm per vocabulary entry, and no cancellation since x - x_m <= 0. Tokens at -inf have
        p = 0, and nansum leaves their 0 * -inf out."""
        stats = self._row_stats
        if stats is not None:
            return stats.entropy
        probs, top = self.probs, self.mode.unsqueeze(-1)
        shifted = self.logits - self.logits.gather(-1, top)
        return -torch.nansum(probs * shifted, dim=-1) - torch.log(probs.gather(-1, top).squeeze(-1))

    def log_prob(self, ids: Tensor) -> Tensor:
        """[...] log p of `ids` ([...] token ids), one per position."""
        index = ids.unsqueeze(-1)
        stats = self._row_stats
        if stats is not None:
            return self.logits.gather(-1, index).squeeze(-1) - stats.log_normalizer
        return torch.log(self.probs.gather(-1, index).squeeze(-1))

    def sample(self, u: Tensor) -> Tensor:
        """One token per position, drawn by inverting the CDF at `u` ([...] uniform in [0, 1), one number a
        position): the same distribution as a categorical draw, and on CPU far cheaper than torch.multinomial
        or an exponential race (which needs a random number per vocabulary entry: ~4 ms per step for a
        16 x 8192 canvas, most of the sampler). On CUDA the kernel's one launch also gives the mode and
        entropy, kept for the step."""
        if triton_sampler.applies(self.logits):
            stats = triton_sampler.row_stats(self.logits, u)
            self.__dict__.setdefault("_row_stats", stats)
            assert stats.sampled is not None
            return stats.sampled
        probs, mode = self.probs, self.mode
        cdf = probs.cumsum(dim=-1)  # nondecreasing; flat at zero-probability (banned) tokens, never drawn
        target = (u.to(cdf.dtype) * cdf[..., -1]).unsqueeze(-1)
        drawn = torch.searchsorted(cdf, target, right=True).squeeze(-1)  # first index with cdf > target
        # u * total can round up to the total itself: no index then; the mode stands in (probability ~0).
        return torch.where(drawn < probs.shape[-1], drawn, mode)

    @cached_property
    def top(self) -> tuple[Tensor, Tensor]:
        """(probability, token) of the most probable token per position, read off the probabilities (a
        greedy decoder's choice and its confidence)."""
        conf, token = self.probs.max(dim=-1)
        return conf, token


@dataclass
class DenoiseState:
    """One canvas batch as it denoises. Shapes: B candidates, L canvas, V vocab.

    `rules` never changes; `canvas`, `seeded`, `self_cond` and the row bookkeeping carry from step to step;
    `logits` .. `accepted` are this step's (a finished row keeps its last values)."""

    rules: Constraints
    canvas: Tensor  # [B, L] long: the noisy canvas the denoiser sees next
    generator: torch.Generator  # the only source of randomness (seeded runs are reproducible)
    # [B, L] the argmax canvas a start from text counts as having come before the first step (nothing of
    # it renoised); None from noise. `stable_and_confident` compares the first step with it.
    previous: Tensor | None = None
    seeded: Tensor | None = None  # [B, L] bool: still holding a warm-start token (never renoised since)
    self_cond: Tensor | None = None  # [B, L, V] fed to the next decoder pass; None before the first
    step: int = 0  # denoising steps run so far (1-based once the first step ran)
    temperature: float = 1.0  # of the current step
    logits: Tensor | None = None  # [B, L, V] fp32: this step's logits, masked and temperature-scaled
    # False while `logits` is the denoiser's own tensor (`take_logits`): a backend may hand out a buffer its
    # next pass overwrites, so a step edits them through `editable_logits` or `scale_logits`, which copy first
    owns_logits: bool = field(default=False, repr=False)
    # Derived from `logits` once the steps that edit them ran (`derive`), until the next step derives its own
    # (None before the first step, and after a step that left finished rows as they were).
    dist: Distribution | None = field(default=None, repr=False)
    _argmax: Tensor | None = field(default=None, repr=False)  # see `argmax`
    _entropy: Tensor | None = field(default=None, repr=False)  # see `entropy`
    # `sampler_steps.read_entropy` of this step, read by both stop rules: computed once
    end_entropy: Tensor | None = field(default=None, repr=False)
    sampled: Tensor | None = None  # [B, L] a token drawn per position
    eligible: Tensor | None = None  # [B, L] bool: positions this step may accept (None: all)
    accepted: Tensor | None = None  # [B, L] bool: kept this step (pins included)
    finished: Tensor | None = None  # [B] bool, all False at the start: rows finish through `finish`
    # per row, once finished (`stop_reason`): also the host's copy of `finished`, so the loop needs no device
    # read to know which rows still run (`finish` is the one place both change)
    _reasons: list[str | None] = field(default_factory=list, repr=False)
    # rows `finish` marked ([B] bool on the device) with their reasons, not yet read back: the step's stop
    # rules read them back once, when the host first asks (`stop_reason`), not once a rule
    _pending: list[tuple[Tensor, str]] = field(default_factory=list, repr=False)
    steps: Tensor | None = None  # [B] long: decoder passes each row used
    # What the stop steps measured this step, per row ([B] tensors by name: "stable", "doubt", "end_settled"),
    # so a trace can say why a row went on. Written, never read, by the chain.
    checks: dict[str, Tensor] = field(default_factory=dict)

    def __post_init__(self) -> None:
        b = self.canvas.shape[0]
        if self.finished is None:
            self.finished = torch.zeros(b, dtype=torch.bool, device=self.canvas.device)
        if self.steps is None:
            self.steps = torch.zeros(b, dtype=torch.long, device=self.canvas.device)
        if not self._reasons:
            self._reasons = [None] * b

    @property
    def free(self) -> Tensor:
        """[L] bool: positions the sampler decides (not pinned)."""
        return self.rules.free

    def take_logits(self, logits: Tensor) -> None:
        """A decoder pass's logits, borrowed until a step edits them (or `keep_logits`)."""
        self.logits = logits.float()
        self.owns_logits = self.logits is not logits  # a cast made a tensor of our own

    def editable_logits(self) -> Tensor:
        """This step's logits, the state's own copy, for a step to edit in place."""
        assert self.logits is not None
        if not self.owns_logits:
            self.logits, self.owns_logits = self.logits.clone(), True
        return self.logits

    def scale_logits(self, divisor: float) -> None:
        """logits / divisor, into a copy of our own where they are borrowed: one pass, not a copy and then
        an edit (at the 26B shape 268 MB a pass, 0.3 ms a step on an H200 as two)."""
        assert self.logits is not None
        if self.owns_logits:
            self.logits.div_(divisor)
        else:
            self.logits, self.owns_logits = self.logits / divisor, True

    def keep_logits(self) -> None:
        """The steps that edit the logits ran: keep them, copied if no step did (the next pass may overwrite
        the denoiser's tensor, and the next step's self-conditioning reads these)."""
        self.editable_logits()

    def derive(self) -> None:
        """This step's logits are final: from here on `dist`, `argmax` and `entropy` are derived from them,
        each when first read and then kept for the step."""
        assert self.logits is not None
        self.dist = Distribution(self.logits)
        self._argmax = self._entropy = self.end_entropy = None

    @property
    def argmax(self) -> Tensor | None:
        """[B, L] the most likely token per position, pins forced."""
        if self._argmax is None and self.dist is not None:
            self._argmax = torch.where(self.rules.pinned[None], self.rules.pin_ids[None], self.dist.mode)
        return self._argmax

    @argmax.setter
    def argmax(self, value: Tensor | None) -> None:
        self._argmax = value
        self.end_entropy = None  # read from this one

    @property
    def entropy(self) -> Tensor | None:
        """[B, L] nats of the processed distribution; 0 at pins (they are certain)."""
        if self._entropy is None and self.dist is not None:
            self._entropy = self.dist.entropy.masked_fill(self.rules.pinned[None], 0.0)
        return self._entropy

    @entropy.setter
    def entropy(self, value: Tensor | None) -> None:
        self._entropy = value
        self.end_entropy = None  # read from this one

    def finish(self, rows: Tensor, reason: str) -> None:
        """Mark `rows` ([B] bool) finished with `reason`, those not finished before only. The device's flags
        change now; the host learns the reasons when it next reads `stop_reason` (one read for every rule
        of a step: on a GPU each read waits for the device)."""
        assert self.finished is not None
        newly = rows & ~self.finished
        self._pending.append((newly, reason))
        self.finished |= newly

    @property
    def stop_reason(self) -> list[str | None]:
        """[B] why each row stopped, None while it runs (read from the device once after `finish`)."""
        if self._pending:
            flags = torch.stack([rows for rows, _ in self._pending]).tolist()
            for row_flags, (_, reason) in zip(flags, self._pending, strict=True):
                for b, flag in enumerate(row_flags):
                    if flag and self._reasons[b] is None:
                        self._reasons[b] = reason
            self._pending = []
        return self._reasons

    @property
    def running(self) -> list[int]:
        """The rows not finished, read from the host (`stop_reason`): no device sync."""
        return [b for b, reason in enumerate(self.stop_reason) if reason is None]


# --- pure helpers -------------------------------------------------------------------------------


def uniform_tokens(
    shape: tuple[int, ...], vocab_size: int, generator: torch.Generator, device: torch.device
) -> Tensor:
    return torch.randint(0, vocab_size, shape, generator=generator, device=device)


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


def pad_after_eos(ids: Tensor, eos_id: int, pad_id: int) -> Tensor:
    end = first_eos(ids, eos_id)
    return ids.masked_fill(~up_to(end, ids.shape[-1]), pad_id)


def mean_free_entropy(
    state: DenoiseState, read: Tensor | None = None, entropy: Tensor | None = None
) -> Tensor:
    """[B] mean entropy (default `state.entropy`) over the positions the sampler decides (pins are known,
    not predicted); where `read` ([B, L] bool) is given, positions outside it count as certain."""
    entropy = state.entropy if entropy is None else entropy
    assert entropy is not None
    entropy = entropy if read is None else entropy * read
    free = state.free.to(entropy.dtype)
    return (entropy * free[None]).sum(dim=-1) / free.sum().clamp(min=1.0)
