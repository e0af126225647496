"""Issue 32's latencies through the real server: `dfim serve` at the 26B-A4B shape with random weights.

    python3 scripts/bench_gpu_server.py [--shape 26b-a4b|tiny] [--device cuda|cpu] [--requests 24]
                                        [--candidates 2,1] [--blocks 2] [--draft] [--settings JSON] [--out FILE]
    python3 scripts/bench_gpu_server.py --model default ...      (the shipped model instead of a random shape)

It writes a checkpoint folder without weights (the shape's config.json, dfim-base's tokenizer, and a dfim.json
whose `random_init` has the server make bf16 weights on the GPU at load, engine/model/random_init.py: the
52 GB of files are never written), starts `dfim serve --model FOLDER --device cuda` over stdio with pygls's
LanguageClient (tests/server_helpers.py), waits for the model, then times, in this order:

- warm-up: inline requests at every position used below (the fast path is built, and a CUDA graph is
  captured per context bucket and canvas length, once, as in a server that has run a while); printed.
- block: *Fill the hole* (`dfim.fillHole`) on a `pass` with sampling.maxCanvas 256: a 256-token canvas from
  noise for sampling.actionMaxSteps (48) steps. One warm-up, then `--blocks` timed.
- inline, once per `--candidates` value (inline.candidates, the canvases of a fill; 2 is the server's
  default): single-line inline completions (textDocument/inlineCompletion) in a Python file
  (scripts/data/typing.py.txt), at the ends of code lines (a new suffix each, so the whole context is
  encoded), then while typing new lines 3 characters at a time (the context before the cursor cached).
  p50/p95 of the client's round trip and of the engine's time. Each request is one model call (result
  cache, retry and Tab-Tab speculation off); the rest is the server's default: sampling.maxSteps 8, which a
  random model always runs to (its entropy never falls under the bound). Passes not begun by `--budget`
  seconds are skipped, so one GPU call stays short.

It prints the GPU, where the server's fills ran (dfim/stats' engine_path: device, dtype, the fast path's CUDA
graphs and experts' kernel), the numbers and the server log's last lines, and exits 1 when the server fails:
no ready model, a request that errs (a block the random model left nothing usable in is not an error), a
failed fill, a fill that moved off the device asked for.

GPU machine: pygls, lsprotocol, cattrs and tree-sitter are not installed there; they travel as wheels in
.whl/ (carry it), and scripts/device_env.sh puts dfim on the path:
    python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl \
      && source scripts/device_env.sh && export PYTHONPATH=/tmp/site:$PYTHONPATH \
      && python3 scripts/bench_gpu_server.py --out $OUT/bench_gpu_server.txt
The wheels (Python 3.12, x86-64): pygls 2.1.1, lsprotocol 2025.0.0, cattrs 26.2.1, attrs 26.1.0,
typing_extensions 4.16.0, tree-sitter 0.26.1, tree-sitter-python 0.25.0 (`pip download --no-deps
--only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 ... -d .whl`).
CPU, the whole pipeline on a tiny shape (tests/test_bench_gpu_server.py):
    python scripts/bench_gpu_server.py --shape tiny --device cpu --requests 4 --blocks 1
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, TypeVar

try:
    from lsprotocol import types
    from pygls.exceptions import JsonRpcException
except ImportError as exc:  # the GPU machine without the wheels of the docstring
    sys.exit(f"bench_gpu_server: {exc}; install the wheels in .whl/ first (see the docstring)")

from dfim.engine.model.checkpoint import DEFAULT_MODEL_DIR, write_random_checkpoint
from dfim.engine.model.config import RELEASED_26B_A4B
from dfim.server.options import Options

ROOT = Path(__file__).resolve().parents[1]


def _server_helpers() -> ModuleType:
    """tests/server_helpers.py by its path: a `tests` package some wheel left in site-packages would
    shadow the checkout's (which has no __init__.py) if it were imported by name."""
    spec = importlib.util.spec_from_file_location(
        "bench_server_helpers", ROOT / "tests" / "server_helpers.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


if TYPE_CHECKING:
    from tests.server_helpers import Session
else:
    Session = _server_helpers().Session

TOKENIZER = DEFAULT_MODEL_DIR / "tokenizer.json"  # 16,384 ids: the model's others are banned by the engine
SHAPES: dict[str, dict[str, Any]] = {
    "26b-a4b": RELEASED_26B_A4B,
    # write_random_checkpoint's small shape with both layer kinds, more experts than a token picks, and ids
    # beyond the tokenizer's, as the 26B has
    "tiny": dict(
        vocab_size=16_384 + 128,
        intermediate_size=96,
        num_hidden_layers=3,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        num_experts=8,
        top_k_experts=2,
        moe_intermediate_size=32,
        canvas_length=64,
    ),
}
SOURCE = ROOT / "scripts" / "data" / "typing.py.txt"
BLOCK_STUB = "\n\ndef summarize_steps(states, settings):\n    pass\n"  # Fill the hole replaces the `pass`
REQUEST_FAILED = -32803  # LSP's RequestFailed: an action the random model left nothing usable in
T = TypeVar("T")


class Report:
    """Lines to stdout and, with --out, to a file as they come (a run cut short keeps what it printed)."""

    def __init__(self, path: str) -> None:
        self.file = open(path, "w", buffering=1) if path else None  # noqa: SIM115 - open for the whole run
        self.start = time.perf_counter()
        self.failures: list[str] = []

    def __call__(self, line: str = "") -> None:
        print(line, flush=True)
        if self.file:
            self.file.write(line + "\n")

    def fail(self, why: str) -> None:
        self.failures.append(why)
        self(f"FAILED: {why}")

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def phase(self, name: str) -> None:
        self(f"\n== {name}  (t={self.elapsed():.0f} s)")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(round(q / 100 * len(ordered) + 0.5)) - 1))]


