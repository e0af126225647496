"""From a FillRequest to a canvas plan, and from committed canvas tokens back to text. Pure functions.

A canvas is a fixed run of L token positions (a bucket: 16/32/64/128/256) that the sampler denoises.
Its layout comes from the request's `middle` skeleton:

- a string is encoded on its own and its tokens are *pinned*: they sit verbatim at their positions
  and are never renoised;
- an inner `Hole(width)` is exactly `width` free positions that may not hold EOS or pad (they are
  filled to their width);
- a trailing `Hole` (or an empty skeleton) is the *open hole*: it runs to the end of the canvas and
  the text ends at its first EOS, the rest is padding;
- a skeleton that ends with a string gets a pinned EOS after it and pinned pad to the end.

Token healing: when the prefix ends inside what would be one token (`    ret` of `    return`,
`self.ba` of `self.base`), the last prefix token(s) are backed off the context and canvas position 0
may only hold tokens whose bytes start with the backed-off bytes; the backed-off bytes are stripped
from the output again.

Warm start (rewrites): the open hole starts from the old text's tokens instead of pure noise.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field

from dfim.engine.api import EngineError, FillRequest, Hole, TokenScore

BUCKETS = (16, 32, 64, 128, 256)
MAX_HEAL_TOKENS = 3  # back off at most this many prefix tokens (a partial identifier spans 1-2 tokens)


def bucket_length(n: int, limit: int = BUCKETS[-1]) -> int:
    """The smallest bucket that holds n tokens, capped at the model's canvas `limit`."""
    for size in BUCKETS:
        if size >= n:
            return min(size, limit)
    return limit


class TokenTable:
    """Token bytes sorted for prefix queries (token healing). Built once per tokenizer."""

    def __init__(self, tokenizer, vocab_size: int | None = None) -> None:
        size = vocab_size if vocab_size is not None else tokenizer.vocab_size
        size = min(size, tokenizer.vocab_size)  # ids the model has but the tokenizer lacks never appear
        self.vocab_size = size
        pairs = []
        for i in range(size):
            if tokenizer.is_special(i):
                continue
            pairs.append((tokenizer.token_bytes(i), i))
        pairs.sort()
        self._keys = [b for b, _ in pairs]
        self._ids = [i for _, i in pairs]

    def starting_with(self, head: bytes) -> list[int]:
        """Ids of all (non-special) tokens whose bytes start with `head`."""
        out = []
        i = bisect.bisect_left(self._keys, head)
        while i < len(self._keys) and self._keys[i].startswith(head):
            out.append(self._ids[i])
            i += 1
        return out

    def extends(self, head: bytes) -> bool:
        """True when some token is strictly longer than `head` and starts with it."""
        i = bisect.bisect_left(self._keys, head)
        while i < len(self._keys) and self._keys[i].startswith(head):
            if len(self._keys[i]) > len(head):
                return True
            i += 1
        return False


def heal_prefix(prefix_ids: Sequence[int], tokenizer, table: TokenTable) -> tuple[list[int], bytes]:
    """Back off the longest tail of at most MAX_HEAL_TOKENS prefix tokens whose bytes some single
    token extends. Returns (kept prefix ids, backed-off bytes); b"" when nothing needs healing.

    A prefix ending in a run of spaces (the cursor after a line's indentation, where editors ask most)
    backs off one space only: code tokenizers write an 8-space indent before a word as 7 spaces and
    " word", so demanding a first token that starts with all 8 spaces would force a wrong split (an
    8-space token, then " word": one space too many in the fill)."""
    if prefix_ids:
        last = tokenizer.token_bytes(prefix_ids[-1])
        try:  # a token can start inside a multi-byte character: then it is not a plain space run
            text = last[:-1].decode("utf-8") if len(last) >= 2 and last.endswith(b"  ") else None
        except UnicodeDecodeError:
            text = None
        if text is not None:
            kept = tokenizer.encode(text)
            if b"".join(tokenizer.token_bytes(i) for i in kept) == last[:-1]:
                return list(prefix_ids[:-1]) + kept, b" "
    for k in range(min(MAX_HEAL_TOKENS, len(prefix_ids)), 0, -1):
        tail = b"".join(tokenizer.token_bytes(i) for i in prefix_ids[-k:])
        if tail and table.extends(tail):
            return list(prefix_ids[:-k]), tail
    return list(prefix_ids), b""


