"""Code actions over LSP: offered at a cursor or selection, resolved into a version-stamped `WorkspaceEdit`.

The handlers fetch the document, call the pure planners of `dfim.server.actions`, run the engine and wrap
the edits in lsprotocol types. Clients without `codeAction/resolve` run `dfim.runAction`, which applies
the edit with `workspace/applyEdit`; `dfim.<action>` commands take `[uri, range, instruction?]` directly.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import threading
import uuid
from dataclasses import dataclass
from typing import Any

from lsprotocol import types
from pygls.exceptions import (
    JsonRpcContentModified,
    JsonRpcException,
    JsonRpcInternalError,
    JsonRpcInvalidParams,
    JsonRpcRequestCancelled,
)

from dfim.engine.api import EngineError, FillCancelled, FillRequest
from dfim.server.actions import (
    KIND,
    TITLES,
    ActionError,
    NothingToChange,
    available_actions,
    finish_action,
    plan_action,
    too_long,
    unsure_skeleton,
)
from dfim.server.documents import Document, PositionError
from dfim.server.languages import language_for
from dfim.server.options import quoted

log = logging.getLogger("dfim.server.code_actions")

RUN_COMMAND = "dfim.runAction"  # arguments: [data] as carried by a code action
REQUEST_FAILED = -32803  # LSP 3.17's RequestFailed (pygls has no class for it)
ACTION_COMMANDS = {f"dfim.{name}": name for name in TITLES}  # arguments: [uri, range, instruction?]


@dataclass
class ActionData:
    """What a code action carries to its resolve (and `dfim.runAction` takes): the client sends it back, so it
    is checked once, here, before anything uses it."""

    uri: str
    action: str
    range: types.Range
    version: int | None = None
    instruction: str | None = None

    def to_client(self, ls) -> dict[str, Any]:
        data = {
            "uri": self.uri,
            "version": self.version,
            "action": self.action,
            "range": ls.protocol._converter.unstructure(self.range),
        }
        if self.instruction is not None:
            data["instruction"] = self.instruction
        return data

    @classmethod
    def from_client(cls, ls, raw: Any) -> ActionData:
        """The data as the client sent it back; InvalidParams for anything of the wrong type."""
        if not isinstance(raw, dict):
            raise JsonRpcInvalidParams(f"an action's data must be an object, got {quoted(raw)}")
        uri, action, instruction, version = (raw.get(k) for k in ("uri", "action", "instruction", "version"))
        if not isinstance(uri, str):
            raise JsonRpcInvalidParams(f"the action's uri must be a string, got {quoted(uri)}")
        if not isinstance(action, str) or action not in TITLES:
            raise JsonRpcInvalidParams(f"dfim: unknown action {quoted(action)} (known: {', '.join(TITLES)})")
        if instruction is not None and not isinstance(instruction, str):
            raise JsonRpcInvalidParams(
                f"the action's instruction must be a string, got {quoted(instruction)}"
            )
        if version is not None and (not isinstance(version, int) or isinstance(version, bool)):
            raise JsonRpcInvalidParams(f"the action's version must be an integer, got {quoted(version)}")
        try:
            rng = ls.protocol._converter.structure(raw.get("range"), types.Range)
        except Exception:  # cattrs' own message names its exception groups, not what was wrong
            raise JsonRpcInvalidParams(
                "the action's range must be an LSP Range ({start: {line, character}, end: {line, character}}"
                f", non-negative integers), got {quoted(raw.get('range'))}"
            ) from None
        return cls(uri=uri, action=action, range=rng, version=version, instruction=instruction)


def finish_with_the_first_usable(plan, result) -> list[tuple[int, int, str]]:
    """The edits of the best candidate the action can use: the model's first choice, else the next of its
    alternatives (a first choice that is only a comment need not end the action). The first choice's
    ActionError when none is usable."""
    try:
        return finish_action(plan, result.text, result.token_scores)
    except ActionError as first:
        if plan.action == "fillSelectionHoles":  # its holes are split by the first choice's token scores
            raise
        for text in result.alternatives:
            try:
                return finish_action(plan, text)
            except ActionError:
                continue
        raise first


def _resolve_supported(ls) -> bool:
    caps = ls.client_capabilities
    try:
        support = caps.text_document.code_action.resolve_support
        return support is not None and "edit" in support.properties
    except AttributeError:
        return False


def _max_canvas(ls) -> int:
    """The canvas an action may use: the setting, but never more than the model was built for."""
    return min(ls.options.sampling.max_canvas, getattr(ls.host.engine, "canvas_limit", 256))


def _disabled_supported(ls) -> bool:
    """Whether the client shows an action's `disabled` reason (LSP 3.16); others never see such actions."""
    try:
        return bool(ls.client_capabilities.text_document.code_action.disabled_support)
    except AttributeError:
        return False


