"""`dfim stats`: acceptance rate and latency percentiles from the server's local telemetry."""

from __future__ import annotations

import argparse
import json
import sys

from dfim.commands import options
from dfim.server import gate
from dfim.server.options import GateOptions
from dfim.server.telemetry import FILE_NAME, data_dir, read_events, summarize


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data-dir", default="", help="telemetry folder (default: the server's data dir)")
    options.add_json(parser, help="print the summary as JSON")
    from dfim.commands.replay import add_gate_arguments

    add_gate_arguments(parser, live=False)


def run(args: argparse.Namespace) -> int:
    from dfim.commands.checks import InputError, fail, within

    try:
        within("--gate-threshold", getattr(args, "gate_threshold", None), 0.0, 1.0)
    except InputError as e:
        return fail("dfim stats", str(e))
    folder = data_dir(args.data_dir)
    if folder.exists() and not folder.is_dir():
        print(f"dfim stats: --data-dir {folder}: is a file, not a folder", file=sys.stderr)
        return 2
    path = folder / FILE_NAME
    try:
        events = read_events(path)
    except OSError as e:
        print(f"dfim stats: {e.filename or path}: cannot read ({e.strerror or e})", file=sys.stderr)
        return 2
    if not events:  # on stderr: `dfim stats --json | jq` must never read this line as the summary
        print(f"dfim stats: no telemetry at {path}", file=sys.stderr)
        return 1
    summary = summarize(events)
    # a caller's own Namespace (tests, scripts) may leave the gate's flags out: the server's defaults then
    defaults = GateOptions()
    measure = getattr(args, "gate_measure", defaults.measure)
    threshold = getattr(args, "gate_threshold", defaults.threshold)
    summary["gate"] = gate.telemetry_report(events, measure, threshold)
    if args.json:
        print(json.dumps(summary, indent=2, allow_nan=False))
        return 0

    def ms(value):
        return "-" if value is None else f"{value:.0f} ms"

    print(f"telemetry: {path} ({len(events)} events)")
    outcomes = summary["accepted"] + summary["partial"] + summary["rejected"]
    print(
        f"shown {summary['shown']} = accepted {summary['accepted']} + partial {summary['partial']} + "
        f"rejected {summary['rejected']} + no outcome {summary['no_outcome']}"
        + (
            ""
            if outcomes <= summary["shown"]
            else f" ({outcomes - summary['shown']} outcomes of older shows)"
        )
    )
    print(f"acceptance rate {summary['acceptance_rate']:.1%}  (partial {summary['partial_rate']:.1%})")
    print(f"accepted characters {summary['accepted_chars']}")
    for label, name in (("latency", "all shown"), ("model_latency", "model calls")):
        n = summary[f"{label}_n"]
        print(
            f"latency ({name}, n={n}): p50 {ms(summary[f'{label}_p50'])}  p90 {ms(summary[f'{label}_p90'])}  "
            f"p95 {ms(summary[f'{label}_p95'])}  p99 {ms(summary[f'{label}_p99'])}"
            + ("  (p95/p99 of fewer than 20 samples: the slowest few)" if 0 < n < 20 else "")
        )
    if summary.get("held_for_model"):
        print(
            f"({summary['held_for_model']} shown after waiting for the model to load: not in the latencies)"
        )
    print_gate(summary["gate"])
    return 0


def print_gate(report: dict) -> None:
    """Shown, acceptance of those shown, characters saved and reward, as shown and with the gate."""
    rule = f"{report['measure']} >= {report['threshold']}"
    print(
        "the confidence gate, on the suggestions with an outcome (those still without one are left out "
        "below; reward: +0.75 per accept, whole or partial, -0.25 per shown reject):"
    )
    for label, row in (("as shown", report["as_shown"]), (f"gated ({rule})", report["gated"])):
        rate = "-" if row["acceptance_rate"] is None else f"{row['acceptance_rate']:.1%}"
        print(
            f"  {label}: shown {row['shown']}, accepted {row['accepted']} ({rate} of shown), "
            f"characters saved {row['accepted_chars']}, reward {row['reward']:.2f}"
        )
    print(f"  the gate hid {report['hidden']} suggestions (never seen, so no outcome)")