def summary(values: list[float]) -> str:
    if not values:
        return "no values"
    return (
        f"p50 {pct(values, 50):.0f} ms  p95 {pct(values, 95):.0f} ms  mean {statistics.mean(values):.0f} ms  "
        f"min {min(values):.0f}  max {max(values):.0f}  (n={len(values)})"
    )


def plain(value: Any) -> Any:
    """pygls hands custom results back as named tuples (nested): JSON-like values again, for printing."""
    if hasattr(value, "_asdict"):
        return {k: plain(v) for k, v in value._asdict().items()}
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def gpu_name(device: str) -> str:
    """From nvidia-smi, so that this client process never opens a CUDA context of its own on the card."""
    if device != "cuda":
        return f"none (cpu, {os.cpu_count()} cores)"
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return "unknown (no nvidia-smi)"
    query = ["--query-gpu=name,memory.used,memory.total", "--format=csv,noheader"]
    out = subprocess.run([smi, *query], capture_output=True, text=True, timeout=30)
    return out.stdout.strip().replace("\n", "; ") or f"unknown (nvidia-smi: {out.stderr.strip()})"


def write_folder(folder: Path, shape: str, device: str, draft: bool, experts: str = "bf16") -> Path:
    """The checkpoint without weights; bf16 on a GPU (what the fast path was measured in), fp32 on the CPU;
    `experts` "fp8": the experts' weights in e4m3, as an FP8 checkpoint's are kept."""
    import torch

    dtype = torch.bfloat16 if device == "cuda" else None  # None: the engine's own fp32
    write_random_checkpoint(
        folder,
        TOKENIZER,
        stored=False,
        init_dtype=dtype,
        init_experts="fp8" if experts == "fp8" else None,
        name=f"random-{shape}",
        **SHAPES[shape],
    )
    if draft:  # the encoder drafts single lines, as dfim's own checkpoints do (decision 38)
        info = json.loads((folder / "dfim.json").read_text())
        (folder / "dfim.json").write_text(json.dumps({**info, "sampler": {"draft": True}}, indent=2) + "\n")
    return folder


