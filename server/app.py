"""The language server object: lifecycle, capabilities, document sync, configuration, status.

Features live in their own modules (`dfim.server.inline`, `dfim.server.actions`) and register their handlers on the
server built here. The model loads in the background after `initialized`, so the editor never waits on torch;
until it is ready (or if it cannot load) requests are still answered, with no completions.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import sys
import threading
from collections.abc import Iterator

from lsprotocol import types
from pygls.io_ import StdoutWriter
from pygls.lsp.server import LanguageServer

from dfim.server import gate
from dfim.server.documents import DocumentStore, choose_encoding
from dfim.server.engine_host import EngineHost, heap_usage
from dfim.server.extra_context import ExtraContext
from dfim.server.inline_plan import ResultCache, ShownSuggestion
from dfim.server.options import Options, merge_options, snake
from dfim.server.protocol import DEFAULT_CLIENT_TIMEOUT_S, DfimProtocol
from dfim.server.speculation import Speculations
from dfim.server.status import StatusReporter
from dfim.server.telemetry import SuggestionTracker, Telemetry, data_dir
from dfim.server.transport import (
    DEFAULT_MAX_MESSAGE_BYTES,
    FrameReader,
    Message,
    ThreadSource,
)

log = logging.getLogger("dfim.server")
VERSION = "0.1.0"
STATS_METHOD = "dfim/stats"  # custom request: counters for tests and benchmarks
TEXT_METHOD = "dfim/documentText"  # custom request: the server's copy of a document (sync checks)


class DfimServer(LanguageServer):
    def __init__(
        self,
        model: str = "",
        device: str = "cpu",
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        client_timeout: float = DEFAULT_CLIENT_TIMEOUT_S,
    ) -> None:
        super().__init__(
            "dfim",
            VERSION,
            protocol_cls=DfimProtocol,
            text_document_sync_kind=types.TextDocumentSyncKind.Incremental,
        )
        self.max_message_bytes = max_message_bytes
        self.protocol.client_timeout = client_timeout
        self.docs = DocumentStore()
        self.extra = ExtraContext()  # other files' chunks and imported definitions (context.extra)
        self.options = Options()
        self.startup_options = self.options  # the settings of initializationOptions (`apply_settings`)
        self.options.model.path, self.options.model.device = model, device
        self.host = EngineHost()
        self.status = StatusReporter(self.protocol.notify)
        self.status.status.device = device
        self.cache = ResultCache(self.options.inline.cache_size)
        self.gate_memory = gate.ConfidenceMemory(self.options.inline.cache_size)  # the cache's confidences
        self.gate_log = gate.GateLog()  # verdicts of the confidence gate (dfim/stats)
        self.shown: dict[str, ShownSuggestion] = {}  # uri -> last inline suggestion (typed-ahead reuse)
        self.inflight: dict[str, threading.Event] = {}  # uri -> cancel flag of the inline fill in flight
        self.actions_running: dict[str, set[threading.Event]] = {}  # uri -> cancel flags of its code actions
        self.telemetry_warned = False  # a telemetry failure is shown to the user once per session
        self.tracker = SuggestionTracker(
            Telemetry(data_dir(), enabled=True, on_failure=self.telemetry_failed)
        )
        self.counters = {
            "fills": 0,
            "completed": 0,
            "cancelled": 0,
            "failed": 0,
            "cache_hits": 0,
            "typed_ahead": 0,
            "held_for_model": 0,  # inline requests that came while the model loaded (server/model_wait.py)
            "retries": 0,  # inline fills asked again because nothing of the first was worth showing
            "model_ms": 0.0,  # engine time of all inline fills
            "encoded_tokens": 0,  # context tokens the encoder ran for them (the rest came from its cache)
        }
        # Tab-Tab: fills ahead of an accept (their counters join the ones above)
        self.speculations = Speculations(self.counters)
        self.pending_errors: list[str] = []
        self._load_task: asyncio.Task | None = None
        self._loaded = ("", "")
        self._in_use: tuple[str, str] | None = None  # (path, device) of the model the host holds now

    # ---- transport -------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _serving(self) -> Iterator[None]:
        """One session's life: a lost client or an interrupt ends it quietly, and shutdown always runs."""
        self._stop_event = threading.Event()
        try:
            yield
        except BrokenPipeError:
            log.error("the connection to the client is lost: shutting down")
        except (KeyboardInterrupt, SystemExit):
            pass
        finally:
            self.shutdown()

    def start_io(self, stdin=None, stdout=None) -> None:
        """Serve on stdio through `FrameReader` (pygls's `run_async` loop is not used: see server/transport.py)."""
        with self._serving():
            self.protocol.set_writer(StdoutWriter(stdout or sys.stdout.buffer))
            reader = FrameReader(ThreadSource(stdin or sys.stdin.buffer), self.max_message_bytes)
            asyncio.run(self.serve_frames(reader))

    def start_tcp(self, host: str, port: int, token_file=None) -> None:
        """Serve one authenticated client on TCP (server/tcp.py)."""
        from dfim.server.tcp import serve_tcp

        with self._serving():
            serve_tcp(self, host, port, token_file)

    async def serve_frames(self, reader: FrameReader) -> None:
        """Read frames until the input ends or the server stops; a bad frame is answered or dropped."""
        while not self._stop_event.is_set():
            item = await reader.next()
            if item is None:
                return
            if isinstance(item, Message):
                self.protocol.receive(item.value)
            else:
                self.protocol.reject(item)

    @property
    def model_key(self) -> tuple[str, str]:
        """(model path, device) of the model asked for last: results of another model are not reused."""
        return self._loaded

    # ---- settings --------------------------------------------------------------------------------------

    def apply_settings(self, raw, source: str, whole: bool = False) -> list[str]:
        """Merge client settings; bad values are reported and the previous values kept. `whole`: `raw` is the
        client's whole dfim section (what workspace/configuration and didChangeConfiguration carry), merged
        onto the settings the server started with, so a key the user removed goes back to that value."""
        previous = self.options
        base = self.startup_options if whole else previous
        self.options, errors = merge_options(base, raw, keep=previous)
        self.cache.size = self.gate_memory.size = self.options.inline.cache_size
        telemetry = self.options.telemetry
        self.tracker.telemetry = Telemetry(
            data_dir(telemetry.data_dir), enabled=telemetry.enabled, on_failure=self.telemetry_failed
        )
        messages = []
        # a directory the user chose: say so when it cannot be written (the default one is said at its first
        # failed write, by telemetry_failed)
        if telemetry.data_dir and telemetry != previous.telemetry:
            problem = self.tracker.telemetry.problem()
            if problem:
                self.telemetry_warned = True
                messages.append(f"dfim: telemetry.dataDir {problem}: no telemetry is recorded")
        if self.options.sampling != previous.sampling or self.options.context != previous.context:
            self.cache.clear()
        if not errors:
            return messages
        # One message for the whole change (six bad values are one popup, not six); an unknown key says
        # "(ignored)", a bad value that the previous one stays.
        errors = [e if e.endswith("(ignored)") else f"{e}; keeping the previous value" for e in errors]
        head = "a setting was" if len(errors) == 1 else f"{len(errors)} settings were"
        return [f"dfim: {head} not applied ({source}): " + "; ".join(errors), *messages]

    def telemetry_failed(self, message: str) -> None:
        """A telemetry write failed (a full disk, no permission): tell the user once per session, as a
        warning; completions go on without telemetry."""
        if self.telemetry_warned:
            return
        self.telemetry_warned = True
        self.window_show_message(
            types.ShowMessageParams(type=types.MessageType.Warning, message=f"dfim: {message}")
        )

    def show_errors(self, errors: list[str]) -> None:
        for message in errors:
            log.warning(message)
            self.window_show_message(types.ShowMessageParams(type=types.MessageType.Error, message=message))

    def stop_fills(self) -> None:
        """Raise the cancel flag of every fill: inline ones in flight and everything handed to the engine."""
        for flag in self.inflight.values():
            flag.set()
        self.host.cancel_all()

    def ensure_model(self) -> None:
        """(Re)load the model in the background when the configured path/device differ from the loaded one.
        A path/device that failed is not tried again until it changes (every configuration change would
        otherwise show the same error again)."""
        wanted = (self.options.model.path, self.options.model.device)
        if wanted == self._loaded and (self.host.ready or self.host.loading or self.host.error):
            return
        if wanted == self._in_use and self.host.ready and not self.host.loading:
            # back to the model still serving after a load that failed (its settings undone): nothing to load
            self._loaded, self.host.error = wanted, None
            self.status.update(state="ready", message="")
            return
        self._loaded = wanted
        self.cache.clear()
        self._load_task = asyncio.ensure_future(self._load(*wanted))

    async def _load(self, path: str, device: str) -> None:
        self.status.update(
            state="loading", message=f"loading {path or 'the default model'} on {device}", device=device
        )
        model = self.options.model
        await self.host.load(path, device, fast=model.fast, compile=model.compile)
        if (path, device) != self._loaded:
            return  # a newer configuration superseded this load
        # Errors are logged and shown before the status says so: a client (or a test) that reads the log
        # when the status arrives finds the line there.
        if self.host.ready and self.host.error:  # the new model failed; the one loaded before keeps serving
            engine = self.host.engine
            self.show_errors([f"dfim: {self.host.error} (still using the model loaded before)"])
            self.status.update(
                state="ready",
                message=f"still using {getattr(engine, 'model_name', 'the previous model')}: {self.host.error}",
                device=str(getattr(engine, "device", device)),
            )
        elif self.host.ready:
            engine = self.host.engine
            self._in_use = (path, device)
            self.status.update(
                state="ready",
                message="",
                model=str(getattr(engine, "model_name", path or "dfim-base")),
                is_random=bool(getattr(engine, "is_random", False)),
            )
        else:
            self.show_errors([f"dfim: {self.host.error}"])
            self.status.update(state="error", message=self.host.error or "the model could not be loaded")

    async def pull_configuration(self) -> None:
        caps = self.client_capabilities
        if not (caps and caps.workspace and caps.workspace.configuration):
            return
        try:
            result = await self.workspace_configuration_async(
                types.ConfigurationParams(items=[types.ConfigurationItem(section="dfim")])
            )
        except Exception as exc:  # a client that advertises but fails: keep what we have
            log.warning("workspace/configuration failed: %s", exc)
            return
        if result and result[0] is not None:
            self.show_errors(self.apply_settings(result[0], "workspace/configuration", whole=True))

    def note_fallback(self) -> None:
        """After a fill: say so in the status when out-of-GPU-memory moved the model to the CPU."""
        if self.host.fell_back_to_cpu and self.status.status.device != "cpu":
            message = "out of GPU memory: the model now runs on the CPU"
            log.warning(message)
            self.status.update(device="cpu", message=message)

    def cancel_actions(self, uri: str) -> None:
        """Stop the code actions running on `uri`: its text changed or it closed, and their edits, stamped with
        the version they read, could no longer apply (they answer ContentModified)."""
        for flag in self.actions_running.get(uri, ()):
            flag.set()

    def cancel_inflight(self, uri: str) -> threading.Event:
        """Raise the cancel flag of the fill in flight for `uri` and return a fresh flag for the next one."""
        previous = self.inflight.get(uri)
        if previous is not None:
            previous.set()
        flag = threading.Event()
        self.inflight[uri] = flag
        return flag


