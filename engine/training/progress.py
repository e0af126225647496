"""What a training run writes as it goes: train_log.jsonl rows and the printed progress line (loss, LR,
tokens/s in all and per GPU, model FLOPs utilisation, validation scores)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dfim.engine.progress import format_duration
from dfim.engine.training.examples import Batch
from dfim.engine.training.run import Run


@dataclass
class Log:
    path: Path
    rows: list[dict[str, Any]] = field(default_factory=list)

    def write(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")


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
        f"tokens {run.tokens:,} t {row['elapsed_s']}s{done_and_eta(run, t_start)}",
        flush=True,
    )


def done_and_eta(run: Run, t_start: float) -> str:
    """ " 42% ETA 3m10s": how far the run is toward the limit that will stop it (--steps, else --minutes), so
    a line in a log says how long is left; "" when neither is set (a run stopped by hand)."""
    args = run.args
    elapsed = time.time() - t_start
    if args.steps:
        fraction = run.step / args.steps
    elif args.minutes:
        fraction = elapsed / (args.minutes * 60)
    else:
        return ""
    fraction = min(max(fraction, 0.0), 1.0)
    if fraction <= 0:
        return ""
    return f" {fraction:.0%} ETA {format_duration(elapsed * (1 - fraction) / fraction)}"
