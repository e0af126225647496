"""The denoising chain's steps (in the spirit of llama.cpp's sampler chain: each step is small, named, and
keeps its own memory, forgotten by `reset` at the start of every canvas). `build_chain(settings)` builds
the chain a request runs:

    temperature -> mask_logits | sample -> pins -> order_window -> entropy_bound -> renoise
    -> self_conditioning -> stable_and_confident -> eos_confident -> max_steps

Steps before the bar edit the logits (through `DenoiseState.editable_logits` or `scale_logits`: the
denoiser's tensor is borrowed); then the state derives the distribution from them
(`DenoiseState.derive`: probabilities, argmax and entropy, pins forced, each computed once when first
read), and the steps after the bar read those and decide. A step a setting turns off is left out.

Uniform-state diffusion: the canvas starts as uniformly random tokens, each step keeps the positions
the model is sure about (entropy-bound acceptance) and replaces all others with fresh random tokens.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import torch
from torch import Tensor

from dfim.engine.api import SamplerSettings
from dfim.engine.inference.sampler_state import (
    Constraints,
    DenoiseState,
    first_index,
    mean_free_entropy,
    uniform_tokens,
    up_to,
)

NEG_INF = float("-inf")


class Step:
    """One rule of the chain. `apply` runs once per denoising step; `reset` forgets what the step kept
    from an earlier canvas. A step with `edits_logits` changes `state.logits` (through `editable_logits` or
    `scale_logits`) and runs before the chain derives the distribution; every other step must leave the
    logits alone."""

    name = "step"
    edits_logits = False

    def apply(self, state: DenoiseState) -> None:
        raise NotImplementedError

    def reset(self, state: DenoiseState) -> None:
        """The start of a new canvas (`state` is fresh): forget this step's memory."""

    def __repr__(self) -> str:
        return self.name


class Chain:
    """The steps in order: those that edit the logits first, then those that read the distribution."""

    def __init__(self, steps: Sequence[Step]) -> None:
        self.steps = tuple(steps)
        n = next((i for i, step in enumerate(self.steps) if not step.edits_logits), len(self.steps))
        if any(step.edits_logits for step in self.steps[n:]):
            raise ValueError(f"steps that edit the logits must come first: {self.steps}")
        self.logit_steps, self.token_steps = self.steps[:n], self.steps[n:]

    def reset(self, state: DenoiseState) -> None:
        for step in self.steps:
            step.reset(state)

    def __iter__(self) -> Iterator[Step]:
        return iter(self.steps)

    def __repr__(self) -> str:
        return " -> ".join(step.name for step in self.steps)


# --- editing the logits -------------------------------------------------------------------------


def mask_logits(x: Tensor, rules: Constraints, start: int = 0) -> None:
    """In place, on logits `x` [B, n, V] for canvas positions start .. start + n (positions past the
    canvas have no per-position rule): tokens that must never appear get -inf: banned ids everywhere,
    EOS/pad inside inner holes, and everything outside a position's allowed set (token healing)."""
    if rules.banned_ids is not None:
        x.index_fill_(-1, rules.banned_ids, NEG_INF)
    if start == 0 and x.shape[1] == rules.length:
        positions = rules.no_end_positions  # the whole canvas (every denoising step): found once
    else:
        no_end = rules.no_end[start : start + x.shape[1]] if rules.no_end is not None else None
        positions = no_end.nonzero().squeeze(-1) if no_end is not None and bool(no_end.any()) else None
    if positions is not None:
        ends = rules.end_ids
        x[:, positions[:, None], ends[None, :]] = NEG_INF
    for position, allowed in rules.allowed_at.items():
        if start <= position < start + x.shape[1]:
            x[:, position - start].masked_fill_(~allowed, NEG_INF)


class MaskLogits(Step):
    name, edits_logits = "mask_logits", True

    def apply(self, state: DenoiseState) -> None:
        mask_logits(state.editable_logits(), state.rules)


def temperature_at(step: int, max_steps: int, t_min: float, t_max: float) -> float:
    """Linear schedule over the remaining-steps index k = N..1: t_max at the first step."""
    k = max_steps - step + 1
    return t_min + (t_max - t_min) * k / max_steps


class Temperature(Step):
    name, edits_logits = "temperature", True

    def __init__(self, t_min: float, t_max: float, max_steps: int) -> None:
        self.t_min, self.t_max, self.max_steps = t_min, t_max, max_steps

    def apply(self, state: DenoiseState) -> None:
        state.temperature = max(temperature_at(state.step, self.max_steps, self.t_min, self.t_max), 1e-6)
        state.scale_logits(state.temperature)


# --- choosing tokens ----------------------------------------------------------------------------


