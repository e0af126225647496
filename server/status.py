"""The `dfim/status` notification: what the engine is doing, for a status bar item.

Params (camelCase JSON): `state` ("loading" | "ready" | "busy" | "error"), `message` (one line for a
person), `model`, `device`, `isRandom` (an untrained test checkpoint), `lastLatencyMs`, `lastSteps`,
`lastStopReason`, and `lastHidden`: why the confidence gate hid the last inline suggestion (`unsure:
min_probability 0.39 < 0.47`), null once one is shown, so a status bar can say the server answered and chose
silence. Sent on every state change, after every fill and when `lastHidden` changes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

STATUS_METHOD = "dfim/status"
STATES = ("loading", "ready", "busy", "error")


@dataclass
class Status:
    state: str = "loading"
    message: str = ""
    model: str = ""
    device: str = "cpu"
    is_random: bool = False
    last_latency_ms: float | None = None
    last_steps: int | None = None
    last_stop_reason: str | None = None
    last_hidden: str | None = None  # why the gate hid the last inline suggestion; None once one is shown

    def to_json(self) -> dict:
        out = {}
        for f in dataclasses.fields(self):
            head, *rest = f.name.split("_")
            out[head + "".join(w.capitalize() for w in rest)] = getattr(self, f.name)
        return out


class StatusReporter:
    """Holds the current status and sends it through `send(method, params)` whenever it changes."""

    def __init__(self, send: Callable[[str, dict], None]) -> None:
        self._send = send
        self.status = Status()
        self.busy = 0  # fills in flight (a worker runs one at a time, others wait)

    def update(self, **changes) -> None:
        for key, value in changes.items():
            if key not in {f.name for f in dataclasses.fields(Status)}:
                raise KeyError(key)
            if key == "state" and value not in STATES:
                raise ValueError(value)
            setattr(self.status, key, value)
        try:
            self._send(STATUS_METHOD, self.status.to_json())
        except Exception:  # no transport yet (tests, shutdown): the status is still kept
            pass

    def begin_fill(self) -> None:
        self.busy += 1
        if self.status.state in ("ready", "busy"):
            self.update(state="busy")

    def end_fill(
        self, latency_ms: float | None = None, steps: int | None = None, stop: str | None = None
    ) -> None:
        self.busy = max(0, self.busy - 1)
        changes: dict = {}
        if latency_ms is not None:
            changes.update(last_latency_ms=round(latency_ms, 1), last_steps=steps, last_stop_reason=stop)
        if self.status.state == "busy" and self.busy == 0:
            changes["state"] = "ready"
        if changes:
            self.update(**changes)
