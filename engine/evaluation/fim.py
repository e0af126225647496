"""Fill-in-the-middle evaluation with execution-based pass@1 (DESIGN §6); `dfim eval` runs it.

For every problem of a HumanEval-infilling-format JSONL file (`task_id, prompt, suffix, canonical_solution,
test, entry_point`; plain or .gz) the engine fills the middle between `prompt` and `suffix`; the completion is
cut to its first line (the single-line set's middle is exactly one line), and scored by
- pass@1: `prompt + completion + suffix + test + check(entry_point)` exits 0 in the sandbox (dfim.engine.evaluation.sandbox);
- exact match after strip(), and edit similarity (normalized Levenshtein ratio, 0-100) against the canonical line;
- the engine's steps, stop reason, tokens and latency.

Model calls run one after another in this process (one engine, so latencies are not disturbed by each other);
the test programs run in a pool of `--workers` sandboxed subprocesses while the model keeps filling.
`--sweep` evaluates several sampler settings side by side in one run. Results: `results.json` (per problem and
per config) and `summary.md` in `--out`; the summary is also printed.
"""

from __future__ import annotations

import dataclasses
import gzip
import itertools
import json
import math
import os
import time
import zlib
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from dfim.engine.api import EngineError, FillRequest, SamplerSettings, parse_draft_from, parse_rank
from dfim.engine.evaluation import metrics, sandbox
from dfim.engine.progress import Progress

PROBLEM_FIELDS = ("task_id", "prompt", "suffix", "canonical_solution", "test", "entry_point")
DEFAULT_MAX_TOKENS = (
    32  # one canvas bucket; 99% of the single-line set's canonical lines fit (see docs/eval.md)
)


class DataError(Exception):
    """The evaluation file is missing or malformed; the message names the file and line."""


@dataclass(frozen=True)
class Problem:
    task_id: str
    prompt: str
    suffix: str
    canonical_solution: str
    test: str
    entry_point: str


def load_problems(path: str | os.PathLike, limit: int | None = None) -> list[Problem]:
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    problems: list[Problem] = []
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            for line_no, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    raise DataError(f"{path}:{line_no}: not JSON ({e.msg})") from None
                if not isinstance(row, dict):
                    raise DataError(f"{path}:{line_no}: not a JSON object")
                missing = [k for k in PROBLEM_FIELDS if not isinstance(row.get(k), str)]
                if missing:
                    raise DataError(f"{path}:{line_no}: missing or non-string fields {', '.join(missing)}")
                problems.append(Problem(**{k: row[k] for k in PROBLEM_FIELDS}))
                if limit is not None and len(problems) >= limit:
                    break
    except (OSError, EOFError, UnicodeDecodeError, zlib.error) as e:  # zlib.error: corrupt gzip data
        raise DataError(f"{path}: cannot read ({e})") from None
    if not problems:
        raise DataError(f"{path}: no problems")
    return problems


def first_line(text: str) -> str:
    """The completion scored for a single-line hole: the model's text up to its first newline, plus one newline.

    The prompt ends with a newline and the suffix starts a new line, so the hole is exactly one line; whatever a
    model writes after the first line would duplicate the suffix. A model that writes no newline gets one.
    """
    return text.split("\n", 1)[0] + "\n"


# ----------------------------------------------------------------------------- configs and sweeps


# sweep/override key -> (FillRequest/SamplerSettings field, parser)
def _parse_bool(value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("on", "true", "yes", "1"):
        return True
    if lowered in ("off", "false", "no", "0"):
        return False
    raise ValueError(f"expected on/off, got {value!r}")


SWEEP_KEYS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "steps": ("max_steps", int),
    "max_steps": ("max_steps", int),
    "entropy_bound": ("entropy_bound", float),
    "early_stop": ("early_stop", _parse_bool),
    "t_max": ("t_max", float),
    "t_min": ("t_min", float),
    "confidence_threshold": ("confidence_threshold", float),
    "stability_threshold": ("stability_threshold", int),
    "self_conditioning": ("self_conditioning", _parse_bool),
    "window": ("window", int),
    "max_tokens": ("max_tokens", int),  # the canvas bucket (rounded up by the engine)
    "bucket": ("max_tokens", int),
    "candidates": ("candidates", int),  # canvases denoised per problem; the best-ranked one is scored
    "rank": ("rank", parse_rank),  # entropy | likelihood
    "draft": ("draft", _parse_bool),  # the encoder's greedy draft seeds the first candidate's canvas
    "draft_from": ("draft_from", parse_draft_from),  # prefix | middle: where that draft starts
}


