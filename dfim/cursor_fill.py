"""One fill at a cursor, as the editor gets it, for the commands that fill a file position without the
server (`dfim fill`, `dfim trace`, `dfim bench-realcode score`): the text near the cursor cut at whole lines,
then to the checkpoint's trained context; at the end of a line that opens a block, the line break and
indentation first; one line unless multiline; and, in the middle of a line, the server's post-processing.
The server builds its own windows (dfim.server.context) by the same rules (decisions 19, 25 and 49).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from dfim.engine.api import FillRequest, FillResult, SamplerSettings, StepInfo
from dfim.engine.layout import block_lead

if TYPE_CHECKING:
    from dfim.engine.inference.fill import Engine

# The context window around the cursor before the model's own cut: enough for a function or two around
# the cursor without encoding a whole large file.
PREFIX_CHARS = 6000
SUFFIX_CHARS = 3000


@dataclass
class CursorFill:
    result: FillResult  # its text is what the editor would show
    raw: str  # the model's text, before the mid-line post-processing


def window(prefix: str, suffix: str) -> tuple[str, str]:
    """Keep the text near the cursor, cut at line boundaries."""
    if len(prefix) > PREFIX_CHARS:
        head = prefix[-PREFIX_CHARS:]
        prefix = head[head.find("\n") + 1 :] if "\n" in head else head
    if len(suffix) > SUFFIX_CHARS:
        tail = suffix[:SUFFIX_CHARS]
        suffix = tail[: tail.rfind("\n") + 1] if "\n" in tail else tail
    return prefix, suffix


def fit_to_model(prefix: str, suffix: str, engine: Engine) -> tuple[str, str]:
    """Cut the windows, at whole lines, to the context the checkpoint was trained with (`dfim.json`
    `context_tokens`), the suffix to at most a third of it, as the server does (decision 19): past that
    length a small model reads positions it never learnt, and every extra token costs encoding time.
    Unchanged for a checkpoint that declares no length."""
    from dfim.engine.model.tokenizer import FIM_SPECIALS, head_within, tail_within

    trained = engine.trained_context
    if not trained:
        return prefix, suffix

    def count(text: str) -> int:
        return len(engine.tokenizer.encode(text)) if text else 0

    room = max(2, trained - FIM_SPECIALS)
    suffix = head_within(suffix, room // 3, count)
    return tail_within(prefix, room - count(suffix), count), suffix


def fill_request(
    prefix: str,
    suffix: str,
    defaults: SamplerSettings,
    *,
    multiline: bool = False,
    max_tokens: int | None = None,
    seed: int = 0,
    steps: int | None = None,
    candidates: int | None = 1,
) -> FillRequest:
    """The request for one cursor fill: the model's sampler with `steps` over it, and one line (a stop at the
    newline, a 32-token canvas) unless `multiline`, as the server answers (decisions 25 and 49): this small
    model's later lines are rarely right, and often repeat. A line without `steps` stops where the server's
    inline fills stop (its `sampling.maxSteps` and `entropyBound`; decision 48); a several-line fill keeps
    the model's cap, as a rewrite does. `candidates` None: the server's inline choice (a drafted line is one
    canvas, decision 38; else two)."""
    if steps is not None:
        settings = replace(defaults, max_steps=steps)
    elif not multiline:
        from dfim.server.options import SamplingOptions

        inline = SamplingOptions()
        settings = replace(
            defaults, max_steps=min(defaults.max_steps, inline.max_steps), entropy_bound=inline.entropy_bound
        )
    else:
        settings = defaults
    settings = replace(
        settings, draft=settings.draft and not multiline
    )  # the editor drafts single lines only
    if candidates is None:
        candidates = 1 if settings.draft else 2
    return FillRequest(
        prefix=prefix,
        suffix=suffix,
        max_tokens=max_tokens if max_tokens is not None else (64 if multiline else 32),
        seed=seed,
        settings=settings,
        stop=() if multiline else ("\n",),
        candidates=candidates,
    )


def cut_as_the_server(text: str, prefix: str, suffix: str, language: str, max_tokens: int) -> str:
    """A one-line fill after the server's inline post-processing (the chain of dfim.server.postprocess): in
    the middle of a line the model often writes the rest of the line again (`ret` before `return`), and at
    a line's start it may indent a line no block opens; the editor shows neither. "" when the server would
    show nothing."""
    from dfim.server.context import FillContext, opens_line
    from dfim.server.languages import GRAMMARS
    from dfim.server.postprocess import clean

    at = len(prefix)
    ctx = FillContext(
        prefix=prefix,
        suffix=suffix,
        start=at,
        end=at,
        mode="line",
        indent="",
        rest_of_line=suffix.split("\n", 1)[0],
        lang=language if language in GRAMMARS else None,
        max_tokens=max_tokens,
        opens_line=opens_line(prefix + suffix, at, at, "line"),
    )
    return clean(text, ctx) or ""


def fill_at_cursor(
    engine: Engine,
    prefix: str,
    suffix: str,
    language: str,
    *,
    multiline: bool = False,
    max_tokens: int | None = None,
    seed: int = 0,
    steps: int | None = None,
    candidates: int | None = 1,
    on_step: Callable[[StepInfo], None] | None = None,
) -> CursorFill:
    """Fill between `prefix` and `suffix` (the whole file's, or any part of it) as the editor would."""
    prefix, suffix = fit_to_model(*window(prefix, suffix), engine)
    lead = "" if multiline else block_lead(prefix, suffix, language)
    request = fill_request(
        prefix + lead,
        suffix,
        engine.settings,
        multiline=multiline,
        max_tokens=max_tokens,
        seed=seed,
        steps=steps,
        candidates=candidates,
    )
    result = engine.fill(replace(request, on_step=on_step))
    if lead and result.text.strip():  # the fill starts on the new line: the break comes with it
        result = replace(result, text=lead + result.text.lstrip(" \t"))
    raw = result.text
    if not multiline and not lead:  # what the editor would show of a one-line fill (a lead's line: as it is)
        result = replace(result, text=cut_as_the_server(raw, prefix, suffix, language, request.max_tokens))
    return CursorFill(result, raw)
