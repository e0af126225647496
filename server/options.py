"""The server's settings: one typed, fully defaulted dataclass tree.

Clients send settings as JSON (`initializationOptions`, the `dfim` section of `workspace/configuration`),
with camelCase or snake_case keys. `merge_options` validates every value against the field's type and
bounds; a bad value is reported and the previous value kept, so a typo never takes the server down.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import typing
from dataclasses import dataclass, field


def _bounds(lo: float | None = None, hi: float | None = None, choices: tuple = ()) -> dict:
    return {"min": lo, "max": hi, "choices": choices}


@dataclass
class ModelOptions:
    path: str = ""  # "" = the shipped model (engine/weights/dfim-base)
    device: str = field(default="cpu", metadata=_bounds(choices=("cpu", "cuda")))
    # On CUDA, denoise on the fast path (static KV cache, CUDA graphs, grouped experts; the same sampler
    # rules). Read when the model loads. Off: the plain network, to rule the fast path out of a problem.
    fast: bool = True
    # On the fast path, torch.compile the layers: about 1.3x per decoder pass at the 26B shape on an H200,
    # but each new canvas shape's first fill waits for the compiler (seconds to minutes). Read at load.
    compile: bool = False


@dataclass
class SamplingOptions:
    # Inline fills: a drafted line usually stops after one step; the cap bounds the lines the denoiser
    # rewrites, the retries and several-line fills from noise. 8 lost nothing against 16 on HumanEval, our
    # own code's lines and blocks, and cut the slowest fills by 5-33% (decision 48, docs/benchmarks.md).
    max_steps: int = field(default=8, metadata=_bounds(1, 256))
    entropy_bound: float = field(default=0.1, metadata=_bounds(0.0, 100.0))
    max_canvas: int = field(default=128, metadata=_bounds(16, 256))  # tokens; rewrites may use all of it
    action_max_steps: int = field(default=48, metadata=_bounds(1, 256))  # code actions can afford more
    seed: int = field(
        default=0, metadata=_bounds(0, 2**31 - 1)
    )  # fixed: the same context gives the same fill


@dataclass
class ExtraContextOptions:
    """Context beyond the cursor's file (server/extra_context.py): a comment block at the start of the
    prefix window, its tokens taken from the far end of the file's own prefix."""

    # Off until a checkpoint is trained to read it: dfim-base ignores it (decision 75, scripts/eval_cross_file.py)
    enabled: bool = False
    share: float = field(default=0.25, metadata=_bounds(0.0, 0.5))  # most of the prefix budget it may take
    imports: bool = True  # definitions of the names the file imports from the workspace
    chunks: bool = True  # chunks of other open and recently edited files


@dataclass
class ContextOptions:
    prefix_tokens: int = field(default=1024, metadata=_bounds(16, 8192))
    suffix_tokens: int = field(default=256, metadata=_bounds(0, 8192))
    # Pin the rest of the cursor line after a hole of the estimated width. The engine fills an inner hole to
    # exactly its width, so this only helps when the width is right: off by default (the rest of the line
    # still conditions the fill as the head of the suffix).
    pin_rest_of_line: bool = False
    extra: ExtraContextOptions = field(default_factory=ExtraContextOptions)


@dataclass
class GateOptions:
    """Silence when unsure (dfim.server.gate): a suggestion whose fill was less sure than `threshold` is not
    shown. Calibrated for +0.75 per accept and -0.25 per shown reject, with at least half of what is shown
    accepted (decisions 68 and 91)."""

    enabled: bool = True
    # The fill's confidence read as a probability (dfim.server.gate.MEASURES).
    measure: str = field(
        default="min_probability",
        metadata=_bounds(
            choices=("mean_probability", "min_probability", "mean_confidence", "min_confidence")
        ),
    )
    threshold: float = field(default=0.47, metadata=_bounds(0.0, 1.0))


