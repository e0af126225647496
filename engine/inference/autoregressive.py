"""Autoregressive fill with a causal checkpoint: the same-size AR baseline of the evaluation.

A checkpoint trained with `dfim.engine.training.train --objective causal` (its `dfim.json` says
`"objective": "causal"`) is the DiffusionGemma network read as a causal LM over
`<bos><fim_suffix>suffix<fim_prefix>prefix<fim_middle>middle<eos>`. `Engine` sends its requests
here instead of to the denoising loop, so `dfim fill`, `dfim eval`, `dfim replay` and the server
all compare the two objectives through the same interface.

Decoding is greedy, one token per network pass, over the engine's `ContextCache`: the context is
cached once (the prefix-sharing reuse works exactly as for diffusion), the generated tokens are
appended to it while decoding and cut off again afterwards. The middle skeleton of a request is
honoured position by position: pinned tokens are forced, free positions are decoded, inner holes
cannot end, the open hole ends at the first EOS.

A backend of the denoising chain's rules, not a copy of them: the request's `Constraints` are built as
for a canvas (pins, banned tokens, inner holes, token healing), the chain's `mask_logits` masks each
position's logits, and the choice is read off the same `Distribution` (`pick`). What does not apply:
- temperature: decoding is greedy, and a temperature moves no argmax; the confidence reported with each
  token (the draft's seed confidence) stays the plain probability, as before;
- sampling, entropy-bound acceptance, renoising, self-conditioning and the stable/confident stops: one
  token is final once written, there is no canvas to revise or to watch settle;
- stop tokens: the text is on hand after every token, so a stop string is looked for in it
  (`_reached_stop`), which also sees one split over two tokens; the stop-token mask cannot.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from dfim.engine.api import FillCancelled, FillRequest, StepInfo
from dfim.engine.inference import lookup
from dfim.engine.inference.cache import ContextCache
from dfim.engine.inference.canvas import CanvasPlan, assemble_text, cut_at_stop
from dfim.engine.inference.sampler_state import Constraints, Distribution, plan_constraints
from dfim.engine.inference.sampler_steps import mask_logits
from dfim.engine.model.tokenizer import Tokenizer


@dataclass
class Decoded:
    tokens: list[tuple[int, float, bool]]  # (id, confidence, pinned) of the text, EOS excluded
    steps: int  # network passes after the context
    reason: str  # "eos": the model ended the text; "stop": a stop string did; "max_tokens": the budget


def constraints(plan: CanvasPlan, banned: torch.Tensor, eos_id: int, pad_id: int) -> Constraints:
    """The plan's constraints for a causal decode: those of a canvas, with pad banned everywhere too (a
    causal model ends its text with EOS, never pad). No stop tokens: see the module's docstring."""
    banned = banned.clone()
    banned[pad_id] = True
    return plan_constraints(plan, banned, eos_id=eos_id, pad_id=pad_id)


def pick(logits: torch.Tensor, rules: Constraints, position: int) -> Distribution:
    """The masked distribution of the next token, at canvas `position` (past the plan's canvas only the
    open hole goes on: no rule but the banned tokens); its `top` is the greedy choice."""
    x = logits.clone()
    mask_logits(x[None, None], rules, start=position)
    return Distribution(x)


