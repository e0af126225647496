"""Context KV cache reuse across requests.

While the user types, consecutive requests share almost all of their context: the FIM layout puts
the suffix first and the prefix last, so typing at the cursor only changes the last few context
tokens. `ContextCache` remembers which token ids its KVCache holds; a new context keeps the longest
common leading run, truncates the cache there and encodes only the rest.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class ContextRunner(Protocol):
    """A backend that encodes context tokens for a `ContextCache` (`FastBackend`): it runs them after what the
    cache holds and returns their keys and values, per layer, for the cache to append, and the next-token
    logits [1, logit_rows, V] fp32 after the last `logit_rows` of them (None for 0)."""

    def takes(self, cache: ContextCache, tokens: int, logit_rows: int) -> bool: ...

    def encode(
        self, cache: ContextCache, ids: list[int], logit_rows: int
    ) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor | None]: ...


class ContextCache:
    """The model's KVCache plus the token ids it was built from (batch 1)."""

    def __init__(self, model, causal: bool = False, runner: ContextRunner | None = None) -> None:
        self.model = model
        # Another backend that runs the tokens this cache lacks where it takes them (the fast path on a GPU:
        # graphs instead of the plain network's eager pass); their keys and values land here all the same.
        self.runner = runner
        # A causal (AR) checkpoint builds its cache with the network run as a causal LM, not with the
        # diffusion encoder (their layer scalars and last feed-forward differ).
        self.causal = causal
        self.kv = model.new_cache()
        self.ids: list[int] = []
        self.parked: Parked | None = None
        # The tokens the last greedy decode wrote, and how long the context was they followed: the next
        # decode's first guesses where its context continues that one (the user typing out the suggestion).
        self.recent: list[int] = []
        self.recent_after = 0

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def prepare(self, ids: Sequence[int]) -> int:
        """Make the cache hold exactly `ids`; returns how many tokens the encoder had to run (parked tokens
        that `ids` continue with are written back without running them)."""
        ids = [int(i) for i in ids]
        self._truncate(common_prefix_length(self.ids, ids))
        rest = ids[len(self.ids) :]
        parked = self.parked
        if parked is not None and parked.start == len(self.ids) and rest[: len(parked.ids)] == parked.ids:
            self.kv.extend(parked.keys_values)
            self.ids.extend(parked.ids)
            self.parked = None
            rest = rest[len(parked.ids) :]
        if rest:
            self._encode(rest)
        return len(rest)

    def extend(self, ids: Sequence[int]) -> int:
        """Append tokens after what the cache holds (a committed canvas before the next one)."""
        ids = [int(i) for i in ids]
        if ids:
            self._encode(ids)
        return len(ids)

    def next_logits(self, ids: Sequence[int], park: Sequence[int] = ()) -> torch.Tensor:
        """Make the cache hold exactly `ids` and return the next-token logits after them ([V], fp32), in one
        pass over the tokens it lacks: at least the last one, which is run again where the cache held it.

        `park`: tokens that will follow `ids` later, after a detour (the FIM context's `<fim_middle>`, after
        the encoder's draft has continued the prefix). They run in the same pass; their keys and values are
        set aside and written back by the `prepare` that asks for them: no pass of their own."""
        ids, park = [int(i) for i in ids], [int(i) for i in park]
        if not ids:
            raise ValueError("next_logits needs at least one token to predict after")
        self._truncate(min(common_prefix_length(self.ids, ids), len(ids) - 1))
        logits = self._encode(ids[len(self.ids) :] + park, want_logits=True, logits_back=len(park))
        assert logits is not None
        if park:
            self.parked = Parked(len(ids), park, self.kv.tail(len(park)))
            self.kv.truncate(len(ids))
            del self.ids[len(ids) :]
        return logits[0, 0]

    def step(self, ids: Sequence[int]) -> torch.Tensor:
        """Append `ids` and return the next-token logits after each of them ([T, V], fp32): the causal LM of
        a causal checkpoint, the encoder read as a causal LM (its context LM) of a diffusion one. The keys
        and values appended are the ones `prepare` would have written."""
        ids = [int(i) for i in ids]
        logits = self._encode(ids, want_logits=True, rows=len(ids))
        assert logits is not None
        return logits[0]

    def recent_for(self, ids: Sequence[int], slack: int = 3) -> list[int]:
        """The last decode's tokens if `ids` continues the context they followed (all of it but the last
        `slack` tokens, which typing at the cursor may re-tokenize), else none: after a jump elsewhere or
        another document they would only be wrong guesses."""
        shared = common_prefix_length(self.ids, ids)
        return self.recent if self.recent and shared >= self.recent_after - slack else []

    def truncate(self, length: int) -> None:
        """Forget every token after the first `length` (a decode's guesses that turned out wrong)."""
        self._truncate(length)

    def reset(self) -> None:
        self.kv = self.model.new_cache()
        self.ids = []
        self.parked = None
        self.recent = []
        self.recent_after = 0

    def _truncate(self, length: int) -> None:
        if length < len(self.ids):
            self.kv.truncate(length)
            del self.ids[length:]
        if self.parked is not None and self.parked.start > length:
            self.parked = None  # what it was computed after is gone

    def _encode(
        self, ids: list[int], want_logits: bool = False, logits_back: int = 0, rows: int = 1
    ) -> torch.Tensor | None:
        """Run `ids` after the cache's tokens; returns the logits [1, rows, V] after the last `rows` of them
        but `logits_back`, for a causal model or where asked for."""
        logit_rows = rows + logits_back if want_logits or self.causal else 0
        try:
            if self.runner is not None and self.runner.takes(self, len(ids), logit_rows):
                keys_values, logits = self.runner.encode(self, ids, logit_rows)
                self.kv.extend(keys_values)
            else:
                batch = torch.tensor([ids], dtype=torch.long, device=self.device)
                if self.causal:
                    logits = self.model.causal_lm(batch, self.kv, last=logit_rows)
                elif want_logits:
                    logits = self.model.context_lm(batch, self.kv, last=logit_rows)
                else:
                    self.model.encode(batch, self.kv)
                    logits = None
        except BaseException:
            self.reset()  # a half-written cache must never be reused
            raise
        self.ids.extend(ids)
        return None if logits is None else logits[:, :rows]

    def __len__(self) -> int:
        return len(self.ids)


@dataclass
class Parked:
    """Keys and values of `ids`, computed after the cache's first `start` tokens, set aside (`next_logits`)."""

    start: int
    ids: list[int]
    keys_values: list[tuple[torch.Tensor | None, torch.Tensor | None]]
