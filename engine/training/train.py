"""Train a DiffusionGemma infilling model on token shards from `dfim.engine.training.data`.

    dfim train --data DIR --out RUN [--model-config small] [--minutes 8] [--resume]
    torchrun --nproc_per_node=4 -m dfim.commands.train ...     (data-parallel on every GPU of a machine)

The options are parsed by `dfim.commands.train`; this module takes the parsed Namespace.

Objective (DESIGN §2, shaped for infilling): FIM examples from `examples`, uniform-state noise on the
canvas (`objective`); each position not pinned is replaced by a uniformly random token with probability
t ~ U(t_min, 1); pins are never noised and carry no loss. A share of the steps (--self-cond-p) runs a
first no-grad pass whose logits self-condition the second. `--objective causal` trains the same network
as an AR FIM model instead (the first phase of the AR-then-diffusion recipe).

Data-parallel (`distributed`): under torchrun every process trains on its own GPU and its own data
stream (seeded by its rank); --batch-size is PER PROCESS, so the global batch is batch-size x processes.
Gradients are summed over the ranks with losses normalised by the global weight, so one step equals one
process's step over the global batch. Only rank 0 logs, validates, saves and exports; the ranks agree on
when to stop every step, so none is left waiting in a collective.

Resumable in chunks: `--minutes` stops cleanly and saves (`RUN/state/`: model and optimizer as
safetensors, scalars as JSON; nothing is pickled); `--resume` continues. Every run ends with an
HF-format bf16 export (`RUN/export/`, shards of at most 16 MiB) plus tokenizer.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dfim.engine.model.network import uncompile_layers
from dfim.engine.model.tokenizer import Tokenizer
from dfim.engine.training.cross_file import ProjectFiles
from dfim.engine.training.distributed import (
    World,
    active_parameters,
    close_world,
    global_sum,
    global_weight,
    init_world,
    peak_flops,
    step_flops,
    sum_gradients,
)
from dfim.engine.training.examples import Batch, BatchStream, ExampleSettings
from dfim.engine.training.export import export_run
from dfim.engine.training.objective import (
    add_noise,
    causal_loss,
    context_lm_loss,
    lr_at,
    weighted_loss,
)
from dfim.engine.training.progress import Log, LogWindow, log_window
from dfim.engine.training.run import Run, pick_device, resolve_context_tokens, setup
from dfim.engine.training.shards import TokenShards
from dfim.engine.training.state import save_state

# Re-exported: tests, scripts and the command import these from here.


def example_mix(args: argparse.Namespace, settings: ExampleSettings) -> dict[str, Any]:
    """The training stream's span and pin mix from --span-mix / --pin-subset-p (unset: the defaults)."""
    changes: dict[str, Any] = {}
    if getattr(args, "span_mix", None):
        try:
            mix = tuple(float(x) for x in args.span_mix.split(","))
        except ValueError:
            mix = ()
        if len(mix) != 3 or min(mix) < 0 or abs(sum(mix) - 1) > 1e-6:
            raise SystemExit(
                f"--span-mix wants three shares that sum to 1 (line,block,random): {args.span_mix!r}"
            )
        changes["span_mix"] = mix
    pin_p = getattr(args, "pin_subset_p", None)
    if pin_p is not None and settings.pin_subset_p > 0:  # a causal run has no pins to mix
        if not 0 <= pin_p <= 1 - settings.pin_run_p:
            raise SystemExit(f"--pin-subset-p must be in [0, {1 - settings.pin_run_p}]: {pin_p}")
        changes["pin_subset_p"] = pin_p
    cross_file_p = getattr(args, "cross_file_p", 0.0) or 0.0
    if cross_file_p:
        if not 0 <= cross_file_p <= 1:
            raise SystemExit(f"--cross-file-p must be in [0, 1]: {cross_file_p}")
        shards = TokenShards(args.data, "train")
        if ProjectFiles.load(args.data, "train", len(shards)) is None:
            raise SystemExit(
                f"--cross-file-p needs {args.data}/manifest.jsonl with one line per training file, as `dfim data` "
                "writes it"
            )
        changes["cross_file_p"] = cross_file_p
    return changes


