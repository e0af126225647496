"""`dfim replay`'s account of the confidence gate (dfim.server.gate): each request's verdict, read from
`dfim/stats`, and shown / acceptance of shown / characters saved / reward with the gate and without it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dfim.bench.lsp_client import get_field

if TYPE_CHECKING:
    from dfim.bench.replay import RegionStats, ReplayOptions, RequestRecord
    from dfim.server.gate import Outcome


CONFIDENCE_KEYS = ("tokens", "meanLogprob", "minLogprob", "meanEntropy", "maxEntropy")


def read_verdict(server: Any, uri: str, seen: int, record: RequestRecord) -> int:
    """Copy the gate's verdict on this request from `dfim/stats` into `record`, if the server judged one
    since verdict number `seen` (typed-ahead reuse and empty fills are not judged); the new number."""
    gate = get_field(server, "gate")
    seq = get_field(gate, "seq") or 0
    last = get_field(gate, "last")
    if seq > seen and last is not None and get_field(last, "uri") == uri:
        record.gate_score = get_field(last, "gateScore")
        confidence = get_field(last, "confidence")
        if confidence is not None:
            record.confidence = {k: get_field(confidence, k) for k in CONFIDENCE_KEYS}
        record.gated = not get_field(last, "shown")
    return max(seq, seen)


def shown_suggestions(request_log: list[Any]) -> list[tuple[Any, bool, int]]:
    """(confidence summary as JSON, accepted, accepted chars) of every suggestion a request log shows
    (`RequestRecord`s or their JSON). A typed-ahead continuation (the rest of the suggestion shown before,
    served with no fill and no verdict: after a partial accept it is by construction the part that was not
    taken) carries the confidence of the suggestion it continues: had that one been hidden, it would not
    exist."""
    out: list[tuple[Any, bool, int]] = []
    last = None
    for r in request_log:
        confidence = get_field(r, "confidence")
        judged = confidence is not None or get_field(r, "gate_score") is not None
        if judged:
            last = confidence
        verdict = get_field(r, "verdict")
        if verdict != "none":
            accepted = verdict in ("full", "partial")
            out.append((confidence if judged else last, accepted, get_field(r, "accepted_chars") or 0))
    return out


def gate_outcomes(regions: list[RegionStats], measure: str) -> list[Outcome]:
    """Every suggestion shown, with its gate score and whether it was accepted (dfim.server.gate.Outcome)."""
    from dfim.server.gate import Outcome, score, summary_from_json

    return [
        Outcome(score(summary_from_json(c), measure), accepted, chars)
        for region in regions
        for c, accepted, chars in shown_suggestions(region.request_log)
    ]


def gate_summary(regions: list[RegionStats], options: ReplayOptions) -> dict[str, Any]:
    """Shown, acceptance of those shown, characters saved and reward (+0.75 per accept, -0.25 per shown
    reject) without the gate and with it. Not live: both from the one run, the gate's row being what it
    would have let through of the suggestions shown (the typing after a hidden accept is not replayed
    again). Live: the server hid them; what it hid is counted, its outcome unknown."""
    from dfim.server.gate import tally

    chars = sum(r.chars for r in regions)
    outcomes = gate_outcomes(regions, options.gate_measure)

    def with_chars(row: dict[str, Any] | None) -> dict[str, Any] | None:
        if row is not None:
            row["chars_saved"] = row["accepted_chars"] / chars if chars else None
        return row

    live = options.gate_live
    return {
        "live": live,
        "measure": options.gate_measure,
        "threshold": options.gate_threshold,
        "hidden": sum(r.gated for region in regions for r in region.request_log),
        "without": None if live else with_chars(tally(outcomes)),
        "with": with_chars(tally(outcomes) if live else tally(outcomes, options.gate_threshold)),
    }


def gate_markdown(gate: dict[str, Any]) -> list[str]:
    """The with/without-the-gate table under the summary."""

    def f(v: Any, scale: float = 1.0, digits: int = 1) -> str:
        return "-" if v is None else f"{v * scale:.{digits}f}"

    rule = f"{gate['measure']} >= {gate['threshold']}"
    lines = [
        "| gate | shown | accepted | acceptance of shown | chars saved | reward |",
        "|---|---|---|---|---|---|",
    ]
    for label, row in (("off", gate["without"]), (f"on ({rule})", gate["with"])):
        if row is None:
            lines.append(f"| {label} | - | - | - | - | - |")
            continue
        lines.append(
            f"| {label} | {row['shown']} | {row['accepted']} | {f(row['acceptance_rate'], 100)}% "
            f"| {f(row['chars_saved'], 100)}% | {row['reward']:.2f} |"
        )
    how = (
        f"live: the server hid {gate['hidden']} suggestions (their outcome unknown)"
        if gate["live"]
        else "from one run with the server's gate off: the gated row is what the gate would have let through"
    )
    return [*lines, "", f"reward: +0.75 per accept (full or partial), -0.25 per shown reject; {how}."]
