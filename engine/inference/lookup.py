"""Guesses for the greedy decode to check in one pass: prompt lookup decoding.

On a CPU a one-token pass of the network costs about as much as a pass over eight tokens (both are
mostly per-op overhead: 12 vs 23 ms for dfim-small on the 2-core dev machine), so a greedy decode
that guesses its next few tokens and checks them all in one pass writes several tokens for the price
of one wherever the guess is right, and exactly the same tokens either way: a guess is only kept
where the greedy choice agrees with it (`dfim.engine.inference.autoregressive.decode`).

Code repeats itself, and the best guess for what follows the last few tokens is what followed them
the last time they occurred (Saxena, "Prompt Lookup Decoding", 2023): in the context (a name used
before, the rest of a call) or in the draft written for the previous request of the same document,
which the user is often typing out character by character (llama.vscode keeps its last suggestion
for the same reason).
"""

from __future__ import annotations

from collections.abc import Sequence

MAX_NGRAM = 3  # the longest run of last tokens looked for; shorter runs are tried after it
# The shortest run looked for in the context: one token (a `(`, a name) recurs too often there for what
# followed it once to be a good guess, and a wrong guess costs (a pass over 1 + 8 tokens ~2x one over 1).
# The previous draft is searched down to one token: the user typing it out is the case it is kept for.
MIN_NGRAM_CONTEXT = 2
LOOKAHEAD = 8  # guessed tokens per pass


def propose(history: Sequence[int], recent: Sequence[int], k: int) -> list[int]:
    """Up to `k` tokens that followed the latest earlier occurrence of `history`'s last n tokens, for n
    from `MAX_NGRAM` down, searched in `recent` (the previous draft, down to n = 1) before `history`
    itself (down to `MIN_NGRAM_CONTEXT`). Empty when nothing matches or `k` < 1."""
    if k < 1 or not history:
        return []
    for n in range(min(MAX_NGRAM, len(history)), 0, -1):
        tail = list(history[-n:])
        found = _latest(recent, tail, len(recent))
        if found is not None:
            return list(recent[found + n : found + n + k])
        if n >= MIN_NGRAM_CONTEXT:
            found = _latest(history, tail, len(history) - n)
            if found is not None:
                return list(history[found + n : found + n + k])
    return []


def _latest(source: Sequence[int], tail: list[int], end: int) -> int | None:
    """The start of the latest occurrence of `tail` that starts before `end` and is followed by a token."""
    n = len(tail)
    first = tail[0]
    for i in range(min(end, len(source) - n - 1), -1, -1):
        if source[i] == first and list(source[i : i + n]) == tail:
            return i
    return None


def cut_after_stop(guess: list[int], table: Sequence[bytes], needles: Sequence[bytes]) -> list[int]:
    """The guess up to and including its first token that holds a stop string (`needles`, as bytes;
    `table`: each token id's bytes): the decode ends there, and tokens after it would never be used."""
    for i, token in enumerate(guess):
        if token < len(table) and any(needle in table[token] for needle in needles):
            return guess[: i + 1]
    return guess
