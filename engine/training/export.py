"""The export at the end of every run: an HF-format bf16 checkpoint with the tokenizer, what was trained
in dfim.json, and the sampler defaults of the checkpoint it started from (else the shipped model's)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import torch

from dfim.engine.training.run import Run


def export(model, out_dir: Path, tok_path: Path, info: dict[str, Any], origin: str | None = None) -> Path:
    """Write the trained weights as a checkpoint. Sampler defaults come from `origin` (the checkpoint the
    run started from) when it is still there, so a continuation keeps e.g. its `window`; else from the
    shipped model, so a new model is served with the same draft, ranking and window."""
    from dfim.engine.api import SamplerSettings
    from dfim.engine.model.checkpoint import DEFAULT_MODEL_DIR, read_settings, save_model

    settings = SamplerSettings()
    # without an origin, the shipped model's: a new model is served the same way (draft, ranking, window)
    source = Path(origin) if origin and Path(origin).is_dir() else DEFAULT_MODEL_DIR
    if (source / "generation_config.json").is_file():
        settings = read_settings(source)
    out_dir.mkdir(parents=True, exist_ok=True)
    save_model(model, out_dir, settings, dtype=torch.bfloat16, info=info)
    shutil.copyfile(tok_path, out_dir / "tokenizer.json")
    return out_dir


def default_name(out: str | os.PathLike) -> str:
    """The model name of a run without --name: its --out folder's name."""
    return Path(out).resolve().name or "dfim-small"


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