def make_val_batches(args: argparse.Namespace, settings: ExampleSettings, tok_path: str) -> list[Batch]:
    """Fixed validation batches (same files, cuts and noise every time) from the val split."""
    val_docs = Path(args.data) / "val_docs.npy"
    if not val_docs.is_file() or len(np.load(val_docs)) == 0:
        # A small project gives no validation file: say so, or val_loss passes for held-out loss.
        print(
            f"dfim train: WARNING: --data {args.data} has no validation files, so val_loss is measured on "
            "TRAINING files and shows no overfitting; rebuild the data with a larger `dfim data "
            "--val-fraction` or from more files, or pass --val-batches 0",
            file=sys.stderr,
            flush=True,
        )
        split = "train"
    else:
        split = "val"
    stream = iter(BatchStream(args.data, split, tok_path, settings, args.batch_size, seed=12345))
    return [next(stream) for _ in range(args.val_batches)]


def example_settings(
    args: argparse.Namespace, buckets: tuple[int, ...]
) -> tuple[ExampleSettings, ExampleSettings]:
    """(the training stream's example settings, validation's). Validation keeps the default mix of spans
    and pins, so val loss compares across runs that train on another mix (a continuation that favours
    single lines, say)."""
    settings = ExampleSettings(
        context_tokens=args.context_tokens, buckets=buckets, pad_weight=args.pad_weight
    )
    if args.objective == "causal":  # no canvas to pin, and a causal model never reads the pads after EOS
        settings = replace(settings, pin_subset_p=0.0, pin_run_p=0.0, pad_weight=0.0)
    return replace(settings, **example_mix(args, settings)), settings


STOP_REASONS = ("steps", "time", "plan")


def stop_reason(run: Run, deadline: float, plan_seconds: float) -> str | None:
    """Why training stops before the next step ("steps", "time", "plan"), or None to go on. Every rank
    gets the same answer (the first reason any rank has): a rank that stopped alone would leave the
    others waiting in the next step's collectives."""
    reason = local_stop_reason(run, deadline, plan_seconds)
    if not run.world.distributed:
        return reason
    votes = global_sum([float(reason == r) for r in STOP_REASONS], run.device, run.world)
    return next((r for r, v in zip(STOP_REASONS, votes, strict=True) if v > 0), None)


def local_stop_reason(run: Run, deadline: float, plan_seconds: float) -> str | None:
    args = run.args
    if args.steps and run.step >= args.steps:
        return "steps"
    if time.time() >= deadline - args.reserve_seconds:  # --minutes, less the time kept for saving
        return "time"
    if args.stop_at_plan and plan_seconds and run.train_seconds >= plan_seconds:
        return "plan"  # the planned GPU minutes are spent (equal-budget comparisons)
    return None


def lr_now(run: Run, plan_seconds: float) -> float:
    """The learning rate of the next step: the WSD schedule at the run's progress through its plan, in
    steps (--total-steps, else --steps) or training seconds (--plan-minutes, else --minutes)."""
    args = run.args
    if args.total_steps or args.steps:
        progress = run.step / (args.total_steps or args.steps)
    elif plan_seconds:
        progress = run.train_seconds / plan_seconds
    else:
        progress = 0.0  # no plan: constant learning rate after warmup
    return lr_at(run.step, progress, args.lr, args.warmup, args.decay_share, args.min_lr_ratio)


