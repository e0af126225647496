"""Inline requests that arrive while the model loads: held until it is ready, within a bound.

The model loads in the background after `initialized` (torch and the checkpoint take seconds), and the first
keystroke in a new window usually comes before it is ready. Answered empty, that keystroke is lost: VS Code
asks again only at the next keystroke, so the user sees nothing until typing on. So an inline request waits
for the load, up to `inline.waitForModelMs`, and is then served like any other. Past the bound it is answered
empty, and the clients ask again when `dfim/status` turns ready (decision 72).

The wait polls the engine host rather than awaiting one load task: readiness can come from the first load,
from a reload after a settings change, or not at all (a load that failed), and a wait happens only during a
load, so a poll every few milliseconds costs nothing that matters.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

POLL_S = 0.02  # how often a held request looks at the host: at most this much later than the load


class LoadingHost(Protocol):
    """What the wait reads of `dfim.server.engine_host.EngineHost`."""

    @property
    def ready(self) -> bool: ...

    loading: bool
    error: str | None


async def wait_for_model(host: LoadingHost, cancelled: Callable[[], bool], bound_ms: int) -> bool:
    """Whether the model is ready, after waiting up to `bound_ms` for a load in progress or still to come.

    False at once when the last load failed and no other one runs (nothing would come of waiting); False as
    soon as `cancelled()` is true (a newer request, an edit or a close superseded this one: its answer would
    be stale anyway); False past the bound."""
    if host.ready:
        return True
    loop = asyncio.get_running_loop()
    deadline = loop.time() + bound_ms / 1000
    while not host.ready:
        if host.error and not host.loading:
            return False
        if cancelled() or loop.time() >= deadline:
            return False
        await asyncio.sleep(min(POLL_S, max(0.0, deadline - loop.time())))
    return not cancelled()
