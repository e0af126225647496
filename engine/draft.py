"""The encoder's draft: a canvas that starts from text instead of noise.

DiffusionGemma's encoder reads the context causally, and ours was trained with a next-token loss on it
(the context LM loss, `engine.train --context-lm-weight`): read as a causal LM it continues the prefix,
with the suffix in view, since the FIM layout puts the suffix first. A greedy continuation costs one
one-token pass over the cached context per token, a few milliseconds on a CPU against tens for a
denoising step over a whole canvas.

The draft seeds the first candidate's canvas as a warm start (`SamplerSettings.draft`). Nothing about
it is trusted: the denoiser reads it whole, bidirectionally, with the suffix and the code after the
line, and the sampler chain treats it as any canvas. Where its argmax reproduces the draft and it is
confident, the fill stops after one step (`stable_and_confident` compares the first step with the
draft); elsewhere it keeps the positions it is sure of and renoises the rest, as it would any canvas.

Why continue the prefix, and not decode after `<fim_middle>`: the context LM loss trains each context
token to predict the next one, and `<fim_middle>` only the middle's first token. After that the
encoder never learnt to go on (a greedy decode there writes garbage), while the prefix's own text,
continued, is exactly what it was trained on.
"""

from __future__ import annotations

import dataclasses

import torch

from engine import autoregressive
from engine.api import FillRequest
from engine.cache import ContextCache
from engine.canvas import CanvasPlan
from engine.tokenizer import Tokenizer


def can_draft(plan: CanvasPlan, request: FillRequest) -> bool:
    """Only a single open hole that a stop string ends (a single-line fill) is drafted. The encoder cannot
    see pinned text after the cursor (the skeleton is the canvas's alone); a rewrite's warm start already
    seeds its canvas; and continuing the prefix it never writes EOS (the context it was trained on has
    none), so a several-line draft would run to the end of the canvas with no idea where the hole ends."""
    return bool(request.stop) and plan.warm_ids is None and not any(plan.pinned) and len(plan.context_ids) > 1


def draft_canvas(
    cache: ContextCache, plan: CanvasPlan, request: FillRequest, banned: torch.Tensor, tokenizer: Tokenizer
) -> list[int]:
    """The canvas [L] the draft seeds: the greedy continuation of the prefix (at most the canvas long, cut
    after a stop string as the fill would be), then EOS where it ended, then pad. The cache holds the
    context without `<fim_middle>` afterwards (the fill's `prepare` adds it back: one token)."""
    prefix_end = dataclasses.replace(plan, context_ids=plan.context_ids[:-1])
    quiet = dataclasses.replace(request, on_step=None)  # progress reports belong to the denoising steps
    out = autoregressive.decode(cache, prefix_end, quiet, banned, tokenizer, budget=plan.length)
    ids = [token for token, _, _ in out.tokens][: plan.length]
    if len(ids) < plan.length:
        ids.append(tokenizer.eos_id)
    return ids + [tokenizer.pad_id] * (plan.length - len(ids))