@dataclass
class CanvasPlan:
    """Everything the engine needs to denoise one canvas for a request, as plain lists."""

    context_ids: list[int]  # the encoder input: FIM-formatted suffix + (healed) prefix
    length: int  # L
    pinned: list[bool]  # [L]
    pin_ids: list[int]  # [L] (0 where not pinned)
    no_end: list[bool]  # [L] free positions where EOS/pad are banned (inner holes)
    open_start: int | None  # first position of the open hole; None when the skeleton ends with a string
    heal_bytes: bytes = b""  # backed off the prefix: canvas position 0 must start with them
    heal_allowed: list[int] = field(default_factory=list)  # token ids allowed at position 0 when healing
    warm_ids: list[int] | None = None  # [L] starting tokens where warm_mask is set
    warm_mask: list[bool] | None = None

    @property
    def can_continue(self) -> bool:
        """Whether text may run on into a further canvas (an open hole reaching the canvas end)."""
        return self.open_start is not None


def layout_middle(middle: Sequence[str | Hole], tokenizer, max_tokens: int, limit: int) -> CanvasPlan:
    """Place the skeleton on a canvas (context and healing are filled in by `build_canvas`)."""
    if not middle:
        length = bucket_length(max(1, max_tokens), limit)
        return CanvasPlan([], length, [False] * length, [0] * length, [False] * length, open_start=0)
    runs: list[tuple[str, list[int] | int]] = []
    for part in middle:
        if isinstance(part, Hole):
            if part.width < 0:
                raise EngineError(f"a hole cannot have a negative width ({part.width})")
            runs.append(("hole", part.width))
        elif isinstance(part, str):
            runs.append(("pin", tokenizer.encode(part)))
        else:
            raise EngineError(f"middle parts must be strings or Hole, not {type(part).__name__}")
    ends_open = runs[-1][0] == "hole"
    used = sum(len(r) if kind == "pin" else r for kind, r in runs)
    needed = used if ends_open else used + 1  # room for the pinned EOS
    if ends_open and runs[-1][1] == 0:
        needed += 1  # an empty open hole still needs a position for its EOS
    if needed > limit:
        raise EngineError(f"the middle skeleton needs {needed} tokens but a canvas holds at most {limit}")
    length = bucket_length(needed, limit)
    pinned, pin_ids, no_end = [False] * length, [0] * length, [False] * length
    pos = 0
    open_start = None
    for index, (kind, run) in enumerate(runs):
        if kind == "pin":
            for token in run:
                pinned[pos], pin_ids[pos] = True, token
                pos += 1
        elif index == len(runs) - 1:
            open_start = pos  # the trailing hole runs to the canvas end
        else:
            for p in range(pos, pos + run):
                no_end[p] = True
            pos += run
    if not ends_open:
        pinned[pos], pin_ids[pos] = True, tokenizer.eos_id
        for p in range(pos + 1, length):
            pinned[p], pin_ids[p] = True, tokenizer.pad_id
    return CanvasPlan([], length, pinned, pin_ids, no_end, open_start=open_start)