def line_ends(text: str, limit: int) -> list[tuple[int, int]]:
    """(line, character) at the end of code lines spread over the file (after its docstring, from the first
    import on): single-line fills after code."""
    lines = text.split("\n")
    first = next((i for i, line in enumerate(lines) if line.startswith(("import ", "from "))), 0)
    out = []
    for i, line in enumerate(lines[first:], start=first):
        stripped = line.strip()
        if len(stripped) >= 12 and not stripped.startswith(("#", '"""', "import ", "from ")):
            out.append((i, len(line)))
    step = max(1, len(out) // max(1, limit))
    return out[::step][:limit]


async def timed(report: Report, what: str, call: Awaitable[T], timeout: float) -> tuple[T | None, float]:
    """(result, round trip ms); a request that errs or times out is a failure of the server."""
    t0 = time.perf_counter()
    try:
        result = await asyncio.wait_for(call, timeout)
    except Exception as exc:  # noqa: BLE001 - any error answer or a dead server fails the benchmark
        report.fail(f"{what}: {type(exc).__name__}: {exc}")
        return None, (time.perf_counter() - t0) * 1000
    return result, (time.perf_counter() - t0) * 1000


class Pass:
    """The requests of one inline pass: round trips and engine times of those that ran exactly one fill."""

    def __init__(self, session: Session, report: Report, args: argparse.Namespace, canvases: int = 0) -> None:
        self.session, self.report, self.args = session, report, args
        # decoder passes a step runs: the fast path denoises a fill's canvases one after another (batch 1);
        # 0 in the warm-up, which sets no inline.candidates
        self.canvases = canvases
        self.trips: list[float] = []
        self.engine_ms: list[float] = []
        self.encoded: list[int] = []
        self.steps: list[int] = []
        self.requests = self.fills = self.empty = 0

    async def ask(self, uri: str, line: int, ch: int, count: bool = True) -> None:
        session = self.session
        before = plain(await session.stats())
        call = session.inline(uri, line, ch)
        result, ms = await timed(self.report, f"inline {line}:{ch}", call, self.args.timeout)
        after = plain(await session.stats())
        ran = after["engine_fills_started"] - before["engine_fills_started"]
        if self.args.verbose:
            shown = result.items[0].insert_text if result and result.items else None
            self.report(f"  {ms:7.0f} ms  {ran} fill(s)  {line + 1}:{ch + 1}  -> {shown!r}")
        if not count:
            return
        self.requests += 1
        self.fills += ran
        self.empty += result is None or not result.items
        if ran == 1:  # one model call: what the latency target is about
            self.trips.append(ms)
            self.engine_ms.append(after["model_ms"] - before["model_ms"])
            self.encoded.append(after["encoded_tokens"] - before["encoded_tokens"])
            self.steps.append(after["status"]["lastSteps"] or 0)

    def print(self) -> None:
        report = self.report
        report(f"  round trip      {summary(self.trips)}")
        report(f"  engine          {summary(self.engine_ms)}")
        if self.steps:
            report(
                f"  steps mean {statistics.mean(self.steps):.1f}, context tokens encoded mean "
                f"{statistics.mean(self.encoded):.0f}; {self.fills} fills for {self.requests} requests, "
                f"{self.empty} empty answers"
            )
        if self.steps and self.canvases:
            passes = [
                ms / max(1, n * self.canvases) for ms, n in zip(self.engine_ms, self.steps, strict=True)
            ]
            report(f"  engine ms per decoder pass (the encode included): p50 {pct(passes, 50):.1f}")
        if len(self.trips) != self.requests:
            report(
                f"  note: {self.requests - len(self.trips)} request(s) did not run exactly one fill (left out)"
            )


async def line_ends_pass(
    session: Session,
    report: Report,
    uri: str,
    spots: list[tuple[int, int]],
    args: argparse.Namespace,
    canvases: int = 0,
) -> None:
    """One request at each line end: a new suffix each time, so the whole context is encoded anew."""
    timed_pass = Pass(session, report, args, canvases)
    for line, ch in spots:
        await timed_pass.ask(uri, line, ch)
    timed_pass.print()


async def typing_pass(
    session: Session,
    report: Report,
    text: str,
    name: str,
    requests: int,
    args: argparse.Namespace,
    canvases: int = 0,
) -> None:
    """A user typing lines anew in the middle of the file, 3 characters and a request at a time: the context
    up to the cursor stays in the engine's cache (the suffix comes first in it), as while typing. The first
    request encodes the whole context and is left out."""
    uri = (ROOT / f"bench-typing-{name}.py").as_uri()  # never written: the text is sent
    cut = text.index("\n", len(text) // 2) + 1
    typed = text[cut : cut + 3 * requests]
    session.open(uri, text[:cut] + text[cut + len(typed) :], "python")
    line, ch = text[:cut].count("\n"), 0
    timed_pass = Pass(session, report, args, canvases)
    await timed_pass.ask(uri, line, ch, count=False)
    for k in range(0, len(typed), 3):
        line, ch = session.type_at(uri, typed[k : k + 3], line, ch)
        await timed_pass.ask(uri, line, ch)
    timed_pass.print()


async def block_fills(session: Session, report: Report, text: str, args: argparse.Namespace) -> None:
    """*Fill the hole* on the stub's `pass`: one warm-up, then `args.blocks` timed."""
    uri = (ROOT / "bench-block.py").as_uri()  # never written: the text is sent
    doc = text + BLOCK_STUB
    session.open(uri, doc, "python")
    at = {"line": doc.count("\n") - 1, "character": 6}  # inside the `pass`
    params = types.ExecuteCommandParams(command="dfim.fillHole", arguments=[uri, {"start": at, "end": at}])
    trips: list[float] = []
    for n in range(1 + args.blocks):
        t0 = time.perf_counter()
        try:
            await asyncio.wait_for(session.client.workspace_execute_command_async(params), args.timeout)
            outcome = "edit applied"
        except JsonRpcException as exc:
            if exc.code != REQUEST_FAILED:
                report.fail(f"block fill: {exc.code} {exc.message}")
                return
            outcome = f"nothing usable ({exc.message})"  # the fill ran; a random model writes noise
        except Exception as exc:  # noqa: BLE001 - a timeout or a dead server
            report.fail(f"block fill: {type(exc).__name__}: {exc}")
            return
        ms = (time.perf_counter() - t0) * 1000
        trips += [ms] if n else []
        status = plain(await session.stats())["status"]
        label = "warm-up" if n == 0 else f"timed {n}"
        report(
            f"  {label:8} round trip {ms:6.0f} ms  engine {status['lastLatencyMs'] or 0:6.0f} ms  "
            f"{status['lastSteps']} steps ({status['lastStopReason']}), {outcome}"
        )
    if trips:
        report(f"  block fill round trip: {summary(trips)}")


async def run(args: argparse.Namespace, report: Report) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="dfim-gpu-bench-"))
    report(f"gpu: {gpu_name(args.device)}")
    if args.model:  # a trained checkpoint: its own dfim.json (the shipped one drafts single lines)
        folder = DEFAULT_MODEL_DIR if args.model == "default" else Path(args.model)
        report(f"checkpoint: {folder}")
    else:
        folder = write_folder(tmp / "ckpt", args.shape, args.device, args.draft, args.experts)
        notes = json.dumps(json.loads((folder / "dfim.json").read_text()))
        report(f"checkpoint: {folder} (shape {args.shape}, no weight files), dfim.json {notes}")
    settings: dict[str, dict[str, Any]] = {
        "telemetry": {"enabled": False},
        "inline": {"cacheSize": 0, "retries": 0, "speculate": False},  # every request one model call
        "sampling": {"maxCanvas": 256},  # the block's canvas (the model's own limit caps it)
    }
    for section, values in json.loads(args.settings).items():
        settings[section] = {**settings.get(section, {}), **values}
    report(f"settings sent: {json.dumps(settings)}")
    session = Session()
    log = tmp / "server.log"
    # PYTHONPATH as this process has it: Session's default (the checkout) lacks engine/ on the GPU machine
    env = {"PYTHONPATH": os.environ.get("PYTHONPATH") or str(ROOT)}
    report.phase(f"start dfim serve --device {args.device}")
    serve_args = ("--device", args.device, "--log-file", str(log))
    await session.start(folder, tmp, init_options=settings, args=serve_args, env=env)
    try:
        await measure(session, report, args)
    finally:
        try:
            await session.stop()
        except Exception as exc:  # noqa: BLE001 - the numbers are in; a bad shutdown is reported
            report.fail(f"the server did not shut down cleanly: {exc!r}")
        tail = log.read_text(errors="replace").strip().splitlines()[-20:] if log.exists() else []
        if tail:  # warnings such as a CUDA graph capture that failed
            report("\nserver log (last lines):\n" + "\n".join(tail))
        shutil.rmtree(tmp, ignore_errors=True)


