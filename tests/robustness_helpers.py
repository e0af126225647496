"""Helpers for the robustness tests (faults, big inputs, security, load): a server session started with extra
arguments and environment, waiting for the next settled status, and the server's resident memory."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.server_helpers import Session

FAST = {"sampling": {"maxSteps": 2, "actionMaxSteps": 2, "maxCanvas": 32}, "telemetry": {"enabled": False}}


class ServerSession(Session):
    """`Session` with the process-level views the robustness tests need (pid, liveness, memory)."""

    @property
    def pid(self) -> int:
        return self.client._server.pid

    @property
    def alive(self) -> bool:
        return self.client._server.returncode is None

    async def settled_after(self, count: int, timeout: float = 90.0):
        """The first `ready`/`error` status sent after a `loading` one, among the statuses from index `count`."""
        deadline = asyncio.get_running_loop().time() + timeout
        while asyncio.get_running_loop().time() < deadline:
            seen_loading = False
            for status in self.statuses[count:]:
                seen_loading = seen_loading or status.state == "loading"
                if seen_loading and status.state in ("ready", "error"):
                    return status
            await asyncio.sleep(0.05)
        raise TimeoutError(f"no settled status after a reload; statuses: {self.statuses[count:]}")

    async def document_text(self, uri: str):
        return await self.client.protocol.send_request_async("dfim/documentText", {"uri": uri})


def rss_bytes(pid: int) -> int:
    """Resident set size of a process (Linux /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for {pid}")