def forward_backward(
    run: Run, batch: Batch, noisy: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor | None, bool]:
    """One step's gradients -> (the objective's own loss, the auxiliary LM loss or None, whether the step
    self-conditioned). Under data parallelism each loss is this rank's share of the global batch's loss
    (normalised by the weight summed over all ranks), so the ranks' losses and gradients sum to one
    process's over the whole batch.

    causal: the AR FIM loss over `context middle <eos>`. diffusion: noise the canvas (or take `noisy`, a
    canvas noised by the caller: the data-parallel test noises one global batch and splits it); on a
    share --self-cond-p of the steps a first no-grad pass's logits self-condition the second; the
    weighted denoising loss, plus --context-lm-weight x the encoder's next-token loss on the context or
    --causal-weight x the AR FIM loss."""
    args = run.args

    def denominator(weight: torch.Tensor) -> torch.Tensor:
        return global_weight(weight, run.world)

    if run.causal:
        with run.autocast():
            loss = causal_loss(run.model, batch, denominator, run.causal_forward)
        run.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        return loss, None, False
    if noisy is None:
        noisy, _ = add_noise(
            batch.canvas,
            batch.pinned,
            run.config.vocab_size,
            args.t_min,
            run.noise_gen,
            args.ordered_noise_p,
            run.pad_id,
        )
    self_cond = None
    if run.self_cond_rng.random() < args.self_cond_p:
        with torch.no_grad(), run.autocast():
            self_cond = run.fwd(batch.context, noisy, None, batch.context_pad).detach()
    context_lm = args.context_lm_weight > 0
    with run.autocast():
        logits, hidden = run.fwd_lm(batch.context, noisy, self_cond, batch.context_pad, context_lm)
    loss = weighted_loss(logits, batch.canvas, batch.weight, denominator)
    total, lm = loss, None
    if hidden is not None:
        with run.autocast():
            lm = context_lm_loss(run.model, hidden, batch, denominator)
        total = loss + args.context_lm_weight * lm
    if args.causal_weight > 0:
        # The same weights as an AR FIM model over `context middle <eos>`: the draft that serves
        # single lines (decision 38) decodes this way, and the diffusion loss never trains it.
        with run.autocast():
            lm = causal_loss(run.model, batch, denominator, run.causal_forward)
        total = total + args.causal_weight * lm
    run.optimizer.zero_grad(set_to_none=True)
    total.backward()
    # the diffusion loss alone is reported: comparable with runs that have no context LM loss
    return loss, (None if lm is None else lm.detach()), self_cond is not None


def train_step(
    run: Run, batch: Batch, lr: float, noisy: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor | None, bool]:
    """One optimizer step at learning rate `lr` (gradients summed over the ranks, then clipped) ->
    forward_backward's losses and whether it self-conditioned."""
    for group in run.optimizer.param_groups:
        group["lr"] = lr
    try:
        loss, lm, self_conditioned = forward_backward(run, batch, noisy)
    except Exception as err:  # a compiler failure must not cost the run: fall back to eager
        if not run.args.compile or run.step > 0:
            raise
        print(f"torch.compile failed ({type(err).__name__}: {err}); continuing without it", flush=True)
        run.compiled = run.compiled_causal = None
        uncompile_layers(run.model)
        run.args.compile = False
        loss, lm, self_conditioned = forward_backward(run, batch, noisy)
    sum_gradients(run.model, run.world)
    torch.nn.utils.clip_grad_norm_(run.model.parameters(), run.args.grad_clip)
    run.optimizer.step()
    return loss, lm, self_conditioned


def train(args: argparse.Namespace) -> dict[str, Any]:
    """One training run (or the next chunk of a resumed one) as the options say -> the final log row
    (step, tokens, stop reason, val scores) with every step's loss and the export folder (rank 0; the
    other ranks of a data-parallel run return the same row without validation scores or export)."""
    world, device = init_world(args.device)
    try:
        return train_in_world(args, world, pick_device(device))
    finally:
        close_world(world)


