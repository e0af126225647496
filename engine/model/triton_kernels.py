"""Where the Triton kernel modules are imported: on first use, so the CPU install never needs Triton.

Each `triton_*_kernels` module imports Triton at its top (Triton resolves a kernel's helpers among its
module's globals, so kernels live in modules of their own); `triton_norm`, `triton_moe` and
`triton_attention` reach them through `load` / `require` with the module's name.
"""

from __future__ import annotations

import functools
import importlib
import logging
from collections.abc import Callable
from typing import Any

import torch

log = logging.getLogger(__name__)


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


def passes_check(check: Callable[[], list[str]], what: str, device_type: str) -> bool:
    """Whether `check` (a kernel's comparison with its reference: the mismatches it found) finds nothing; a
    kernel that fails to build or run counts as a mismatch. Where not, the log says why `what` is not used
    on this kind of device, so a Triton that cannot build a kernel costs speed, not a crash."""
    try:
        with torch.no_grad():
            bad = check()
    except Exception as err:  # noqa: BLE001 - any failure to build or run: the reference ops
        bad = [f"{type(err).__name__}: {err}"]
    if bad:
        log.warning("%s not used on %s: %s", what, device_type, "; ".join(bad)[:500])
    return not bad