# The least value of each numeric sweep field (a temperature or threshold below 0 means nothing; 0 steps,
# tokens or candidates fill nothing).
SWEEP_FLOORS: dict[str, float] = {
    "max_steps": 1,
    "max_tokens": 1,
    "candidates": 1,
    "window": 0,
    "entropy_bound": 0,
    "t_max": 0,
    "t_min": 0,
    "confidence_threshold": 0,
    "stability_threshold": 0,
}


@dataclass(frozen=True)
class EvalConfig:
    name: str
    settings: SamplerSettings
    max_tokens: int
    candidates: int = 1


def parse_sweep(spec: str) -> list[dict[str, Any]]:
    """`steps=8,16,48;early_stop=on,off` -> the grid of all combinations, first key slowest.

    Each combination is a dict of field -> value. Several grids can be joined with `|`
    (`steps=8;early_stop=off | steps=48;early_stop=on`) to compare chosen points instead of a full grid.
    """
    combos: list[dict[str, Any]] = []
    for grid in spec.split("|"):
        axes: list[list[tuple[str, Any]]] = []
        seen: dict[str, str] = {}  # field -> the key that set it in this grid
        for part in grid.split(";"):
            if not part.strip():
                continue
            key, sep, values = part.partition("=")
            key = key.strip()
            if not sep or key not in SWEEP_KEYS:
                known = ", ".join(SWEEP_KEYS)
                raise ValueError(
                    f"bad sweep axis {part.strip()!r}: expected KEY=V1,V2 with KEY one of {known}"
                )
            field, parse = SWEEP_KEYS[key]
            if field in seen:  # dict(product) would keep only the last value: a config silently dropped
                what = "is given twice" if seen[field] == key else f"sets the same field as {seen[field]!r}"
                raise ValueError(
                    f"sweep axis {key!r} {what} in one grid: list its values once, comma-separated, "
                    "or join grids with |"
                )
            seen[field] = key
            try:
                parsed = [(field, parse(v.strip())) for v in values.split(",") if v.strip()]
            except ValueError as err:
                raise ValueError(f"sweep axis {key!r}: {err}") from None
            if not parsed:
                raise ValueError(f"sweep axis {key!r} has no values")
            axes.append(parsed)
        if not axes:
            raise ValueError(f"empty sweep grid in {spec!r}")
        combos.extend(dict(c) for c in itertools.product(*axes))
    return combos


def config_name(overrides: dict[str, Any]) -> str:
    if not overrides:
        return "default"

    def show(v: Any) -> str:
        return ("on" if v else "off") if isinstance(v, bool) else str(v)

    short = {"max_steps": "steps"}
    return " ".join(f"{short.get(k, k)}={show(v)}" for k, v in overrides.items())


def build_configs(
    base: SamplerSettings, max_tokens: int, overrides: dict[str, Any], sweep: str | None
) -> list[EvalConfig]:
    """One config for a plain run; one per sweep point otherwise (command-line overrides apply underneath)."""
    points = parse_sweep(sweep) if sweep else [{}]
    configs: list[EvalConfig] = []
    for point in points:
        merged = {**overrides, **point}
        tokens = merged.pop("max_tokens", max_tokens)
        candidates = merged.pop("candidates", 1)
        settings = dataclasses.replace(base, **merged)
        name = config_name(point) if sweep else config_name(overrides)
        configs.append(EvalConfig(name=name, settings=settings, max_tokens=tokens, candidates=candidates))
    names = [c.name for c in configs]
    if len(set(names)) != len(names):
        raise ValueError("the sweep names the same config twice")
    return configs


# ----------------------------------------------------------------------------- the run

# A filler returns the raw middle text and the engine's report for one problem under one config.
Filler = Callable[[Problem, EvalConfig, int], dict[str, Any]]


def engine_filler(engine: Any) -> Filler:
    def fill(problem: Problem, config: EvalConfig, seed: int) -> dict[str, Any]:
        request = FillRequest(
            prefix=problem.prompt,
            suffix=problem.suffix,
            max_tokens=config.max_tokens,
            settings=config.settings,
            seed=seed,
            stop=("\n",),  # only the first line is scored (first_line): a causal model stops there
            candidates=config.candidates,
        )
        start = time.perf_counter()
        result = engine.fill(request)
        wall_ms = (time.perf_counter() - start) * 1000.0
        return {
            "raw": result.text,
            "steps": result.steps,
            "stop_reason": result.stop_reason,
            "tokens": result.tokens,
            "canvas_length": result.canvas_length,
            "latency_ms": result.latency_ms,
            "wall_ms": wall_ms,
            "encoded_tokens": result.encoded_tokens,
            "context_tokens": result.context_tokens,
            "blocks": getattr(result, "blocks", 1),
        }

    return fill