def train_in_world(args: argparse.Namespace, world: World, device: torch.device) -> dict[str, Any]:
    t_start = time.time()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # data-loader workers fork this process
    deadline = t_start + args.minutes * 60 if args.minutes else float("inf")
    torch.manual_seed(args.seed)
    if not 0 <= args.ordered_noise_p <= 1 or (args.objective == "causal" and args.ordered_noise_p > 0):
        raise SystemExit(f"--ordered-noise-p must be in [0, 1] on a diffusion run: {args.ordered_noise_p}")
    args.context_tokens = resolve_context_tokens(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tok_path = Path(args.tokenizer)
    tok = Tokenizer.from_file(tok_path)
    meta_path = Path(args.data) / "meta.json"
    if meta_path.is_file():
        meta = json.loads(meta_path.read_text())
        if meta.get("vocab_size") not in (None, tok.vocab_size):
            raise SystemExit(f"{args.data} was tokenized with another vocabulary ({meta['vocab_size']})")
    buckets = tuple(sorted(int(b) for b in args.buckets.split(",")))
    if args.objective == "causal" and (args.context_lm_weight > 0 or args.causal_weight > 0):
        raise SystemExit("--context-lm-weight and --causal-weight are for the diffusion objective")
    settings, val_settings = example_settings(args, buckets)

    run = setup(args, out, tok, device, max(buckets), world)
    run.active_params = active_parameters(run.model)
    run.peak_flops = peak_flops(device, getattr(args, "peak_tflops", 0.0) or 0.0)
    plan_seconds = (args.plan_minutes or args.minutes or 0) * 60
    main = world.is_main
    val_batches = make_val_batches(args, val_settings, str(tok_path)) if args.val_batches and main else []
    # Seeded by the step too, so a resumed run reads other examples than its first chunk did, and by the
    # rank, so every rank reads its own examples (rank 0 of a world of one reads what it always did).
    stream = BatchStream(
        args.data,
        "train",
        str(tok_path),
        settings,
        args.batch_size,
        seed=args.seed + run.step + 7919 * world.rank,
    )
    loader = torch.utils.data.DataLoader(
        stream,
        batch_size=None,
        num_workers=args.workers,
        pin_memory=device.type == "cuda",
        prefetch_factor=8 if args.workers else None,
        persistent_workers=False,
    )
    log = Log(out / "train_log.jsonl")
    if main:
        n_params = run.model.num_parameters()
        print(
            f"model {n_params / 1e6:.2f} M parameters ({run.active_params / 1e6:.2f} M active per token, "
            f"{n_params * 2 / 2**20:.1f} MiB bf16), device {device} x {world.size}, batch {args.batch_size} "
            f"per process ({args.batch_size * world.size} in all) x context {args.context_tokens} + canvas "
            f"{buckets}, compile {bool(args.compile)}, workers {args.workers}",
            flush=True,
        )

    if val_batches and run.step == 0 and args.init_from:
        # The starting checkpoint's scores on this build's validation split: what a continued run is
        # compared with (another build's split gives other numbers).
        start = run.validate(val_batches)
        log.write({"step": 0, "start": True, **start})
        print(f"start ({args.init_from}): val {start['val_loss']:.4f} acc {start['val_acc']:.3f}", flush=True)

    last_save = time.time()
    window = LogWindow()
    losses: list[float] = []
    it = iter(loader)
    while True:
        stop = stop_reason(run, deadline, plan_seconds)
        if stop:
            break
        t0 = time.time()
        batch = next(it).to(device)
        lr = lr_now(run, plan_seconds)
        loss, lm, self_conditioned = train_step(run, batch, lr)
        # One small collective (or none) per step: the global loss (the ranks' shares sum to it), the
        # tokens of every rank, and the step time the LR schedule counts (the mean, identical on every
        # rank, so every rank computes the same learning rate and the weights stay equal).
        tokens = batch.real_tokens
        flops = step_flops(run.active_params, tokens, self_conditioned, args.causal_weight > 0, run.causal)
        loss_value, lm_value, tokens_all, flops_all, seconds = global_sum(
            [float(loss.detach()), 0.0 if lm is None else float(lm), tokens, flops, time.time() - t0],
            device,
            world,
        )  # syncs: keeps the step time honest
        run.step += 1
        run.tokens += int(tokens_all)
        losses.append(loss_value)
        window.add(loss_value, lm_value, int(tokens_all), flops_all)
        run.train_seconds += seconds / world.size

        if main and (run.step % args.log_every == 0 or run.step == 1):
            log_window(run, window, log, lr, int(batch.canvas.shape[1]), t_start, val_batches)
            window = LogWindow()
        if main and args.save_every_minutes and time.time() - last_save > args.save_every_minutes * 60:
            save_state(out, run.model, run.optimizer, run.scalars())
            last_save = time.time()

    del it, loader  # ends the data-loader workers
    final = {"step": run.step, "tokens": run.tokens, "stop": stop}
    export_dir = Path(args.export) if args.export else out / "export"
    if main:
        if val_batches:
            final.update(run.validate(val_batches))
        save_state(out, run.model, run.optimizer, run.scalars())
        log.write({"final": True, **final, "elapsed_s": round(time.time() - t_start, 1)})
        export_dir = export_run(run, final, tok_path)
        print(
            f"stopped ({stop}) at step {run.step}; state in {out / 'state'}, export in {export_dir}",
            flush=True,
        )
    if world.distributed:  # the others wait for rank 0's save and export before the group closes
        torch.distributed.barrier()
    return {**final, "losses": losses, "export": str(export_dir)}
