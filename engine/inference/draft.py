"""The encoder's draft: a canvas that starts from text instead of noise.

DiffusionGemma's encoder reads the context causally, and ours was trained with a next-token loss on it
(`dfim.engine.training.train --context-lm-weight` or `--causal-weight`): read as a causal LM it writes the middle,
with the suffix in view, since the FIM layout puts the suffix first. A greedy continuation costs one
one-token pass over the cached context per token, a few milliseconds on a CPU against tens for a
denoising step over a whole canvas.

The draft seeds the first candidate's canvas as a warm start (`SamplerSettings.draft`). Nothing about
it is trusted: the denoiser reads it whole, bidirectionally, with the suffix and the code after the
line, and the sampler chain treats it as any canvas. Where its argmax reproduces the draft and it is
confident, the fill stops after one step (`stable_and_confident` compares the first step with the
draft); elsewhere it keeps the positions it is sure of and renoises the rest, as it would any canvas.

Where the draft starts (`SamplerSettings.draft_from`, set by the checkpoint's `dfim.json`):
- "prefix": continue the prefix's own text. That is all a context LM loss teaches: each context token
  predicts the next one, and `<fim_middle>` only the middle's first token, so a greedy decode after it
  writes garbage. Continuing the prefix, the encoder never writes EOS; the draft ends at a stop string
  or where it leaves the hole (`hole_end`).
- "middle": decode after `<fim_middle>`, as an AR FIM model does, until its own EOS. For a checkpoint
  trained with the AR FIM loss over the whole middle (`dfim.engine.training.train --causal-weight`, dfim-small version
  6 on): it knows where the middle ends, and writes it knowing that a suffix follows (decision 40).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from dfim.engine.api import FillRequest
from dfim.engine.inference import autoregressive
from dfim.engine.inference.cache import ContextCache
from dfim.engine.inference.canvas import CanvasPlan, assemble_text, bucket_length
from dfim.engine.model.tokenizer import Tokenizer


def can_draft(plan: CanvasPlan, request: FillRequest) -> bool:
    """Only a single open hole is drafted: the encoder cannot see pinned text after the cursor (the skeleton
    is the canvas's alone), and a rewrite's warm start already seeds its canvas."""
    return plan.warm_ids is None and not any(plan.pinned) and len(plan.context_ids) > 1


def hole_end(text: str, prefix: str, suffix: str) -> int | None:
    """Where a several-line draft has left the hole: the offset of the line break before the first complete
    line that repeats the suffix's first non-blank line (it has reached the code after the hole), or that is
    indented less than the line the hole starts on (it has left the hole's block). Continuing the prefix,
    the encoder never writes EOS (the context it was trained on has none): this is how a draft ends."""
    target = next((line.strip() for line in suffix.split("\n") if line.strip()), "")
    first = prefix[prefix.rfind("\n") + 1 :]
    base = len(first) - len(first.lstrip(" \t"))
    start = 0
    while True:
        brk = text.find("\n", start)
        end = text.find("\n", brk + 1) if brk >= 0 else -1
        if end < 0:
            return None  # no complete line after a break yet
        line = text[brk + 1 : end]
        if line.strip() and (line.strip() == target or len(line) - len(line.lstrip(" \t")) < base):
            return brk
        start = brk + 1


@dataclass
class Draft:
    """The canvas the draft seeds, and how sure the encoder was of each token it wrote."""

    ids: list[int]  # [L]: the text, then EOS where it ended (unless it filled the canvas), then pad
    confidence: list[float]  # [L]: the greedy token's probability; 0 where the encoder wrote nothing


def draft_canvas(
    cache: ContextCache, plan: CanvasPlan, request: FillRequest, banned: torch.Tensor, tokenizer: Tokenizer
) -> Draft:
    """The canvas [L] the draft seeds: the greedy continuation of the prefix (at most the canvas long, cut
    after a stop string as the fill would be, or where it leaves the hole), then EOS where it ended, then
    pad. A prefix draft leaves the cache holding the context without `<fim_middle>`; that token's keys and
    values are parked in it (computed in the draft's first pass), and the fill's `prepare` writes them
    back. A middle draft leaves the whole context."""
    quiet = dataclasses.replace(request, on_step=None)  # progress reports belong to the denoising steps
    ends = None if request.stop else (lambda text: hole_end(text, request.prefix, request.suffix) is not None)
    if request.settings.draft_from == "middle":  # the AR FIM decode: it ends at its own EOS
        start, park = plan, []
    else:  # continue the prefix; `<fim_middle>` is parked for the fill's `prepare`
        start, park = dataclasses.replace(plan, context_ids=plan.context_ids[:-1]), plan.context_ids[-1:]
    out = autoregressive.decode(
        cache, start, quiet, banned, tokenizer, budget=plan.length, ends=ends, park=park, avoid=request.avoid
    )
    tokens = out.tokens[: plan.length]
    if ends is not None:  # keep the tokens before the line break where the draft left the hole
        text, _ = assemble_text(tokens, tokenizer, plan.heal_bytes)
        cut = hole_end(text, request.prefix, request.suffix)
        while cut is not None and tokens and len(assemble_text(tokens, tokenizer, plan.heal_bytes)[0]) > cut:
            tokens = tokens[:-1]
    ids = [token for token, _, _ in tokens]
    if len(ids) < plan.length:
        ids.append(tokenizer.eos_id)
    rest = plan.length - len(ids)
    confidence = [conf for _, conf, _ in tokens] + [0.0] * (plan.length - len(tokens))
    return Draft(ids + [tokenizer.pad_id] * rest, confidence)


def fit_canvas(plan: CanvasPlan, seed: Draft, eos_id: int, limit: int) -> tuple[CanvasPlan, Draft]:
    """The smallest canvas bucket that holds the draft and its EOS, and the draft cut to it. A denoising
    step costs by canvas rows (on the 2-core CPU ~24 ms for 16, ~31 ms for 32: a line asks for 32), and a
    line the denoiser confirms needs no room after its end; one it rewrites longer runs on into a further
    canvas, as any open hole does. Only for a plan `can_draft` accepts (one open hole, nothing pinned)."""
    used = seed.ids.index(eos_id) + 1 if eos_id in seed.ids else len(seed.ids)
    length = bucket_length(used, limit)
    if length >= plan.length:
        return plan, seed
    cut = dataclasses.replace(
        plan,
        length=length,
        pinned=plan.pinned[:length],
        pin_ids=plan.pin_ids[:length],
        no_end=plan.no_end[:length],
    )
    return cut, Draft(seed.ids[:length], seed.confidence[:length])
