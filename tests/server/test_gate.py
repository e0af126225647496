"""The confidence gate (server/gate.py): measures, the decision, which candidate's confidence it reads,
the cache's memory of confidences, and the reward accounting `dfim replay` and `dfim stats` report."""

from __future__ import annotations

import asyncio
import dataclasses
import math

import pytest

from dfim.engine.api import FillConfidence, FillRequest, FillResult
from dfim.server import gate, options


def conf(
    mean_p: float, min_p: float | None = None, mean_h: float = 0.1, max_h: float = 0.5
) -> FillConfidence:
    return FillConfidence(
        tokens=3,
        mean_logprob=math.log(mean_p),
        min_logprob=math.log(min_p if min_p is not None else mean_p),
        mean_entropy=mean_h,
        max_entropy=max_h,
    )


def result(text: str, confidence: FillConfidence | None, alternatives=()) -> FillResult:
    alts = [a for a, _ in alternatives]
    return FillResult(
        text, 1, 32, 3, 0, 0, 1.0, "stable",
        alternatives=alts,
        confidence=confidence,
        alternative_confidence=[c for _, c in alternatives],
    )  # fmt: skip


def test_every_measure_the_settings_offer_exists_and_is_a_probability():
    choices = {f.name: f.metadata for f in dataclasses.fields(options.GateOptions)}["measure"]["choices"]
    assert set(choices) == set(gate.MEASURES)
    c = conf(0.5, 0.1, mean_h=0.7, max_h=2.0)
    values = {name: gate.score(c, name) for name in gate.MEASURES}
    assert values["mean_probability"] == pytest.approx(0.5) and values["min_probability"] == pytest.approx(
        0.1
    )
    assert values["mean_confidence"] == pytest.approx(math.exp(-0.7))
    assert all(0.0 < v <= 1.0 for v in values.values())


def test_the_gate_hides_below_its_threshold_and_never_when_off():
    sure, unsure = conf(0.9), conf(0.05)
    assert gate.judge(sure, True, "mean_probability", 0.25).show
    hidden = gate.judge(unsure, True, "mean_probability", 0.25)
    assert not hidden.show and hidden.score == pytest.approx(0.05)
    off = gate.judge(unsure, False, "mean_probability", 0.25)
    assert off.show and off.score == pytest.approx(0.05)  # still scored: telemetry tells what it would hide
    # the threshold is inclusive, 0 shows everything, 1 only what is certain
    assert gate.judge(conf(0.25), True, "mean_probability", 0.25).show
    assert gate.judge(conf(0.01), True, "mean_probability", 0.0).show
    assert not gate.judge(conf(0.99), True, "mean_probability", 1.0).show
    # nothing predicted (all pinned): nothing to judge
    assert gate.judge(None, True, "mean_probability", 1.0).show


def test_the_measure_chooses_what_is_read():
    spiky = conf(0.9, min_p=0.05)  # sure on the whole, one token a guess
    assert gate.judge(spiky, True, "mean_probability", 0.5).show
    assert not gate.judge(spiky, True, "min_probability", 0.5).show


def test_verdict_fields_carry_the_whole_summary_for_telemetry():
    fields = gate.judge(conf(0.5, 0.25), True, "mean_probability", 0.9).fields()
    assert fields["gateScore"] == pytest.approx(0.5, abs=1e-5)
    assert fields["confidence"]["minLogprob"] == pytest.approx(math.log(0.25), abs=1e-5)
    assert gate.judge(None, True, "mean_probability", 0.9).fields() == {}


def test_the_confidence_read_is_that_of_the_candidate_shown_first():
    best, other = conf(0.2), conf(0.8)

    def clean(raw: str) -> str | None:  # post-processing drops the copy of the line below
        return None if raw == "return y" else raw.strip()

    both = result("return y", best, [("y += 1 ", other)])
    assert gate.confidence_of("y += 1", both, clean) is other
    assert gate.confidence_of("return y", result("return y", best, [("z", other)]), lambda r: r) is best
    assert gate.confidence_of("x", result("x", best), clean) is best  # one candidate: no cleaning needed
    assert gate.confidence_of("x", None, clean) is None
    # a result without per-alternative summaries (another backend) falls back to the best one's
    assert gate.confidence_of("z", dataclasses.replace(both, alternative_confidence=[]), clean) is best


def test_last_fill_keeps_the_fill_whose_candidates_were_ranked():
    texts = iter(["a", None, "b"])

    async def fill_once(request: FillRequest) -> FillResult | None:
        text = next(texts)
        return None if text is None else result(text, conf(0.5))

    fills = gate.LastFill(fill_once)
    request = FillRequest(prefix="", suffix="")
    for expected in ("a", "a", "b"):  # a cancelled fill (None) leaves the last one
        asyncio.run(fills(request))
        assert fills.last is not None and fills.last.text == expected


def test_confidence_memory_is_an_lru_that_remembers_none_too():
    memory = gate.ConfidenceMemory(size=2)
    memory.put("a", conf(0.5))
    memory.put("b", None)
    memory.get("a")  # used: "b" is now the oldest
    memory.put("c", conf(0.9))
    assert memory.get("a") == conf(0.5) and memory.get("b") is None and memory.get("c") == conf(0.9)
    off = gate.ConfidenceMemory(size=0)
    off.put("a", conf(0.5))
    assert off.get("a") is None


def test_reward_and_tally_with_and_without_the_gate():
    assert gate.reward(accepted=3, shown=4) == pytest.approx(3 * 0.75 - 0.25)
    outcomes = [
        gate.Outcome(0.9, True, 10),
        gate.Outcome(0.8, False, 0),
        gate.Outcome(0.1, False, 0),
        gate.Outcome(0.05, False, 0),
        gate.Outcome(0.2, True, 4),
        gate.Outcome(None, True, 2),  # nothing to judge: always shown
    ]
    without = gate.tally(outcomes)
    assert without == {"shown": 6, "accepted": 3, "acceptance_rate": 0.5, "accepted_chars": 16, "reward": 1.5}
    gated = gate.tally(outcomes, threshold=0.5)
    assert gated["shown"] == 3 and gated["accepted"] == 2 and gated["accepted_chars"] == 12
    assert gated["reward"] == pytest.approx(1.25)
    assert gate.tally([], threshold=0.5)["acceptance_rate"] is None
