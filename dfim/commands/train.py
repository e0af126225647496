"""`dfim train`: train or fine-tune a checkpoint, on one device or data-parallel on every GPU of a machine.

    dfim train --data DIR --out RUN [--model-config base] [--minutes 8] [--resume]
    torchrun --nproc_per_node=4 -m dfim.commands.train --data DIR --out RUN ...

The options, their checks and the command's exit codes live here; the training itself is
`dfim.engine.training.train.train(args)`, which takes the parsed Namespace. Under torchrun every process
parses the same options; --batch-size is per process (the global batch is batch-size x processes).
The GPU scripts run it as `python3 -m dfim.commands.train` (dfim is not installed there).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from dfim.commands import options
from dfim.engine.model.checkpoint import DEFAULT_MODEL_DIR
from dfim.engine.model.tokenizer import FIM_SPECIALS, Tokenizer
from dfim.engine.training.examples import ExampleSettings
from dfim.engine.training.presets import (
    CONTEXT_TOKENS,
    DEFAULT_CONTEXT_TOKENS,
    PRESETS,
    model_config,
)
from dfim.engine.training.run import resolve_context_tokens
from dfim.engine.training.train import example_mix, train


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", required=True, help="token shards from `dfim data`")
    parser.add_argument("--out", required=True, help="run folder: state/, train_log.jsonl, export/")
    parser.add_argument(
        "--tokenizer", default=str(DEFAULT_MODEL_DIR / "tokenizer.json"), help="tokenizer.json of the data"
    )
    parser.add_argument(
        "--model-config", default="small", help=f"preset {sorted(PRESETS)}, JSON file or JSON"
    )
    parser.add_argument("--init-from", help="start from the weights of this checkpoint folder")
    parser.add_argument("--resume", action="store_true", help="continue from OUT/state if it exists")
    parser.add_argument("--export", help="export folder (default OUT/export)")
    parser.add_argument(
        "--name", default=None, help="model name written to dfim.json (default: the --out folder's name)"
    )
    parser.add_argument("--minutes", type=float, default=0.0, help="wall-clock limit of this run (0 = none)")
    parser.add_argument(
        "--plan-minutes", type=float, default=0.0, help="training time planned over all chunks (lr schedule)"
    )
    parser.add_argument("--total-steps", type=int, default=0, help="plan in steps instead of minutes")
    parser.add_argument("--steps", type=int, default=0, help="stop after this many steps in total (0 = none)")
    parser.add_argument("--reserve-seconds", type=float, default=20.0, help="kept for saving and export")
    parser.add_argument(
        "--batch-size",
        type=int,
        default=128,
        help="examples per step PER PROCESS: under torchrun the global batch is this x the processes",
    )
    parser.add_argument(
        "--context-tokens",
        type=int,
        default=None,
        help=(
            "encoder input the examples are cut to, FIM tokens included (default: a resumed run's, an "
            f"--init-from checkpoint's, else {DEFAULT_CONTEXT_TOKENS}; "
            + ", ".join(f"{k} {v}" for k, v in CONTEXT_TOKENS.items())
            + ")"
        ),
    )
    parser.add_argument("--buckets", default="16,32,64,128", help="canvas lengths")
    parser.add_argument("--lr", type=float, default=2e-3, help="peak learning rate")
    parser.add_argument(
        "--min-lr-ratio", type=float, default=0.1, help="learning rate at the end of the decay, over --lr"
    )
    parser.add_argument("--warmup", type=int, default=300, help="steps of linear learning-rate warm-up")
    parser.add_argument(
        "--decay-share", type=float, default=0.25, help="WSD: share of the plan spent decaying"
    )
    parser.add_argument("--weight-decay", type=float, default=0.1, help="AdamW weight decay")
    parser.add_argument("--grad-clip", type=float, default=1.0, help="gradient norm clipped to this")
    parser.add_argument(
        "--objective",
        choices=("diffusion", "causal"),
        default="diffusion",
        help="diffusion: the shipped infilling objective; causal: the same network as an AR FIM model",
    )
    parser.add_argument("--pad-weight", type=float, default=0.5, help="loss weight of pads after EOS")
    parser.add_argument(
        "--span-mix",
        default=None,
        help="training spans as line,block,random shares (default 0.45,0.35,0.20; validation keeps it)",
    )
    parser.add_argument(
        "--pin-subset-p",
        type=float,
        default=None,
        help="share of training examples with 10-60%% of the canvas pinned (default 0.3)",
    )
    parser.add_argument(
        "--cross-file-p",
        type=float,
        default=0.0,
        help="share of training examples whose prefix starts with a block of other files of the project, "
        "as the server's context.extra writes it (needs the data build's manifest.jsonl; default 0)",
    )
    parser.add_argument(
        "--stop-at-plan", action="store_true", help="stop once --plan-minutes of training are spent"
    )
    parser.add_argument(
        "--context-lm-weight",
        type=float,
        default=0.0,
        help="diffusion: weight of a next-token loss on the encoder's context pass (0 = off)",
    )
    parser.add_argument(
        "--causal-weight",
        type=float,
        default=0.0,
        help="diffusion: weight of an AR FIM loss on `context middle <eos>`, which trains the draft (0 = off)",
    )
    parser.add_argument("--t-min", type=float, default=0.02, help="smallest noise level sampled")
    parser.add_argument(
        "--ordered-noise-p",
        type=float,
        default=0.0,
        help="share of rows noised left-to-right as the sampler's window leaves them (clean up to a cut)",
    )
    parser.add_argument(
        "--self-cond-p", type=float, default=0.5, help="share of steps trained with self-conditioning"
    )
    # Data-loader workers per process: under torchrun the machine's cores are shared by its processes.
    local_processes = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    parser.add_argument(
        "--workers",
        type=int,
        default=min(12, max(0, (os.cpu_count() or 2) // local_processes - 2)),
        help="data-loader worker processes per training process (0: load in the training process)",
    )
    options.add_device(
        parser, default=None, help="where training runs (default: cuda when available, else cpu)"
    )
    parser.add_argument(
        "--compile",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="torch.compile (default: on GPU)",
    )
    parser.add_argument(
        "--compile-scope",
        choices=("layers", "model"),
        default="layers",
        help="what --compile compiles: each layer's projections and feed-forward (a minute to compile), "
        "or the whole training forward (default: %(default)s)",
    )
    parser.add_argument(
        "--compile-mode", default=None, help="torch.compile mode (e.g. max-autotune-no-cudagraphs)"
    )
    parser.add_argument("--log-every", type=int, default=50, help="log to train_log.jsonl every N steps")
    parser.add_argument("--eval-every", type=int, default=500, help="validation every N steps (at log steps)")
    parser.add_argument("--val-batches", type=int, default=8, help="batches per validation (0: none)")
    parser.add_argument(
        "--save-every-minutes", type=float, default=4.0, help="minutes between saves of OUT/state"
    )
    options.add_seed(parser, help="seed of the initial weights, the data order and the noise")
    parser.add_argument(
        "--peak-tflops",
        type=float,
        default=0.0,
        help="one device's bf16 dense peak for the logged MFU (default: a table by GPU name, e.g. H100 989)",
    )
    parser.add_argument(
        "--skip-memory-check",
        action="store_true",
        help="start even where the estimate of the memory a step needs exceeds the memory available",
    )


def available_memory(device: str | None) -> tuple[int, str] | None:
    """(bytes free, what) on the device the run will use: GPU memory, else RAM; None when unknown."""
    if (device or "cuda").startswith("cuda") and torch.cuda.is_available():
        free, _ = torch.cuda.mem_get_info(torch.device(device) if device else None)
        return int(free), "free GPU memory"
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024, "available RAM"
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "available RAM"
    except (ValueError, OSError, AttributeError):
        return None


def step_memory(config, parameters: int, batch: int, context: int, canvas: int, gpu: bool) -> int:
    """A rough upper estimate of the bytes one training step holds: weights, gradients and AdamW's two
    moments in fp32, each layer's saved activations (about 17 values per hidden unit per token; on a CPU
    in fp32 and with the attention scores of eager attention), and the logits with their softmax and
    gradient over the canvas and the context (the context-LM and causal branches)."""
    tokens = context + canvas
    per_elem = 2 if gpu else 4
    per_token_layer = 17 * config.hidden_size + (0 if gpu else 3 * config.num_attention_heads * tokens)
    activations = batch * tokens * config.num_hidden_layers * per_token_layer * per_elem
    logits = batch * tokens * config.vocab_size * 4 * 3
    return 16 * parameters + activations + logits


def check_memory(config, model: torch.nn.Module, args: argparse.Namespace, canvas: int) -> None:
    """Refuse a batch whose step cannot fit the device (the OOM killer ends such a run without a word),
    naming the largest --batch-size that fits."""
    from dfim.commands.checks import InputError

    free = available_memory(args.device)
    if free is None or args.skip_memory_check:
        return
    have, what = free
    gpu = what.startswith("free GPU")
    parameters = sum(p.numel() for p in model.parameters())

    def need(batch: int) -> int:
        return step_memory(config, parameters, batch, args.context_tokens, canvas, gpu)

    budget = int(have * 0.8)  # the data loader, the allocator and the rest of the machine
    if need(args.batch_size) <= budget:
        return
    fits = args.batch_size
    while fits > 1 and need(fits) > budget:
        fits //= 2
    gib = 1024**3
    advice = (
        f"try --batch-size {fits}"
        if need(fits) <= budget
        else "even one example does not fit: a smaller --model-config or --context-tokens"
    )
    raise InputError(
        f"--batch-size {args.batch_size}: a training step needs about {need(args.batch_size) / gib:.1f} GiB, "
        f"this machine has {have / gib:.1f} GiB of {what}; {advice} "
        "(or --skip-memory-check to start anyway)"
    )


# The encoder input holds the 4 FIM tokens and, on short-context examples, a budget drawn from [16, rest].
MIN_CONTEXT_TOKENS = FIM_SPECIALS + 16
MIN_DOC_TOKENS = 8  # shorter files are never drawn (FimExamples)


def check_args(args: argparse.Namespace) -> None:
    """Refuse bad options before any data or model is loaded: InputError, whose message is the one line
    `dfim train` prints (exit 2). Reads the tokenizer, the shard index and the model config only."""
    from dfim.commands.checks import (
        InputError,
        at_least,
        existing_dir,
        existing_file,
        output_folder,
        positive,
        within,
    )
    from dfim.engine.api import EngineError
    from dfim.engine.inference.fill import check_device
    from dfim.engine.model.checkpoint import read_config
    from dfim.engine.model.network import DiffusionGemma

    at_least("--batch-size", args.batch_size, 1)
    at_least("--steps", args.steps, 0)  # 0: no step limit
    at_least("--total-steps", args.total_steps, 0)
    at_least("--minutes", args.minutes, 0)  # 0: no time limit
    at_least("--plan-minutes", args.plan_minutes, 0)
    at_least("--reserve-seconds", args.reserve_seconds, 0)
    if args.minutes and args.minutes * 60 <= args.reserve_seconds:
        raise InputError(
            f"--minutes {args.minutes} leaves no training time: {args.reserve_seconds:g} s of it are kept "
            "for saving (--reserve-seconds)"
        )
    at_least("--peak-tflops", args.peak_tflops, 0)
    try:
        args.context_tokens = resolve_context_tokens(args)
    except (OSError, ValueError) as err:  # an unreadable saved state or dfim.json
        raise InputError(f"--context-tokens: cannot read the default ({err})") from None
    at_least("--context-tokens", args.context_tokens, MIN_CONTEXT_TOKENS)
    positive("--lr", args.lr)
    within("--min-lr-ratio", args.min_lr_ratio, 0, 1)
    at_least("--warmup", args.warmup, 0)
    within("--decay-share", args.decay_share, 0, 1)
    at_least("--weight-decay", args.weight_decay, 0)
    positive("--grad-clip", args.grad_clip)
    at_least("--pad-weight", args.pad_weight, 0)
    at_least("--context-lm-weight", args.context_lm_weight, 0)
    at_least("--causal-weight", args.causal_weight, 0)
    within("--t-min", args.t_min, 0, 1, open_high=True)
    within("--self-cond-p", args.self_cond_p, 0, 1)
    within("--ordered-noise-p", args.ordered_noise_p, 0, 1)
    at_least("--workers", args.workers, 0)
    at_least("--log-every", args.log_every, 1)
    at_least("--eval-every", args.eval_every, 1)
    at_least("--val-batches", args.val_batches, 0)
    at_least("--save-every-minutes", args.save_every_minutes, 0)
    if args.objective == "causal" and args.context_lm_weight > 0:
        raise InputError("--context-lm-weight is for the diffusion objective (a causal run's loss is all LM)")
    if args.context_lm_weight > 0 and args.causal_weight > 0:
        raise InputError("--causal-weight already trains the context's next tokens: drop --context-lm-weight")
    if args.objective == "causal" and args.causal_weight > 0:
        raise InputError("--causal-weight is for the diffusion objective (a causal run's loss is all LM)")
    if args.objective == "causal" and args.ordered_noise_p > 0:
        raise InputError("--ordered-noise-p is for the diffusion objective")
    mix = ExampleSettings()
    if args.objective == "causal":
        mix = replace(mix, pin_subset_p=0.0, pin_run_p=0.0)
    try:
        example_mix(args, mix)
    except SystemExit as err:
        raise InputError(str(err.code)) from None
    try:
        buckets = sorted({int(b) for b in args.buckets.split(",") if b.strip()})
    except ValueError:
        buckets = []
    if not buckets or buckets[0] < 2:
        raise InputError(
            f"--buckets wants canvas lengths of at least 2, comma-separated (e.g. 16,32,64,128): {args.buckets!r}"
        )
    if args.device is not None:
        try:
            check_device(args.device)
        except EngineError as err:
            raise InputError(f"--device: {err}") from None

    output_folder(args.out, "--out")
    if args.export:
        output_folder(args.export, "--export")
    tok_path = existing_file(args.tokenizer, "--tokenizer")
    try:
        tok = Tokenizer.from_file(tok_path)
    except Exception as err:  # tokenizers raises its own Exception subclass
        raise InputError(f"--tokenizer {tok_path}: not a usable tokenizer.json ({err})") from None

    data = existing_dir(args.data, "--data")
    index = data / "train_docs.npy"
    if not index.is_file():
        raise InputError(
            f"--data {data}: no token shards (train_docs.npy); build them with "
            f"`dfim data --out {data} --tokenizer ...`"
        )
    try:
        docs = np.load(index)
    except (OSError, ValueError, EOFError) as err:
        raise InputError(f"--data {data}: unreadable shard index train_docs.npy ({err})") from None
    if docs.ndim != 2 or docs.shape[1] != 3:
        raise InputError(f"--data {data}: train_docs.npy is not a shard index (shape {docs.shape})")
    if not (docs[:, 2] >= MIN_DOC_TOKENS).any():
        raise InputError(
            f"--data {data}: no training files ({len(docs)} in the train split, none of {MIN_DOC_TOKENS}+ tokens)"
        )
    for shard in sorted({int(i) for i in docs[:, 0]}):
        if not (data / f"train_{shard:03d}.bin").is_file():
            raise InputError(f"--data {data}: shard train_{shard:03d}.bin is missing")
    try:
        meta = json.loads((data / "meta.json").read_text()) if (data / "meta.json").is_file() else {}
    except (OSError, ValueError):
        meta = {}
    if isinstance(meta, dict) and meta.get("vocab_size") not in (None, tok.vocab_size):
        raise InputError(
            f"--data {data} was tokenized with another vocabulary ({meta['vocab_size']} tokens, "
            f"--tokenizer has {tok.vocab_size})"
        )

    resuming = args.resume and (Path(args.out) / "state" / "trainer.json").is_file()
    if resuming:
        return  # the model is the saved run's
    if args.init_from:
        folder = existing_dir(args.init_from, "--init-from")
        try:
            config = read_config(folder)
        except EngineError as err:
            raise InputError(f"--init-from: {err}") from None
        what = f"--init-from {folder}"
    else:
        try:
            config = model_config(args.model_config, tok.vocab_size, max(buckets))
        except (ValueError, TypeError) as err:
            raise InputError(f"--model-config: {err}") from None
        what = "--model-config"
    if config.vocab_size != tok.vocab_size:
        raise InputError(
            f"{what}: model vocabulary {config.vocab_size} != tokenizer vocabulary {tok.vocab_size}"
        )
    try:
        with torch.device("meta"):  # shapes only: no memory, no time
            model = DiffusionGemma(config)
    except Exception as err:  # a config that names impossible shapes
        raise InputError(f"{what}: cannot build this model ({type(err).__name__}: {err})") from None
    check_memory(config, model, args, max(buckets))


def run(args: argparse.Namespace) -> int:
    from dfim.commands.checks import InputError, fail
    from dfim.engine.api import EngineError

    try:
        check_args(args)
    except InputError as err:
        return fail("dfim train", str(err))
    if args.compile is None:
        args.compile = torch.cuda.is_available() and (args.device or "cuda") != "cpu"
    try:
        train(args)
    except EngineError as err:  # a checkpoint (--init-from) whose weights cannot be read
        return fail("dfim train", str(err))
    except SystemExit as err:  # train's own refusals (option combinations) carry their message
        if isinstance(err.code, str):
            return fail("dfim train", err.code)
        raise
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dfim.commands.train",
        description=__doc__.split("\n\n")[0],
        formatter_class=options.HelpFormatter,
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
