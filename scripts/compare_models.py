"""Compare checkpoints through the real server on every set we measure, with the same commands, on this machine.

For each `--model NAME=PATH` (PATH `default` is the shipped model):
- HumanEval single-line infilling through the server (`scripts/eval_through_server.py`): pass@1, EM, ES;
- line completion in code the model never saw, per language: the cursor after a random part of a line's code,
  exact match of the rest of the line (`--dev --kind midline`). Python: this repository's own code; the
  other languages: the held-out projects of the corpus build (`--heldout`, kept out of training);
- a typing replay (`dfim replay`, word triggers) over held-out files: inline latency p50/p95 through the
  server, warm, and acceptance.

    python scripts/compare_models.py --model dfim-small=engine/weights/dfim-small --model dfim-base=default \\
        --humaneval ~/data/HumanEval-SingleLineInfilling.jsonl.gz --heldout .corpus/heldout --out runs/compare

Prints one markdown table and writes it, with every raw result, under `--out`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# language -> (folder under --heldout, globs, LSP languageId); python reads this repository's own code
LINE_SETS: dict[str, tuple[str, tuple[str, ...], str]] = {
    "python": ("", (), "python"),
    "typescript": ("ts_js", ("**/*.ts",), "typescript"),
    "go": ("go", ("**/*.go",), "go"),
    "rust": ("rust", ("**/*.rs",), "rust"),
    "java": ("java", ("**/*.java",), "java"),
    "c": ("c_cpp/lua5.4", ("**/*.c",), "c"),
    "cpp": ("c_cpp/leveldb", ("**/*.cc",), "cpp"),
}
SUMMARY = re.compile(
    r"(?P<n>\d+) problems through the server: (?:pass@1 (?P<pass>[\d.]+)% )?EM (?P<em>[\d.]+)% ES (?P<es>[\d.]+) "
    r"shown (?P<shown>\d+)% p50 (?P<p50>\d+) ms p95 (?P<p95>\d+) ms"
)


def through_server(args: list[str], out: Path) -> dict:
    """One `scripts/eval_through_server.py` run; its summary line parsed."""
    cmd = [sys.executable, str(ROOT / "scripts" / "eval_through_server.py"), *args, "--out", str(out)]
    print("$", " ".join(cmd), flush=True)
    started = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    line = next((m for m in map(SUMMARY.search, done.stdout.splitlines()) if m), None)
    if done.returncode != 0 or line is None:
        raise SystemExit(f"failed ({done.returncode}): {done.stderr[-2000:]}")
    result = {k: float(v) for k, v in line.groupdict().items() if v is not None}
    result["wall_s"] = round(time.perf_counter() - started, 1)
    print("  ", line.group(0), flush=True)
    return result


def replay(model: str, files: list[Path], out: Path) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "dfim",
        "replay",
        *map(str, files),
        "--trigger",
        "word",
        "--max-chars",
        "1500",
    ]
    cmd += ["--out", str(out), "--quiet"] + (["--model", model] if model != "default" else [])
    print("$", " ".join(cmd), flush=True)
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        raise SystemExit(f"replay failed ({done.returncode}): {done.stderr[-2000:]}")
    return json.loads((out / "report.json").read_text())["summary"]


def replay_files(heldout: Path, per_language: int = 2) -> list[Path]:
    """A few mid-sized held-out files per language (the same files for every model)."""
    files = []
    for folder, globs, _ in LINE_SETS.values():
        if not folder:
            continue
        found = sorted(
            p for g in globs for p in (heldout / folder).glob(g) if 2_000 < p.stat().st_size < 20_000
        )
        files += found[:per_language]
    return files


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", action="append", required=True, help="NAME=PATH (PATH 'default': shipped)")
    parser.add_argument("--humaneval", type=Path, help="HumanEval-SingleLineInfilling.jsonl.gz")
    parser.add_argument("--humaneval-limit", type=int, default=1033)
    parser.add_argument("--heldout", type=Path, default=ROOT / ".corpus" / "heldout")
    parser.add_argument("--lines", type=int, default=200, help="line problems per language")
    parser.add_argument("--languages", default=",".join(LINE_SETS))
    parser.add_argument("--no-replay", action="store_true")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "compare")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    models = dict(spec.split("=", 1) for spec in args.model)
    results: dict[str, dict] = {name: {} for name in models}
    for name, path in models.items():
        model_args = [] if path == "default" else ["--model", str(Path(path).resolve())]
        if args.humaneval:
            results[name]["humaneval"] = through_server(
                [str(args.humaneval), "--limit", str(args.humaneval_limit), *model_args],
                args.out / f"{name}-humaneval.jsonl",
            )
        for language in args.languages.split(","):
            folder, globs, language_id = LINE_SETS[language]
            source = ["--source", str(args.heldout / folder)] if folder else []
            patterns = [w for g in globs for w in ("--glob", g)]
            results[name][language] = through_server(
                ["--dev", "--kind", "midline", *source, *patterns, "--language", language_id]
                + ["--limit", str(args.lines), *model_args],
                args.out / f"{name}-lines-{language}.jsonl",
            )
        if not args.no_replay:
            results[name]["replay"] = replay(path, replay_files(args.heldout), args.out / f"{name}-replay")
    meta = {
        "date": dt.date.today().isoformat(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.platform()}",
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
    }
    (args.out / "results.json").write_text(json.dumps({"meta": meta, "results": results}, indent=1) + "\n")
    table = markdown(results, meta)
    (args.out / "summary.md").write_text(table)
    print(table)


def markdown(results: dict[str, dict], meta: dict) -> str:
    names = list(results)
    rows = [f"| set | {' | '.join(names)} |", "|---|" + "---|" * len(names)]

    def cell(r: dict | None, key: str, unit: str = "%") -> str:
        return "-" if not r or key not in r else f"{r[key]:.1f}{unit}"

    first = results[names[0]]
    if "humaneval" in first:
        rows.append(
            "| HumanEval single-line, through the server: pass@1 / EM / ES | "
            + " | ".join(
                f"{cell(results[n].get('humaneval'), 'pass')} / {cell(results[n].get('humaneval'), 'em')} / "
                f"{cell(results[n].get('humaneval'), 'es', '')}"
                for n in names
            )
            + " |"
        )
    for language in LINE_SETS:
        if language in first:
            rows.append(
                f"| {language} lines, rest of the line: EM / ES (n={int(first[language]['n'])}) | "
                + " | ".join(
                    f"{cell(results[n].get(language), 'em')} / {cell(results[n].get(language), 'es', '')}"
                    for n in names
                )
                + " |"
            )
    if "replay" in first:

        def ms(r: dict, key: str) -> str:
            return "-" if r.get(key) is None else f"{r[key]:.0f}"

        rows.append(
            "| typing replay: inline p50 / p95 ms (model fills) | "
            + " | ".join(
                f"{ms(results[n]['replay'], 'model_latency_p50_ms')} / {ms(results[n]['replay'], 'model_latency_p95_ms')}"
                for n in names
            )
            + " |"
        )
        rows.append(
            "| typing replay: acceptance / chars saved | "
            + " | ".join(
                f"{100 * (results[n]['replay']['acceptance_rate'] or 0):.0f}% / "
                f"{100 * (results[n]['replay']['chars_saved'] or 0):.1f}%"
                for n in names
            )
            + " |"
        )
    return "\n".join(rows) + f"\n\n{meta['date']}, {meta['machine']}: `{meta['command']}`\n"


if __name__ == "__main__":
    main()
