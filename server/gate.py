"""Silence when unsure: whether an inline suggestion is shown, from the fill's own confidence.

A wrong suggestion costs the user a look and a dismissal; a right one saves typing. With +0.75 per accept
and -0.25 per shown reject (the trade Cursor trained for), a suggestion is worth showing when it is
accepted at least a quarter of the time. The engine summarizes how sure the canvas was of the text it
returns (dfim.engine.api.FillConfidence, no extra model pass); the gate reads one measure of that summary,
a probability in (0, 1], and hides the suggestion below `inline.gate.threshold`. The default measure and
threshold were calibrated on a development set of code none of the benchmarks use
(scripts/calibrate_gate.py, docs/decisions.md).

The gate judges the first item, the one an editor shows as ghost text: the others only ever appear when
the user cycles. Suggestions served again from the result cache are judged again, with the confidence the
fill had (`ConfidenceMemory`), so that a changed setting applies to them too; typed-ahead continuations of
a suggestion already shown are never hidden.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from dfim.engine.api import FillConfidence, FillRequest, FillResult

ACCEPT_REWARD = 0.75  # per accepted suggestion
REJECT_COST = 0.25  # per shown suggestion rejected

# Each measure is a probability in (0, 1], so that one threshold scale serves them all.
MEASURES: dict[str, Callable[[FillConfidence], float]] = {
    # the geometric mean of the written tokens' probabilities
    "mean_probability": lambda c: math.exp(c.mean_logprob),
    # the least likely written token
    "min_probability": lambda c: math.exp(c.min_logprob),
    # exp(-entropy), mean over the tokens (TokenScore.confidence's scale)
    "mean_confidence": lambda c: math.exp(-c.mean_entropy),
    # exp(-entropy) of the most uncertain position
    "min_confidence": lambda c: math.exp(-c.max_entropy),
}


def reward(accepted: int, shown: int) -> float:
    """The reward of `shown` suggestions of which `accepted` were taken."""
    return ACCEPT_REWARD * accepted - REJECT_COST * (shown - accepted)


def score(confidence: FillConfidence | None, measure: str) -> float | None:
    """The gate's measure of a fill's confidence; None without a summary (nothing was predicted)."""
    return None if confidence is None else MEASURES[measure](confidence)


def passes(value: float | None, threshold: float) -> bool:
    """Whether a suggestion of measure `value` is shown at `threshold`: one with no summary has nothing
    for the gate to judge (it was all given), so it passes."""
    return value is None or value >= threshold


@dataclass(frozen=True)
class Verdict:
    """The gate's decision on one suggestion, and what telemetry and `dfim/stats` report of it."""

    show: bool
    score: float | None  # the measure; None: no summary
    measure: str
    confidence: FillConfidence | None

    def fields(self) -> dict[str, Any]:
        """Telemetry fields (camelCase, like the rest of an event): the measure and the whole summary,
        so that `dfim stats` can ask what another threshold or measure would have shown."""
        if self.confidence is None:
            return {}
        c = self.confidence
        return {
            "gateScore": round(self.score, 5) if self.score is not None else None,
            "confidence": {
                "tokens": c.tokens,
                "meanLogprob": round(c.mean_logprob, 5),
                "minLogprob": round(c.min_logprob, 5),
                "meanEntropy": round(c.mean_entropy, 5),
                "maxEntropy": round(c.max_entropy, 5),
            },
        }


def judge(confidence: FillConfidence | None, enabled: bool, measure: str, threshold: float) -> Verdict:
    """Show or hide a suggestion of this confidence. Off, the gate shows everything but still scores it
    (telemetry and replay then tell what it would have hidden)."""
    value = score(confidence, measure)
    return Verdict(
        show=not enabled or passes(value, threshold), score=value, measure=measure, confidence=confidence
    )


def hidden_reason(verdict: Verdict, threshold: float) -> str:
    """One line for a status bar: why the gate hid a suggestion (a hidden one always has a score)."""
    return f"unsure: {verdict.measure} {verdict.score:.3f} < {threshold:g}"


class LastFill:
    """Wraps an inline request's fill function and keeps the last result: the fill whose candidates
    `fill_until_shown` ranked (it stops at the first fill that leaves something to show)."""

    def __init__(self, fill_once: Callable[[FillRequest], Awaitable[FillResult | None]]) -> None:
        self.fill_once = fill_once
        self.last: FillResult | None = None

    async def __call__(self, request: FillRequest) -> FillResult | None:
        result = await self.fill_once(request)
        if result is not None:
            self.last = result
        return result


def confidence_of(
    first: str, result: FillResult | None, clean: Callable[[str], str | None]
) -> FillConfidence | None:
    """The confidence of the candidate that became the first shown text `first`: the best one unless
    post-processing dropped or demoted it (then an alternative's). `clean` is post-processing of one raw
    candidate (None when it drops it)."""
    if result is None:
        return None
    # strict=False: a result built without per-alternative summaries falls back to the best one's
    pairs = [
        (result.text, result.confidence),
        *zip(result.alternatives, result.alternative_confidence, strict=False),
    ]
    if len(pairs) > 1:
        for raw, confidence in pairs:
            if clean(raw) == first:
                return confidence
    return result.confidence