def init_options_section(options):
    """initializationOptions as dfim reads them: the settings tree itself, or the tree under a `dfim` key (as
    `settings` holds it in the `vim.lsp.config` example, which users copy into `init_options`); other keys
    beside it (`token`, for --tcp) stay."""
    if isinstance(options, dict) and isinstance(options.get("dfim"), dict):
        return {**{k: v for k, v in options.items() if k != "dfim"}, **options["dfim"]}
    return options


def dfim_section(settings):
    """dfim's part of pushed settings: the `dfim` key where there is one; else the object itself when one of
    its keys is a dfim setting (clients that send the section alone); else None, with a log line: a client
    pushing every server's sections (`{"pylsp": ...}`) says nothing to dfim."""
    if not isinstance(settings, dict):
        return settings
    if "dfim" in settings:
        return settings["dfim"]
    ours = {f.name for f in dataclasses.fields(Options)}
    if any(snake(str(key)) in ours for key in settings):
        return settings
    if settings:
        log.info("didChangeConfiguration without dfim settings (keys %s): nothing to apply", sorted(settings))
    return None


def build_server(
    model: str = "",
    device: str = "cpu",
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    client_timeout: float = DEFAULT_CLIENT_TIMEOUT_S,
) -> DfimServer:
    """A fresh server with every feature registered (tests may build several in one process)."""
    from dfim.server import code_actions, extra_context, inline, trace_feature

    ls = DfimServer(model, device, max_message_bytes, client_timeout)
    _register_lifecycle(ls)
    inline.register(ls)
    code_actions.register(ls)
    trace_feature.register(ls)
    extra_context.register(ls)
    return ls