def register(ls) -> None:
    options = types.CodeActionOptions(code_action_kinds=[KIND], resolve_provider=True)

    @ls.feature(types.TEXT_DOCUMENT_CODE_ACTION, options)
    def code_action(ls, params: types.CodeActionParams):
        only = params.context.only
        if only and not any(KIND == k or KIND.startswith(f"{k}.") for k in only):
            return None
        doc = ls.docs.get(params.text_document.uri)
        if doc is None:
            return None
        try:
            start, end = doc.range_offsets(params.range, ls.docs.encoding)
        except PositionError as exc:
            raise JsonRpcInvalidParams(f"range: {exc}") from None
        lang = language_for(doc.language_id, doc.uri)
        names = available_actions(doc.text, lang, start, end)
        resolve, show_disabled = _resolve_supported(ls), _disabled_supported(ls)
        max_canvas = _max_canvas(ls)
        count = functools.cache(ls.host.count_tokens)  # rewrite and regeneration count the same selection
        out = []
        for name in names:
            why = too_long(name, doc.text, lang, start, end, max_canvas, count)
            if why is not None and not show_disabled:
                continue  # offered, it would only be refused
            data = ActionData(uri=doc.uri, action=name, range=params.range, version=doc.version).to_client(ls)
            action = types.CodeAction(title=TITLES[name], kind=KIND, data=data)
            if why is not None:
                action.disabled = types.CodeActionDisabled(reason=f"dfim: {why}")
            elif not resolve:  # clients without resolve run the command; it sends workspace/applyEdit
                action.command = types.Command(title=TITLES[name], command=RUN_COMMAND, arguments=[data])
            out.append(action)
        return out

    @ls.feature(types.CODE_ACTION_RESOLVE)
    async def resolve_code_action(ls, action: types.CodeAction):
        # every action this server offers carries its data: anything else is InvalidParams, never an action
        # handed back without an edit (which a client applies as nothing, silently)
        action.edit = await run_action(ls, ActionData.from_client(ls, action.data))
        return action

    @ls.command(RUN_COMMAND)
    async def run_command(ls, *args: Any):
        if len(args) != 1:
            raise JsonRpcInvalidParams(f"{RUN_COMMAND} takes one argument: the action's data")
        data = ActionData.from_client(ls, args[0])
        return await _apply(ls, await run_action(ls, data), TITLES[data.action])

    for command, name in ACTION_COMMANDS.items():
        ls.command(command)(_direct_command(name))


def _direct_command(name: str):
    """`dfim.<action>` with arguments [uri, range, instruction?], checked as an action's data is (a message
    that says which argument is wrong, where pygls's typed structuring names cattrs' exception groups); the
    edit is computed and applied."""

    async def direct(ls, *args: Any):
        if not 2 <= len(args) <= 3:
            raise JsonRpcInvalidParams(
                f"dfim.{name} takes [uri, range, instruction?], got {len(args)} arguments"
            )
        uri, rng, instruction = (*args, None)[:3]
        raw = {"uri": uri, "action": name, "range": rng, "instruction": instruction}
        data = ActionData.from_client(ls, raw)
        return await _apply(ls, await run_action(ls, data), TITLES[name])

    return direct


