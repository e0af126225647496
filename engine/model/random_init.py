"""Checkpoint folders whose weights are made at load time instead of read: a shape with random weights.

Timing the server at a big shape (issue 32: the released 26B-A4B) needs the shape, not the values, and the
26B checkpoint is 52 GB of safetensors nobody should write only to time it. Such a folder holds
`config.json`, `generation_config.json`, `tokenizer.json` and no weights; its `dfim.json` says how to make
them:

    {"name": "random-26b-a4b", "random": true, "random_init": {"seed": 0, "dtype": "bfloat16"}}

(`"experts": "fp8"` in `random_init` also quantizes the experts' weights to e4m3, as an FP8 checkpoint's are
kept, so the FP8 kernels can be timed the same way.)

`load_model` (engine/model/checkpoint.py) then builds the network on the meta device, allocates it on the
target device in that dtype and initialises it there, so the weights never exist on the host: a 26B model
is ready on a GPU in seconds, where building it on the CPU first would take minutes and 100 GB of memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from dfim.engine.api import CheckpointError
from dfim.engine.model.config import ModelConfig
from dfim.engine.model.network import DiffusionGemma

RANDOM_INIT = "random_init"  # the dfim.json entry
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class RandomInit:
    """How to make a folder's weights: `DiffusionGemma.init_weights` with this seed and std, in `dtype`
    (None: the dtype the loader is asked for, as a stored checkpoint's weights are converted to it)."""

    seed: int = 0
    dtype: torch.dtype | None = None
    std: float = 0.02
    experts: str | None = None  # "fp8": the experts' weights quantized to e4m3 and run on the FP8 kernels

    def to_json(self) -> dict[str, Any]:
        entry: dict[str, Any] = {"seed": self.seed, "std": self.std}
        if self.dtype is not None:
            entry["dtype"] = str(self.dtype).removeprefix("torch.")
        if self.experts is not None:
            entry["experts"] = self.experts
        return entry


def parse_random_init(info: dict[str, Any], path: Path) -> RandomInit | None:
    """The `random_init` entry of a folder's notes (`path` names dfim.json in errors); None when absent."""
    raw = info.get(RANDOM_INIT)
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise CheckpointError(f"{path}: bad {RANDOM_INIT} (expected a JSON object, got {raw!r})")
    unknown = sorted(set(raw) - {"seed", "dtype", "std", "experts"})
    if unknown:  # a misspelt key would otherwise make weights other than the ones asked for
        raise CheckpointError(f"{path}: bad {RANDOM_INIT} (unknown keys {unknown})")
    seed, dtype, std = raw.get("seed", 0), raw.get("dtype"), raw.get("std", 0.02)
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise CheckpointError(f"{path}: bad {RANDOM_INIT} seed (expected an integer >= 0, got {seed!r})")
    if dtype is not None and dtype not in DTYPES:
        raise CheckpointError(f"{path}: bad {RANDOM_INIT} dtype {dtype!r} (one of {', '.join(DTYPES)})")
    if not isinstance(std, int | float) or isinstance(std, bool) or not 0 < std < 1:
        raise CheckpointError(f"{path}: bad {RANDOM_INIT} std (expected a number in (0, 1), got {std!r})")
    experts = raw.get("experts")
    if experts not in (None, "fp8"):
        raise CheckpointError(f'{path}: bad {RANDOM_INIT} experts {experts!r} ("fp8" or absent)')
    return RandomInit(
        seed=seed, dtype=None if dtype is None else DTYPES[dtype], std=float(std), experts=experts
    )


def random_model(config: ModelConfig, init: RandomInit, device: str, dtype: torch.dtype) -> DiffusionGemma:
    """The network with random weights made on `device` (in `init.dtype`, else `dtype`): meta model, storage
    allocated on the device, then the in-place init of `DiffusionGemma.init_weights` there."""
    with torch.device("meta"):
        model = DiffusionGemma(config)
    model = model.to(init.dtype or dtype).to_empty(device=device)
    generator = torch.Generator(device=device).manual_seed(init.seed)
    model.init_weights(std=init.std, generator=generator)
    with torch.no_grad():
        for buffer in model.buffers():  # the layer scalars: `to_empty` left them unset, a checkpoint has ones
            buffer.fill_(1.0)
    return model.eval()
