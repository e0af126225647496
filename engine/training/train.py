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
import random
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from dfim.engine.model.config import ModelConfig
from dfim.engine.model.tokenizer import Tokenizer
from dfim.engine.training.distributed import (
    World,
    active_parameters,
    broadcast_parameters,
    close_world,
    global_sum,
    global_weight,
    init_world,
    peak_flops,
    step_flops,
    sum_gradients,
)
from dfim.engine.training.examples import Batch, BatchStream, Example, ExampleSettings, FimExamples, collate
from dfim.engine.training.objective import (
    add_noise,
    causal_loss,
    causal_sequence,
    context_lm_loss,
    evaluate,
    lr_at,
    validate,
    weighted_loss,
)
from dfim.engine.training.presets import DEFAULT_TOKENIZER, PRESETS, context_tokens_for, model_config
from dfim.engine.training.state import load_state, save_state

if TYPE_CHECKING:
    from dfim.engine.model.network import DiffusionGemma

# Re-exported: tests and scripts import these from here.
__all__ = [
    "DEFAULT_TOKENIZER",
    "PRESETS",
    "Batch",
    "BatchStream",
    "Example",
    "ExampleSettings",
    "FimExamples",
    "add_noise",
    "causal_loss",
    "causal_sequence",
    "collate",
    "context_lm_loss",
    "context_tokens_for",
    "evaluate",
    "load_state",
    "lr_at",
    "model_config",
    "save_state",
    "train",
    "weighted_loss",
]

# Where an export's sampler defaults come from when the run did not start from a checkpoint: the shipped
# model's, so a new model is served the same way (draft, ranking, window).
SHIPPED_MODEL = Path(__file__).parents[1] / "weights" / "dfim-small"


# ----------------------------------------------------------------------------------------------
# Training


