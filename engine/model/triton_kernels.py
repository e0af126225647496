"""Where the Triton kernel modules are imported: on first use, so the CPU install never needs Triton.

Each `triton_*_kernels` module imports Triton at its top (Triton resolves a kernel's helpers among its
module's globals, so kernels live in modules of their own); `triton_norm`, `triton_moe` and
`triton_attention` reach them through `load` / `require` with the module's name.
"""

from __future__ import annotations

import functools
import importlib
from typing import Any


@functools.cache
def load(module: str) -> tuple[Any, Any] | None:
    """(triton, the kernels module `module`), or None where Triton cannot be imported."""
    try:
        import triton

        kernels = importlib.import_module(module)
    except ImportError:
        return None
    return triton, kernels


def require(module: str) -> tuple[Any, Any]:
    """`load(module)`, or a RuntimeError that says Triton is missing."""
    loaded = load(module)
    if loaded is None:
        raise RuntimeError("Triton is not available here")
    return loaded