@dataclass
class InlineOptions:
    enabled: bool = True
    debounce_ms: int = field(default=0, metadata=_bounds(0, 2000))  # editors already debounce; 0 = none
    # Canvases denoised in one batch; the model ranks them (dfim-small: by the encoder's likelihood) and the
    # best that parses is shown. Two lift pass@1 through the server from 12% to 17% for ~1.4x the latency on
    # a 2-core CPU (decision 33); on a GPU more cost little (8: 15.0% of all HumanEval at the engine). A
    # drafted line is one canvas (below); this applies to fills from noise and to retries.
    candidates: int = field(default=2, metadata=_bounds(1, 8))
    # A single-line fill starts from the encoder's draft where the checkpoint supports it (dfim.json's
    # `"sampler": {"draft": true}`, as dfim-small's): one canvas, usually confirmed in one denoising step, at
    # about a third of the wait of `candidates` canvases from noise (decision 38). A retry drafts again away
    # from the dropped text, beside `candidates - 1` canvases from noise (decision 44); the column-0 retry of
    # decision 37 drafts with the indentation typed.
    draft: bool = True
    # Several lines on a blank line. Off: one line at a time there, as on any other line (the shipped small
    # model's lines after the first are rarely right, and one line answers ~40% sooner; decision 25).
    multiline: bool = False
    # Fills asked again, with the next seed, when post-processing leaves nothing to show (the model copied
    # the line below or wrote nothing): a second draw often has a line to offer (decision 26).
    retries: int = field(default=1, metadata=_bounds(0, 4))
    cache_size: int = field(default=256, metadata=_bounds(0, 100000))
    # An inline request that comes while the model loads waits this long for it (the first keystroke of a
    # new window); past it the answer is empty and the clients ask again when the status turns ready. The
    # shipped model loads in ~5 s on a 2-core CPU, torch's import included (decision 72).
    wait_for_model_ms: int = field(default=10000, metadata=_bounds(0, 120000))
    gate: GateOptions = field(default_factory=GateOptions)
    # Tab-Tab: once a suggestion is shown, fill the next one in the background as if it had been accepted,
    # so that the request after an accept is answered without waiting for the model (decision 70).
    speculate: bool = True
    # Canvases of an explicit request (triggerKind Invoked: the user asks for suggestions to cycle through),
    # so that it gets several distinct ones; automatic requests keep `candidates` (decision 71).
    cycle_candidates: int = field(default=4, metadata=_bounds(2, 8))


@dataclass
class ActionOptions:
    candidates: int = field(default=1, metadata=_bounds(1, 8))
    unsure_threshold: float = field(default=0.5, metadata=_bounds(0.0, 1.0))  # confidence below = regenerate


@dataclass
class TelemetryOptions:
    enabled: bool = True  # events stay on this machine; nothing is ever sent anywhere
    # "" = $DFIM_DATA_DIR, else $XDG_DATA_HOME/dfim, else ~/.local/share/dfim. Absolute (or ~/...): a relative
    # one would be read against the server's working directory, usually the user's project.
    data_dir: str = field(default="", metadata={"absolute_path": True})


@dataclass
class Options:
    model: ModelOptions = field(default_factory=ModelOptions)
    sampling: SamplingOptions = field(default_factory=SamplingOptions)
    context: ContextOptions = field(default_factory=ContextOptions)
    inline: InlineOptions = field(default_factory=InlineOptions)
    actions: ActionOptions = field(default_factory=ActionOptions)
    telemetry: TelemetryOptions = field(default_factory=TelemetryOptions)
    languages: list[str] = field(default_factory=lambda: ["*"])  # languageIds served; "*" = all


def snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(w.capitalize() for w in rest)