@dataclass
class Log:
    path: Path
    rows: list[dict[str, Any]] = field(default_factory=list)

    def write(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")


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
    return changes


def make_val_batches(args: argparse.Namespace, settings: ExampleSettings, tok_path: str) -> list[Batch]:
    """Fixed validation batches (same files, cuts and noise every time) from the val split."""
    split = "val" if (Path(args.data) / "val_docs.npy").is_file() else "train"
    if split == "val" and len(np.load(Path(args.data) / "val_docs.npy")) == 0:
        split = "train"
    stream = iter(BatchStream(args.data, split, tok_path, settings, args.batch_size, seed=12345))
    return [next(stream) for _ in range(args.val_batches)]


def export(model, out_dir: Path, tok_path: Path, info: dict[str, Any], origin: str | None = None) -> Path:
    """Write the trained weights as a checkpoint. Sampler defaults come from `origin` (the checkpoint the
    run started from) when it is still there, so a continuation keeps e.g. its `window`; else from the
    shipped model, so a new model is served with the same draft, ranking and window."""
    from dfim.engine.api import SamplerSettings
    from dfim.engine.model.checkpoint import read_settings, save_model

    settings = SamplerSettings()
    source = Path(origin) if origin and Path(origin).is_dir() else SHIPPED_MODEL
    if (source / "generation_config.json").is_file():
        settings = read_settings(source)
    out_dir.mkdir(parents=True, exist_ok=True)
    save_model(model, out_dir, settings, dtype=torch.bfloat16, info=info)
    shutil.copyfile(tok_path, out_dir / "tokenizer.json")
    return out_dir


def default_name(out: str | os.PathLike) -> str:
    """The model name of a run without --name: its --out folder's name."""
    return Path(out).resolve().name or "dfim-small"


def resolve_context_tokens(args: argparse.Namespace) -> int:
    """--context-tokens, else what the run trains on by default: a resumed run's saved value, the
    --init-from checkpoint's (its dfim.json), or the preset's (`presets.CONTEXT_TOKENS`: 1,024 for base)."""
    if getattr(args, "context_tokens", None) is not None:
        return int(args.context_tokens)
    trainer = Path(args.out) / "state" / "trainer.json"
    if args.resume and trainer.is_file():
        saved = json.loads(trainer.read_text()).get("args", {}).get("context_tokens")
        if saved:
            return int(saved)
    if args.init_from:
        notes = Path(args.init_from) / "dfim.json"
        if notes.is_file():
            saved = json.loads(notes.read_text()).get("context_tokens")
            if isinstance(saved, int) and saved > 0:
                return saved
    return context_tokens_for(args.model_config)


def pick_device(device: torch.device) -> torch.device:
    """Set the matmul precision (TF32 on CUDA) or denormal handling (CPU) for the training device."""
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    else:
        torch.set_flush_denormal(True)  # tiny CPU runs slow down badly on denormal activations
    return device


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


@dataclass
class Run:
    """One training run: the model, its optimizer and the counters carried from step to step (nanoGPT
    keeps these in globals). `step`, `tokens` and `train_seconds` are saved with the state (`scalars`)
    and go on counting after --resume."""

    args: argparse.Namespace
    config: ModelConfig
    model: DiffusionGemma
    optimizer: torch.optim.Optimizer
    device: torch.device
    pad_id: int
    origin: str | None  # the checkpoint this run started from (--init-from), remembered across resumes
    compiled: Any  # torch.compile(model.forward_train_lm); None: eager (also after a compiler failure)
    world: World  # this process among the data-parallel ranks (a world of one without torchrun)
    noise_gen: torch.Generator  # the noise of the diffusion objective
    self_cond_rng: random.Random  # which steps self-condition
    step: int
    tokens: int  # real tokens trained on (non-pad context + canvas)
    train_seconds: float  # time spent in training steps: the clock of a --plan-minutes schedule
    active_params: int = 0  # parameters a token passes through (top-k experts): the MFU's N
    peak_flops: float = 0.0  # one device's bf16 peak FLOP/s; 0: unknown, no MFU logged
    compiled_causal: Any = None  # torch.compile(model.causal_forward_train); None: eager

    @property
    def causal(self) -> bool:
        return self.args.objective == "causal"

    def fwd_lm(self, context, canvas, self_cond, context_pad, context_lm: bool):
        """The denoiser -> (canvas logits, with `context_lm` the encoder's hidden states over the
        context, else None), compiled when --compile."""
        if self.compiled is None:
            return self.model.forward_train_lm(context, canvas, self_cond, context_pad, context_lm=context_lm)
        # One graph for every canvas bucket instead of one per L (compile time is training time).
        torch._dynamo.mark_dynamic(canvas, 1)
        if self_cond is not None:
            torch._dynamo.mark_dynamic(self_cond, 1)
        return self.compiled(context, canvas, self_cond, context_pad, context_lm=context_lm)

    def causal_forward(self, ids: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        """The network read as a causal LM (the causal objective, --causal-weight), compiled when --compile."""
        if self.compiled_causal is None:
            return self.model.causal_forward_train(ids, pad)
        torch._dynamo.mark_dynamic(ids, 1)  # one graph for every canvas bucket
        torch._dynamo.mark_dynamic(pad, 1)
        return self.compiled_causal(ids, pad)

    def fwd(self, context, canvas, self_cond, context_pad):
        """The denoiser's canvas logits alone (the self-conditioning pass, validation)."""
        return self.fwd_lm(context, canvas, self_cond, context_pad, False)[0]

    def autocast(self):
        """bf16 autocast on CUDA; plain fp32 on CPU."""
        if self.device.type == "cuda":
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return torch.autocast("cpu", enabled=False)

    def validate(self, batches: Sequence[Batch]) -> dict[str, float]:
        # No eval()/train() toggling: the network has no dropout, and a changed mode would make
        # torch.compile recompile.
        return validate(
            self.model, self.fwd, batches, self.causal, self.config, self.pad_id, self.device, self.autocast
        )

    def scalars(self) -> dict[str, Any]:
        """trainer.json's fields besides the optimizer's param groups (see `save_state`)."""
        return {
            "step": self.step,
            "tokens": self.tokens,
            "train_seconds": self.train_seconds,
            "model_config": self.config.to_dict(),
            "init_from": self.origin,
            "args": {k: v for k, v in vars(self.args).items() if not k.startswith("_") and not callable(v)},
        }


def setup(
    args: argparse.Namespace,
    out: Path,
    tok: Tokenizer,
    device: torch.device,
    max_canvas: int,
    world: World | None = None,
) -> Run:
    """The model and its AdamW: a fresh init (--model-config), a checkpoint's weights (--init-from), or,
    with --resume and a saved state in OUT/state, the saved run with its optimizer and counters."""
    from dfim.engine.model.network import DiffusionGemma

    resuming = args.resume and (out / "state" / "trainer.json").is_file()
    origin = args.init_from
    if resuming:
        saved = json.loads((out / "state" / "trainer.json").read_text())
        config = ModelConfig.from_dict(saved["model_config"])
        origin = saved.get("init_from") or origin
    elif args.init_from:
        from dfim.engine.model.checkpoint import read_config

        config = read_config(Path(args.init_from))
    else:
        config = model_config(args.model_config, tok.vocab_size, max_canvas)
    if config.vocab_size != tok.vocab_size:
        raise SystemExit(f"model vocab {config.vocab_size} != tokenizer vocab {tok.vocab_size}")
    model = DiffusionGemma(config)
    model.init_weights(generator=torch.Generator().manual_seed(args.seed))
    if args.init_from and not resuming:
        from dfim.engine.model.checkpoint import load_model

        loaded, _ = load_model(args.init_from, dtype=torch.float32)
        model.load_state_dict(loaded.state_dict())
    model.to(device)
    model.train()

    # Weight decay on matrices and embeddings only, not on norms' scales and other vectors.
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr,
        betas=(0.9, 0.95),
        eps=1e-8,
        fused=device.type == "cuda",
    )
    step, tokens, train_seconds = 0, 0, 0.0
    if resuming:
        scalars = load_state(out, model, optimizer)
        step, tokens, train_seconds = scalars["step"], scalars["tokens"], scalars["train_seconds"]
        if world is None or world.is_main:
            print(f"resumed from {out / 'state'} at step {step} ({tokens:,} tokens)", flush=True)
    world = world or World()
    broadcast_parameters(model, world)

    compiled = torch.compile(model.forward_train_lm, mode=args.compile_mode) if args.compile else None
    compiled_causal = (
        torch.compile(model.causal_forward_train, mode=args.compile_mode) if args.compile else None
    )
    return Run(
        args=args,
        config=config,
        model=model,
        optimizer=optimizer,
        device=device,
        pad_id=tok.pad_id,
        origin=origin,
        compiled=compiled,
        compiled_causal=compiled_causal,
        world=world,
        # Seeded by the step too, so a resumed run does not replay the noise of its first chunk, and by
        # the rank, so the ranks noise their examples independently.
        noise_gen=torch.Generator(device=device).manual_seed(args.seed * 7 + step + 1_000_003 * world.rank),
        # The same on every rank: a step self-conditions everywhere or nowhere (equal step times).
        self_cond_rng=random.Random(args.seed + step),
        step=step,
        tokens=tokens,
        train_seconds=train_seconds,
    )


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
        if run.compiled is None or run.step > 0:
            raise
        print(f"torch.compile failed ({type(err).__name__}: {err}); continuing without it", flush=True)
        run.compiled = run.compiled_causal = None
        loss, lm, self_conditioned = forward_backward(run, batch, noisy)
    sum_gradients(run.model, run.world)
    torch.nn.utils.clip_grad_norm_(run.model.parameters(), run.args.grad_clip)
    run.optimizer.step()
    return loss, lm, self_conditioned


@dataclass
class LogWindow:
    """Sums over the steps since the last train_log.jsonl row."""

    loss: float = 0.0
    lm: float = 0.0  # the auxiliary LM loss (context LM or causal FIM)
    steps: int = 0
    tokens: int = 0  # over every rank
    flops: float = 0.0  # model FLOPs over every rank (`distributed.step_flops`)
    t0: float = field(default_factory=time.time)

    def add(self, loss: float, lm: float, tokens: int, flops: float) -> None:
        self.loss += loss
        self.lm += lm
        self.steps += 1
        self.tokens += tokens
        self.flops += flops


def log_window(
    run: Run, window: LogWindow, log: Log, lr: float, canvas: int, t_start: float, val_batches: list[Batch]
) -> None:
    """Write the window's row to train_log.jsonl (validation scores every --eval-every steps) and print it."""
    args = run.args
    dt = max(time.time() - window.t0, 1e-9)
    gpus = run.world.size
    row = {
        "step": run.step,
        "loss": window.loss / window.steps,
        "lr": lr,
        "tok_per_s": window.tokens / dt,  # all ranks together
        "tok_per_s_per_gpu": window.tokens / dt / gpus,
        "tokens": run.tokens,
        "elapsed_s": round(time.time() - t_start, 1),
        "canvas": canvas,  # the last step's canvas length
    }
    if (args.context_lm_weight > 0 or args.causal_weight > 0) and not run.causal:
        row["lm_loss"] = window.lm / window.steps
    if run.peak_flops > 0:
        row["mfu"] = window.flops / dt / (run.peak_flops * gpus)
    if val_batches and (run.step % args.eval_every == 0):
        row.update(run.validate(val_batches))
    log.write(row)
    extra = f" lm {row['lm_loss']:.4f}" if "lm_loss" in row else ""
    if "val_loss" in row:
        extra += f" val {row['val_loss']:.4f} acc {row['val_acc']:.3f}"
    if "val_loss_ordered" in row:
        extra += f" ordered {row['val_loss_ordered']:.4f}"
    speed = f"tok/s {row['tok_per_s']:,.0f}"
    if gpus > 1:
        speed += f" ({row['tok_per_s_per_gpu']:,.0f}/gpu)"
    if "mfu" in row:
        speed += f" mfu {row['mfu']:.1%}"
    print(
        f"step {run.step} loss {row['loss']:.4f}{extra} lr {lr:.2e} {speed} "
        f"tokens {run.tokens:,} t {row['elapsed_s']}s",
        flush=True,
    )


def export_run(run: Run, final: dict[str, Any], tok_path: Path) -> Path:
    """The run's export (--export, default OUT/export), with what was trained and how far in dfim.json."""
    args = run.args
    random_weights = run.step == 0 and not run.origin
    if random_weights:
        print("warning: no training step ran: the export holds untrained (random) weights", flush=True)
    info = {
        "name": args.name or default_name(args.out),
        "random": random_weights,
        "objective": args.objective,
        **({"context_lm_weight": args.context_lm_weight} if args.context_lm_weight > 0 else {}),
        **({"causal_weight": args.causal_weight} if args.causal_weight > 0 else {}),
        **({"ordered_noise_p": args.ordered_noise_p} if args.ordered_noise_p > 0 else {}),
        "context_tokens": args.context_tokens,
        "step": run.step,
        "tokens": run.tokens,
        "train_seconds": round(run.train_seconds, 1),
        "data": str(args.data),
        **{k: v for k, v in final.items() if k.startswith("val")},
    }
    export_dir = Path(args.export) if args.export else Path(args.out) / "export"
    export(run.model, export_dir, tok_path, info, run.origin)
    return export_dir


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


if __name__ == "__main__":  # the GPU scripts' `python3 -m dfim.engine.training.train`: the command parses
    import sys

    from dfim.commands.train import main

    sys.exit(main())
