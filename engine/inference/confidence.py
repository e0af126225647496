"""A fill's confidence summary: how sure the canvas was of the text it returns.

The denoiser's last step leaves a distribution at every canvas position; the sampler already keeps its
entropy (TokenScore.confidence = exp(-entropy)) and the log-probability of the token committed there
(TokenScore.logprob). A summary over the tokens of the returned text costs a pass over a few dozen floats,
not a model pass. Only the tokens that reach the text count: a single-line fill is cut at its first line
break, and what the canvas wrote after it (often a confident EOS, or junk it never committed to) says
nothing about the line shown. Pins are given, not predicted, so they are left out too.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from dfim.engine.api import FillConfidence, TokenScore

MIN_CONFIDENCE = 1e-30  # exp(-entropy) of a flat distribution over a big vocabulary still exceeds this


def shown_tokens(text: str, scores: Sequence[TokenScore]) -> list[TokenScore]:
    """The predicted tokens whose text starts inside `text`: `scores` spell the uncut text (the engine cuts
    `text` at a stop string), so a token that starts at or after its end was never shown."""
    out: list[TokenScore] = []
    position = 0
    for score in scores:
        if position >= len(text):
            break
        if not score.pinned:
            out.append(score)
        position += len(score.text)
    return out


def summarize(text: str, scores: Sequence[TokenScore]) -> FillConfidence | None:
    """The confidence summary of the tokens of `text` (see `shown_tokens`); None when none was predicted."""
    tokens = shown_tokens(text, scores)
    if not tokens:
        return None
    logprobs = [min(0.0, s.logprob) for s in tokens]
    entropies = [-math.log(max(s.confidence, MIN_CONFIDENCE)) for s in tokens]
    return FillConfidence(
        tokens=len(tokens),
        mean_logprob=sum(logprobs) / len(logprobs),
        min_logprob=min(logprobs),
        mean_entropy=sum(entropies) / len(entropies),
        max_entropy=max(entropies),
    )