async def _apply(ls, edit: types.WorkspaceEdit, label: str) -> dict:
    """Send the edit to the client with `workspace/applyEdit` where it says it takes one; the command's result
    carries the edit either way (a client without applyEdit applies it from there)."""
    unstructured = ls.protocol._converter.unstructure(edit)
    caps = ls.client_capabilities
    empty = not any(change.edits for change in edit.document_changes or ())
    if empty or not (caps and caps.workspace and caps.workspace.apply_edit):
        return {"applied": False, "edit": unstructured}
    try:
        result = await ls.workspace_apply_edit_async(types.ApplyWorkspaceEditParams(edit=edit, label=label))
    except JsonRpcException as exc:  # no answer in time, or an unreadable one: the edit is in the result
        log.warning("dfim: %s; the edit is returned in the command's result instead", exc)
        return {"applied": False, "edit": unstructured}
    return {"applied": bool(result and result.applied), "edit": unstructured}


async def run_action(ls, data: ActionData) -> types.WorkspaceEdit:
    """Compute one action's WorkspaceEdit, stamped with the document version it was computed from."""
    uri, action, instruction = data.uri, data.action, data.instruction
    doc = ls.docs.get(uri)
    if doc is None:
        raise JsonRpcInvalidParams(f"document {uri} is not open")
    if data.version is not None and data.version != doc.version:
        raise JsonRpcContentModified("the document changed since this action was offered")
    text, version, encoding = doc.text, doc.version, ls.docs.encoding
    try:
        start, end = doc.range_offsets(data.range, encoding)
    except PositionError as exc:
        raise JsonRpcInvalidParams(f"range: {exc}") from None
    options = ls.options
    if not ls.host.ready:
        raise JsonRpcException(  # LSP's RequestFailed: valid params, the server cannot serve it now
            f"dfim: the model is not ready ({ls.host.error or 'still loading'})", code=REQUEST_FAILED
        )
    lang = language_for(doc.language_id, uri)
    prefix_tokens, suffix_tokens = ls.host.context_budget(
        options.context.prefix_tokens, options.context.suffix_tokens
    )
    max_canvas = _max_canvas(ls)
    try:
        plan = plan_action(
            action,
            text,
            lang,
            start,
            end,
            max_canvas=max_canvas,
            prefix_tokens=prefix_tokens,
            suffix_tokens=suffix_tokens,
            count_tokens=ls.host.count_tokens,
            instruction=instruction,
        )
    except ActionError as exc:
        raise JsonRpcInvalidParams(f"dfim: {exc}") from None

    engine = ls.host.engine
    settings = dataclasses.replace(
        engine.settings,
        max_steps=options.sampling.action_max_steps,
        entropy_bound=options.sampling.entropy_bound,
    )
    loop = asyncio.get_running_loop()
    flag = threading.Event()
    running = ls.actions_running.setdefault(uri, set())
    running.add(flag)  # an edit or close of the document raises it: the edit would be stale (`changed`)
    token = await _begin_progress(ls, TITLES[plan.action], flag)

    def changed() -> bool:
        now = ls.docs.get(uri)
        return now is None or now.version != version

    def on_step(info) -> None:
        if token is None or info.step == 0:  # step 0 is the draft: no denoising step done yet
            return
        message = f"step {info.step}/{info.max_steps}, {info.accepted} tokens accepted"
        percent = int(100 * info.step / max(1, info.max_steps))
        loop.call_soon_threadsafe(
            ls.work_done_progress.report,
            token,
            types.WorkDoneProgressReport(message=message, percentage=percent, cancellable=True),
        )

    ls.status.begin_fill()
    result = None
    try:
        if plan.action == "regenerateUnsure":
            # one step from the selection itself (no renoising): the model's confidence at each position
            pieces = ls.host.token_pieces(plan.original_text)
            score = FillRequest(
                prefix=plan.ctx.prefix,
                suffix=plan.ctx.suffix,
                max_tokens=len(pieces) + 1,
                warm_start=plan.original_text,
                warm_start_noise=0.0,
                settings=dataclasses.replace(settings, max_steps=1),
                seed=options.sampling.seed,
            )
            scored = await ls.host.fill(score, flag)
            skeleton = unsure_skeleton(
                pieces, scored.token_scores, options.actions.unsure_threshold, limit=max_canvas
            )
            if skeleton is None:
                raise NothingToChange("every token of the selection is confident; nothing to regenerate")
            plan.middle = skeleton
            plan.warm_start = None
        request = FillRequest(
            prefix=plan.ctx.prefix,
            suffix=plan.ctx.suffix,
            middle=plan.middle,
            max_tokens=plan.max_tokens,
            warm_start=plan.warm_start,
            instruction=plan.instruction
            or "",  # read by instruction-tuned checkpoints only (dfim.engine.inference.chat)
            settings=settings,
            seed=options.sampling.seed,
            candidates=options.actions.candidates,
            on_step=on_step,
        )
        result = await ls.host.fill(request, flag)
        if changed():
            raise FillCancelled("the document changed")
        edits = finish_with_the_first_usable(plan, result)
    except NothingToChange as exc:
        ls.window_show_message(types.ShowMessageParams(type=types.MessageType.Info, message=f"dfim: {exc}"))
        edits = []
    except ActionError as exc:  # the model ran and wrote nothing usable: the request was fine
        raise JsonRpcException(f"dfim: {exc}", code=REQUEST_FAILED) from None
    except FillCancelled:
        if changed():
            raise JsonRpcContentModified("the document changed while the action ran") from None
        raise JsonRpcRequestCancelled("dfim: cancelled") from None
    except EngineError as exc:
        raise JsonRpcInternalError(f"dfim: the engine failed: {exc}") from None
    except Exception as exc:  # a bug in the engine fails this request only
        raise JsonRpcInternalError(f"dfim: the engine failed: {type(exc).__name__}: {exc}") from None
    finally:
        running.discard(flag)
        if not running:
            ls.actions_running.pop(uri, None)
        if result is not None:
            ls.status.end_fill(result.latency_ms, result.steps, result.stop_reason)
        else:
            ls.status.end_fill()
        if token is not None:
            ls.work_done_progress.end(
                token, types.WorkDoneProgressEnd(message="done" if result else "stopped")
            )
            ls.work_done_progress.tokens.pop(token, None)
        ls.note_fallback()

    snapshot = Document(uri=uri, text=text, version=version)
    text_edits = [
        types.TextEdit(range=snapshot.range_at(s, e, encoding), new_text=new) for s, e, new in edits
    ]
    return types.WorkspaceEdit(
        document_changes=[
            types.TextDocumentEdit(
                text_document=types.OptionalVersionedTextDocumentIdentifier(uri=uri, version=version),
                edits=text_edits,
            )
        ]
    )


async def _begin_progress(ls, title: str, flag):
    """A server-created `$/progress` token when the client supports it; its cancel raises `flag`."""
    caps = ls.client_capabilities
    if not (caps and caps.window and caps.window.work_done_progress):
        return None
    token = f"dfim-{uuid.uuid4().hex[:12]}"
    try:
        await ls.work_done_progress.create_async(token)
    except Exception:
        return None
    ls.work_done_progress.begin(
        token, types.WorkDoneProgressBegin(title=title, cancellable=True, percentage=0)
    )
    future = ls.work_done_progress.tokens.get(token)
    if future is not None:
        future.add_done_callback(lambda _f: flag.set())
    return token