def decode(
    cache: ContextCache,
    plan: CanvasPlan,
    request: FillRequest,
    banned: torch.Tensor,
    tokenizer: Tokenizer,
    budget: int | None = None,
    ends: Callable[[str], bool] | None = None,
    park: Sequence[int] = (),
    lookahead: int = lookup.LOOKAHEAD,
    avoid: Sequence[str] = (),
) -> Decoded:
    """Greedy decoding of the middle after `plan.context_ids`; the cache holds the context again after.
    `budget`: at most this many tokens (default: the request's `max_tokens`, or the plan if longer).
    `ends(text)`: True once the text so far is complete (as a stop string would end it).
    `park`: tokens the cache will need after the context later (see `ContextCache.next_logits`).
    `lookahead`: tokens guessed per pass (`dfim.engine.inference.lookup`; 0: one token per pass). Guesses change the
    cost, never the tokens: each is kept only where the greedy choice agrees with it.
    `avoid`: texts not to write again (`FillRequest.avoid`): until the text has left all of them, a token
    that would follow one of them at a word (or end the text where one ends) gives way to the next most
    likely token; whitespace may follow them (the indentation is rarely what was wrong)."""
    eos_id, pad_id = tokenizer.eos_id, tokenizer.pad_id
    context = plan.context_ids
    recent = cache.recent_for(context)
    logits = cache.next_logits(context, park)
    budget = max(request.max_tokens, plan.length) if budget is None else budget
    rules = constraints(plan, banned, eos_id, pad_id)
    needles = [s.encode("utf-8") for s in request.stop if s]
    tokens: list[tuple[int, float, bool]] = []
    # Guessed tokens the cache already holds after the text so far, and the logits after each of them.
    guess: list[int] = []
    ahead: list[torch.Tensor] = []
    reason, passes = "max_tokens", 0
    try:
        for p in range(budget):
            if request.cancel is not None and request.cancel():
                raise FillCancelled("fill cancelled")
            # The pins rule (read off the plan's list: no device read per token): known, and certain.
            if p < plan.length and plan.pinned[p]:
                token, conf, pinned = plan.pin_ids[p], 1.0, True
            else:
                dist = pick(logits, rules, p)
                conf_t, token_t = dist.top
                token, conf, pinned = int(token_t), float(conf_t), False
                if avoid:
                    token, conf, avoid = _leave_avoided(
                        dist.probs, tokens, avoid, tokenizer, plan.heal_bytes, request.stop
                    )
            if token == eos_id:
                reason = "eos"
                break
            tokens.append((token, conf, pinned))
            if request.stop and not pinned and _reached_stop(tokens, tokenizer, plan, request.stop):
                reason = "stop"  # the rest would be cut anyway: stop paying for it
                break
            if ends is not None and ends(assemble_text(tokens, tokenizer, plan.heal_bytes)[0]):
                reason = "stop"
                break
            if request.on_step is not None:
                ids = [t for t, _, _ in tokens]
                request.on_step(StepInfo(p + 1, budget, 1, budget, 0.0, tokenizer.decode(ids), token_ids=ids))
            if p + 1 >= budget:
                break
            if guess and guess[0] == token:  # the cache holds it already, and the logits after it
                guess.pop(0)
                logits = ahead.pop(0)
                continue
            if guess:  # wrong from here on: forget the guessed tokens the cache holds
                cache.truncate(len(cache) - len(guess))
            written = [t for t, _, _ in tokens]
            # Guessed tokens take positions p+1.. and need logits after them inside the budget.
            guess = lookup.propose(list(context) + written, recent, min(lookahead, budget - p - 2))
            guess = lookup.cut_after_stop(guess, tokenizer.bytes_table, needles)
            out = cache.step([token, *guess])
            logits, ahead = out[0], list(out[1:])
            passes += 1
    finally:
        cache.recent, cache.recent_after = [t for t, _, _ in tokens], len(context)
        cache.prepare(context)  # drop the generated tokens: the next request shares the context only
    return Decoded(tokens, passes + 1, reason)


def _leave_avoided(
    probs: torch.Tensor,
    tokens: list[tuple[int, float, bool]],
    avoid: Sequence[str],
    tokenizer: Tokenizer,
    heal_bytes: bytes,
    stop: Sequence[str],
) -> tuple[int, float, Sequence[str]]:
    """(token, probability, what is still to avoid) for the next token after `tokens`: the most likely one
    that does not follow an avoided text at a word or end the text where one ends (see `decode`). Texts
    are compared as the result reads, token healing undone. Once a word has left all of them nothing is
    avoided any more; when the 16 likeliest all follow one, the likeliest is taken."""
    top = torch.topk(probs, min(16, probs.numel()))
    for p, t in zip(top.values.tolist(), top.indices.tolist(), strict=True):
        if p <= 0.0:
            break
        if t == tokenizer.eos_id:
            written, ends = assemble_text(tokens, tokenizer, heal_bytes)[0], True
        else:
            whole = assemble_text([*tokens, (t, p, False)], tokenizer, heal_bytes)[0]
            written = cut_at_stop(whole, tuple(stop))
            ends = written != whole
        if ends:
            if any(a.strip() == written.strip() for a in avoid):
                continue
            return t, p, ()
        if not written.strip():
            return t, p, avoid  # nothing but whitespace yet: still on the avoided texts' track
        if any(a.lstrip().startswith(written.lstrip()) for a in avoid):
            continue
        return t, p, ()
    return int(top.indices[0]), float(top.values[0]), avoid


def _reached_stop(
    tokens: list[tuple[int, float, bool]], tokenizer: Tokenizer, plan: CanvasPlan, stop
) -> bool:
    """Whether the text so far (as the result will read: healing undone) contains a stop string."""
    text, _ = assemble_text(tokens, tokenizer, plan.heal_bytes)
    return any(s and s in text for s in stop)
