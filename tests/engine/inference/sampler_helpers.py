"""Synthetic canvases and denoisers for the sampler's tests (test_sampler*.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from dfim.engine.inference import sampler
from dfim.engine.inference.sampler_state import Constraints, DenoiseState

V = 50  # vocab of the synthetic denoisers
EOS, PAD = 1, 0


def make_state(
    length: int = 8,
    batch: int = 1,
    pins: dict[int, int] | None = None,
    seed: int = 0,
    init_ids: torch.Tensor | None = None,
    init_mask: torch.Tensor | None = None,
    init_noise: float = 0.0,
    **constraints: Any,
) -> DenoiseState:
    """A fresh canvas batch over the vocabulary V; `constraints` go to `Constraints.build`."""
    pinned = torch.zeros(length, dtype=torch.bool)
    pin_ids = torch.zeros(length, dtype=torch.long)
    for position, token in (pins or {}).items():
        pinned[position] = True
        pin_ids[position] = token
    rules = Constraints.build(pinned, pin_ids, vocab_size=V, eos_id=EOS, pad_id=PAD, **constraints)
    return sampler.new_state(
        batch,
        rules,
        generator=torch.Generator().manual_seed(seed),
        init_ids=init_ids,
        init_mask=init_mask,
        init_noise=init_noise,
    )


def peaked(tokens: list[int], batch: int = 1, scale: float = 100.0) -> torch.Tensor:
    """Logits that put (almost) all mass on `tokens` (one per position)."""
    logits = torch.zeros(batch, len(tokens), V)
    logits[:, torch.arange(len(tokens)), torch.tensor(tokens)] = scale
    return logits


def constant(logits: torch.Tensor) -> Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor]:
    """A denoiser that always answers `logits`."""
    return lambda canvas, self_cond: logits.clone()