def build_canvas(request: FillRequest, tokenizer, table: TokenTable, limit: int) -> CanvasPlan:
    """The canvas plan for a request: layout, FIM context, token healing, warm start."""
    plan = layout_middle(request.middle, tokenizer, request.max_tokens, limit)
    if (
        tokenizer.chat
    ):  # an instruction-tuned checkpoint: the request as a user turn (dfim.engine.inference.chat)
        plan.context_ids = tokenizer.prompt_context(request)
        _warm_start(plan, request, tokenizer)
        return plan
    prefix_ids = tokenizer.encode(request.prefix)
    suffix_ids = tokenizer.encode(request.suffix)
    # Heal only where canvas position 0 is free and the text there is new (a rewrite's warm start
    # already begins at a token boundary of the old text).
    if not plan.pinned[0] and request.warm_start is None:
        prefix_ids, plan.heal_bytes = heal_prefix(prefix_ids, tokenizer, table)
        if plan.heal_bytes:
            plan.heal_allowed = table.starting_with(plan.heal_bytes)
    plan.context_ids = tokenizer.fim_context(prefix_ids, suffix_ids)
    _warm_start(plan, request, tokenizer)
    return plan


def _warm_start(plan: CanvasPlan, request: FillRequest, tokenizer) -> None:
    """A rewrite's old text seeds the open hole (not pinned: the sampler may renoise it)."""
    if request.warm_start is None:
        return
    if plan.open_start is None:
        raise EngineError("warm_start needs an open hole at the end of the middle")
    old = tokenizer.encode(request.warm_start) + [tokenizer.eos_id]
    plan.warm_ids, plan.warm_mask = [0] * plan.length, [False] * plan.length
    for p in range(plan.open_start, plan.length):
        i = p - plan.open_start
        plan.warm_ids[p] = old[i] if i < len(old) else tokenizer.pad_id
        plan.warm_mask[p] = True


def continuation_plan(length: int) -> CanvasPlan:
    """A further block of an open hole: all positions free, the text ends at the first EOS."""
    return CanvasPlan([], length, [False] * length, [0] * length, [False] * length, open_start=0)


# --- from committed tokens back to text ---------------------------------------------------------


def middle_tokens(
    ids: Sequence[int], pinned: Sequence[bool], eos_id: int, pad_id: int
) -> tuple[list[int], bool]:
    """The tokens of a committed canvas that carry text: up to the first EOS, pad dropped.
    Returns (positions, whether an EOS ended the block)."""
    keep = []
    for p, token in enumerate(ids):
        if token == eos_id:
            return keep, True
        if token != pad_id:
            keep.append(p)
    return keep, False


def assemble_text(
    tokens: Sequence[tuple[int, float, bool]],
    tokenizer,
    heal_bytes: bytes = b"",
    logprobs: Sequence[float] | None = None,
) -> tuple[str, list[TokenScore]]:
    """Text and per-token scores from (token id, confidence, pinned) triples; the token-healing bytes
    are stripped from the front (the canvas' first token starts with them by construction). `logprobs`,
    parallel to `tokens`, are each token's log p (TokenScore.logprob; 0 where not given)."""
    raw = b"".join(tokenizer.token_bytes(t) for t, _, _ in tokens)
    strip = len(heal_bytes) if raw.startswith(heal_bytes) else 0
    # Byte-level tokens can leave a character half written (a model's slip, or a block cut mid-character);
    # those bytes are dropped rather than shown as U+FFFD in the user's code.
    text = raw[strip:].decode("utf-8", errors="ignore")
    scores = []
    skip = strip
    for n, (token, conf, is_pin) in enumerate(tokens):
        piece = tokenizer.token_bytes(token)
        cut = min(skip, len(piece))
        skip -= cut
        piece = piece[cut:]
        if piece:
            logprob = 0.0 if logprobs is None or is_pin else logprobs[n]
            scores.append(TokenScore(piece.decode("utf-8", errors="replace"), conf, is_pin, logprob))
    return text, scores


def cut_at_stop(text: str, stop: tuple[str, ...]) -> str:
    """`text` up to (not including) the earliest of the stop strings."""
    cut = min((i for i in (text.find(s) for s in stop if s) if i >= 0), default=len(text))
    return text[:cut]
