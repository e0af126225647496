"""dfim's engine: tokenizer, DiffusionGemma network, canvas, sampler, caches and checkpoints.

`from dfim.engine import Engine, FillRequest` is all a front end needs. `Engine` is imported lazily so
that importing the public types does not load torch.
"""

from dfim.engine.api import (
    CheckpointError,
    EngineError,
    FillCancelled,
    FillRequest,
    FillResult,
    Hole,
    SamplerSettings,
    StepInfo,
    TokenScore,
)

__all__ = [
    "CheckpointError",
    "Engine",
    "EngineError",
    "FillCancelled",
    "FillRequest",
    "FillResult",
    "Hole",
    "SamplerSettings",
    "StepInfo",
    "TokenScore",
]


def __getattr__(name: str):
    if name == "Engine":
        from dfim.engine.inference.fill import Engine

        return Engine
    raise AttributeError(f"module 'engine' has no attribute {name!r}")
