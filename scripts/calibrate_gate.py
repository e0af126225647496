"""Calibrate the confidence gate (dfim.server.gate) on `dfim replay` reports of a development set.

    python scripts/gate_dev_set.py /tmp/gate-dev --packages pygls cattrs pydantic
    dfim replay --git /tmp/gate-dev --commits 1 --out runs/gate-dev     # the server's gate off: all scored
    python scripts/calibrate_gate.py runs/gate-dev/report.json --min-acceptance 0.5

Every suggestion the replay showed carries its fill's confidence summary and its verdict. For each measure
of dfim.server.gate.MEASURES and each threshold on a 0.01 grid, the reward of the suggestions a gate would
let through is counted (+0.75 per accept, whole or partial, as the replay counts accepts; -0.25 per shown
reject); the best threshold of each measure is printed, with its shown / acceptance / characters saved, and
per source package so that one package's luck is visible. The counts are those of the one ungated typing
(see dfim.bench.replay_gate). Never point it at an evaluation set (HumanEval, the held-out corpus, this
repository's own code): a threshold tuned there would flatter the benchmarks.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

from dfim.bench.replay_gate import shown_suggestions
from dfim.engine.api import FillConfidence
from dfim.server.gate import MEASURES, Outcome, summary_from_json, tally

GRID = [round(i / 100, 2) for i in range(101)]


def load(paths: list[Path]) -> tuple[list[tuple[str, FillConfidence | None, bool, int]], int]:
    """(package, confidence, accepted, accepted chars) of every suggestion shown (a typed-ahead
    continuation carries its suggestion's confidence: `shown_suggestions`), and the typed chars."""
    rows = []
    chars = 0
    for path in paths:
        report = json.loads(path.read_text(encoding="utf-8"))
        for region in report["regions"]:
            chars += region["chars"]
            # git regions are named `commit:package/file:line`
            package = region["source"].split(":")[1].split("/")[0] if ":" in region["source"] else "?"
            for confidence, accepted, accepted_chars in shown_suggestions(region["request_log"]):
                rows.append((package, summary_from_json(confidence), accepted, accepted_chars))
    return rows, chars


def outcomes(rows, measure: str) -> list[Outcome]:
    return [Outcome(None if c is None else MEASURES[measure](c), ok, n) for _, c, ok, n in rows]


def best_threshold(items: list[Outcome], min_acceptance: float = 0.0) -> float:
    """The grid threshold of the highest reward among those whose acceptance of shown suggestions is at least
    `min_acceptance` (none: the highest threshold); the lowest of equals (show the most for the same reward)."""
    allowed = [t for t in GRID if (tally(items, t)["acceptance_rate"] or 0.0) >= min_acceptance] or GRID[-1:]
    return max(allowed, key=lambda t: (tally(items, t)["reward"], -t))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("reports", nargs="+", type=Path, help="report.json of ungated replays")
    parser.add_argument(
        "--min-acceptance",
        type=float,
        default=0.0,
        help="only thresholds whose acceptance of shown suggestions is at least this (the default's 0.5)",
    )
    args = parser.parse_args(argv)
    rows, chars = load(args.reports)
    if not rows:
        print("no suggestion was shown in these reports", file=sys.stderr)
        return 1

    def line(label: str, row: dict) -> str:
        rate = "-" if row["acceptance_rate"] is None else f"{100 * row['acceptance_rate']:.1f}%"
        saved = f"{100 * row['accepted_chars'] / chars:.1f}%" if chars else "-"
        return f"| {label} | {row['shown']} | {row['accepted']} | {rate} | {saved} | {row['reward']:.2f} |"

    print(
        f"{len(rows)} suggestions shown over {chars} typed characters ({', '.join(map(str, args.reports))})"
    )
    print()
    print("| gate | shown | accepted | acceptance of shown | chars saved | reward |")
    print("|---|---|---|---|---|---|")
    print(line("off", tally(outcomes(rows, "mean_probability"))))
    chosen: dict[str, float] = {}
    for measure in MEASURES:
        items = outcomes(rows, measure)
        chosen[measure] = best_threshold(items, args.min_acceptance)
        print(line(f"{measure} >= {chosen[measure]:.2f}", tally(items, chosen[measure])))
    print()
    print("per package, each measure at its threshold above (reward: off -> gated):")
    packages: dict[str, list] = defaultdict(list)
    for row in rows:
        packages[row[0]].append(row)
    for package, group in sorted(packages.items()):
        off = tally(outcomes(group, "mean_probability"))["reward"]
        cells = [f"{m} {tally(outcomes(group, m), chosen[m])['reward']:.2f}" for m in MEASURES]
        print(f"- {package} ({len(group)} shown): off {off:.2f}; " + "; ".join(cells))
    print()
    print("reward by threshold (mean_probability):")
    items = outcomes(rows, "mean_probability")
    print("  " + "  ".join(f"{t:.2f}:{tally(items, t)['reward']:.1f}" for t in GRID[::5]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
