"""Training throughput on one GPU without data: the real training step (`train_step`) on synthetic
batches shaped like dfim-base's (context 1,024, canvas buckets, the causal loss on), eager or with
`--compile-scope layers`, and optionally a torch-profiler table of where a step's GPU time goes.

The base pipeline (`scripts/train_base_pipeline.sh`) runs it on spare GPUs while the CPU builds the token
shards, and trains with whichever setting was faster. Prints one JSON line per run:

    python scripts/probe_train_speed.py --compile layers --steps 40 --out probe-layers.json
    python scripts/probe_train_speed.py --compile none --profile --out probe-eager.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from dfim.commands.train import add_arguments
from dfim.engine.model.tokenizer import Tokenizer
from dfim.engine.training.examples import Batch
from dfim.engine.training.run import setup
from dfim.engine.training.train import train_step

ROOT = Path(__file__).resolve().parents[1]


def synthetic_batch(batch: int, context: int, canvas: int, vocab: int, gen: torch.Generator) -> Batch:
    """Random tokens with a realistic mix: a tenth of the rows left-padded to half, a few pins."""
    ctx = torch.randint(10, vocab, (batch, context), generator=gen)
    pad = torch.zeros(batch, context, dtype=torch.bool)
    pad[: batch // 10, : context // 2] = True
    middle = torch.randint(10, vocab, (batch, canvas), generator=gen)
    pinned = torch.zeros(batch, canvas, dtype=torch.bool)
    pinned[:, -2:] = True
    weight = (~pinned).float()
    return Batch(ctx, pad, middle, pinned, weight, int((~pad).sum()) + batch * canvas)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compile", choices=("none", "layers", "model"), default="layers")
    parser.add_argument("--steps", type=int, default=40, help="timed steps after the warm-up ones")
    parser.add_argument("--warmup", type=int, default=8, help="steps not timed (compiles happen here)")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--canvases", default="16,32,64,128", help="canvas lengths, cycled")
    parser.add_argument("--config", default="base")
    parser.add_argument("--tokenizer", default=str(ROOT / "engine/weights/dfim-base/tokenizer.json"))
    parser.add_argument("--profile", action="store_true", help="print the top GPU kernels of 5 steps")
    parser.add_argument("--out", type=Path, help="also write the JSON result here")
    opts = parser.parse_args()

    train_parser = argparse.ArgumentParser()
    add_arguments(train_parser)
    args = train_parser.parse_args(
        [
            "--data",
            "unused",
            "--tokenizer",
            opts.tokenizer,
            "--model-config",
            opts.config,
            "--out",
            "/tmp/probe",
        ]
        + ["--causal-weight", "1.0", "--batch-size", str(opts.batch), "--context-tokens", str(opts.context)]
    )
    args.compile = opts.compile != "none"
    args.compile_scope = "model" if opts.compile == "model" else "layers"
    args.canvas_length = max(int(c) for c in opts.canvases.split(","))
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    tok = Tokenizer.from_file(Path(opts.tokenizer))
    canvases = [int(c) for c in opts.canvases.split(",")]
    run = setup(args, Path(args.out), tok, device, max(canvases), None)
    gen = torch.Generator().manual_seed(0)
    batches = [
        synthetic_batch(opts.batch, opts.context, c, run.config.vocab_size, gen).to(device) for c in canvases
    ]

    def step(i: int) -> None:
        train_step(run, batches[i % len(batches)], 1e-4)

    t0 = time.time()
    for i in range(opts.warmup):
        step(i)
    if device.type == "cuda":
        torch.cuda.synchronize()
    warmup_s = time.time() - t0
    t0 = time.time()
    tokens = 0
    for i in range(opts.steps):
        step(i)
        tokens += batches[i % len(batches)].real_tokens
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.time() - t0
    result = {
        "compile": opts.compile
        if args.compile or opts.compile == "none"
        else f"{opts.compile} failed: eager",
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "batch": opts.batch,
        "context": opts.context,
        "warmup_s": round(warmup_s, 1),
        "step_s": round(seconds / opts.steps, 4),
        "tok_per_s": round(tokens / seconds),
        "peak_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 1)
        if device.type == "cuda"
        else None,
    }
    print(json.dumps(result), flush=True)
    if opts.out:
        opts.out.write_text(json.dumps(result) + "\n")
    if opts.profile and device.type == "cuda":
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for i in range(5):
                step(i)
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=30), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