def reference_filler(problem: Problem, config: EvalConfig, seed: int) -> dict[str, Any]:
    """Scores the canonical line itself: checks the harness and the sandbox (expect pass@1 = 100)."""
    return {
        "raw": problem.canonical_solution,
        "steps": 0,
        "stop_reason": "reference",
        "tokens": 0,
        "canvas_length": 0,
        "latency_ms": 0.0,
        "wall_ms": 0.0,
        "encoded_tokens": 0,
        "context_tokens": 0,
        "blocks": 0,
    }


def _execute(problem: Problem, completion: str, limits: sandbox.SandboxLimits) -> sandbox.SandboxResult:
    program = sandbox.humaneval_program(
        problem.prompt, completion, problem.suffix, problem.test, problem.entry_point
    )
    try:
        return sandbox.run_program(program, limits)
    except (
        Exception
    ) as e:  # the harness itself failed (no temp space, ...): this problem fails, the run goes on
        return sandbox.SandboxResult(False, False, None, f"sandbox error: {e!r}", "", 0.0)


def evaluate(
    problems: Sequence[Problem],
    configs: Sequence[EvalConfig],
    fill: Filler,
    *,
    seed: int = 0,
    workers: int = 4,
    limits: sandbox.SandboxLimits | None = None,
    progress: TextIO | None = None,
    overlap: bool = False,
    on_fill: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Fill every problem under every config, execute the tests in parallel, return one record per pair.

    Configs run one after another over all problems (not interleaved) so every fill meets a context the engine
    has not cached yet, as a user's first request would. Problem i gets seed `seed + i` under every config:
    the configs are compared on the same random draws.

    By default the tests run after all fills, so test programs never compete with the model for CPU and the
    latencies are clean. `overlap=True` starts each test as soon as its completion exists (faster wall time
    on a machine with cores to spare, noisier latencies). `on_fill` sees each record as soon as it is filled
    (before its test), so a run that is killed midway still leaves its fills behind.

    `progress` (a stream, normally stderr) gets two phases, the fills and then the tests that are still
    running, each with its own count and ETA (engine/progress.py: a bar on a terminal, a few lines in a log).
    """
    limits = limits or sandbox.SandboxLimits()
    records: list[dict[str, Any]] = []
    futures: list[Future[sandbox.SandboxResult]] = []
    total = len(problems) * len(configs)
    enabled = progress is not None
    filling = Progress(total, "filling", unit="fills", stream=progress, enabled=enabled)

    pending: list[tuple[Problem, str]] = []

    with ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="dfim-sandbox") as pool:

        def submit_pending() -> None:
            for problem, completion in pending:
                futures.append(pool.submit(_execute, problem, completion, limits))
            pending.clear()

        try:
            for config in configs:
                for i, problem in enumerate(problems):
                    record: dict[str, Any] = {"task_id": problem.task_id, "config": config.name}
                    try:
                        record.update(fill(problem, config, seed + i))
                        record["error"] = None
                    except EngineError as e:  # one unfillable problem fails; the run goes on
                        record.update(reference_filler(problem, config, 0), raw="", stop_reason="error")
                        record["error"] = f"engine: {e}"
                    completion = first_line(record["raw"])
                    record["completion"] = completion
                    record["exact_match"] = metrics.exact_match(completion, problem.canonical_solution)
                    record["edit_similarity"] = round(
                        metrics.edit_similarity(completion, problem.canonical_solution), 2
                    )
                    records.append(record)
                    if on_fill is not None:
                        on_fill(record)
                    pending.append((problem, completion))
                    if overlap:
                        submit_pending()
                    filling.update(1, config.name)
            submit_pending()
            filling.close()
            testing = Progress(len(futures), "testing", unit="tests", stream=progress, enabled=enabled)
            tested = passed = 0
            for future in as_completed(futures):  # in the order they finish: the count moves as tests end
                tested += 1
                passed += future.result().passed
                testing.update(1, f"pass {100.0 * passed / tested:.1f}%")
            testing.close()
        except KeyboardInterrupt:
            for future in futures:
                future.cancel()
            raise
        for record, future in zip(records, futures, strict=True):
            result = future.result()
            record["passed"] = result.passed
            record["timed_out"] = result.timed_out
            record["returncode"] = result.returncode
            record["exec_ms"] = round(result.duration_ms, 1)
            if not result.passed:
                record["stderr"] = result.stderr[-500:]
    return records


def summarize(records: Sequence[dict[str, Any]], configs: Sequence[EvalConfig]) -> list[dict[str, Any]]:
    rows = []
    for config in configs:
        mine = [r for r in records if r["config"] == config.name]
        n = len(mine)
        latencies = [r["latency_ms"] for r in mine]
        total_ms = sum(latencies)
        tokens = sum(r["tokens"] for r in mine)
        rows.append(
            {
                "config": config.name,
                "settings": dataclasses.asdict(config.settings),
                "max_tokens": config.max_tokens,
                "n": n,
                "passed": sum(r["passed"] for r in mine),
                "pass_at_1": 100.0 * metrics.mean([float(r["passed"]) for r in mine]),
                "exact_match": 100.0 * metrics.mean([float(r["exact_match"]) for r in mine]),
                "edit_similarity": metrics.mean([r["edit_similarity"] for r in mine]),
                "mean_steps": metrics.mean([r["steps"] for r in mine]),
                "latency_p50_ms": metrics.percentile(latencies, 50),
                "latency_p95_ms": metrics.percentile(latencies, 95),
                "latency_mean_ms": metrics.mean(latencies),
                "tokens_per_s": 1000.0 * tokens / total_ms if total_ms > 0 else math.nan,
                "timeouts": sum(r["timed_out"] for r in mine),
                "engine_errors": sum(r["error"] is not None for r in mine),
                "stop_reasons": dict(Counter(r["stop_reason"] for r in mine)),
            }
        )
    return rows


def early_stop_checks(summary: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """For every pair of configs that differ only in early stopping: the steps saved and pass@1 given up.

    Target (issue 5): early stopping cuts mean steps at least 2x for at most 1 point of pass@1.
    """
    checks = []
    for on in summary:
        if not on["settings"]["early_stop"]:
            continue
        for off in summary:
            same = {**on["settings"], "early_stop": False} == off["settings"]
            if off is on or not same or off["max_tokens"] != on["max_tokens"]:
                continue
            ratio = off["mean_steps"] / on["mean_steps"] if on["mean_steps"] > 0 else math.nan
            delta = on["pass_at_1"] - off["pass_at_1"]
            checks.append(
                {
                    "on": on["config"],
                    "off": off["config"],
                    "steps_ratio": ratio,
                    "pass_at_1_delta": delta,
                    "target_met": bool(ratio >= 2.0 and delta >= -1.0),
                }
            )
    return checks


def _f(value: float, digits: int = 1) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def markdown_summary(
    meta: dict[str, Any], summary: Sequence[dict[str, Any]], checks: Sequence[dict[str, Any]]
) -> str:
    model = meta["model"]
    lines = [
        f"## dfim eval: {meta['data_name']} ({summary[0]['n'] if summary else 0} problems)",
        "",
        f"model `{model['name']}`{' (RANDOM WEIGHTS)' if model.get('is_random') else ''} on {meta['device']}, "
        f"seed {meta['seed']}, {meta['date']}",
        "",
        "| config | n | pass@1 % | EM % | ES | mean steps | p50 ms | p95 ms | tok/s | timeouts |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in summary:
        lines.append(
            f"| {row['config']} | {row['n']} | {_f(row['pass_at_1'])} | {_f(row['exact_match'])} | "
            f"{_f(row['edit_similarity'])} | {_f(row['mean_steps'], 2)} | {_f(row['latency_p50_ms'])} | "
            f"{_f(row['latency_p95_ms'])} | {_f(row['tokens_per_s'], 0)} | {row['timeouts']} |"
        )
    if checks:
        lines += ["", "Early stopping (target: mean steps cut >= 2x for <= 1 point of pass@1):", ""]
        for c in checks:
            verdict = "met" if c["target_met"] else "NOT met"
            lines.append(
                f"- `{c['on']}` vs `{c['off']}`: steps {_f(c['steps_ratio'], 2)}x fewer, "
                f"pass@1 {c['pass_at_1_delta']:+.1f} points -> target {verdict}"
            )
    lines += ["", f"command: `{meta['command']}`", ""]
    return "\n".join(lines)