class Sample(Step):
    """One token drawn per position from the processed distribution (`Distribution.sample`: the inverse
    CDF at one uniform number per position)."""

    name = "sample"

    def apply(self, state: DenoiseState) -> None:
        assert state.dist is not None
        logits = state.dist.logits
        u = torch.rand(logits.shape[:-1], generator=state.generator, device=logits.device, dtype=logits.dtype)
        state.sampled = state.dist.sample(u)


class Pins(Step):
    """Pinned positions hold their token whatever the model says (the argmax and entropy the chain
    derives have the pins forced already: certain, entropy 0)."""

    name = "pins"

    def apply(self, state: DenoiseState) -> None:
        assert state.sampled is not None
        rules = state.rules
        state.sampled = torch.where(rules.pinned[None], rules.pin_ids[None], state.sampled)


class OrderWindow(Step):
    """Left-to-right window (`window` > 0): only free positions before the first one the previous step
    did not accept, plus `window` more, may be accepted now; the rest is renoised.

    Accepting many far-apart positions in one step is where a small model's fills go incoherent (each
    token is chosen without knowing the others: "value_value_value"); a narrow window lets every new
    token see the ones just left of it, the order code is written in, while the model still reads the
    whole canvas and the suffix. 0 leaves every position eligible (the released sampler). Tokens of a
    warm start (a rewrite's old text) stay eligible wherever they are until they are renoised: they
    were written in order already, and the window must not throw them away."""

    name = "order_window"

    def __init__(self, window: int) -> None:
        self.window = window

    def apply(self, state: DenoiseState) -> None:
        if self.window <= 0:
            state.eligible = None
            return
        length = state.canvas.shape[-1]
        free = state.free[None].expand(state.canvas.shape[0], length)
        previous = state.accepted if state.accepted is not None else torch.zeros_like(free)
        open_ = free & ~previous
        index = torch.arange(length, device=free.device).expand_as(free)
        first_open = torch.where(open_, index, length).min(dim=-1, keepdim=True).values  # [B, 1]
        state.eligible = index < first_open + self.window
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


class EntropyBound(Step):
    name = "entropy_bound"

    def __init__(self, bound: float) -> None:
        self.bound = bound

    def apply(self, state: DenoiseState) -> None:
        assert state.entropy is not None
        state.accepted = accept_by_entropy(state.entropy, state.rules.pinned, self.bound, state.eligible)


class Renoise(Step):
    """Accepted positions keep the sampled token; all others get fresh uniform random tokens."""

    name = "renoise"

    def apply(self, state: DenoiseState) -> None:
        assert state.accepted is not None and state.sampled is not None
        shape, device = tuple(state.canvas.shape), state.canvas.device
        noise = uniform_tokens(shape, state.rules.vocab_size, state.generator, device)
        keep = state.accepted | state.rules.pinned[None]
        state.canvas = torch.where(keep, state.sampled, noise)
        if state.seeded is not None:
            state.seeded = state.seeded & keep


class SelfConditioning(Step):
    """This step's temperature-scaled logits condition the next decoder pass."""

    name = "self_conditioning"

    def apply(self, state: DenoiseState) -> None:
        state.self_cond = state.logits


# --- stopping -----------------------------------------------------------------------------------


def end_class(state: DenoiseState, ids: Tensor) -> Tensor:
    """`ids` with every stop token that begins with the stop string read as EOS: they end the text at the
    same place with nothing of their own, so which of them a position holds changes no answer."""
    if state.rules.stop_starts is None:
        return ids
    return torch.where(state.rules.stop_starts[ids], state.rules.eos_id, ids)


def read_entropy(state: DenoiseState) -> Tensor:
    """[B, L] `state.entropy`, except where a row's text ends (`first_end`) if that free position's argmax
    ends it with nothing of its own (EOS, or a stop token that begins with the stop string): there the doubt
    that matters is whether the text ends, not which of those tokens ends it (a newline or three), so they
    count as one outcome. The stop rules read no position past a row's end, so that one position a row is
    all that differs. With log p = (x - x_m) + log p_m as in `Distribution.entropy`:
    H' = H + sum_C p log p - q log q, q = p(C)."""
    if state.end_entropy is None:
        state.end_entropy = _end_entropy(state)
    return state.end_entropy


def _end_entropy(state: DenoiseState) -> Tensor:
    ends = state.rules.ends
    assert state.entropy is not None and state.argmax is not None and state.dist is not None
    if ends is None:
        return state.entropy
    # One position a row, by index: no read of the device to learn which positions (a mask would need one)
    length = state.argmax.shape[-1]
    end = first_end(state)
    at = (torch.arange(end.shape[0], device=end.device), end.clamp(max=length - 1))  # [B], [B]
    applies = (end < length) & ends[state.argmax[at]] & state.free[at[1]]  # [B]
    if applies.device.type == "cpu" and not bool(applies.any()):  # a read costs nothing here: skip the rest
        return state.entropy
    probs, logits, mode = state.dist.probs_at(at), state.dist.logits[at], state.dist.mode[at]  # [B, V].. [B]
    top = mode.unsqueeze(-1)
    shifted = logits - logits.gather(-1, top)
    in_class = ends.to(probs.dtype)
    q = (probs * in_class).sum(dim=-1)
    plogp = torch.nansum(probs * shifted * in_class, dim=-1) + q * torch.log(
        probs.gather(-1, top).squeeze(-1)
    )
    entropy = state.entropy.clone()
    merged = (entropy[at] + plogp - q * torch.log(q.clamp(min=1e-30))).clamp(min=0)
    entropy[at] = torch.where(applies, merged, entropy[at])
    return entropy