async def measure(session: Session, report: Report, args: argparse.Namespace) -> None:
    t0 = time.perf_counter()
    status = await session.wait_state(timeout=args.load_timeout)
    report(f"{status.state} after {time.perf_counter() - t0:.1f} s: {status.model} on {status.device}")
    if status.state != "ready":
        report.fail(f"no model: {status.message}")
        return
    text = SOURCE.read_text(encoding="utf-8")
    uri = (ROOT / "bench-inline.py").as_uri()  # never written: the text is sent
    session.open(uri, text, "python")
    spots = line_ends(text, args.requests)
    # Warm-up: the first fill builds the fast path, and each context bucket and canvas length captures its
    # graph once, as a server that has run a while has done. Printed, so the cold cost is seen too.
    report.phase("inline warm-up (graphs are captured here)")
    report(f" {len(spots)} line ends:")
    await line_ends_pass(session, report, uri, spots, args)
    report(" typing:")
    await typing_pass(session, report, text, "warm-up", min(5, args.requests), args)
    path = plain(await session.stats())["engine_path"]
    report(f"engine path after the first fills: {json.dumps(path)}")
    # The block before the timed inline passes: both numbers of the issue come before --budget cuts a pass.
    canvas = 256 if args.model else min(256, SHAPES[args.shape]["canvas_length"])
    report.phase(f"block: Fill the hole, canvas {canvas} tokens (at most)")
    await block_fills(session, report, text, args)
    for n in args.candidates:
        session.configure({"inline": {"candidates": n}})
        await asyncio.sleep(0.2)  # a notification: let the server apply it before the next request
        default = " (the server's default)" if n == Options().inline.candidates else ""
        rows = n if path["fast"] else 1  # decoder passes a step runs: the plain network batches canvases
        for kind in ("line ends (a fresh context each)", "typing (the context cached)"):
            if report.elapsed() > args.budget:
                report(f"\n(skipped: inline at {kind}, candidates {n}: past --budget {args.budget:.0f} s)")
                continue
            report.phase(f"inline at {kind}, inline.candidates={n}{default}")
            if kind.startswith("line ends"):
                await line_ends_pass(session, report, uri, spots, args, canvases=rows)
            else:
                await typing_pass(session, report, text, str(n), args.requests, args, canvases=rows)
    stats = plain(await session.stats())
    report.phase("end")
    report(f"engine path: {json.dumps(stats['engine_path'])}")
    report(f"gpu now: {gpu_name(args.device)}")
    counters = {k: stats[k] for k in ("fills", "completed", "failed", "cancelled", "oom_retries")}
    report(f"server counters: {json.dumps(counters)}")
    if stats["failed"] or stats["oom_retries"]:
        report.fail(f"the server counted failed fills or out-of-memory retries: {counters}")
    device = stats["status"]["device"]
    if not str(device).startswith(args.device):  # e.g. moved to the CPU after running out of GPU memory
        report.fail(f"fills ran on {device}, not {args.device}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="26b-a4b")
    parser.add_argument(
        "--model", help="a trained checkpoint folder (the shipped one: 'default') for --shape"
    )
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--requests", type=int, default=24, help="inline requests per pass (default 24)")
    parser.add_argument(
        "--candidates",
        type=lambda s: [int(x) for x in s.split(",") if x],
        default=[2, 1],
        help="inline.candidates of each timed inline pass (comma-separated; default 2,1)",
    )
    parser.add_argument("--blocks", type=int, default=2, help="timed block fills after the warm-up one")
    parser.add_argument("--draft", action="store_true", help="dfim.json asks for the encoder's draft")
    parser.add_argument(
        "--experts", choices=("bf16", "fp8"), default="bf16", help="the random shape's experts' weights"
    )
    parser.add_argument("--settings", default="{}", help="server settings merged over the benchmark's (JSON)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds one request may take")
    parser.add_argument(
        "--load-timeout", type=float, default=300.0, help="seconds the model may take to load"
    )
    parser.add_argument(
        "--budget", type=float, default=200.0, help="seconds after which inline passes not begun are skipped"
    )
    parser.add_argument("--out", default="", help="also write the report here")
    parser.add_argument("--verbose", action="store_true", help="print every inline request")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    report = Report(args.out)
    try:
        asyncio.run(run(args, report))
    except Exception as exc:  # noqa: BLE001 - e.g. the server never started: a failure, reported
        report.fail(f"{type(exc).__name__}: {exc}")
    report(f"\n{'FAILED' if report.failures else 'OK'} after {report.elapsed():.0f} s")
    return 1 if report.failures else 0


if __name__ == "__main__":
    sys.exit(main())
