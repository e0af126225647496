"""A language-server client for benchmarks: starts `dfim serve` over stdio with pygls and speaks LSP to it.

Positions are UTF-16 code units, as LSP counts them by default.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

# The checkout, so the server started here runs this tree's code.
ROOT = Path(__file__).resolve().parents[2]


def utf16_position(text: str, offset: int) -> tuple[int, int]:
    line = text.count("\n", 0, offset)
    start = text.rfind("\n", 0, offset) + 1
    return line, len(text[start:offset].encode("utf-16-le")) // 2


def utf16_offset(text: str, line: int, character: int) -> int:
    start = 0
    for _ in range(line):
        start = text.index("\n", start) + 1
    end = text.find("\n", start)
    row = text[start : len(text) if end < 0 else end]
    units = 0
    for i, ch in enumerate(row):
        if units >= character:
            return start + i
        units += 2 if ord(ch) > 0xFFFF else 1
    return start + len(row)


def get_field(obj: Any, key: str) -> Any:
    return obj.get(key) if isinstance(obj, dict) else getattr(obj, key, None)


class Client:
    """The real `dfim serve` over stdio."""

    def __init__(self) -> None:
        from lsprotocol import types
        from pygls.lsp.client import LanguageClient

        self.types = types
        self.lsp = LanguageClient("dfim-replay", "0")
        self.statuses: list[Any] = []
        self.version: dict[str, int] = {}

        @self.lsp.feature("dfim/status")
        def status(params: Any) -> None:
            self.statuses.append(params)

        @self.lsp.feature(types.WORKSPACE_APPLY_EDIT)
        def apply_edit(params: Any) -> Any:  # a code action's edit: the caller reads it from the reply
            return types.ApplyWorkspaceEditResult(applied=True)

        @self.lsp.feature(types.WINDOW_SHOW_MESSAGE)
        def show_message(params: Any) -> None:  # the status notification says the same: the caller reports it
            return None

    async def start(
        self, model: str, device: str, init_options: dict, data_dir: str, root_uri: str | None = None
    ) -> Any:
        """Start the server and initialize it (`root_uri`: the workspace folder it may read project files
        from, for the extra context of other files)."""
        t = self.types
        env = {**os.environ, "DFIM_DATA_DIR": data_dir, "PYTHONPATH": str(ROOT)}
        args = ["-m", "dfim", "serve", "--device", device] + (["--model", model] if model else [])
        await self.lsp.start_io(sys.executable, *args, env=env, cwd=str(ROOT))
        await self.lsp.initialize_async(
            t.InitializeParams(
                process_id=os.getpid(),
                capabilities=t.ClientCapabilities(
                    text_document=t.TextDocumentClientCapabilities(
                        inline_completion=t.InlineCompletionClientCapabilities()
                    ),
                    workspace=t.WorkspaceClientCapabilities(apply_edit=True),
                ),
                initialization_options=init_options,
                root_uri=root_uri,
            )
        )
        self.lsp.initialized(t.InitializedParams())
        return await self.wait_ready()

    async def wait_ready(self, timeout: float = 600.0) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.statuses and get_field(self.statuses[-1], "state") in ("ready", "error"):
                return self.statuses[-1]
            await asyncio.sleep(0.05)
        raise TimeoutError("the server never became ready")

    def open(self, uri: str, text: str, language_id: str) -> None:
        t = self.types
        self.version[uri] = 1
        self.lsp.text_document_did_open(
            t.DidOpenTextDocumentParams(
                text_document=t.TextDocumentItem(uri=uri, language_id=language_id, version=1, text=text)
            )
        )

    def insert(self, uri: str, doc: str, offset: int, text: str) -> None:
        t = self.types
        line, character = utf16_position(doc, offset)
        here = t.Position(line=line, character=character)
        self.version[uri] += 1
        self.lsp.text_document_did_change(
            t.DidChangeTextDocumentParams(
                text_document=t.VersionedTextDocumentIdentifier(uri=uri, version=self.version[uri]),
                content_changes=[
                    t.TextDocumentContentChangePartial(range=t.Range(start=here, end=here), text=text)
                ],
            )
        )

    def close(self, uri: str) -> None:
        t = self.types
        self.lsp.text_document_did_close(
            t.DidCloseTextDocumentParams(text_document=t.TextDocumentIdentifier(uri=uri))
        )

    async def inline(self, uri: str, doc: str, offset: int) -> Any:
        t = self.types
        line, character = utf16_position(doc, offset)
        return await self.lsp.text_document_inline_completion_async(
            t.InlineCompletionParams(
                text_document=t.TextDocumentIdentifier(uri=uri),
                position=t.Position(line=line, character=character),
                context=t.InlineCompletionContext(trigger_kind=t.InlineCompletionTriggerKind.Automatic),
            )
        )

    async def action(self, uri: str, doc: str, name: str, start: int, end: int) -> Any:
        """Run code action `name` (`dfim.<name>`) on [start, end); the server's reply: {applied, edit}."""
        t = self.types
        rng = t.Range(
            start=t.Position(*utf16_position(doc, start)), end=t.Position(*utf16_position(doc, end))
        )
        params = t.ExecuteCommandParams(
            command=f"dfim.{name}", arguments=[uri, self.lsp.protocol._converter.unstructure(rng)]
        )
        return await self.lsp.workspace_execute_command_async(params)

    def configure(self, settings: dict) -> None:
        """Push new settings (`workspace/didChangeConfiguration`; this client has no `configuration`)."""
        t = self.types
        self.lsp.workspace_did_change_configuration(
            t.DidChangeConfigurationParams(settings={"dfim": settings})
        )

    async def stats(self) -> Any:
        return await self.lsp.protocol.send_request_async("dfim/stats", {})

    async def stop(self) -> None:
        """Shut the server down as an editor does (shutdown, exit); kill it if it does not go in 10 s."""
        try:
            await asyncio.wait_for(self.lsp.shutdown_async(None), 10)
            self.lsp.exit(None)
            await asyncio.wait_for(self.lsp.stop(), 10)
        except Exception:  # the report is complete: a server that will not stop cleanly is killed
            pass
        finally:
            self.kill()

    def kill(self) -> None:
        """Stop the server process now, if it runs (synchronous: safe in any `finally`)."""
        server = getattr(self.lsp, "_server", None)
        if server is None:
            return
        if server.returncode is None:
            try:
                server.kill()
            except ProcessLookupError:
                pass
        # Close its pipes now, while the event loop runs: left to the garbage collector, the transport would
        # close them after `asyncio.run` closed the loop and print a traceback (seen on SIGTERM under load).
        transport = getattr(server, "_transport", None)
        if transport is not None:
            try:
                transport.close()
            except RuntimeError:  # called after the loop was closed: nothing left to do
                pass

    async def reap(self, timeout: float = 5.0) -> None:
        """`kill`, then wait for the process to exit while the event loop runs (else the loop's child watcher
        reports the exit to a closed loop)."""
        self.kill()
        server = getattr(self.lsp, "_server", None)
        if server is not None:
            try:
                await asyncio.wait_for(server.wait(), timeout)
            except (TimeoutError, asyncio.TimeoutError, ProcessLookupError):
                pass