def first_end(state: DenoiseState) -> Tensor:
    """[B] index of the first position where the text ends (EOS or a stop token), L where none does."""
    assert state.argmax is not None
    ends = state.argmax == state.rules.eos_id
    if state.rules.stop_tokens is not None:
        ends |= state.rules.stop_tokens[state.argmax]
    return first_index(ends)


class StableAndConfident(Step):
    """Stop a row once its argmax canvas equals the previous `need` argmax canvases and the mean entropy
    over its free positions is below `threshold`. Positions after the text's end (its first EOS, or a
    stop token of the request) count as settled: the commit cuts them off, so their churn and doubt cannot
    change the answer. Memory: the last `need` argmax canvases (a start from text counts as one)."""

    name = "stable_and_confident"

    def __init__(self, need: int, threshold: float) -> None:
        self.need, self.threshold = need, threshold
        self.history: list[Tensor] = []

    def reset(self, state: DenoiseState) -> None:
        self.history = [] if state.previous is None else [state.previous]

    def apply(self, state: DenoiseState) -> None:
        assert state.argmax is not None and state.finished is not None
        need = self.need
        read = up_to(first_end(state), state.argmax.shape[-1])
        if need == 0:
            stable = torch.ones_like(state.finished)
        elif len(self.history) < need:
            stable = torch.zeros_like(state.finished)
        else:
            now = end_class(state, state.argmax)
            same = [(end_class(state, h) == now) | ~read for h in self.history[-need:]]
            stable = torch.stack([s.all(dim=-1) for s in same]).all(dim=0)
        self.history = (self.history + [state.argmax])[-max(need, 1) :]
        doubt = mean_free_entropy(state, read, read_entropy(state))
        state.checks["stable"], state.checks["doubt"] = stable, doubt
        state.finish(stable & (doubt < self.threshold), "stable")


class EosConfident(Step):
    """Stop a row once every token up to and including the one that ends its text (its first EOS, or a
    stop token such as a newline in a single-line fill) is accepted and confident (entropy below
    `threshold`): what follows is padding or text the stop cuts off, which nobody reads, so waiting for
    it to settle too would only spend steps."""

    name = "eos_confident"

    def __init__(self, threshold: float) -> None:
        self.threshold = threshold

    def apply(self, state: DenoiseState) -> None:
        assert state.argmax is not None and state.accepted is not None
        length = state.argmax.shape[-1]
        end = first_end(state)
        span = up_to(end, length)
        ok = (state.accepted & (read_entropy(state) < self.threshold)) | ~span
        done = (end < length) & ok.all(dim=-1)
        state.checks["end_settled"] = done
        at_end = state.argmax.gather(1, end.clamp(max=length - 1)[:, None])[:, 0]
        state.finish(done & (at_end == state.rules.eos_id), "eos_confident")
        state.finish(done, "stop_confident")


class MaxSteps(Step):
    name = "max_steps"

    def __init__(self, max_steps: int) -> None:
        self.max_steps = max_steps

    def apply(self, state: DenoiseState) -> None:
        assert state.finished is not None
        if state.step >= self.max_steps:
            state.finish(torch.ones_like(state.finished), "max_steps")


def build_chain(settings: SamplerSettings) -> Chain:
    """The chain a request's settings ask for, with fresh memories. Without early stopping the two stop
    rules are left out (the stable rule's memory is only read to stop); a window of 0 and self-conditioning
    off leave their steps out (every position eligible, nothing fed back)."""
    # the temperature first: it copies the denoiser's logits as it scales them (one pass), and -inf / t is -inf
    steps: list[Step] = [
        Temperature(settings.t_min, settings.t_max, settings.max_steps),
        MaskLogits(),
        Sample(),
        Pins(),
    ]
    if settings.window > 0:
        steps.append(OrderWindow(settings.window))
    steps += [EntropyBound(settings.entropy_bound), Renoise()]
    if settings.self_conditioning:
        steps.append(SelfConditioning())
    if settings.early_stop:
        steps += [
            StableAndConfident(settings.stability_threshold, settings.confidence_threshold),
            EosConfident(settings.confidence_threshold),
        ]
    steps.append(MaxSteps(settings.max_steps))
    return Chain(steps)