class ConfidenceMemory:
    """The confidence of each cached result (keyed as the result cache), so a cache hit is judged as the
    fill was: an LRU as big as the result cache."""

    def __init__(self, size: int = 256) -> None:
        self.size = size
        self._items: OrderedDict[str, FillConfidence | None] = OrderedDict()

    def get(self, key: str) -> FillConfidence | None:
        value = self._items.get(key)
        if key in self._items:
            self._items.move_to_end(key)
        return value

    def put(self, key: str, confidence: FillConfidence | None) -> None:
        if self.size <= 0:
            return
        self._items[key] = confidence
        self._items.move_to_end(key)
        while len(self._items) > self.size:
            self._items.popitem(last=False)


class GateLog:
    """The last verdict, numbered, for `dfim/stats` (benchmarks such as `dfim replay` read whether the request
    they just sent was scored and hidden), and how many suggestions the gate hid."""

    def __init__(self) -> None:
        self.seq = 0
        self.hidden = 0
        self.last: dict[str, Any] | None = None

    def note(self, uri: str, verdict: Verdict) -> None:
        self.seq += 1
        self.hidden += not verdict.show
        self.last = {"seq": self.seq, "uri": uri, "shown": verdict.show, **verdict.fields()}

    def to_json(self) -> dict[str, Any]:
        return {"seq": self.seq, "hidden": self.hidden, "last": self.last}


def screen(
    ls, uri: str, candidates: list[str], confidence: FillConfidence | None, invoked: bool = False
) -> tuple[list[str], Verdict | None]:
    """The candidates to show for an inline request (none when the gate hides the first) and the verdict
    (None when there was nothing to judge). Records the verdict on the server (`ls.gate_log`) and a
    hidden suggestion in telemetry. An `invoked` request (the user asked: triggerKind Invoked) is scored
    but never hidden: the gate keeps unasked-for ghost text quiet, and one who asks wants an answer."""
    if not candidates:
        return candidates, None
    options = ls.options.inline.gate
    # An untrained checkpoint (tests, smoke runs) is unsure of everything: gated, it would never show a thing.
    enabled = options.enabled and not ls.status.status.is_random and not invoked
    verdict = judge(confidence, enabled, options.measure, options.threshold)
    ls.gate_log.note(uri, verdict)
    hidden = None if verdict.show else hidden_reason(verdict, options.threshold)
    if ls.status.status.last_hidden != hidden:  # the status bar says when the server chose silence
        ls.status.update(last_hidden=hidden)
    if verdict.show:
        return candidates, verdict
    doc = ls.docs.get(uri)
    language = doc.language_id if doc is not None else ""
    ls.tracker.telemetry.record("hidden", language=language, chars=len(candidates[0]), **verdict.fields())
    return [], verdict


# ---- accounting: what showing, or gating, a set of suggestions earned ------------------------------------


@dataclass(frozen=True)
class Outcome:
    """One suggestion that was (or, with the gate off, would be) shown, and what became of it."""

    score: float | None  # the gate's measure
    accepted: bool  # taken whole or in part (as `dfim replay` and telemetry count an accept)
    accepted_chars: int


def tally(outcomes: list[Outcome], threshold: float | None = None) -> dict[str, Any]:
    """Shown, accepted, acceptance rate, characters saved and reward of the suggestions a gate at
    `threshold` lets through (None: all of them, the gate off)."""
    kept = [o for o in outcomes if threshold is None or passes(o.score, threshold)]
    accepted = sum(o.accepted for o in kept)
    return {
        "shown": len(kept),
        "accepted": accepted,
        "acceptance_rate": accepted / len(kept) if kept else None,
        "accepted_chars": sum(o.accepted_chars for o in kept),
        "reward": reward(accepted, len(kept)),
    }


def summary_from_json(value: Any) -> FillConfidence | None:
    """A `confidence` object of telemetry or a replay report (`Verdict.fields`) back as a summary; None when
    absent or malformed."""
    if not isinstance(value, dict):
        return None
    try:
        return FillConfidence(
            tokens=int(value["tokens"]),
            mean_logprob=float(value["meanLogprob"]),
            min_logprob=float(value["minLogprob"]),
            mean_entropy=float(value["meanEntropy"]),
            max_entropy=float(value["maxEntropy"]),
        )
    except (KeyError, TypeError, ValueError, OverflowError):
        return None


def telemetry_report(events: list[dict], measure: str, threshold: float) -> dict[str, Any]:
    """`dfim stats`'s account of the gate: the suggestions shown that have an outcome, as shown and as a
    gate of `measure` >= `threshold` would have let them through, and how many the gate hid when they
    were asked (their outcome is unknown: the user never saw them). The last outcome of each suggestion
    counts, as in `telemetry.summarize`; accepted means taken whole or in part."""
    scores: dict[str, float | None] = {}
    outcome: dict[str, tuple[bool, int]] = {}
    hidden = 0
    for event in events:
        kind, key = event.get("event"), event.get("id")
        if kind == "hidden":
            hidden += 1
        elif kind == "shown" and isinstance(key, str):
            scores[key] = score(summary_from_json(event.get("confidence")), measure)
        elif kind in ("accepted", "partial", "rejected") and isinstance(key, str):
            chars = event.get("acceptedChars")
            chars = int(chars) if isinstance(chars, int | float) and not isinstance(chars, bool) else 0
            outcome[key] = (kind != "rejected", chars if kind != "rejected" else 0)
    outcomes = [Outcome(scores[key], *outcome[key]) for key in scores if key in outcome]
    return {
        "measure": measure,
        "threshold": threshold,
        "hidden": hidden,
        "as_shown": tally(outcomes),
        "gated": tally(outcomes, threshold),
    }