def _register_lifecycle(ls: DfimServer) -> None:
    @ls.feature(types.INITIALIZE)
    def initialize(ls: DfimServer, params: types.InitializeParams) -> None:
        ls.docs.encoding = choose_encoding(
            list(params.capabilities.general.position_encodings or [])
            if params.capabilities.general is not None
            else []
        )
        options = init_options_section(params.initialization_options)
        ls.pending_errors += ls.apply_settings(options, "initializationOptions")
        ls.startup_options = ls.options  # what a client's whole settings are merged onto, later

    @ls.feature(types.INITIALIZED)
    async def initialized(ls: DfimServer, params: types.InitializedParams) -> None:
        ls.show_errors(ls.pending_errors)
        ls.pending_errors = []
        ls.status.update(state="loading")
        await ls.pull_configuration()
        ls.ensure_model()

    @ls.feature(types.WORKSPACE_DID_CHANGE_CONFIGURATION)
    async def did_change_configuration(ls: DfimServer, params: types.DidChangeConfigurationParams) -> None:
        caps = ls.client_capabilities
        if caps and caps.workspace and caps.workspace.configuration:
            await ls.pull_configuration()
        else:
            settings = dfim_section(params.settings)
            if settings is not None:
                ls.show_errors(ls.apply_settings(settings, "didChangeConfiguration", whole=True))
        ls.ensure_model()

    @ls.feature(types.TEXT_DOCUMENT_DID_OPEN)
    def did_open(ls: DfimServer, params: types.DidOpenTextDocumentParams) -> None:
        doc = params.text_document
        ls.extra.opened(ls.docs.open(doc.uri, doc.text, doc.version, doc.language_id))

    @ls.feature(types.TEXT_DOCUMENT_DID_CHANGE)
    def did_change(ls: DfimServer, params: types.DidChangeTextDocumentParams) -> None:
        uri = params.text_document.uri
        changed = ls.docs.change(uri, params.text_document.version, params.content_changes)
        if changed is None:
            log.warning("didChange for %s, which is not open: ignored", uri)
        else:  # anything but accepting (or typing) the suggestion shown drops the fill ahead of its accept
            ls.speculations.changed(uri, ls.docs.get(uri).text)
            ls.extra.changed(changed, params.content_changes)
        in_flight = ls.inflight.get(uri)
        if in_flight is not None:  # its answer would be placed in the text before this change
            in_flight.set()
        ls.cancel_actions(uri)

    @ls.feature(types.TEXT_DOCUMENT_DID_CLOSE)
    def did_close(ls: DfimServer, params: types.DidCloseTextDocumentParams) -> None:
        uri = params.text_document.uri
        ls.docs.close(uri)
        ls.cancel_inflight(uri)
        ls.cancel_actions(uri)
        ls.inflight.pop(uri, None)
        ls.shown.pop(uri, None)
        ls.speculations.closed(uri)
        ls.tracker.supersede(uri)

    @ls.feature(types.EXIT)
    def exit_(ls: DfimServer, *args) -> None:
        ls.stop_fills()  # `exit` without `shutdown`: nothing may denoise on (DfimProtocol sends nothing more)

    @ls.feature(types.SHUTDOWN)
    def shutdown(ls: DfimServer, *args) -> None:
        ls.stop_fills()  # a code action would otherwise denoise on after shutdown and delay exit
        # pygls then cancels every other pending request while iterating its table of them, and a request
        # cancelled there leaves the table at once: "dictionary changed size during iteration", and
        # shutdown answered an internal error. Cancelling them here, over a copy, leaves it nothing to do.
        protocol = ls.protocol
        for msg_id, future in list(getattr(protocol, "_request_futures", {}).items()):
            if msg_id != protocol.msg_id and not future.done():
                future.cancel()

    @ls.feature(TEXT_METHOD)
    def document_text(ls: DfimServer, params) -> dict | None:
        uri = params.get("uri") if isinstance(params, dict) else getattr(params, "uri", None)
        doc = ls.docs.get(str(uri))
        return None if doc is None else {"uri": doc.uri, "version": doc.version, "text": doc.text}

    @ls.feature(STATS_METHOD)
    def stats(ls: DfimServer, *args) -> dict:
        return {
            **ls.counters,
            "engine_fills_started": ls.host.fills_started,
            "engine_fills_completed": ls.host.fills_completed,
            "engine_queued": ls.host.queued,
            "engine_queued_live": ls.host.queued_live,
            "oom_retries": ls.host.oom_retries,
            "engine_path": ls.host.path_info(),  # device, dtype, fast path's graphs and kernels
            "engine_preempted": ls.host.preempted,
            "status": ls.status.status.to_json(),
            "encoding": ls.docs.encoding,
            "gate": ls.gate_log.to_json(),
            # handlers of client messages still running: a count that grows with the session is a leak
            "pending_handlers": len(ls.protocol._request_futures),
            "heap_mb": heap_usage(),  # glibc's arenas: in use, free but kept, mmapped (None elsewhere)
        }
