"""The KV cache of the encoded context, per layer, growing in place."""

from __future__ import annotations

import torch
from torch import Tensor


class KVCache:
    """Keys and values of the encoded context, per layer: [B, Hkv, P, D]. Sliding layers keep the whole
    context too (the window is applied when attending), so truncating to any length stays exact.

    Each layer's keys and values are views of the first P positions of a buffer with room to grow, so
    appending a token writes it in place instead of copying the whole cache (a one-token pass, as the
    encoder's draft runs ~10 of per fill, would otherwise copy every layer's keys and values each time)."""

    GROW = 256  # spare positions a buffer gets when it is (re)allocated

    def __init__(self, num_layers: int) -> None:
        self.keys: list[Tensor | None] = [None] * num_layers
        self.values: list[Tensor | None] = [None] * num_layers
        self.length = 0
        self._buffers: list[tuple[Tensor, Tensor] | None] = [None] * num_layers

    def append(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        old_k, old_v = self.keys[layer], self.values[layer]
        n = 0 if old_k is None else old_k.shape[2]
        t = k.shape[2]
        buffer = self._buffers[layer]
        fits = (
            buffer is not None
            and old_k is not None
            and buffer[0].shape[2] >= n + t
            and buffer[0].shape[:2] == k.shape[:2]
            and buffer[0].dtype == k.dtype
            and buffer[0].device == k.device
            and old_k.data_ptr() == buffer[0].data_ptr()  # still a view of this buffer (not replaced)
            # a buffer made under inference_mode cannot be written outside it
            and (torch.is_inference_mode_enabled() or not buffer[0].is_inference())
        )
        if not fits:
            if old_k is None or old_v is None:
                old_k, old_v = k[:, :, :0], v[:, :, :0]
            shape_k = (*k.shape[:2], n + t + self.GROW, k.shape[3])
            shape_v = (*v.shape[:2], n + t + self.GROW, v.shape[3])
            buffer = (k.new_empty(shape_k), v.new_empty(shape_v))
            buffer[0][:, :, :n] = old_k
            buffer[1][:, :, :n] = old_v
            self._buffers[layer] = buffer
        assert buffer is not None
        buffer[0][:, :, n : n + t] = k
        buffer[1][:, :, n : n + t] = v
        self.keys[layer], self.values[layer] = buffer[0][:, :, : n + t], buffer[1][:, :, : n + t]
        return self.keys[layer], self.values[layer]

    def tail(self, n: int) -> list[tuple[Tensor | None, Tensor | None]]:
        """Copies of the last `n` positions' keys and values, per layer (to `extend` with later)."""
        assert 0 < n <= self.length
        return [
            (None, None) if k is None or v is None else (k[:, :, -n:].clone(), v[:, :, -n:].clone())
            for k, v in zip(self.keys, self.values, strict=True)
        ]

    def extend(self, keys_values: list[tuple[Tensor | None, Tensor | None]]) -> None:
        """Append what `tail` copied (computed after exactly what this cache now holds)."""
        n = 0
        for layer, (k, v) in enumerate(keys_values):
            if k is not None and v is not None:
                self.append(layer, k, v)
                n = k.shape[2]
        self.length += n

    def get(self, layer: int) -> tuple[Tensor | None, Tensor | None]:
        return self.keys[layer], self.values[layer]

    def shared_prefix(self, length: int, batch: int) -> KVCache:
        """A new cache over this one's first `length` tokens, repeated for `batch` rows without a copy (rows
        appended to it go to the new cache only: scoring several continuations of one context at once)."""
        view = KVCache(len(self.keys))
        for i, (k, v) in enumerate(zip(self.keys, self.values, strict=True)):
            if k is not None and v is not None:
                view.keys[i] = k[:, :, :length].expand(batch, -1, -1, -1)
                view.values[i] = v[:, :, :length].expand(batch, -1, -1, -1)
        view.length = min(length, self.length)
        return view

    def truncate(self, length: int) -> None:
        """Forget everything after the first `length` context tokens."""
        if length >= self.length:
            return
        for i, (k, v) in enumerate(zip(self.keys, self.values, strict=True)):
            if k is not None and v is not None:
                self.keys[i], self.values[i] = k[:, :, :length], v[:, :, :length]
        self.length = length
