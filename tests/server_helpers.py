"""Drive the real `dfim serve` process over stdio with pygls's LanguageClient (end-to-end server tests)."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from lsprotocol import types
from pygls.lsp.client import LanguageClient

ROOT = Path(__file__).resolve().parents[1]
TOKENIZER = ROOT / "engine" / "weights" / "dfim-small" / "tokenizer.json"


def random_checkpoint(folder: Path) -> Path:
    from dfim.engine.model.checkpoint import write_random_checkpoint

    return Path(write_random_checkpoint(folder, TOKENIZER))


def client_capabilities(
    encodings: list[str] | None = None, resolve: bool = True, apply_edit: bool = True
) -> types.ClientCapabilities:
    return types.ClientCapabilities(
        general=types.GeneralClientCapabilities(position_encodings=encodings) if encodings else None,
        window=types.WindowClientCapabilities(work_done_progress=True),
        workspace=types.WorkspaceClientCapabilities(apply_edit=apply_edit),
        text_document=types.TextDocumentClientCapabilities(
            code_action=types.CodeActionClientCapabilities(
                resolve_support=types.ClientCodeActionResolveOptions(properties=["edit"])
                if resolve
                else None,
                data_support=True,
                disabled_support=True,
            ),
            inline_completion=types.InlineCompletionClientCapabilities(),
        ),
    )


class Session:
    """One server process and a client that records what the server sends on its own."""

    def __init__(self) -> None:
        self.client = LanguageClient("dfim-tests", "0")
        self.statuses: list = []
        self.messages: list = []
        self.progress: list = []
        self.applied: list = []
        self.version: dict[str, int] = {}
        self.result: types.InitializeResult | None = None

        @self.client.feature("dfim/status")
        def status(params) -> None:
            self.statuses.append(params)

        @self.client.feature(types.WINDOW_SHOW_MESSAGE)
        def show_message(params: types.ShowMessageParams) -> None:
            self.messages.append(params)

        @self.client.feature(types.WINDOW_WORK_DONE_PROGRESS_CREATE)
        def create_progress(params) -> None:
            return None

        @self.client.feature(types.PROGRESS)
        def progress(params: types.ProgressParams) -> None:
            self.progress.append(params)

        @self.client.feature(types.WORKSPACE_APPLY_EDIT)
        def apply_edit(params: types.ApplyWorkspaceEditParams) -> types.ApplyWorkspaceEditResult:
            self.applied.append(params.edit)
            return types.ApplyWorkspaceEditResult(applied=True)

    async def start(
        self,
        model: Path | str,
        data_dir: Path,
        init_options: dict | None = None,
        encodings: list[str] | None = None,
        resolve: bool = True,
        apply_edit: bool = True,
        args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
        root_uri: str | None = None,
    ) -> types.InitializeResult:
        """Start `dfim serve` (with extra command-line `args` and `env` variables) and initialize it."""
        self.data_dir = Path(data_dir)
        full_env = {**os.environ, "DFIM_DATA_DIR": str(data_dir), "PYTHONPATH": str(ROOT), **(env or {})}
        await self.client.start_io(
            sys.executable, "-m", "dfim", "serve", "--model", str(model), *args, env=full_env, cwd=str(ROOT)
        )
        self.result = await self.client.initialize_async(
            types.InitializeParams(
                process_id=os.getpid(),
                capabilities=client_capabilities(encodings, resolve, apply_edit),
                initialization_options=init_options,
                root_uri=root_uri,
            )
        )
        self.client.initialized(types.InitializedParams())
        return self.result

    async def wait_state(self, states: tuple[str, ...] = ("ready", "error"), timeout: float = 60.0):
        deadline = asyncio.get_running_loop().time() + timeout
        while asyncio.get_running_loop().time() < deadline:
            if self.statuses and getattr(self.statuses[-1], "state", None) in states:
                return self.statuses[-1]
            await asyncio.sleep(0.05)
        raise TimeoutError(f"server never reached {states}; statuses: {self.statuses}")

    async def wait_message(self, words: str, timeout: float = 10.0) -> bool:
        """Whether a window/showMessage containing `words` arrives within `timeout` (it may come just
        after the status notification that announced the same event)."""
        deadline = asyncio.get_running_loop().time() + timeout
        while asyncio.get_running_loop().time() < deadline:
            if any(words in m.message for m in self.messages):
                return True
            await asyncio.sleep(0.05)
        return False

    def open(self, uri: str, text: str, language_id: str = "python") -> None:
        self.version[uri] = 1
        self.client.text_document_did_open(
            types.DidOpenTextDocumentParams(
                text_document=types.TextDocumentItem(uri=uri, language_id=language_id, version=1, text=text)
            )
        )

    def type_at(self, uri: str, text: str, line: int, ch: int) -> tuple[int, int]:
        """Insert `text` at (line, ch) as a keystroke would -> the cursor's position after it."""
        at = types.Position(line, ch)
        self.change(uri, text, types.Range(start=at, end=at))
        if "\n" in text:
            return line + text.count("\n"), len(text.rsplit("\n", 1)[1])
        return line, ch + len(text)

    def change(self, uri: str, text: str, rng: types.Range | None = None) -> None:
        """A ranged (incremental) change, or a whole-document change when `rng` is None."""
        self.version[uri] += 1
        change = (
            types.TextDocumentContentChangeWholeDocument(text=text)
            if rng is None
            else types.TextDocumentContentChangePartial(range=rng, text=text)
        )
        self.client.text_document_did_change(
            types.DidChangeTextDocumentParams(
                text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=self.version[uri]),
                content_changes=[change],
            )
        )

    async def inline(self, uri: str, line: int, character: int, invoked: bool = False):
        kind = types.InlineCompletionTriggerKind
        return await self.client.text_document_inline_completion_async(
            types.InlineCompletionParams(
                text_document=types.TextDocumentIdentifier(uri=uri),
                position=types.Position(line=line, character=character),
                context=types.InlineCompletionContext(
                    trigger_kind=kind.Invoked if invoked else kind.Automatic
                ),
            )
        )

    async def until_a_fill_starts(self, before) -> None:
        """Wait until the engine has started a fill since the `stats()` snapshot `before` (at most 5 s)."""
        for _ in range(500):
            if (await self.stats()).engine_fills_started > before.engine_fills_started:
                return
            await asyncio.sleep(0.01)

    async def open_slowly(self, uri: str, text: str):
        """Open `uri` with fills set to run long (64 steps); returns the stats before any fill on it."""
        self.open(uri, text)
        self.configure({"sampling": {"maxSteps": 64}})
        await asyncio.sleep(0.1)
        return await self.stats()

    async def stats(self):
        return await self.client.protocol.send_request_async("dfim/stats", {})

    def configure(self, settings: dict) -> None:
        self.client.workspace_did_change_configuration(
            types.DidChangeConfigurationParams(settings={"dfim": settings})
        )

    async def stop(self) -> None:
        try:
            await asyncio.wait_for(self.client.shutdown_async(None), 10)
            self.client.exit(None)
        finally:
            await asyncio.wait_for(self.client.stop(), 10)


def apply_edits(text: str, edits, encoding: str = "utf-16") -> str:
    """Apply LSP TextEdits (non-overlapping) to `text` the way an editor would."""
    from dfim.server.documents import Document

    doc = Document("file:///x", text)
    spans = sorted(((doc.range_offsets(e.range, encoding), e.new_text) for e in edits), reverse=True)
    for (start, end), new in spans:
        text = text[:start] + new + text[end:]
    return text