def quoted(value: object, limit: int = 40) -> str:
    """A value as a message shows it: its repr, shortened (a client may send a 400-digit number)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _encodable(path: str) -> bool:
    try:
        os.fsencode(path)
    except UnicodeError:
        return False
    return True


def _check_value(name: str, value, kind, meta) -> tuple[object, str | None]:
    """(converted value, error or None) for one leaf."""
    if kind is bool:
        return (
            (value, None)
            if isinstance(value, bool)
            else (None, f"{name} must be true or false, got {quoted(value)}")
        )
    original = value  # messages quote what the client sent (1e300, not its 301 digits as an int)
    if kind is int:
        if isinstance(value, bool) or not (
            isinstance(value, int) or (isinstance(value, float) and value.is_integer())
        ):
            return None, f"{name} must be an integer, got {quoted(value)}"
        value = int(value)
    elif kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return None, f"{name} must be a number, got {quoted(value)}"
        if (
            isinstance(value, int)
            and abs(value) > 1e300
            or isinstance(value, float)
            and not math.isfinite(value)
        ):
            return None, f"{name} must be a finite number, got {quoted(value)}"
        value = float(value)
    elif kind is str:
        if value is None:
            value = ""
        if not isinstance(value, str):
            return None, f"{name} must be a string, got {quoted(value)}"
        if meta.get("absolute_path") and value:
            # a NUL or a lone surrogate is no path the OS takes: every telemetry write would raise
            if "\x00" in value or not _encodable(value):
                return None, f"{name} must be a path without NUL or lone surrogates, got {quoted(value)}"
            if not os.path.isabs(os.path.expanduser(value)):
                return None, f"{name} must be an absolute path (or start with ~), got {quoted(value)}"
    elif typing.get_origin(kind) is list:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            return None, f"{name} must be a list of strings, got {quoted(value)}"
        return list(value), None
    lo, hi, choices = meta.get("min"), meta.get("max"), meta.get("choices") or ()
    if lo is not None and value < lo or hi is not None and value > hi:
        return None, f"{name} must be between {lo} and {hi}, got {quoted(original)}"
    if choices and value not in choices:
        return None, f"{name} must be one of {', '.join(choices)}, got {quoted(original)}"
    return value, None


def merge_options(previous, raw, prefix: str = "dfim", keep=None) -> tuple[object, list[str]]:
    """A copy of `previous` (an options dataclass) with `raw`'s valid values applied, and the errors found.
    A bad value leaves `keep`'s value in its place (default: `previous`'s): a client's whole settings merged
    onto the defaults still keep the value in use where the new one is bad.

    Unknown keys are errors too (a misspelt key would otherwise be silently ignored); None values mean
    "leave as is" (clients send null for unset settings): `previous`'s value, which for a client's whole
    settings merged onto the starting ones (`DfimServer.apply_settings`) is the starting value."""
    errors: list[str] = []
    keep = previous if keep is None else keep
    if raw is None or raw == []:  # Lua clients encode an empty table as [] (no settings)
        return previous, errors
    if not isinstance(raw, dict):
        return keep, [f"{prefix} settings must be an object, got {quoted(raw)}"]
    hints = typing.get_type_hints(type(previous))
    fields = {f.name: f for f in dataclasses.fields(previous)}
    changes = {}
    for key, value in raw.items():
        name = snake(str(key))
        if name not in fields:
            errors.append(f"unknown setting {prefix}.{key} (ignored)")
            continue
        if value is None:
            continue
        kind = hints[name]
        current = getattr(previous, name)
        label = f"{prefix}.{camel(name)}"
        if dataclasses.is_dataclass(current):
            merged, sub_errors = merge_options(current, value, label, getattr(keep, name))
            changes[name] = merged
            errors.extend(sub_errors)
            continue
        converted, error = _check_value(label, value, kind, fields[name].metadata)
        if error:
            errors.append(error)
            changes[name] = getattr(keep, name)
        else:
            changes[name] = converted
    return dataclasses.replace(previous, **changes), errors


def to_json(options) -> dict:
    """camelCase JSON of an options tree (for docs and `dfim/status`)."""
    out = {}
    for f in dataclasses.fields(options):
        value = getattr(options, f.name)
        out[camel(f.name)] = to_json(value) if dataclasses.is_dataclass(value) else value
    return out


def language_enabled(options: Options, language_id: str) -> bool:
    return "*" in options.languages or language_id in options.languages
