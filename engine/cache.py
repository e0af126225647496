"""Context KV cache reuse across requests.

While the user types, consecutive requests share almost all of their context: the FIM layout puts
the suffix first and the prefix last, so typing at the cursor only changes the last few context
tokens. `ContextCache` remembers which token ids its KVCache holds; a new context keeps the longest
common leading run, truncates the cache there and encodes only the rest.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class ContextCache:
    """The model's KVCache plus the token ids it was built from (batch 1)."""

    def __init__(self, model, causal: bool = False) -> None:
        self.model = model
        # A causal (AR) checkpoint builds its cache with the network run as a causal LM, not with the
        # diffusion encoder (their layer scalars and last feed-forward differ).
        self.causal = causal
        self.kv = model.new_cache()
        self.ids: list[int] = []

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def prepare(self, ids: Sequence[int]) -> int:
        """Make the cache hold exactly `ids`; returns how many tokens the encoder had to run."""
        ids = [int(i) for i in ids]
        keep = common_prefix_length(self.ids, ids)
        if keep < len(self.ids):
            self.kv.truncate(keep)
            del self.ids[keep:]
        rest = ids[keep:]
        if rest:
            self._encode(rest)
        return len(rest)

    def extend(self, ids: Sequence[int]) -> int:
        """Append tokens after what the cache holds (a committed canvas before the next one)."""
        ids = [int(i) for i in ids]
        if ids:
            self._encode(ids)
        return len(ids)

    def next_logits(self, ids: Sequence[int]) -> torch.Tensor:
        """Make the cache hold exactly `ids` and return the next-token logits after them ([V], fp32), in one
        pass over the tokens it lacks: at least the last one, which is run again where the cache held it."""
        ids = [int(i) for i in ids]
        keep = min(common_prefix_length(self.ids, ids), len(ids) - 1)
        if keep < len(self.ids):
            self.kv.truncate(keep)
            del self.ids[keep:]
        return self.step(ids[keep:])

    def step(self, ids: Sequence[int]) -> torch.Tensor:
        """Append `ids` and return the next-token logits after them ([V], fp32): the causal LM of a causal
        checkpoint, the encoder read as a causal LM (its context LM) of a diffusion one. The keys and values
        appended are the ones `prepare` would have written."""
        logits = self._encode([int(i) for i in ids], want_logits=True)
        assert logits is not None
        return logits[0, -1]

    def reset(self) -> None:
        self.kv = self.model.new_cache()
        self.ids = []

    def _encode(self, ids: list[int], want_logits: bool = False) -> torch.Tensor | None:
        """Run `ids` after the cache's tokens; returns their last logits [1, 1, V] for a causal model, or
        where asked for."""
        batch = torch.tensor([ids], dtype=torch.long, device=self.device)
        try:
            if self.causal:
                logits = self.model.causal_lm(batch, self.kv, last_only=True)
            elif want_logits:
                logits = self.model.context_lm(batch, self.kv, last_only=True)
            else:
                self.model.encode(batch, self.kv)
                logits = None
        except BaseException:
            self.reset()  # a half-written cache must never be reused
            raise
        self.ids.extend(ids)
        return logits

    def __len__(self) -> int:
        return len(self.ids)
