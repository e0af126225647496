"""One training run's state: the model, its optimizer, the counters saved with it, and how it is built
(a fresh init, a checkpoint's weights, or a resumed state)."""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from dfim.engine.model.config import ModelConfig
from dfim.engine.model.network import DiffusionGemma, compile_layers
from dfim.engine.model.tokenizer import Tokenizer
from dfim.engine.training.distributed import World, broadcast_parameters
from dfim.engine.training.examples import Batch
from dfim.engine.training.objective import validate
from dfim.engine.training.presets import context_tokens_for, model_config
from dfim.engine.training.state import load_state


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

    compiled = compiled_causal = None
    scope = getattr(args, "compile_scope", "model")
    if args.compile and scope == "layers":
        compile_layers(model, args.compile_mode)
    elif args.compile:
        compiled = torch.compile(model.forward_train_lm, mode=args.compile_mode)
        compiled_causal = torch.compile(model.causal_forward_train, mode=args.compile_mode)
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
